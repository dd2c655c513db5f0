"""The xrt host's training path (host/backends/xrt_train.py, manifest codegen/package/xrt_train.py)
against the recording fake of pyxrt (tests/fake_pyxrt.py): no board exists here, so these
check what the host asks of the boards - the kernels it starts in the schedule's order, the
stash slot it reuses only after that slot's backward finished, the buffers it syncs - and that
every kernel it names is one the board's v++ link config instantiates. (The fake computes
nothing: the bits are csim's to check, tests/test_csim_train.py.)"""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

import fake_pyxrt
from test_csim_train import _gen, _plan


def _nk(build, board: str) -> set[str]:
    """Instances the board's link config declares (nk=kernel:count:inst.inst)."""
    text = (build / "link" / f"{board}.cfg").read_text()
    return {i for line in re.findall(r"^nk=(.*)$", text, re.M) for i in line.split(":")[2].split(".")}


def _setup(tmp_path, monkeypatch, replicas=None):
    from bapipe.models import load_model
    from bapipe.fpga_models import train_fixed as tfx
    from bapipe.host.program import fixed_master_params

    plan = _plan("tiny-mlp", (3,), 4, 2, replicas)
    build = _gen(plan, tmp_path / "b")
    stamp = json.loads((build / "bapipe-build.json").read_text())
    for b in stamp["xrt"]["boards"]:
        (build / b["xclbin"]).write_bytes(b"stand-in for v++ output")
    fake = fake_pyxrt.make(len(stamp["xrt"]["boards"]))
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    model = load_model(plan.model)
    tf = tfx.get_formats("fixed16")
    master = fixed_master_params(model, 0, len(model.layers) - 1, 0, tf)
    rng = np.random.default_rng(3)
    x = rng.integers(-1024, 1024, size=(16, 64))
    labels = rng.integers(0, 10, size=16)
    return plan, build, stamp, fake, model, master, x, labels, tfx.sgd_constants(0.05, 0.9, 8, tf), tf


@pytest.mark.parametrize("replicas", [None, (2, 1)])
def test_xrt_trains_iterations_in_the_schedule_order(tmp_path, monkeypatch, replicas):
    """2 iterations of tiny-mlp in 2 stages (1F1B, 4 micro-batches of 2; then with stage 0
    on 2 replica boards): per board the forward and backward kernels start in the stage's op
    order (bapipe.schedules.device_ops), then the flush, (the all-reduce,) the update; the
    loss kernel starts once per micro-batch before the last stage's backward of it; a forward
    that reuses a stash slot starts only after the host waited for that slot's backward;
    inputs and labels are synced to the board before their kernels start, master weights synced
    back after the update; every instance started is in the board's link config."""
    from bapipe.schedules import device_ops
    from bapipe.host.backends import xrt_backend

    plan, build, stamp, fake, model, master, x, labels, consts, tf = _setup(tmp_path, monkeypatch, replicas)
    xrt_backend.check({"build": str(build), "plan": plan})      # a training build is accepted now
    r = xrt_backend.train_iterations(plan, model, None, master, x, labels, None, 2, consts, tf, {"build": str(build)})
    t = stamp["xrt"]["train"]
    dev = {b["name"]: b["device"] for b in stamp["xrt"]["boards"]}
    name = {b["device"]: b["name"] for b in stamp["xrt"]["boards"]}
    m = t["microbatches"]
    for st in t["stages"]:
        ops = [o for o in device_ops(plan.schedule, len(t["stages"]), st["position"], m) if o.kind in "FB"]
        assert [o for i, s, o in r["op_order"] if s == st["name"]] == [f"{o.kind}{o.mb}" for o in ops] * 2
        fwd, bwd = st["forward"]["instance"], st["backward"]["instance"]
        upd = st["update"]["instance"]
        ar = st["allreduce"]["instance"] if st["allreduce"] else None
        assert bool(ar) == (len(st["boards"]) > 1)
        for k, b in enumerate(st["boards"]):
            calls = [c for c in fake.calls if c[0] in ("start", "wait") and c[1] == dev[b]]
            starts = [c[2] for c in calls if c[0] == "start" and c[2] in (fwd, bwd, upd, ar)]
            want = [fwd if o.kind == "F" else bwd for o in ops] + [bwd] + ([ar] if ar else []) + [upd]
            assert starts == want * 2, (b, starts)
            # stash slots: the forward of micro-batch j (j >= S) waits for the backward of j - S
            S = st["slots"]
            assert S == (2 if st["position"] == 0 else 1)
            f_seen = waited = at_start = 0
            for c in calls:
                if c[0] == "wait" and c[2] == bwd:
                    waited += 1
                if c[0] == "start" and c[2] == fwd:
                    j = f_seen % m
                    at_start = waited if j == 0 else at_start
                    assert j < S or waited - at_start >= j - S + 1, (b, j, waited - at_start)
                    f_seen += 1
            if ar:   # every replica's all-reduce knows its rank in the ring
                ranks = [c[4] for c in fake.calls if c[0] == "set_arg" and c[1] == dev[b] and c[2] == ar
                         and c[3] == len(st["allreduce"]["args"]) - 2]
                assert ranks == [k, k]
    last = t["stages"][-1]
    lb = last["boards"][0]
    seq = [c[2] for c in fake.calls if c[0] == "start" and c[1] == dev[lb] and c[2] in (t["loss"]["instance"], last["backward"]["instance"])]
    assert seq == ([t["loss"]["instance"], last["backward"]["instance"]] * m + [last["backward"]["instance"]]) * 2
    # every instance the host opened is in its board's link config
    for c in fake.calls:
        if c[0] == "kernel":
            inst = c[2].split(":")[1].strip("{}")
            assert inst in _nk(build, name[c[1]]), c
    # one bank per buffer: every kernel argument the host passes the same buffer is placed in
    # the same memory bank by the link config (XRT allocates a buffer in one bank)
    for b in stamp["xrt"]["boards"]:
        bank = dict(re.findall(r"^sp=(\S+):(\S+)$", (build / "link" / f"{b['name']}.cfg").read_text(), re.M))
        keys: dict = {}
        for st in t["stages"]:
            if b["name"] not in st["boards"]:
                continue
            for role in ("forward", "backward", "update", "allreduce"):
                for a in (st[role] or {"args": []})["args"]:
                    if a.get("buffer"):
                        keys.setdefault(a["buffer"], set()).add(bank[f"{st[role]['instance']}.{a['name']}"])
        assert keys and all(len(v) == 1 for v in keys.values()), {k: v for k, v in keys.items() if len(v) > 1}
    # data in: synced before the mover / loss kernel starts; master weights synced back
    for c_i, c in enumerate(fake.calls):
        if c[0] == "start" and c[2].startswith("mm2s_"):
            assert any(d[0] == "bo.sync" and d[2] == "to_device" for d in fake.calls[c_i - 4:c_i]), c
    back = [c for c in fake.calls if c[0] == "bo.sync" and c[2] == "from_device"]
    arrays = sum(1 for st in t["stages"] for a in st["update"]["args"] if a["kind"] == "master")
    assert len(back) == 2 * arrays
    assert len(r["weights"]) == 2 and all(np.shape(r["weights"][0][l][k]) == np.shape(master[l][k])
                                          for l in master for k in master[l])
    # the fake computes nothing: what comes back is what the host loaded (kernel layout round trip)
    assert all(np.array_equal(r["weights"][1][l][k], master[l][k]) for l in master for k in master[l])


