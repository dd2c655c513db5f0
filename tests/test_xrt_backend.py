"""The xrt backend against a recording fake of pyxrt (tests/fake_pyxrt.py), checked call by
call against the build's manifest (bapipe-build.json, section xrt): one device per board,
the xclbins the Makefile links, the kernels it starts and in which order, the m_axi weight
buffers (sizes and bytes), and the results read back (the fake's boards compute the numpy
fixed-point reference, so a wrong layout, dtype or order shows up as a mismatch)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import fake_pyxrt
from handplan import hand_plan


def _gen(tmp_path, plan, engines: str = "hls", name: str = "build"):
    """`bapipe gen` of ``plan`` (no csim/rtlsim), with stand-in xclbins where the Makefile puts them."""
    from bapipe.codegen.cli_gen import generate_plan
    from bapipe.fpga_models.plancheck import resolve

    model, cluster = resolve(plan)
    out = tmp_path / name
    generate_plan(plan, model, cluster, out, engines=engines)
    stamp = json.loads((out / "bapipe-build.json").read_text())
    for b in stamp["xrt"]["boards"]:
        (out / b["xclbin"]).write_bytes(b"stand-in for v++ output")
    return out, model, stamp


def _program(plan, model):
    """The boards' data path for the fake: mm2s input bytes -> the numpy reference's s2mm bytes
    (the whole model: every test plan's boards together compute it)."""
    from bapipe.codegen.design.dataflow import plan_weights
    from bapipe.fpga_models import fixedpoint as fx
    from bapipe.host.forward import reference_logits

    params = plan_weights(plan, model)
    fmt = fx.get_fmt(plan.number_format)
    shape = model.inputs[0].shape

    def program(raw: bytes) -> bytes:
        x = np.frombuffer(raw, dtype=np.int16).astype(np.int64)
        if len(shape) == 3:   # HWC on the wire -> NCHW
            c, h, w = shape
            x = x.reshape(-1, h, w, c).transpose(0, 3, 1, 2)
        else:
            x = x.reshape(-1, *shape)
        return reference_logits(model, params, x, fmt).astype(np.int16).tobytes()
    return program


def _inference(plan):
    plan.mode = "inference"
    return plan


def _expected_kernels(xrt: dict) -> list[tuple[int, str]]:
    """(device, "kernel:{instance}") of everything the host must open: hs stage kernels and movers."""
    out = []
    for b in xrt["boards"]:
        out += [(b["device"], f"{k['name']}:{{{k['instance']}}}") for k in b["kernels"] if k["control"] == "hs"]
        out += [(b["device"], f"{m['kernel']}:{{{m['instance']}}}") for m in b["inputs"] + b["outputs"]]
    return sorted(out)


def _run(monkeypatch, plan, model, out, stamp, limit: int = 6, program=None):
    """check + forward of the backend on ``limit`` random raw inputs in [-2, 2); outputs against
    the numpy fixed-point reference (host.forward.run_forward's comparison, without the digits
    data set, whose sklearn import alone takes ~10 s here)."""
    from bapipe.codegen.design.dataflow import plan_weights
    from bapipe.fpga_models import fixedpoint as fx
    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.host.backends import xrt_backend
    from bapipe.host.forward import reference_logits

    fake = fake_pyxrt.make(len(stamp["xrt"]["boards"]), program or _program(plan, model))
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    xrt_backend.check({"build": str(out), "plan": plan})
    fmt = fx.get_fmt(plan.number_format)
    x = np.random.default_rng(limit).integers(-2 << fmt.frac, 2 << fmt.frac, size=(limit, *model.inputs[0].shape))
    got = xrt_backend.forward(plan, model, load_cluster(plan.cluster), None, x, {"build": str(out), "timeout": 1.0})
    ref = reference_logits(model, plan_weights(plan, model), x, fmt)
    diff = np.abs(got - ref)
    r = {"samples": len(x), "mismatches_vs_numpy": int(np.count_nonzero(diff.max(axis=1))),
         "max_abs_err_vs_numpy": int(diff.max())}
    return r, fake.calls


def _interface(out, kernel: str) -> tuple[str, str]:
    """(control, starts) read off the generated HLS kernel's interface pragmas."""
    cpp = (out / kernel / f"{kernel}.cpp").read_text()
    if "mode=ap_ctrl_none port=return" in cpp:
        return "none", "never"
    return "hs", ("once" if "mode=s_axilite port=n" in cpp else "per_sample")


def _common_checks(out, stamp, calls, n: int):
    xrt = stamp["xrt"]
    boards = xrt["boards"]
    for b in boards:   # the manifest says what the generated kernels are
        for k in b["kernels"]:
            if k["engine"] == "hls":
                assert (k["control"], k["starts"]) == _interface(out, k["name"]), k["name"]
            once = [c for c in calls if c[0] == "start" and c[2] == k["instance"]]
            assert len(once) == {"never": 0, "once": 1, "per_sample": n}[k["starts"]]
            for a in k["args"]:
                if a["kind"] == "samples":
                    assert ("set_arg", b["device"], k["instance"], a["index"], n) in calls
    # one device per board, each opened once, each loaded with the xclbin the Makefile links
    assert [c[1] for c in calls if c[0] == "device"] == [b["device"] for b in boards]
    assert [c[1:] for c in calls if c[0] == "load_xclbin"] == [(b["device"], str(out / b["xclbin"])) for b in boards]
    assert all(b["xclbin"] == f"link/{b['name']}.xclbin" for b in boards)
    makefile = (out / "Makefile").read_text()
    assert all(f"\n{b['xclbin']}: " in makefile for b in boards)   # the Makefile's own targets
    assert sorted((c[1], c[2]) for c in calls if c[0] == "kernel") == _expected_kernels(xrt)
    starts = [(c[1], c[2]) for c in calls if c[0] == "start"]
    first = {s: starts.index(s) for s in starts}
    s2mm = [first[(b["device"], o["instance"])] for b in boards for o in b["outputs"]]
    mm2s = [first[(b["device"], i["instance"])] for b in boards for i in b["inputs"]]
    assert s2mm and mm2s and max(s2mm) < min(mm2s)      # drain before feeding
    for b in boards:
        for m in b["inputs"] + b["outputs"]:
            assert ("set_arg", b["device"], m["instance"], m["args"]["n"], n * m["elements"]) in calls
    return starts


def test_tiny_cnn_4_boards_hls(tmp_path, monkeypatch):
    """Free-running HLS stages (weights on chip): only the movers are started; 4 devices."""
    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan)
    r, calls = _run(monkeypatch, plan, model, out, stamp)
    assert r["samples"] == 6 and r["mismatches_vs_numpy"] == 0 and r["max_abs_err_vs_numpy"] == 0
    assert stamp["engines"] == "hls" and len(stamp["xrt"]["boards"]) == 4
    starts = _common_checks(out, stamp, calls, 6)
    once = [(b["device"], k["instance"]) for b in stamp["xrt"]["boards"] for k in b["kernels"][::-1]
            if k["starts"] == "once"][::-1]
    once.sort(key=lambda c: -int(c[1][len("stage"):-2]))
    assert starts == [(3, "s2mm_stage3_out0"), *once, (0, "mm2s_stage0_in0")]


