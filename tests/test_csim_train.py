"""HLS training (issue 17 item 4): the SGD update kernel (codegen/design/train_kernels.py,
bapipe_update.h) and `bapipe csim build/ --iterations K` (codegen/check/csim_train.py): forward,
backward and update kernels in C-simulation, the weights after every iteration bit-exact
against fpga_models.train_fixed.train_step."""
from __future__ import annotations

import re

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from bapipe.models import load_model
from bapipe.fpga_models import train_fixed as tfx
from handplan import hand_plan

CACHE = Path(os.environ.get("BAPIPE_TEST_CSIM_CACHE", Path(tempfile.gettempdir()) / "bapipe-csim-cache"))
TF = tfx.get_formats("fixed16")


def _gen(plan, out: Path) -> Path:
    from bapipe.codegen.cli_gen import generate_plan
    from bapipe.fpga_models.cluster import load_cluster

    generate_plan(plan, load_model(plan.model), load_cluster(plan.cluster), out)
    return out


def _project(plan):
    from bapipe.codegen.design.lower import build_project
    from bapipe.fpga_models.cluster import load_cluster

    return build_project(plan, load_model(plan.model), load_cluster(plan.cluster))


def _plan(model: str, cuts: tuple[int, ...], microbatches: int, size: int, replicas: tuple[int, ...] | None = None):
    """A hand plan with every matrix layer folded (the training RTL that gen also writes needs
    a folding): PE and SIMD the largest divisors up to 4 of the MVU's rows and columns."""
    from bapipe.plan import Folding
    from bapipe.codegen.design.context import mvu_dims

    plan = hand_plan(model, cuts=cuts, microbatches=microbatches, microbatch_size=size, replicas=replicas)
    mdl = load_model(model)
    for st in plan.stages:
        for n in st.layers:
            l = mdl.layers[mdl.index[n]]
            if l.type in ("dense", "conv2d"):
                mh, mw = mvu_dims(l)
                st.folding[n] = Folding(max(d for d in (1, 2, 4) if mh % d == 0), max(d for d in (1, 2, 4) if mw % d == 0))
    return plan


# ---------------------------------------------------------------- structure (no compiler)

