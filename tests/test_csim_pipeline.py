"""Generated projects compiled with g++ and run stage by stage, outputs chained, against numpy."""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from bapipe import toolchain
from bapipe.codegen.cli_gen import generate_plan

from handplan import make_plan, residual_model_file

pytestmark = [pytest.mark.csim,
              pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                                 reason="needs g++ and the hls4ml ap_types headers")]

CACHE = Path(os.environ.get("BAPIPE_TEST_CSIM_CACHE", Path(tempfile.gettempdir()) / "bapipe-csim-cache"))


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch):
    monkeypatch.setenv("BAPIPE_CSIM_CACHE", str(CACHE))


def test_tiny_cnn_three_stages_chained_match_numpy(tmp_path, capsys):
    from bapipe.cli import main

    # cut after the flatten (as the demo's split is): the stream crosses the cut in HWC order and
    # the fc's columns are permuted to match, so each stage is checked in that order
    plan, model, cluster = make_plan(cuts=(3, 8), folding={"conv1": (2, 3), "conv2": (4, 8), "conv3": (16, 8),
                                                           "fc": (2, 16), "pool1": (2, 1), "pool2": (4, 1)})
    pf = tmp_path / "plan.yaml"
    plan.save(pf)
    assert main(["gen", str(pf), "-o", str(tmp_path / "build"), "--allow-rule-violations"]) == 0
    capsys.readouterr()
    rc = main(["csim", str(tmp_path / "build"), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["passed"], r
    # training plan: each stage has a forward and a backward kernel
    assert [s["name"] for s in r["stages"]] == ["stage0", "stage0_bwd", "stage1", "stage1_bwd", "stage2", "stage2_bwd"]
    for s in r["stages"]:
        assert s["passed"] and s["max_abs_err_lsb"] == 0
        assert set(s) >= {"name", "passed", "max_abs_err_lsb", "compile_s", "run_s"}
    assert r["model_max_abs_err_lsb"] == 0      # the chained pipeline equals numpy over the whole model


def test_side_by_side_runs_draw_and_report_as_one_by_one(tmp_path, monkeypatch):
    """The backward kernels run beside the forward chain (codegen.check.csim._Jobs) and every
    random input is drawn before anything runs, in the order the stages once ran one after
    another: stage 0's forward inputs, then per stage its backward micro-batch (x, then dy).
    Replayed here from the seed in that order, the draws are the ones the kernels got; and one
    job at a time (BAPIPE_CSIM_JOBS=1) reports the very rows two at a time do, timings aside."""
    import bapipe.codegen.check.csim_bwd as cb
    from bapipe.codegen.check.csim import csim_project
    from bapipe.codegen.check.cxx_run import random_input
    from bapipe.fpga_models import fixedpoint as fx

    plan, model, cluster = make_plan(cuts=(3, 8), folding={"conv1": (2, 3), "conv2": (4, 8), "conv3": (16, 8),
                                                           "fc": (2, 16), "pool1": (2, 1), "pool2": (4, 1)})
    generate_plan(plan, model, cluster, tmp_path)
    got, real = {}, cb.csim_backward

    def spy(build, st, *a, draws=None, **k):
        got[st["kernel"]] = draws
        return real(build, st, *a, draws=draws, **k)

    monkeypatch.setattr(cb, "csim_backward", spy)
    runs = {}
    for n in ("1", "2"):
        monkeypatch.setenv("BAPIPE_CSIM_JOBS", n)
        runs[n] = csim_project(tmp_path, samples=2, seed=11)
    cfg = json.loads((tmp_path / "host_config.json").read_text())
    fmt, rng = fx.FORMATS["fixed16"], np.random.default_rng(11)
    random_input(rng, 2, tuple(cfg["stages"][0]["inputs"][0]["shape"]), fmt)   # stage 0's forward inputs first
    for st in cfg["stages"]:
        mb = st["backward"]["microbatch"]
        xs = {p["tensor"]: random_input(rng, mb, tuple(p["shape"]), fmt) for p in st["inputs"]}
        dys = {p["tensor"]: random_input(rng, mb, tuple(p["shape"]), fmt, span=1.0) for p in st["backward"]["inputs"]}
        assert set(got[st["kernel"]][0]) == set(xs) and set(got[st["kernel"]][1]) == set(dys)
        assert all((got[st["kernel"]][0][t] == v).all() for t, v in xs.items())
        assert all((got[st["kernel"]][1][t] == v).all() for t, v in dys.items())
    timing = ("compile_s", "run_s", "numpy_s", "cached")
    rows = {n: [{k: v for k, v in row.items() if k not in timing} for row in r["stages"]] for n, r in runs.items()}
    assert rows["1"] == rows["2"] and len(rows["1"]) == 6 and runs["1"]["passed"] and runs["2"]["passed"]
    assert {k: v for k, v in runs["1"].items() if k != "stages"} == {k: v for k, v in runs["2"].items() if k != "stages"}


def test_whole_model_reference_is_independent_of_the_chain(tmp_path):
    """Numpy over the whole model from the stage-0 inputs equals the last stage's C output."""
    from bapipe.codegen.check.csim import csim_project
    from bapipe.codegen.check.cxx_run import load_weights
    from bapipe.fpga_models import fixedpoint as fx

    plan, model, cluster = make_plan(mode="inference")   # shares its binaries with the cache test
    generate_plan(plan, model, cluster, tmp_path)
    r = csim_project(tmp_path, samples=3, seed=7)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0
    # the engines' loop-counted cycles against the Design's figure for each stage (this
    # hand-built plan carries no cycles of its own); 3 samples amortise each call's fill
    design = json.loads((tmp_path / "design.json").read_text())["stages"]
    for row, d in zip(r["stages"], design):
        assert abs(row["cycles_per_sample"] / d["design_cycles_per_sample"] - 1) <= 0.10, (row, d)
    # the result is not trivially zero: logits of the tiny CNN differ across samples
    cfg = json.loads((tmp_path / "host_config.json").read_text())
    params = {}
    for st in cfg["stages"]:
        params.update(load_weights(tmp_path, st, fx.FORMATS["fixed16"]))
    rng = np.random.default_rng(7)
    from bapipe.codegen.check.cxx_run import random_input
    x = random_input(rng, 3, (1, 8, 8), fx.FORMATS["fixed16"])
    y = fx.model_fwd(model.layers, {"input": x}, params, "fixed16")["fc"]
    # integer LSBs: a non-triviality threshold, not a tolerance
    assert y.shape == (3, 10) and len({tuple(v) for v in y}) == 3 and np.abs(y).max() > 10


@pytest.mark.soak  # 10 kernels compiled cold (~54 s on 2 cores): make test-all; test_skip_fifo_depth_is_needed_... keeps a residual skip in make test
def test_residual_model_with_skips_across_cuts(tmp_path):
    from bapipe.codegen.check.csim import csim_project

    CACHE.mkdir(parents=True, exist_ok=True)   # a stable model path keeps the plan (and the cache key) stable
    plan, model, cluster = make_plan(residual_model_file(CACHE), cuts=(1, 2, 3, 5),
                                     folding={"c1": (2, 6), "c3": (4, 9), "mp": (2, 1), "gap": (4, 1)})
    generate_plan(plan, model, cluster, tmp_path / "b")
    r = csim_project(tmp_path / "b", samples=2)
    assert r["passed"], r
    assert len(r["stages"]) == 10 and r["model_max_abs_err_lsb"] == 0   # 5 forward + 5 backward kernels
    assert all(s["max_abs_err_lsb"] == 0 for s in r["stages"])


def test_int8_format(tmp_path):
    from bapipe.codegen.check.csim import csim_project

    plan, model, cluster = make_plan(fmt="int8", cuts=(4,), folding={"conv2": (2, 9)}, mode="inference")
    generate_plan(plan, model, cluster, tmp_path)
    assert "ap_fixed<8,4,AP_RND,AP_SAT>" in (tmp_path / "common/bapipe_types.h").read_text()
    r = csim_project(tmp_path, samples=2)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r


def test_second_run_uses_the_cache(tmp_path):
    from bapipe.codegen.check.csim import csim_project

    plan, model, cluster = make_plan(mode="inference")
    generate_plan(plan, model, cluster, tmp_path)
    csim_project(tmp_path, samples=1)
    r = csim_project(tmp_path, samples=1)
    assert all(s["cached"] and s["compile_s"] == 0.0 for s in r["stages"])


def test_backward_reference_gradients_are_not_trivial():
    """The backward comparison means something: numpy gradients of a tiny-CNN stage are mostly nonzero."""
    from bapipe.fpga_models import fixedpoint as fx
    from bapipe.codegen.design.context import make_weights
    from bapipe.codegen.check.cxx_run import random_input

    plan, model, cluster = make_plan()
    params = make_weights(plan, model)
    rng = np.random.default_rng(0)
    f = fx.FORMATS["fixed16"]
    layers = model.layers[:4]
    x = random_input(rng, 2, (1, 8, 8), f)
    dy = random_input(rng, 2, (8, 8, 8), f, span=1.0)
    g, wg = fx.stage_bwd(layers, {"input": x}, {"relu2": dy}, params, f)
    # integer counts: non-triviality thresholds, not tolerances
    assert np.count_nonzero(g["input"]) > 0.5 * g["input"].size
    assert np.count_nonzero(wg["conv2"]["dw"]) > 0.5 * wg["conv2"]["dw"].size
    assert np.count_nonzero(wg["conv1"]["db"]) == 8


def test_a_wrong_weight_is_caught(tmp_path, capsys, monkeypatch):
    """The comparison is live: numpy reads the weight image weights.bin, the kernel its header;
    change one weight."""
    from bapipe.cli import main

    # `bapipe csim` refuses an edited build by its hashes (bapipe-build.json); this test is
    # about csim's own comparison, so the hash check is switched off
    monkeypatch.setattr("bapipe.codegen.cli_gen.check_build", lambda *a, **k: {})

    plan, model, cluster = make_plan(mode="inference")
    generate_plan(plan, model, cluster, tmp_path)
    wb = tmp_path / "stage2/weights.bin"
    raw = bytearray(wb.read_bytes())
    raw[0] ^= 0x40                      # fc weight [0][0] changes by 64 LSB
    wb.write_bytes(bytes(raw))
    rc = main(["csim", str(tmp_path), "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAILED" in out
    assert out.splitlines()[1].split()[:3] == ["stage0", "PASS", "0"]
    assert "stage2" in out and " FAIL" in out.split("stage2")[1].splitlines()[0]


def test_wrong_beat_counts_fail_the_stage(tmp_path):
    """An engine that reads more beats than arrive blocks forever: the bounded csim reports the
    deadlock (kernel, stream, occupancy) instead of reading garbage (plain hls_stream.h only warns)."""
    from bapipe.codegen.check.csim import csim_project

    plan, model, cluster = make_plan(mode="inference")
    generate_plan(plan, model, cluster, tmp_path)
    k = tmp_path / "stage2/stage2.cpp"
    text = k.read_text()
    assert "s2_fc_mvu_b, (long)n * 1)" in text       # one input vector per sample
    k.write_text(text.replace("s2_fc_mvu_b, (long)n * 1)", "s2_fc_mvu_b, (long)n * 2)"))
    r = csim_project(tmp_path, samples=1)
    row = r["stages"][2]
    assert not r["passed"] and not row["passed"] and row["deadlock"]
    assert row["error"].startswith("BAPIPE_DEADLOCK: every process is blocked:")
    assert "kernel stage2/mvu(s2_pool2_out, out0," in row["error"] and "stream s2_pool2_out empty (0/" in row["error"]
    assert r["deadlocks"] == [f"stage2: {row['error']}"]


ONE_SKIP_YAML = """
name: one-skip
input: [2, 6, 6]
layers:
  - {name: c1, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: bn1, type: batchnorm}
  - {name: r1, type: relu}
  - {name: c2, type: conv2d, out_channels: 4, kernel: 3, padding: 1, bias: false}
  - {name: add1, type: add, inputs: [bn1, c2]}
  - {name: gap, type: globalavgpool}
  - {name: fc, type: dense, units: 5}
"""


def _stream_depths(cpp: str) -> dict[str, int]:
    return {name: int(d) for d, name in re.findall(r"hls::stream<bapipe::vec<\d+>, (\d+)> (\w+)\(", cpp)}


@pytest.mark.slow
def test_skip_fifo_depth_is_needed_and_an_under_deep_one_deadlocks(tmp_path):
    """The residual block's skip FIFO (the Design's depth) carries the branch difference: csim
    records its peak occupancy above the default depth of 2, and the same kernel with that
    stream at depth 2 is reported as a deadlock naming the kernel, the stream and 2/2."""
    from bapipe.codegen.check.csim import csim_project

    CACHE.mkdir(parents=True, exist_ok=True)   # a stable model path keeps the plan (and the cache key) stable
    mf = CACHE / "one-skip.yaml"
    mf.write_text(ONE_SKIP_YAML)
    plan, model, cluster = make_plan(str(mf), cuts=(), mode="inference", folding={"c1": (4, 6), "c2": (4, 12)})
    generate_plan(plan, model, cluster, tmp_path / "ok")
    cpp = (tmp_path / "ok/stage0/stage0.cpp").read_text()
    assert "BAPIPE_DATAFLOW_BEGIN" in cpp
    depths = _stream_depths(cpp)
    skip = max(depths, key=depths.get)
    assert depths[skip] > 2
    r = csim_project(tmp_path / "ok", samples=2)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r
    peak = r["stages"][0]["streams"][skip]["peak"]
    assert 2 < peak <= depths[skip], (skip, peak, depths[skip])

    generate_plan(plan, model, cluster, tmp_path / "shallow")
    k = tmp_path / "shallow/stage0/stage0.cpp"
    k.write_text(k.read_text().replace(f", {depths[skip]}> {skip}(", f", 2> {skip}("))
    r = csim_project(tmp_path / "shallow", samples=2)
    row = r["stages"][0]
    assert not r["passed"] and row["deadlock"], row
    assert f"stream {skip} full (2/2)" in row["error"] and "kernel stage0/fork_ew(" in row["error"], row["error"]


ENGINE_MIX_YAML = """
name: engine-mix
input: [4, 7, 7]
layers:
  - {name: c1, type: conv2d, out_channels: 8, kernel: 3, padding: 1}
  - {name: mp1, type: maxpool, kernel: 3, stride: 2, padding: 1}
  - {name: c2, type: conv2d, out_channels: 6, kernel: 3, stride: 2, padding: 1}
  - {name: r2, type: relu}
  - {name: ap, type: avgpool, kernel: 2, stride: 1, padding: 1}
  - {name: fl, type: flatten}
  - {name: fc, type: dense, units: 5}
"""


@pytest.mark.soak
def test_streaming_engines_bit_exact_on_every_window_shape(tmp_path):
    """The Design-driven engines on shapes the zoo plans do not reach: window generators with
    3 taps a beat (SIMD 12 over C=4), stride 2 with padding, a padded max pool (padding never
    wins), a padded average pool (zeros count), gcd width converters (3 -> 1 -> 2 lanes), a
    flatten into a dense layer. 0 LSB against numpy; counted cycles within 10% of the
    Design's own figure for the stage (design.json; the hand-built plan has no cycles)."""
    from bapipe.codegen.check.csim import csim_project

    CACHE.mkdir(parents=True, exist_ok=True)   # a stable model path keeps the cache key stable
    mf = CACHE / "engine-mix.yaml"
    mf.write_text(ENGINE_MIX_YAML)
    plan, model, cluster = make_plan(str(mf), cuts=(), mode="inference",
                                     folding={"c1": (2, 12), "mp1": (4, 1), "c2": (3, 8), "ap": (2, 1), "fc": (5, 6)})
    generate_plan(plan, model, cluster, tmp_path)
    top = (tmp_path / "stage0/stage0.cpp").read_text()
    # rings of a few words a bank: LUTRAM (fpga_models.allocate.ring_banks)
    assert "bapipe::swg_lutram<4, 7, 7, 3, 1, 1, 4, 3, 3, false>" in top   # 3 taps of 4 channels a beat
    assert "bapipe::swg_lutram<8, 7, 7, 3, 1, 2, 4, 1, 4, true>" in top    # max pool: pads with the minimum
    assert "bapipe::width_conv<3, 1>" in top and "bapipe::width_conv<1, 2>" in top
    r = csim_project(tmp_path, samples=3)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r
    design = json.loads((tmp_path / "design.json").read_text())["stages"][0]["design_cycles_per_sample"]
    got = r["stages"][0]["cycles_per_sample"]
    assert abs(got / design - 1) <= 0.10, (got, design)


def _within_plan(r: dict, rel: float) -> None:
    for s in r["stages"]:
        got, want = s["cycles_per_sample"], s["plan_cycles_per_sample"]
        # rel: the caller's model-agreement bound (issue 16: counted vs planned cycles within 10%)
        assert got is not None and abs(got / want - 1) <= rel, (s["name"], got, want, s.get("processes"))


@pytest.mark.soak
def test_counted_cycles_meet_the_plan_tiny_cnn(tmp_path):
    """tiny-cnn on 4xU250-ring as planned: the kernel's loop-counted cycles per sample in csim
    within 10% of plan.yaml's fwd_interval (the issue's target; 16 samples a call: the window
    generators' start-up and the pipeline depths are paid once a call), 0 LSB."""
    from bapipe.cli import main
    from bapipe.codegen.check.csim import csim_project

    pf = tmp_path / "plan.yaml"
    assert main(["plan", "tiny-cnn", "4xU250-ring", "--mode", "inference", "-o", str(pf)]) == 0
    assert main(["gen", str(pf), "-o", str(tmp_path / "b"), "--allow-rule-violations"]) == 0
    r = csim_project(tmp_path / "b", samples=16)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r
    _within_plan(r, 0.10)
    st = r["stages"][0]
    assert st["cycles_source"].startswith("counted in C-simulation")
    # every engine is a dataflow process; the call takes the slowest (cycles_per_sample: the
    # steady state, the 16-sample call less the 1-sample call over 15)
    assert st["call_cycles_per_sample"] == max(st["processes"].values())
    assert st["cycles_per_sample"] <= st["call_cycles_per_sample"]
    assert any(k.startswith("stage0/swg(") for k in st["processes"])


@pytest.mark.soak
@pytest.mark.parametrize("model,samples", [("tiny-mlp", 32), ("examples/models/small-resnet.yaml", 8)])
def test_counted_cycles_meet_the_plan_soak(tmp_path, model, samples):
    """tiny-mlp (2 cycles a sample: 32 samples so the pipeline depth of a call is amortised)
    and small-resnet: counted cycles within 10% of the plan, 0 LSB."""
    from bapipe.cli import main
    from bapipe.codegen.check.csim import csim_project

    pf = tmp_path / "plan.yaml"
    assert main(["plan", model, "4xU250-ring", "--mode", "inference", "-o", str(pf)]) == 0
    assert main(["gen", str(pf), "-o", str(tmp_path / "b"), "--allow-rule-violations"]) == 0
    r = csim_project(tmp_path / "b", samples=samples)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r
    _within_plan(r, 0.10)


def test_big_stage_path_external_weights_one_sample_mb1(tmp_path, monkeypatch):
    """The path VGG-16/ResNet-50 take, on tiny-cnn: forward engines with their weight matrices as
    m_axi arguments (banked, read by the testbench from the stage's one weight image, weights.bin),
    the backward kernel's unfolded from the same image, the int64 MAC, one sample, backward
    rebuilt with -DMB=1; still 0 LSB."""
    import bapipe.codegen.design.context as cx
    import bapipe.codegen.check.csim as cs
    import bapipe.codegen.check.cxx_run as cr

    monkeypatch.setattr(cx, "EMBED_LIMIT", 0)
    monkeypatch.setattr(cs, "BIG_STAGE_MACS", 0)
    monkeypatch.setattr(cr, "AP_MAC_LIMIT", 0)
    plan, model, cluster = make_plan(cuts=(4,), folding={"conv2": (4, 8), "fc": (2, 16)})
    generate_plan(plan, model, cluster, tmp_path)
    assert "static const data_t" not in (tmp_path / "stage0/stage0_weights.h").read_text()
    top = (tmp_path / "stage1/stage1.cpp").read_text()
    # 640 weights as 20 words of 512 bits, copied on chip once a call (codegen.design.weight_memory.load_weights_once)
    assert ("mode=m_axi port=s1_fc_mvu_w offset=slave bundle=s1_fc_mvu_w depth=20 max_read_burst_length=64 "
            "max_widen_bitwidth=512") in top
    assert "mode=s_axilite port=return" in top
    assert re.search(r"^sp=stage1_1\.s1_fc_mvu_w:DDR\[[0-3]\]$", (tmp_path / "link/fpga1.cfg").read_text(), re.M)
    assert "add_files -tb weights.bin" in (tmp_path / "stage1/run_hls.tcl").read_text()
    assert "add_files -tb weights.bin" in (tmp_path / "stage1/run_hls_bwd.tcl").read_text()
    # the image: the banked matrices and (a training build: writable for the update kernel,
    # codegen.design.train_kernels) the biases, 16-bit raw (conv3 8*3*3*16 = 1152 + 16, fc 64*10 = 640 + 10);
    # no second copy in another layout
    assert (tmp_path / "stage1/weights.bin").stat().st_size == 2 * (1152 + 16 + 640 + 10)
    assert sorted(p.name for p in (tmp_path / "stage1").glob("*.bin")) == ["csim_in.bin", "weights.bin"]
    r = cs.csim_project(tmp_path, samples=4)
    assert r["passed"] and r["samples"] == 1 and r["model_max_abs_err_lsb"] == 0, r
    assert [s["name"] for s in r["stages"]] == ["stage0", "stage0_bwd", "stage1", "stage1_bwd"]
    for s in r["stages"]:
        assert s["max_abs_err_lsb"] == 0 and s["samples"] == 1 and s["mac"] == "int64"
    assert "-DMB=1" in r["stages"][1]["note"]


def test_over_budget_kernels_are_reported_skipped(tmp_path, monkeypatch):
    """A kernel beyond the run budget is listed as skipped and the project does not pass."""
    import bapipe.codegen.check.csim as cs

    plan, model, cluster = make_plan(mode="inference")
    generate_plan(plan, model, cluster, tmp_path)
    monkeypatch.setattr(cs, "RUN_LIMIT_MACS", 1000)
    r = cs.csim_project(tmp_path, samples=1)
    assert not r["passed"] and r["skipped"] == ["stage0"]
    assert r["stages"][0]["passed"] is None and "csim budget" in r["stages"][0]["skipped"]


@pytest.mark.soak
@pytest.mark.parametrize("model,extra", [("resnet50", ["--whole-blocks"]), ("vgg16", [])])
def test_counted_cycles_meet_the_plan_big_forward(tmp_path, monkeypatch, model, extra):
    """ResNet-50 (--whole-blocks) and VGG-16 on 4xU250-ring as planned (time-multiplexed
    stages, weights as m_axi arrays): every forward stage's counted cycles per sample within
    10% of plan.yaml's fwd_interval, 0 LSB, one sample. Forward kernels only (the backward
    ones have tests/test_csim_bwd.py). The placement check is switched off: it refuses these
    plans today, pricing a DSP array per layer of a time-multiplexed stage (docs/codegen.md)."""
    import bapipe.codegen.check.csim as cs
    import bapipe.codegen.check.csim_bwd as cb
    import bapipe.codegen.design.placement as pl
    from bapipe.cli import main

    def skip_backward(build, st, *a, **k):
        return {"name": st["backward"]["kernel"], "passed": True, "max_abs_err_lsb": 0, "compile_s": 0.0,
                "run_s": 0.0, "cached": False, "skipped": None}

    monkeypatch.setattr(pl, "check_stage_fits", lambda *a, **k: None)
    monkeypatch.setattr(cb, "csim_backward", skip_backward)
    monkeypatch.setattr(cb, "compile_backward", lambda *a, **k: None)   # nor compiled
    pf = tmp_path / "plan.yaml"
    assert main(["plan", model, "4xU250-ring", *extra, "-o", str(pf)]) == 0
    assert main(["gen", str(pf), "-o", str(tmp_path / "b"), "--allow-rule-violations"]) == 0
    r = cs.csim_project(tmp_path / "b", samples=1)
    fwd = [x for x in r["stages"] if not x["name"].endswith("_bwd")]
    assert all(x["passed"] and x["max_abs_err_lsb"] == 0 for x in fwd), fwd
    assert r["model_max_abs_err_lsb"] == 0
    _within_plan({"stages": fwd}, 0.10)
