"""The plan's promise, checked against Verilator: every stage's forward cycles per sample as
measured (the stage's engines alone, codegen/check/agreement.py) within 2% of what the planner
put in plan.yaml, on plans `bapipe plan` writes.

2% is the product's promise (docs/architecture.md); the engines' fills and per-image
turnarounds are the only cycles the plan may miss.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from bapipe.plan import load_plan
from bapipe.codegen.check.agreement import load_design, measure_stages, plan_error
from bapipe.codegen.cli_gen import generate

pytestmark = [pytest.mark.verilator, pytest.mark.xdist_group("agreement")]

#: every stage within this of the plan
PLAN_TOLERANCE = 0.02


def _plan(tmp_path, name: str, *args: str) -> str:
    out = tmp_path / f"{name}.plan.yaml"
    subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", *args, "-o", str(out)], check=True,
                   capture_output=True)
    return str(out)


def _agree(plan_file: str, build) -> list[dict]:
    generate(plan_file, build)
    rows = measure_stages(build, load_design(build))
    for r in rows:   # the Design (the lowering's cycle model) says the same as Verilator
        assert r["measured_cycles_per_sample"] == pytest.approx(r["design_cycles_per_sample"], rel=PLAN_TOLERANCE), r
    return rows


def test_demo_plan_every_stage_meets_the_plan(tmp_path):
    """The demo's tiny-cnn pipeline (one board per stage; pools and ReLUs at their planned lanes)."""
    #: the tiny CNN's 4-stage split (conv1+relu1, conv2+relu2, pool1..flatten, fc): one board a stage
    MODEL_SPLIT = ("--partition", "0-1,2-3,4-8,9")
    rows = _agree(_plan(tmp_path, "cnn", "tiny-cnn", "4xU250-ring", *MODEL_SPLIT), tmp_path / "cnn")
    assert len(rows) >= 2 and plan_error(rows) <= PLAN_TOLERANCE, rows


@pytest.mark.soak  # four more benches (~40 s): make test-all
def test_tiny_mlp_pipeline_every_stage_meets_the_plan(tmp_path):
    rows = _agree(_plan(tmp_path, "mlp", "tiny-mlp", "4xU250-ring", "--partition", "0-1,2-3,4-5,6"),
                  tmp_path / "mlp")
    assert len(rows) == 4 and plan_error(rows) <= PLAN_TOLERANCE, rows


def test_time_multiplexed_stage_meets_the_plan(tmp_path):
    """tiny-cnn cut in four, its third stage (pool1, conv3, relu3, pool2, flatten) run as one
    shared engine per layer in turns, priced by the planner's time-multiplexed model
    (fpga_models.allocate.time_multiplexed: turns with their fills and the switch)."""
    from bapipe.fpga_models.allocate import time_multiplexed
    from bapipe.fpga_models.boards import get_board
    from bapipe.fpga_models.plancheck import resolve
    from bapipe.plan import Folding
    from bapipe.fpga_models.cost import matrix_shape

    # an inference plan: rtlsim runs the forward pipeline, whose MVUs are the inference engines
    # (adder-tree fill, engines.mvu_fill); a training plan prices the training engines' forward
    path = _plan(tmp_path, "cnn4", "tiny-cnn", "4xU250-ring", "--partition", "0-1,2-3,4-8,9", "--mode", "inference")
    plan = load_plan(path)
    model, _cluster = resolve(plan, path)
    s = plan.stages[2]
    board = get_board(s.board_type)
    layers = [model.layers[model.index[n]] for n in s.layers]
    beta = plan.microbatch_size // s.replicas
    a = time_multiplexed(layers, board, plan.number_format, beta, plan.utilisation_cap, plan.mode == "train")
    fold = {l.name: Folding(*a.folding[l.name]) if matrix_shape(l) is not None else Folding(lanes=a.folding[l.name][1])
            for l in layers}
    fwd_s, bwd_s = a.fwd_cycles / board.clock_hz, a.bwd_cycles / board.clock_hz
    tm = replace(s, style="time-multiplexed", folding=fold, fwd_s=fwd_s, bwd_s=bwd_s, time_s=fwd_s + bwd_s,
                 cycles={"fwd": a.fwd_cycles, "bwd": a.bwd_cycles, "fwd_interval": a.fwd_cycles / beta},
                 resources={**s.resources, "dsp": a.dsp, "lut": a.lut})
    plan = replace(plan, stages=[*plan.stages[:2], tm, plan.stages[3]])
    plan.save(path)
    rows = _agree(path, tmp_path / "tm")
    assert rows[2]["style"] == "time-multiplexed"
    assert plan_error(rows) <= PLAN_TOLERANCE, rows



