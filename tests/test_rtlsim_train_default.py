"""`bapipe rtlsim` on a training build: how many iterations it simulates by default."""
import json

import pytest

from bapipe.codegen.cli_rtlsim import (DEFAULT_ITERATIONS, TRAIN_BUDGET_CYCLES, default_iterations,
                                per_trained_sample)


def _build(tmp_path, plan_it, sequential=0):
    from bapipe.codegen.check.rtlsim_train import TRAIN_MANIFEST_KEYS
    d = tmp_path / "rtl" / "train"
    d.mkdir(parents=True)
    man = {k: None for k in TRAIN_MANIFEST_KEYS}
    man.update(plan_iteration_cycles=plan_it, sequential_cycles=sequential)
    (d / "manifest.json").write_text(json.dumps(man))
    return tmp_path


@pytest.mark.parametrize("text,field", [("", "(document)"), ("{}", "boards"), ('{"boards": []}', "dense")])
def test_a_corrupt_training_manifest_is_one_line_exit_2(tmp_path, capsys, text, field):
    """An empty or partial rtl/train/manifest.json: one line naming the file and the field,
    exit 2 (it was a JSONDecodeError / KeyError traceback, exit 1)."""
    from bapipe.cli import main
    d = tmp_path / "rtl" / "train"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(text)
    try:
        code = main(["rtlsim", str(tmp_path), "--iterations", "3"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "manifest.json" in err[0] and field in err[0] and "Traceback" not in err[0]


def test_small_training_builds_train_by_default(tmp_path):
    """The demo's tiny-mlp plan (8,875 cycles an iteration) trains 2 iterations."""
    assert default_iterations(_build(tmp_path, 8875.0, 20_000)) == (DEFAULT_ITERATIONS, None)


def test_vgg16_training_build_runs_the_forward_pipeline_and_says_why(tmp_path):
    """VGG-16 on 4xU250-ring (the contract's build): 224,521,066.7 cycles an iteration would
    be 449 M simulated cycles, hours in Verilator: the default is the forward check, stated."""
    n, why = default_iterations(_build(tmp_path, 224_521_066.7058, 500_924_906))
    assert n == 0
    assert "1,001,849,812 cycles" in why and f"{TRAIN_BUDGET_CYCLES:,}" in why and "--iterations K" in why


def test_budget_edge_counts_the_sequential_cycles_too(tmp_path):
    """The sequential replay bounds the run as well as the plan's iteration (whichever is more)."""
    assert default_iterations(_build(tmp_path, 10.0, TRAIN_BUDGET_CYCLES // 2))[0] == DEFAULT_ITERATIONS
    assert default_iterations(_build(tmp_path / "b", 10.0, TRAIN_BUDGET_CYCLES // 2 + 1))[0] == 0


def test_training_result_carries_the_forward_keys_per_trained_sample():
    """Iteration cycles over the samples an iteration trains: 2 iterations of 8 micro-batches
    of 2 samples at 8,760 and 8,780 cycles vs 8,875 planned."""
    r = per_trained_sample({"microbatches": 8, "microbatch_size": 2, "iterations": 2,
                            "iteration_cycles": [8760, 8780], "plan_iteration_cycles": 8875.0,
                            "sim_cycles": 17540, "wall_s": 2.0})
    assert r["samples"] == 32
    assert r["cycles_per_sample"] == (8760 + 8780) / 32
    assert r["predicted_cycles_per_sample"] == 8875.0 / 16
    assert r["error"] == pytest.approx((8770 / 16) / (8875 / 16) - 1, rel=1e-12)   # float division only
    assert r["sim_cycles_per_s"] == 8770.0