def test_tiny_cnn_4_boards_rtl(tmp_path, monkeypatch):
    """Packaged RTL kernels (ap_ctrl_hs): each started once with samples = N, downstream first,
    after the output mover and before the input mover."""
    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan, "rtl")
    r, calls = _run(monkeypatch, plan, model, out, stamp, limit=5)
    assert r["mismatches_vs_numpy"] == 0
    starts = _common_checks(out, stamp, calls, 5)
    assert starts == [(3, "s2mm_stage3_out0"), (3, "stage3_1"), (2, "stage2_1"), (1, "stage1_1"), (0, "stage0_1"),
                      (0, "mm2s_stage0_in0")]
    for dev, i in enumerate(range(4)):
        assert ("set_arg", dev, f"stage{i}_1", 2, 5) in calls   # kernel.xml: samples is argument 2
    assert not [c for c in calls if c[0] == "bo" and c[3] not in (0, 1)]   # no weight buffers: ROM


def test_external_weights_are_loaded_from_the_manifest(tmp_path, monkeypatch):
    """Stages whose weights live off chip (EMBED_LIMIT forced to 0): every m_axi weight argument
    gets a buffer of the manifest's size in the bank of its argument, filled from the stage's one
    weight image at the array's offset (engine kernels: their external ROM banks, banked;
    per-layer kernels: their arrays in kernel layout); engine kernels start once for all N
    samples, per-layer ones once per sample; downstream first."""
    import bapipe.codegen.design.context

    monkeypatch.setattr(bapipe.codegen.design.context, "EMBED_LIMIT", 0)
    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan)
    hc = json.loads((out / "host_config.json").read_text())
    n = 4
    r, calls = _run(monkeypatch, plan, model, out, stamp, limit=n)
    assert r["mismatches_vs_numpy"] == 0
    _common_checks(out, stamp, calls, n)
    bos = [c for c in calls if c[0] == "bo"]
    engine_kernels = 0
    for b in stamp["xrt"]["boards"]:
        for k in b["kernels"]:
            st = next(s for s in hc["stages"] if s["kernel"] == k["name"])
            w = [a for a in k["args"] if a["kind"] == "weights"]
            engine = st["samples_per_call"] == "n"   # Design engine kernels: n samples a call
            engine_kernels += engine
            # sizes: host_config's element counts x 2 bytes (fixed16), same names and order: the
            # engine kernels' external ROM banks, or the per-layer kernels' weight arrays
            want = st["roms"] if engine else st["weights"]
            assert [a["name"] for a in w] == [x["name"] for x in want]
            assert [a["bytes"] for a in w] == [2 * x["elements"] for x in want]
            for a in w:
                assert ("bo", b["device"], a["bytes"], a["index"]) in bos
                assert ("set_arg", b["device"], k["instance"], a["index"], ("bo", a["bytes"])) in calls
                # the buffer is filled from the stage's image, at the array's offset there
                assert a["file"] == st["weights_file"] == f"{k['name']}/weights.bin"
                assert [a["offset"] for a in w] == [2 * x["offset"] for x in want]
            starts = [c for c in calls if c[0] == "start" and c[2] == k["instance"]]
            if engine:
                assert len(starts) == 1 and k["starts"] == "once"
            else:
                assert len(starts) == (n if w else 0) and k["starts"] == ("per_sample" if w else "never")
    assert engine_kernels, "no stage of the plan lowered to engine kernels"
    # every stage kernel's weights reach the board: each image holds every array of its stage once,
    # and unfolds to the plan's weights
    from bapipe.codegen.design.dataflow import plan_weights
    from bapipe.codegen.design.weight_image import read_model
    from bapipe.fpga_models.fixedpoint import conv_weight_matrix

    ref = plan_weights(plan, model)
    for st in hc["stages"]:
        image = np.fromfile(out / st["weights_file"], dtype="<i2")
        assert image.size == sum(w["elements"] for w in st["weights"]) > 0
        for w in st["weights"]:
            assert np.array_equal(read_model(out, w), ref[w["layer"]][w["key"]]), w["name"]
    st = hc["stages"][0]
    if st["samples_per_call"] != "n":   # the per-layer image holds the kernel layout: conv OIHW -> [o][(ky*KW+kx)*C + c]
        conv = st["weights"][0]
        raw = np.fromfile(out / st["weights_file"], dtype="<i2")[conv["offset"]:conv["offset"] + conv["elements"]]
        assert np.array_equal(raw, conv_weight_matrix(ref[conv["layer"]]["w"]).reshape(-1))
    # the stage kernels start downstream first
    order = [c[2] for c in calls if c[0] == "start" and c[2].startswith("stage")]
    assert order[:4] == ["stage3_1", "stage2_1", "stage1_1", "stage0_1"]


