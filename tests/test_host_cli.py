"""`bapipe run`: the --json contract, one-line errors, the optional Ray mode."""
from __future__ import annotations

import importlib.util
import sys
import json

import pytest

from bapipe.cli import main
from handplan import hand_plan
from tolerances import grad_tolerance

KEYS = {"backend", "epochs", "final_loss", "test_accuracy", "samples_per_s", "grad_max_rel_err_vs_single_device"}


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("run") / "mlp.yaml"
    hand_plan("tiny-mlp", cuts=(1, 3, 5), schedule="1f1b").save(p)
    return p


@pytest.mark.slow  # trains through worker processes: ~3 s
def test_run_json_contract(plan_file, capsys, tmp_path):
    log = tmp_path / "log.json"
    rc = main(["run", str(plan_file), "--backend", "numpy", "--epochs", "1", "--json", "--log", str(log)])
    out = capsys.readouterr()
    assert rc == 0
    r = json.loads(out.out)
    assert KEYS <= set(r) and r["backend"] == "numpy" and r["epochs"] == 1
    # float32 vs float64 reference, norm-wise: bound from tests/tolerances.py (global batch <= 64)
    assert r["grad_max_rel_err_vs_single_device"] < grad_tolerance("tiny-mlp", 64) and 0.5 < r["test_accuracy"] <= 1
    assert r["samples_per_s"] > 0 and r["final_loss"] < 2.3
    assert len(json.loads(log.read_text())) == r["iterations"]


@pytest.mark.slow  # trains through worker processes: ~3 s
def test_run_human_table(plan_file, capsys):
    assert main(["run", str(plan_file), "--epochs", "1", "--precision", "fixed"]) == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and "fixed" in out


def test_xrt_without_pyxrt_is_one_line_exit_2(plan_file, capsys):
    if importlib.util.find_spec("pyxrt") is not None:
        pytest.skip("pyxrt is installed here")
    assert main(["run", str(plan_file), "--backend", "xrt"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pyxrt" in err


@pytest.mark.slow  # trains through worker processes: ~3 s
def test_bad_plan_and_checkpoint_are_one_line_exit_2(plan_file, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny-mlp\nstages: 3\n")
    assert main(["run", str(bad)]) == 2
    assert "bad.yaml" in capsys.readouterr().err
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a checkpoint")
    assert main(["run", str(plan_file), "--resume", str(junk)]) == 2
    err = capsys.readouterr().err.strip()
    assert "junk.npz" in err and "\n" not in err


@pytest.mark.slow  # a training run whose worker dies: ~3 s
def test_failed_worker_exits_1_with_one_line(plan_file, capsys, monkeypatch):
    import bapipe.host.driver as drv

    real = drv.train
    monkeypatch.setattr("bapipe.host.cli_run.train", lambda *a, **k: real(*a, faults={1: {"iteration": 0, "op": 0,
                                                                                   "mode": "die"}}, **k))
    assert main(["run", str(plan_file), "--epochs", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "stage 1" in err and "micro-batch 0" in err and "died" in err


@pytest.mark.slow  # ~1 s of CPU: make test, not make test-fast (docs/testing.md)
def test_ray_missing_is_one_line_exit_2(plan_file, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail as if it were not installed
    assert main(["run", str(plan_file), "--ray", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install 'bapipe[ray]'" in err