def test_xrt_refuses_too_few_stash_slots_in_one_line(tmp_path, monkeypatch):
    """The test of the slot rule: with 1 slot on stage 0 (1F1B needs 2), its second forward would
    overwrite the first micro-batch's stash before the backward read it: refused in one line."""
    from bapipe.host.backends import BackendUnavailable, xrt_backend

    plan, build, stamp, fake, model, master, x, labels, consts, tf = _setup(tmp_path, monkeypatch)
    with pytest.raises(BackendUnavailable, match="stash slot") as e:
        xrt_backend.train_iterations(plan, model, None, master, x, labels, None, 1, consts, tf,
                                     {"build": str(build), "stash_slots": 1})
    assert "\n" not in str(e.value) and "needs 2" in str(e.value)


def test_xrt_update_kernel_takes_each_iterations_rate(tmp_path, monkeypatch):
    """A rate schedule (host.optim.lr_factor, train_fixed.SgdSchedule) reaches the board as the
    update kernel's s_axilite arguments: iteration k's update call is given step k's LR, with the
    schedule's one MU and shift (two steps of one iteration each: the full and the half rate)."""
    from bapipe.fpga_models import train_fixed as tfx
    from bapipe.host.backends import xrt_backend

    plan, build, stamp, fake, model, master, x, labels, consts, tf = _setup(tmp_path, monkeypatch, None)
    sched = tfx.sgd_schedule(0.05, 0.9, 8, tf, [1.0, 0.5], 1)
    xrt_backend.train_iterations(plan, model, None, master, x, labels, None, 2, sched, tf, {"build": str(build)})
    for st in stamp["xrt"]["train"]["stages"]:
        upd = st["update"]
        idx = {a["kind"]: a["index"] for a in upd["args"] if a["kind"] in ("mu", "lr", "shift")}
        got = [c[4] for c in fake.calls if c[0] == "set_arg" and c[2] == upd["instance"] and c[3] == idx["lr"]]
        # 0.05 / 8 2^23 = 52428.8 -> 52429; half of it 26214.4 -> 26214 (each step rounds on its own)
        assert got == [sched.steps[0].lr, sched.steps[1].lr] == [52429, 26214]
        shifts = {c[4] for c in fake.calls if c[0] == "set_arg" and c[2] == upd["instance"] and c[3] == idx["shift"]}
        assert shifts == {consts.shift}