@pytest.mark.parametrize("engines", ["hls", "rtl"])
def test_interleaved_boards_open_once(tmp_path, monkeypatch, engines):
    """tiny-cnn as 4 stages on 2 boards (stages 0 and 2 on fpga0): 2 devices, not 4; each
    stage's kernel is opened on its board's device."""
    from handplan import tiny_cnn_interleaved_plan

    plan = tiny_cnn_interleaved_plan()
    out, model, stamp = _gen(tmp_path, plan, engines)
    r, calls = _run(monkeypatch, plan, model, out, stamp, limit=3)
    assert r["mismatches_vs_numpy"] == 0
    _common_checks(out, stamp, calls, 3)
    assert [c[1] for c in calls if c[0] == "device"] == [0, 1]
    assert [[k["stage"] for k in b["kernels"]] for b in stamp["xrt"]["boards"]] == [[0, 2], [1, 3]]
    if engines == "rtl":
        assert [(c[1], c[2]) for c in calls if c[0] == "kernel" and c[2].startswith("stage")] == \
            [(0, "stage0:{stage0_1}"), (0, "stage2:{stage2_1}"), (1, "stage1:{stage1_1}"), (1, "stage3:{stage3_1}")]


def test_images_travel_channel_last(tmp_path, monkeypatch):
    """conv-mini (2-channel 6x6 images, 3 boards): the input buffer holds HWC rows, as the
    kernels stream them; the boards' reference reads them back as such, bit-exact."""
    from handplan import conv_mini_plan

    plan = conv_mini_plan()
    out, model, stamp = _gen(tmp_path, plan)
    assert model.inputs[0].shape[0] == 2
    r, calls = _run(monkeypatch, plan, model, out, stamp, limit=4)
    assert r["mismatches_vs_numpy"] == 0 and r["max_abs_err_vs_numpy"] == 0
    _common_checks(out, stamp, calls, 4)