def test_one_stage_bench_taken_from_the_pipeline_run(tmp_path):
    """No simulation: a pipeline result with known output cycles is handed to measure_stages;
    the one-stage bench (same RTL) takes its figure from it, a two-stage plan's benches are not
    the pipeline, and a different --stage-samples count is not reused."""
    import json

    from bapipe.codegen.check.agreement import same_rtl
    from bapipe.codegen.check.rtlsim import read_manifest

    build = tmp_path / "one"
    generate(_plan(tmp_path, "one", "tiny-mlp", "4xU250-ring", "--partition", "0-6", "--mode", "inference"), build)
    man = read_manifest(build / "rtl" / "manifest.json")
    per = man["out_elems"] // man["out_lanes"]
    last = [100, 107, 115, 121]   # last beats of 4 samples: (121 - 100) / 3 = 7 cycles a sample
    cycles = [c - per + 1 + j for c in last for j in range(per)]
    [row] = measure_stages(build, load_design(build), pipeline=(man, {"out_cycles": cycles}, 4))
    assert row["measured_by"] == "pipeline" and row["samples"] == 4 and row["measured_cycles_per_sample"] == 7.0
    assert row["error"] == 7.0 / row["plan_cycles_per_sample"] - 1

    two = tmp_path / "two"
    generate(_plan(tmp_path, "two", "tiny-mlp", "4xU250-ring", "--partition", "0-3,4-6", "--mode", "inference"), two)
    man2 = read_manifest(two / "rtl" / "manifest.json")
    for i in range(2):
        assert not same_rtl(json.loads((two / "rtl" / "stages" / f"s{i}" / "manifest.json").read_text()), man2)
    assert same_rtl(json.loads((build / "rtl" / "stages" / "s0" / "manifest.json").read_text()), man)


@pytest.mark.soak  # one Verilator build of tiny-mlp (30-160 s with load): make test-all
def test_one_stage_plan_reuses_the_pipeline_run(tmp_path):
    """A one-stage plan's bench is the pipeline's RTL file for file (same sources, widths,
    always-valid source and always-ready sink): `bapipe rtlsim` takes the stage's figure from
    the pipeline run (measured_by "pipeline", no second Verilator build and run); a stage of a
    longer pipeline is not the pipeline and runs its own bench."""
    import json

    from bapipe.codegen.check.agreement import same_rtl
    from bapipe.codegen.check.rtlsim import read_manifest

    build = tmp_path / "one"
    generate(_plan(tmp_path, "one", "tiny-mlp", "4xU250-ring", "--partition", "0-6", "--mode", "inference"), build)
    bench = json.loads((build / "rtl" / "stages" / "s0" / "manifest.json").read_text())
    assert same_rtl(bench, read_manifest(build / "rtl" / "manifest.json"))
    r = subprocess.run([sys.executable, "-m", "bapipe.cli", "rtlsim", str(build), "--samples", "4", "--json"],
                       check=True, capture_output=True, text=True)
    got = json.loads(r.stdout)
    [row] = got["stages"]
    assert got["outputs_match"] and row["measured_by"] == "pipeline" and row["samples"] == 4
    assert row["measured_cycles_per_sample"] == got["cycles_per_sample"]
    assert row["measured_cycles_per_sample"] == pytest.approx(row["plan_cycles_per_sample"], rel=PLAN_TOLERANCE)

    two = tmp_path / "two"
    generate(_plan(tmp_path, "two", "tiny-mlp", "4xU250-ring", "--partition", "0-3,4-6", "--mode", "inference"), two)
    man = read_manifest(two / "rtl" / "manifest.json")
    for i in range(2):
        assert not same_rtl(json.loads((two / "rtl" / "stages" / f"s{i}" / "manifest.json").read_text()), man)


@pytest.mark.soak  # the training RTL and one stage bench of tiny-mlp in Verilator (~1-2 min with load): make test-all
def test_training_build_reports_its_stages_against_the_plan(tmp_path):
    """A mode: train build (the planner's tiny-mlp default, one board): `bapipe rtlsim --json`
    runs the training iterations and, as for inference, every forward stage alone against the
    plan ("stages", "plan_error"); measured 4.0 = plan 4.0 cycles a sample on 2026-11-24."""
    import json

    build = tmp_path / "mlp"
    generate(_plan(tmp_path, "mlp-train", "tiny-mlp", "4xU250-ring"), build)
    r = subprocess.run([sys.executable, "-m", "bapipe.cli", "rtlsim", str(build), "--json"],
                       check=True, capture_output=True, text=True)
    got = json.loads(r.stdout)
    assert got["training"] and got["weights_match"] and got["outputs_match"]
    assert got["stages"] and plan_error(got["stages"]) == got["plan_error"] <= PLAN_TOLERANCE, got["stages"]


def test_default_run_leaves_the_benches_out_over_the_lane_budget():
    """The benches compile every engine a second time: a default rtlsim runs them only while the
    MVUs' lanes (PE x SIMD, the weight memories' lanes) are within BENCH_LANES, and says why not."""
    from bapipe.codegen.cli_rtlsim import BENCH_LANES, default_stages, mvu_lanes

    def man(*lanes):
        mems = {f"s0_l{i}_mvu_w.hex": {"lanes": n, "pe": 1, "simd": n} for i, n in enumerate(lanes)}
        mems.update({f"s0_l{i}_mvu_b.hex": {"lanes": 99_999} for i in range(len(lanes))})   # biases: not lanes
        return {"memories": mems}

    assert mvu_lanes(man(3072, 1728)) == 4800
    assert default_stages(man(BENCH_LANES // 2, BENCH_LANES // 2)) == (True, None)
    run, why = default_stages(man(BENCH_LANES, 1))
    assert run is False and f"{BENCH_LANES + 1:,} MVU lanes" in why and "--stages" in why
