"""Cycles counted in C-simulation against the plan, forward and backward (issue 16, item 4).

`bapipe csim --json` reports per stage ``cycles_per_sample`` (steady state: the n-sample call
minus the one-sample call, over n - 1; a backward micro-batch as one call against one-sample
calls) beside ``plan_cycles_per_sample``. The fast tests pin the arithmetic on hand-made
counts; the soak test builds the demo's tiny-cnn split and small-resnet for training and
holds every forward and backward stage to the plan within 10% (docs/hls.md, "Cycles").
"""
from __future__ import annotations

import pytest

from bapipe.codegen.check.csim import alone_cycles, port_adapter, steady_cycles
from bapipe.codegen.check.csim_bwd import steady_per_sample

#: the issue's bound on counted vs planned cycles per sample (item 4)
CYCLE_TOL = 0.10


def test_steady_state_leaves_the_call_fill_out():
    """n samples cost n x S + F, one sample S + F: (C(n) - C(1)) / (n - 1) = S."""
    s, f = 64, 3          # tiny-cnn conv1: 64 cycles a sample, the window generator's start-up
    assert steady_cycles(4 * s + f, s + f, 4) == s
    assert steady_cycles(4 * s + f, None, 4) == (4 * s + f) / 4    # no second run: the call's own
    assert steady_cycles(s + f, s + f, 1) == s + f                  # one sample (big plans): all of it
    assert steady_cycles(None, s + f, 4) is None


def test_backward_fill_from_one_sample_calls():
    """A micro-batch of mb as one call costs mb x S + F, as mb calls of one sample mb x (S + F)."""
    s, f, mb = 2, 4, 4    # tiny-cnn fc alone: 2 cycles a sample (bwd_in + bwd_w), MVU depth 4
    steady, fill = steady_per_sample(mb * s + f, mb * (s + f), mb)
    assert (steady, fill) == (s, f)
    assert steady_per_sample(mb * s + f, None, mb) == ((mb * s + f) / mb, None)
    assert steady_per_sample(7, 7, 1) == (7.0, None)
    # as 2 calls of mb / 2 (whole chunks of a tiled engine): 2 x (mb / 2 x S + F)
    assert steady_per_sample(mb * s + f, 2 * (mb // 2 * s + f), mb, mb // 2) == (s, f)


def test_tiled_engine_steady_state_from_half_micro_batches():
    """tiny-mlp fc2 (64 x 64 on 16 x 64, dx, chunks of P = 16): a call of n vectors costs
    16 x max(NF, SF) + ceil(n / 16) x 128 + 16 + 4 cycles; one-sample calls would pad a chunk each
    (the linear model then reads 4.13 a sample), half micro-batches of 16 are whole chunks: 8."""
    from bapipe.codegen.check.csim_bwd import second_call_samples

    call = lambda n: 16 * 4 + -(-n // 16) * 128 + 16 + 4   # noqa: E731
    mb = 32
    k = second_call_samples(mb)
    assert k == 16
    assert steady_per_sample(call(mb), mb // k * call(k), mb, k) == (8.0, 84.0)
    assert round(steady_per_sample(call(mb), mb * call(1), mb, 1)[0], 2) == 4.13


def test_port_adapter_is_left_out_as_the_design_bench_does():
    """A width converter fed by the kernel's input port is the link's, not the stage's (the
    Design's stage bench feeds the first engine at its own width): the stage is its slowest
    other process; without one the whole count stands."""
    k = "stage3"
    procs = {"stage3/width_conv(in0, s3_fc_wc0_out, (long)n * 64)": 18.0,
             "stage3/mvu(s3_fc_wc0_out, out0, w, b, (long)n * 1)": 8.0}
    assert port_adapter(next(iter(procs)), k) and not port_adapter("stage3/width_conv(s1, s2, n)", k)
    # a training forward taps its input for the backward's stash at the port's width, then widens
    assert port_adapter("stage3/stash_write(in0, in0_st, st_flatten, n)", k)
    assert port_adapter("stage3/width_conv(in0_st, s3_fc_wc0_out, (long)n * 64)", k)
    assert not port_adapter("stage3/stash_write(s2_relu, s3_x, st_relu, n)", k)   # a layer's own stash
    assert alone_cycles({"cycles": 18, "processes": procs}, k) == 8.0
    # a dataflow kernel copying its off-chip weights on chip first (6e659c2): the engines'
    # region is stage3_engines, after the copy's stage3_wload
    procs = {"stage3_wload/weight_fetch(s3_fc_mvu_w, s3_fc_mvu_wt, 0, 0L, 640L, 1L)": 22.0,
             "stage3_engines/width_conv(in0_st, s3_fc_wc0_out, (long)n * 64)": 18.0,
             "stage3_engines/stash_write(in0, in0_st, st_flatten, n)": 18.0,
             "stage3_engines/mvu_tile(s3_fc_wc0_out, out0, s3_fc_mvu_wt, 0, 0L, b, (long)n * 1)": 8.0}
    assert [port_adapter(p, k) for p in procs] == [False, True, True, False]
    assert alone_cycles({"cycles": 40, "processes": procs}, k) == 8.0
    assert alone_cycles({"cycles": 12, "processes": {"stage3/mvu(in0, out0, w, b, n)": 12.0}}, k) == 12.0
    assert alone_cycles({"cycles": None}, k) is None
    only = {"stage3/width_conv(in0, out0, (long)n * 64)": 4.0}    # nothing but the adapter: its count
    assert alone_cycles({"cycles": 4, "processes": only}, k) == 4.0


def _build(tmp_path, name: str, model: str, *extra: str):
    from bapipe.cli import main

    pf = tmp_path / f"{name}.plan.yaml"
    assert main(["plan", model, "4xU250-ring", "-o", str(pf), "--force", *extra]) in (0, None)
    out = tmp_path / name
    assert main(["gen", str(pf), "-o", str(out), "--force", "--allow-rule-violations"]) in (0, None)
    return out


@pytest.mark.soak     # 8 + 8 g++ builds (~2 min on the shared 2 cores, cached after)
@pytest.mark.csim
@pytest.mark.slow
@pytest.mark.parametrize("name,model,extra", [
    ("demo-split", "tiny-cnn", ("--partition", "0-1,2-3,4-8,9")),
    ("small-resnet", "examples/models/small-resnet.yaml", ()),
])
def test_every_stage_meets_the_plan(tmp_path, monkeypatch, name, model, extra):
    """Training builds: every forward and backward stage 0 LSB, counted cycles per sample
    within 10% of the plan's, the stage holding the model's first layer included (neither the
    kernel nor the plan computes the model input's gradient: fpga_models.gradients)."""
    from bapipe.plan import load_plan
    from bapipe.codegen.check.csim import csim_project

    monkeypatch.setenv("BAPIPE_CSIM_CACHE", str(tmp_path.parent / "csim-cycles-cache"))
    out = _build(tmp_path, name, model, *extra)
    plan = load_plan(out / "plan.yaml")
    r = csim_project(out, samples=4)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r
    rows = {x["name"]: x for x in r["stages"]}
    assert len(rows) == 2 * len(plan.stages)            # every stage, forward and backward
    for st in plan.stages:
        for kernel in (f"stage{st.index}", f"stage{st.index}_bwd"):
            row = rows[kernel]
            assert row["max_abs_err_lsb"] == 0, row
            got, want = row["cycles_per_sample"], row["plan_cycles_per_sample"]
            assert abs(got / want - 1) <= CYCLE_TOL, (kernel, got, want)