def test_replicas_of_one_stage_split_the_samples(tmp_path, monkeypatch):
    """tiny-cnn as one stage replicated on 4 boards (what `bapipe plan --mode inference` picks):
    each board's movers and kernel get a contiguous chunk (7 samples: 2, 2, 2, 1), outputs
    come back in sample order, bit-exact."""
    from bapipe.plan import Plan, Stage
    from bapipe.fpga_models.plancheck import resolve

    base = _inference(hand_plan("tiny-cnn", cuts=()))
    st = base.stages[0]
    plan = Plan(**{**base.__dict__, "stages": [Stage(**{**st.__dict__, "boards": ["fpga0", "fpga1", "fpga2", "fpga3"],
                                                          "replicas": 4})]})
    resolve(plan)
    out, model, stamp = _gen(tmp_path, plan)
    assert [b["inputs"] != [] and b["outputs"] != [] for b in stamp["xrt"]["boards"]] == [True] * 4
    r, calls = _run(monkeypatch, plan, model, out, stamp, limit=7)
    assert r["mismatches_vs_numpy"] == 0 and r["max_abs_err_vs_numpy"] == 0
    per_board = [c[4] for c in calls if c[0] == "set_arg" and c[2] == "mm2s_stage0_in0" and c[3] == 2]
    assert per_board == [2 * 64, 2 * 64, 2 * 64, 1 * 64]
    chunks = [2, 2, 2, 1]
    for b, c in zip(stamp["xrt"]["boards"], chunks):
        assert ("set_arg", b["device"], "s2mm_stage0_out0", 2, c * 10) in calls
        for k in b["kernels"]:
            for a in k["args"]:
                if a["kind"] == "samples":
                    assert ("set_arg", b["device"], k["instance"], a["index"], c) in calls
            assert len([x for x in calls if x[0] == "start" and x[1] == b["device"] and x[2] == k["instance"]]) == \
                {"never": 0, "once": 1, "per_sample": c}[k["starts"]]