@pytest.mark.parametrize("model, cuts", [("tiny-mlp", (3,)), ("tiny-cnn", (1, 3))])
def test_update_kernel_writes_the_layouts_the_kernels_read(model, cuts):
    """Every weight array of a training stage is writable m_axi memory (forward: banked,
    backward: kernel layout) and has an update that reads its backward gradient; the update
    kernel's banked index ((r/PE*SF + c/SIMD)*PE + r%PE)*SIMD + c%SIMD (bapipe_update.h)
    puts every kernel-layout weight where the forward MVU's array holds it (Rom values)."""
    from bapipe.codegen.design.train_kernels import UpdateArray, build_update

    ctx = _project(_plan(model, cuts, 2, 4))
    colmaps = []
    for sc in ctx.stages:
        assert not sc.embed_weights and sc.bwd.weights            # m_axi in both kernels
        u = build_update(sc)
        assert [a.name for a in u.arrays] == [w.name for w in sc.weights]
        grads = {g.name for g in sc.bwd.grad_arrays}
        assert all(a.grad in grads for a in u.arrays)
        # nothing left in ROM (the buffers are the on-chip copies the kernel fills from them)
        roms = {r.name: r for r in sc.engine.roms if not r.buffer}
        assert all(r.external for r in roms.values())
        assert [r for r, _ in u.roms] == [r.name for r in sc.engine.external]
        q = {w.name: np.asarray(w.kernel_q, dtype=np.int64).reshape(-1) for w in sc.weights}
        for a in u.arrays:
            e = np.arange(a.count)
            r, c, sf = e // a.cols, e % a.cols, a.cols // a.simd
            if a.colmap is not None:
                assert sorted(a.colmap) == list(range(a.cols))   # a permutation
                c = np.asarray(a.colmap)[c]
            banked = np.zeros(a.count, dtype=np.int64)
            banked[((r // a.pe * sf + c // a.simd) * a.pe + r % a.pe) * a.simd + c % a.simd] = q[a.name]
            assert np.array_equal(banked, np.asarray(roms[a.rom].values).reshape(-1)), a.name
            assert a.matches(w_q := q[a.name], roms[a.rom].values)   # the gen-time check agrees
            if a.colmap is not None:    # and it catches the kernel's own column order
                assert not UpdateArray(a.name, a.layer, a.key, a.grad, a.rows, a.cols, a.rom, a.pe,
                                       a.simd).matches(w_q, roms[a.rom].values)
            colmaps.append(a.colmap is not None)
    assert any(colmaps) == (model == "tiny-cnn")   # its fc reads the flattened image in HWC order


def test_gen_writes_the_vitis_flow_of_the_update_and_allreduce_kernels(tmp_path):
    """A replicated training stage gets stage0_update and stage0_allreduce: kernel, testbench,
    run_hls_*.tcl / hls_config_*.cfg (the testbenches run their own pattern without arguments:
    no stimulus file, whatever the stage's size), Makefile targets in `make hls`."""
    build = _gen(_plan("tiny-mlp", (), 1, 3, (3,)), tmp_path / "b")
    for k, tag in (("stage0_update", "update"), ("stage0_allreduce", "allreduce")):
        for f in (f"{k}.cpp", f"tb_{k}.cpp", f"run_hls_{tag}.tcl", f"hls_config_{tag}.cfg"):
            assert (build / "stage0" / f).is_file(), f
        tcl = (build / "stage0" / f"run_hls_{tag}.tcl").read_text()
        assert f"set_top {k}" in tcl and 'csim_design -argv ""' in tcl
        mk = (build / "Makefile").read_text()
        assert f"stage0/{k}.xo: stage0/{k}.cpp" in mk and k in mk.split("STAGES := ")[1].splitlines()[0]
    assert not list(build.glob("stage0/csim_update*")) and not list(build.glob("stage0/csim_allreduce*"))


@pytest.mark.parametrize("model, cuts, m, schedule", [("tiny-mlp", (3,), 4, "1f1b"), ("tiny-cnn", (1, 3), 3, "gpipe")])
def test_forward_kernels_write_the_stashes_the_backward_reads(model, cuts, m, schedule):
    """Every stash port of a training stage's backward kernel is written by its forward kernel:
    a stash_write tee on the forward stream carrying that tensor (the stage input, or the last
    engine of its layer; a relu fused into the MVU stashes its output), an m_axi argument of MB
    samples listed in the link cfg, slot count = bapipe.schedules.stash_count for the stage's
    position; a dense layer behind a flatten gets the flattened C,H,W order."""
    import re

    from bapipe.schedules import stash_count

    plan = _plan(model, cuts, m, 2)
    plan.schedule = schedule
    ctx = _project(plan)
    p = len(ctx.stages)
    for d, sc in enumerate(ctx.stages):
        es = sc.engine
        assert sc.stash_note is None and es.stashes
        ports = {q.name: q.tensor for q in sc.bwd.stashes}
        assert sorted(x for b in es.stashes for x in b.ports) == sorted(ports)   # every port, once
        for b in es.stashes:
            assert all(ports[x] == b.tensor for x in b.ports)
            assert b.slots == stash_count(schedule, p, d, m) and b.mb == sc.bwd.mb
            assert f"data_t {b.name}[{b.mb} * {b.elements}]" in sc.params and b.name in sc.args
            tee = [c for c in es.calls if c.startswith("bapipe::stash_write") and f", {b.name}, n)" in c]
            assert len(tee) == 1
            src, dst = re.search(r"\((\w+), (\w+),", tee[0]).groups()
            # exactly one engine writes the tee's input and one reads its output (or it is a port)
            assert src == "in0" or sum(bool(re.search(rf"\b{src}\b", c)) for c in es.calls) == 2
            assert dst == "out0" or sum(bool(re.search(rf"\b{dst}\b", c)) for c in es.calls) == 2
        link = {ln for bd in ctx.boards for ln in bd.sp}
        assert all(f"{sc.name}_1.{b.name}:" in " ".join(link) for b in es.stashes)
    if model == "tiny-mlp":   # relu1 (fused into fc1's MVU): relu1's and fc2's ports read one stash
        assert [b.ports for b in ctx.stages[0].engine.stashes if b.tensor == "relu1"] == [["st_relu1", "st_fc2"]]
        assert [b.slots for b in ctx.stages[0].engine.stashes] == [min(p, m)] * 3   # 1F1B: p - d
    else:
        fl = [b for b in ctx.stages[-1].engine.stashes if b.tensor == "flatten"]
        # the last template argument: port beats a vector (codegen.design.stash, #32: wide stashes)
        assert fl[0].chw == (16, 2, 2) and re.search(r"true, \d+>\(s2_pool2_out_st, s2_pool2_out, st_flatten, n\)$",
                                                      fl[0].call), fl[0].call
        assert {b.slots for sc in ctx.stages for b in sc.engine.stashes} == {m}   # GPipe: m


def test_batchnorm_trains_in_hls():
    """small-resnet (conv, batchnorm, residual adds, globalavgpool, dense) in training: the
    backward kernel sums dscale/dshift per channel (batchnorm_bwd_train, its input stashed by the
    forward: the conv's output before the batchnorm), the update kernel rewrites every batchnorm
    array the forward reads ([C/LANES][LANES], in place), and nothing is left untrained."""
    from bapipe.codegen.design.train_kernels import build_update

    ctx = _project(_plan("examples/models/small-resnet.yaml", (), 2, 1))
    sc = ctx.stages[0]
    bns = [lc.name for lc in sc.layers if lc.type == "batchnorm"]
    assert len(bns) == 6 and sc.update_note is None and sc.stash_note is None
    u = build_update(sc)
    roms = {r.name: r for r in sc.engine.roms}
    for name in bns:
        grads = {g.key: g for g in sc.bwd.grad_arrays if g.layer == name}
        assert set(grads) == {"scale", "shift"}
        for a in (a for a in u.arrays if a.layer == name):
            assert a.grad == grads[a.key].name and a.rom.endswith(f"_{a.key}") and roms[a.rom].external
            assert a.matches(next(w.kernel_q for w in sc.weights if w.name == a.name), roms[a.rom].values)
        assert any(f"batchnorm_bwd_train" in p and f"ds_{name}" in p for p in sc.bwd.processes)
        st = next(s for s in sc.bwd.stashes if s.layer == name)
        assert st.tensor == next(l for l in load_model(ctx.plan.model).layers if l.name == name).inputs[0]
    assert {r for r, _ in u.roms} == {a.rom for a in u.arrays}   # every forward array is updated


def test_time_multiplexed_stage_writes_its_stashes_in_its_turns():
    """A time-multiplexed stage (one sample a turn) tees each stashed stream inside the turn
    that writes it (the input: the turn that reads it); the turns' loop hands that turn the
    stash at sample i (stage.cpp.j2), and every backward stash port is written."""
    from bapipe.codegen.package.project import render_files

    plan = _plan("tiny-cnn", (), 2, 2)
    plan.stages[0].style = "time-multiplexed"
    ctx = _project(plan)
    sc = ctx.stages[0]
    es = sc.engine
    assert sc.stash_note is None and es.units and es.stashes
    assert sorted(x for b in es.stashes for x in b.ports) == sorted(q.name for q in sc.bwd.stashes)
    for b in es.stashes:
        turns = [u for u in es.units if b in u.stashes]
        assert len(turns) == 1 and not turns[0].once
        assert sum(c.startswith("bapipe::stash_write") and f", {b.name}, n)" in c for c in turns[0].calls) == 1
    src = render_files(ctx, "", None)["stage0/stage0.cpp"]
    src = src.decode() if isinstance(src, bytes) else src
    for b in es.stashes:
        assert f"{b.name} + (long)i * {b.elements}, 1);" in src


def test_inference_stages_have_no_update_kernel():
    from bapipe.codegen.design.train_kernels import stage_update

    plan = _plan("tiny-mlp", (3,), 1, 2)
    plan.mode = "inference"
    for sc in _project(plan).stages:
        assert stage_update(sc) == (None, None) and sc.embed_weights


def test_iterations_refuses_bad_input_in_one_line(tmp_path, capsys):
    """`bapipe csim --iterations`: 0 or 1001 iterations, a NaN learning rate, a momentum of 1
    and an inference build each exit 2 with one line naming the field (~4 s: two gens)."""
    from bapipe.cli import main

    train = _gen(_plan("tiny-mlp", (), 1, 2), tmp_path / "t")
    infer = _plan("tiny-mlp", (), 1, 2)
    infer.mode = "inference"
    infer = _gen(infer, tmp_path / "i")
    cases = [([str(train), "--iterations", "0"], "--iterations"),
             ([str(infer), "--iterations", "2"], "mode"),
             ([str(train), "--iterations", "1001"], "--iterations"),
             ([str(train), "--iterations", "1", "--lr", "nan"], "--lr"),
             ([str(train), "--iterations", "1", "--lr", "1e9"], "--lr"),   # beyond the update's shift
             ([str(train), "--iterations", "1", "--momentum", "1"], "--momentum")]
    for args, field in cases:
        assert main(["csim", *args, "--json"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and field in err[0], err


# ---------------------------------------------------------------- C-simulation

def _update_io(u_cfg: dict, g, m, v, consts) -> bytes:
    from bapipe.codegen.check.csim_train import _words

    parts = [np.array([consts.mu, consts.lr, consts.shift], "<i4")]
    for a in u_cfg["arrays"]:
        parts += [_words(g[a["name"]], True), _words(m[a["name"]], False), _words(v[a["name"]], True)]
    return b"".join(p.tobytes() for p in parts)


@pytest.mark.csim
@pytest.mark.slow   # one g++ build of the update kernel: ~7 s
def test_update_kernel_matches_sgd_update_at_the_extremes(tmp_path):
    """The generated update kernel against train_fixed.sgd_update on values at and beyond the
    formats' limits: gradient sums over the whole int64 range (saturating into V), velocities
    at +-2^47, master weights at the int32 limits, for two constant sets (lr 0.05 / batch 64 with
    momentum 0.9; lr 4 / batch 1 without momentum). Every master weight, velocity and 16-bit
    forward copy equal, bit for bit."""
    from bapipe.codegen.check.cxx_run import compile_sources
    from bapipe.codegen.check.csim_train import _unwords

    build = _gen(_plan("tiny-mlp", (), 1, 2), tmp_path / "b")
    st = json.loads((build / "host_config.json").read_text())["stages"][0]
    u = st["update"]
    name = u["kernel"]
    sdir = build / st["kernel"]
    binary = compile_sources([sdir / f"{name}.cpp", sdir / f"tb_{name}.cpp"], [sdir, build / "common"],
                             CACHE, name).path
    rng = np.random.default_rng(7)
    vmax, mmax = (1 << 47) - 1, (1 << 31) - 1
    for consts in (tfx.sgd_constants(0.05, 0.9, 64, TF), tfx.sgd_constants(4.0, 0.0, 1, TF)):
        g, m, v = {}, {}, {}
        for a in u["arrays"]:
            k = a["elements"]
            g[a["name"]] = rng.integers(-(1 << 62), 1 << 62, size=k) >> rng.integers(0, 62, size=k)
            m[a["name"]] = rng.integers(-mmax - 1, mmax + 1, size=k)
            v[a["name"]] = rng.integers(-vmax - 1, vmax + 1, size=k) >> rng.integers(0, 47, size=k)
            m[a["name"]][:4] = [mmax, -mmax - 1, mmax, -mmax - 1]
            v[a["name"]][:4] = [vmax, -vmax - 1, -vmax - 1, vmax]
            g[a["name"]][:4] = [1 << 62, -(1 << 62), 0, 0]
        fin, fout, fw, fr = (tmp_path / f for f in ("in.bin", "out.bin", "w.bin", "r.bin"))
        fin.write_bytes(_update_io(u, g, m, v, consts))
        subprocess.run([str(binary), str(fin), str(fout), str(fw), str(fr)], check=True, capture_output=True)
        vals = np.fromfile(fout, dtype="<i4").astype(np.int64)
        w16 = np.fromfile(fw, dtype="<i2").astype(np.int64)
        pos = wpos = 0
        saturated = 0
        for a in u["arrays"]:
            k = a["elements"]
            m_ref, v_ref = tfx.sgd_update(m[a["name"]], v[a["name"]], g[a["name"]], consts, TF)
            assert np.array_equal(vals[pos:pos + k], m_ref), a["name"]
            assert np.array_equal(_unwords(vals[pos + k:pos + 3 * k]), v_ref), a["name"]
            assert np.array_equal(w16[wpos:wpos + k], tfx.rescale(m_ref, TF.master.frac, TF.act)), a["name"]
            saturated += int(np.sum(np.abs(v_ref) == vmax) + np.sum(v_ref == -vmax - 1))
            pos, wpos = pos + 3 * k, wpos + k
        assert saturated >= 4 * len(u["arrays"])   # the limits were reached, not just approached
    # without arguments (the Vitis csim/cosim run) the testbench updates its own pattern and passes
    r = subprocess.run([str(binary)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("PASS: 0 weights"), r.stdout


@pytest.mark.csim
@pytest.mark.soak   # one g++ build of the all-reduce kernel: 13 s on the loaded machine (make test's budget)
def test_ring_allreduce_kernel_gives_every_replica_the_exact_total(tmp_path):
    """3 replicas of a tiny-mlp stage run the generated all-reduce kernel at once, in a ring
    (reduce-scatter, all-gather; arrays of 4096, 64, ..., 10 sums: 512, 8, ..., 2 words of 8, so
    chunks of 171 and 3 words with padding): every replica ends with train_fixed.allreduce of the
    three replicas' sums, bit for bit, for sums up to +-2^57 (totals inside the ring's 60-bit
    sums, fpga_models.allreduce); the cycles counted are the Design's (RingTiming.cycles)."""
    from bapipe.codegen.check.cxx_run import compile_sources
    from bapipe.codegen.check.csim_train import _unwords, _words

    build = _gen(_plan("tiny-mlp", (), 1, 3, (3,)), tmp_path / "b")
    st = json.loads((build / "host_config.json").read_text())["stages"][0]
    ar = st["update"]["allreduce"]
    assert ar["replicas"] == 3 and st["backward"]["microbatch"] == 1
    sdir = build / st["kernel"]
    name = ar["kernel"]
    binary = compile_sources([sdir / f"{name}.cpp", sdir / f"tb_{name}.cpp"], [sdir, build / "common"],
                             CACHE, name).path
    rng = np.random.default_rng(11)
    sums = [{g["name"]: rng.integers(-(1 << 57), 1 << 57, size=g["elements"]) for g in ar["arrays"]}
            for _ in range(3)]
    (tmp_path / "in.bin").write_bytes(b"".join(_words(r[g["name"]], True).tobytes() for r in sums
                                               for g in ar["arrays"]))
    env = {**os.environ, "BAPIPE_CSIM_STATS": str(tmp_path / "stats.json")}
    subprocess.run([str(binary), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True,
                   capture_output=True, env=env)
    vals = np.fromfile(tmp_path / "out.bin", dtype="<i4").astype(np.int64)
    total = tfx.allreduce([{"l": r} for r in sums])["l"]
    pos = 0
    for _ in range(3):
        for g in ar["arrays"]:
            k = g["elements"]
            assert np.array_equal(_unwords(vals[pos:pos + 2 * k]), total[g["name"]]), g["name"]
            pos += 2 * k
    cycles = int(vals[-2]) & 0xFFFFFFFF | int(vals[-1]) << 32
    assert ar["chunk_words"][:2] == [171, 3] and cycles == ar["cycles"], (cycles, ar["cycles"])
    # without arguments (the Vitis csim/cosim run) the testbench checks its own pattern
    r = subprocess.run([str(binary)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("PASS: 0 sums"), r.stdout


@pytest.mark.csim
@pytest.mark.soak   # one g++ build of the loss kernel: ~6 s (make test's budget)
def test_loss_kernel_matches_softmax_xent_grad_over_the_whole_logit_range(tmp_path):
    """The generated loss kernel against train_fixed.softmax_xent_grad on 256 samples of 10
    logits spread over the whole 16-bit range (differences to the max up to 2^16 - 1 LSB: the
    2^t table's shifts beyond 40 and full saturation), plus equal and one-hot rows: every
    gradient bit-identical; without arguments its testbench's own check passes."""
    from bapipe.codegen.check.cxx_run import compile_sources

    build = _gen(_plan("tiny-mlp", (), 16, 16), tmp_path / "b")
    lk = json.loads((build / "host_config.json").read_text())["loss"]
    assert lk["classes"] == 10 and lk["max_samples"] == 256
    ldir = build / lk["stage"]
    binary = compile_sources([ldir / f"{lk['kernel']}.cpp", ldir / f"tb_{lk['kernel']}.cpp"], [ldir, build / "common"],
                             CACHE, lk["kernel"]).path
    rng = np.random.default_rng(5)
    z = rng.integers(-(1 << 15), 1 << 15, size=(256, 10)) >> rng.integers(0, 15, size=(256, 1))
    z[0], z[1], z[2] = 0, -(1 << 15), [(1 << 15) - 1] + [-(1 << 15)] * 9
    labels = rng.integers(0, 10, size=256)
    (tmp_path / "in.bin").write_bytes(b"".join(a.astype("<i4").tobytes() for a in (np.array([256]), z.reshape(-1), labels)))
    subprocess.run([str(binary), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True, capture_output=True)
    dz = np.fromfile(tmp_path / "out.bin", dtype="<i4").astype(np.int64)[:z.size].reshape(z.shape)
    assert np.array_equal(dz, tfx.softmax_xent_grad(z, labels, TF))
    assert dz[2, labels[2]] in (0, -(1 << 12))      # a saturated row: p is one-hot
    r = subprocess.run([str(binary)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("PASS: 0 rows"), r.stdout


def _train(build: Path, iterations: int, capsys, *extra: str) -> dict:
    from bapipe.cli import main

    os.environ.setdefault("BAPIPE_CSIM_CACHE", str(CACHE))
    rc = main(["csim", str(build), "--iterations", str(iterations), "--json", *extra])
    r = json.loads(capsys.readouterr().out)
    assert rc in (0, None), r
    return r


def _check_run(r: dict, iterations: int, samples: int) -> None:
    assert r["weights_match"] and r["passed"] and len(r["per_iteration"]) == iterations
    for it in r["per_iteration"]:
        assert it["samples"] == samples
        assert it["master_max_abs_err_lsb"] == it["velocity_max_abs_err_lsb"] == 0
        assert it["grad_sums_max_abs_err"] == it["forward_max_abs_err_lsb"] == it["logits_max_abs_err_lsb"] == 0
        assert it["loss_grad_max_abs_err_lsb"] == 0 and it["loss_cycles"] > 0   # the loss kernel ran
        assert it["stash_max_abs_err_lsb"] == 0   # what the forward kernels stashed is the forward's
        assert it["master_moved"] > 0.5 * it["master_elements"]   # the update really changed the weights


@pytest.mark.csim
@pytest.mark.soak   # 6 g++ builds (2 stages x forward, backward, update): ~1 min CPU, minutes on a loaded machine
def test_tiny_mlp_two_stages_two_microbatches_trains_bit_exact(tmp_path, capsys):
    """tiny-mlp cut in 2 stages, 2 micro-batches of 4: 3 iterations through the CLI, the
    master weights and velocities of both stages equal to train_step's after every one."""
    from bapipe.codegen.check.csim_train import csim_train

    build = _gen(_plan("tiny-mlp", (3,), 2, 4), tmp_path / "b")
    r = _train(build, 3, capsys)
    _check_run(r, 3, 8)
    # 1F1B: stage 0 runs F0 F1 B0 B1 with 2 stash slots, stage 1 F0 B0 F1 B1 with 1
    it = r["per_iteration"][0]
    assert it["op_order"] == {"stage0": "F0 F1 B0 B1", "stage1": "F0 B0 F1 B1"}
    assert it["stash_slots"] == {"stage0": 2, "stage1": 1} and r["not_in_hls"] == []
    # the test of the test: one slot fewer on stage 0 hands B0 micro-batch 1's stash (kernels cached: < 1 s)
    bad = csim_train(build, 1, cache=CACHE, stash_slots=1)
    assert not bad["passed"] and not bad["weights_match"]
    assert bad["per_iteration"][0]["stash_max_abs_err_lsb"] > 0


@pytest.mark.csim
@pytest.mark.soak   # 8 g++ builds: ~2 min on a loaded machine
def test_replicated_stage_all_reduces_and_trains_bit_exact(tmp_path, capsys):
    """tiny-mlp in 2 stages, the first with 3 replicas (2 of the 6 samples of each micro-batch
    each) joined by the all-reduce kernel: 2 iterations, every replica's master weights and
    velocities equal to train_step's (the whole batch on one device)."""
    build = _gen(_plan("tiny-mlp", (3,), 2, 6, (3, 1)), tmp_path / "b")
    r = _train(build, 2, capsys)
    _check_run(r, 2, 12)
    assert r["per_iteration"][0]["replicas"] == {"stage0": 3, "stage1": 1}
    assert r["per_iteration"][0]["cycles"]["stage0"]["allreduce"] > 0


@pytest.mark.csim
@pytest.mark.soak   # 8 g++ builds: minutes on a loaded machine
def test_tiny_cnn_replicated_stages_all_reduce_and_train_bit_exact(tmp_path, capsys):
    """tiny-cnn in 2 stages (conv1 relu1 conv2 relu2 pool1 | conv3 relu3 pool2 flatten fc), each on
    2 replicas (2 of the 4 samples of each micro-batch each), the conv and dense weight-gradient
    sums joined by the all-reduce kernel of each stage: 2 iterations, every replica's master
    weights and velocities equal to train_step's (the whole batch on one device)."""
    build = _gen(_plan("tiny-cnn", (4,), 2, 4, (2, 2)), tmp_path / "b")
    r = _train(build, 2, capsys)
    _check_run(r, 2, 8)
    it = r["per_iteration"][0]
    assert it["replicas"] == {"stage0": 2, "stage1": 2}
    assert it["cycles"]["stage0"]["allreduce"] > 0 and it["cycles"]["stage1"]["allreduce"] > 0


@pytest.mark.csim
@pytest.mark.soak   # 9 g++ builds: minutes on a loaded machine
def test_tiny_cnn_three_stages_trains_bit_exact(tmp_path, capsys):
    """tiny-cnn (convolutions, pooling, flatten) in 3 stages, 2 micro-batches of 2: 2 iterations."""
    build = _gen(_plan("tiny-cnn", (1, 3), 2, 2), tmp_path / "b")
    r = _train(build, 2, capsys, "--lr", "0.1", "--momentum", "0.5")   # the run's constants, no rebuild
    _check_run(r, 2, 4)
    assert (r["lr"], r["momentum"], r["sgd_constants"]["mu"]) == (0.1, 0.5, 1 << 15)


@pytest.mark.csim
@pytest.mark.soak   # 4 g++ builds and 32x32x16 images: minutes
def test_small_resnet_with_batchnorm_trains_bit_exact(tmp_path, capsys):
    """small-resnet in one stage, 2 micro-batches of 1 sample: 2 iterations, the batchnorm
    scale/shift master weights and velocities included, equal to train_step's."""
    build = _gen(_plan("examples/models/small-resnet.yaml", (), 2, 1), tmp_path / "b")
    r = _train(build, 2, capsys)
    _check_run(r, 2, 2)
    assert r["not_in_hls"] == []


@pytest.mark.csim
@pytest.mark.soak   # 4 g++ builds: ~30 s
def test_time_multiplexed_stage_trains_bit_exact(tmp_path, capsys):
    """tiny-cnn in one time-multiplexed stage (its layers take turns; the update kernel writes
    the m_axi arrays each turn reads; the turns write the stashes), 2 micro-batches of 2:
    2 iterations bit-exact."""
    plan = _plan("tiny-cnn", (), 2, 2)
    plan.stages[0].style = "time-multiplexed"
    build = _gen(plan, tmp_path / "b")
    r = _train(build, 2, capsys)
    _check_run(r, 2, 4)
    assert r["not_in_hls"] == [] and r["per_iteration"][0]["op_order"] == {"stage0": "F0 B0 F1 B1"}


@pytest.mark.csim
@pytest.mark.soak   # the planner, gen and one g++ -fsyntax-only of a backward kernel (~7 s: make test's budget)
def test_time_multiplexed_backward_without_input_gradients_compiles_werror(tmp_path):
    """A time-multiplexed backward kernel whose MVU turns have no input gradient (tiny-mlp's fc1 relu1
    stage: fc1 reads the model input, fpga_models.gradients) has no input-gradient array, so its shared
    MAC declares no `used_x` (set, never read: g++ -Wall -Werror refused the kernel, which broke
    `bapipe csim --iterations` on the interleaved tiny-mlp plan's first chunk)."""
    from bapipe.codegen.check.cxx_run import CSIM_FLAGS, CXXFLAGS, _ap_types, _compiler

    import sys

    from bapipe.cli import main
    plan = tmp_path / "il.yaml"   # tiny-mlp interleaved, 2 boards x 2 chunks; chunk 0 of fpga0 (fc1 relu1) TM
    subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", "tiny-mlp", "4xU250-ring", "--schedule", "interleaved",
                    "--microbatches", "4", "--global-batch", "4", "--no-replication", "--partition", "0-1,2-3,4-5,6",
                    "--cap", "0.3", "-o", str(plan)], check=True, capture_output=True)
    build = tmp_path / "b"
    assert main(["gen", str(plan), "-o", str(build), "--allow-rule-violations"]) in (0, None)
    assert "time-multiplexed" in plan.read_text()
    src = build / "stage0" / "stage0_bwd.cpp"
    text = src.read_text()
    assert "_bwd_mac(" in text and "used_x" not in text
    inc = [build / "stage0", build / "common"]
    inc = [d / "csim" for d in inc if (d / "csim" / "hls_stream.h").is_file()] + inc   # as codegen.check.csim does
    r = subprocess.run([_compiler()[0], *CXXFLAGS, *CSIM_FLAGS, "-fsyntax-only", "-isystem", str(_ap_types()),
                        *[f"-I{d}" for d in inc if d.is_dir()], str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