def test_check_names_the_missing_xclbin_and_the_stale_build(tmp_path, monkeypatch):
    from bapipe.errors import SpecError
    from bapipe.host.backends import BackendUnavailable
    from bapipe.host.backends import xrt_backend

    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan)
    monkeypatch.setitem(sys.modules, "pyxrt", fake_pyxrt.make(4))
    xrt_backend.check({"build": str(out), "plan": plan})        # all present: no complaint
    (out / "link" / "fpga2.xclbin").unlink()
    with pytest.raises(BackendUnavailable, match=r"link/fpga2.xclbin not found; build it with `make xclbin`"):
        xrt_backend.check({"build": str(out), "plan": plan})
    monkeypatch.setitem(sys.modules, "pyxrt", fake_pyxrt.make(3))
    with pytest.raises(BackendUnavailable, match="needs 4 boards, XRT sees 3"):
        xrt_backend.check({"build": str(out), "plan": plan})
    other = _inference(hand_plan("tiny-cnn", cuts=(1, 3)))
    with pytest.raises(SpecError, match="expected a build of this plan"):
        xrt_backend.check({"build": str(out), "plan": other})
    monkeypatch.setitem(sys.modules, "pyxrt", None)   # no XRT: one line
    with pytest.raises(BackendUnavailable, match="pyxrt is not importable") as e:
        xrt_backend.check({"build": str(out), "plan": plan})
    assert "\n" not in str(e.value)


def test_training_builds_the_host_cannot_train_are_refused_in_one_line(tmp_path, monkeypatch):
    """A training build trains on boards (tests/test_xrt_train.py) from its manifest's ``train``
    section; a build without one (an older gen) is refused by check() in one line, before a
    device is opened."""
    from bapipe.host.backends import BackendUnavailable, xrt_backend
    from test_csim_train import _plan   # every matrix layer folded (the training RTL gen also writes needs it)

    plan = _plan("tiny-cnn", (1, 3), 2, 2)
    assert plan.mode == "train"
    out, _model, stamp = _gen(tmp_path, plan)
    assert stamp["xrt"]["train"]["refused"] is None and len(stamp["xrt"]["train"]["stages"]) == 3
    stamp["xrt"]["train"] = None
    (out / "bapipe-build.json").write_text(json.dumps(stamp))
    fake = fake_pyxrt.make(4)
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    with pytest.raises(BackendUnavailable, match="no training manifest") as e:
        xrt_backend.check({"build": str(out), "plan": plan})
    assert "\n" not in str(e.value) and not [c for c in fake.calls if c[0] == "device"]


@pytest.mark.slow
@pytest.mark.soak   # VGG-16's gen alone takes ~1 minute and writes ~1.5 GB: make test-all
def test_vgg16_interleaved(tmp_path, monkeypatch):
    """VGG-16 as 4 stages on 2 boards (interleaved: stages 0 and 2 on fpga0), every stage's
    weights off chip: 2 devices; each weight buffer the size host_config states; one sample."""
    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.host.backends import xrt_backend

    plan = _inference(hand_plan("vgg16", cuts=(9, 23, 30), schedule="interleaved", chunks=2))
    out, model, stamp = _gen(tmp_path, plan)
    hc = json.loads((out / "host_config.json").read_text())
    fake = fake_pyxrt.make(2, lambda raw: bytes(2 * 1000))
    monkeypatch.setitem(sys.modules, "pyxrt", fake)
    xrt_backend.check({"build": str(out), "plan": plan})
    x = np.zeros((1, *model.inputs[0].shape), dtype=np.int64)
    y = xrt_backend.forward(plan, model, load_cluster(plan.cluster), None, x, {"build": str(out)})
    assert y.shape == (1, 1000)
    calls = fake.calls
    _common_checks(out, stamp, calls, 1)
    assert [c[1] for c in calls if c[0] == "device"] == [0, 1]
    bos = [c for c in calls if c[0] == "bo"]
    for b in stamp["xrt"]["boards"]:
        for k in b["kernels"]:
            st = next(s for s in hc["stages"] if s["kernel"] == k["name"])
            w = [a for a in k["args"] if a["kind"] == "weights"]
            assert [a["bytes"] for a in w] == [2 * x["elements"] for x in st["weights"]] and w
            assert all(("bo", b["device"], a["bytes"], a["index"]) in bos for a in w)
