"""`bapipe run --backend torch`: plans trained with torch.distributed.pipelining, one CPU
process per board, against one PyTorch process; the torch layers against the numpy
backend's; `bapipe profile --measure torch` feeding `bapipe plan`. Needs the [torch] extra.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend needs the [torch] extra")

#: every test imports torch (~13 s cold) and most start pipeline processes: make test, not make test-fast
pytestmark = pytest.mark.slow

from bapipe.models import load_model
from handplan import hand_plan  # noqa: E402
from bapipe.host import layers_np as L  # noqa: E402
from bapipe.host.torch_model import whole_model  # noqa: E402
from bapipe.host.torch_train import TOLERANCE, train_torch  # noqa: E402
import cli_fork  # noqa: E402

# conv, batch norm, relu, a residual add whose skip crosses the cut after position 2, pooling,
# flatten, dense: the layer kinds the tiny models use plus bn and add
RESIDUAL = """
name: tiny-res
input: [1, 8, 8]
layers:
  - {name: conv1, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: bn1, type: batchnorm}
  - {name: relu1, type: relu}
  - {name: conv2, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: add1, type: add, inputs: [conv2, relu1]}
  - {name: pool1, type: maxpool, kernel: 2}
  - {name: flatten, type: flatten}
  - {name: fc, type: dense, units: 10}
"""


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    p = tmp_path_factory.mktemp("m") / "tiny-res.yaml"
    p.write_text(RESIDUAL)
    return str(p)


def _check(r, processes):
    assert r["processes"] == processes and r["iterations"] == 3
    # TOLERANCE (host/torch_train.py) is float32 summation order carried over a few steps
    assert r["loss_max_rel_err"] <= TOLERANCE and r["weight_max_rel_err"] <= TOLERANCE, r
    assert r["matches_single_process"] and np.isfinite(r["final_loss"])
    assert r["history"][-1] < r["history"][0] + 0.5   # training, not diverging
    assert r["measured_iteration_s"] > 0


@pytest.mark.slow  # ~20 s on a cold start (torch, sklearn, first forks), then ~1-2 s per plan
@pytest.mark.parametrize("schedule,cuts,reps,chunks,procs", [
    ("gpipe", (4,), None, 1, 2),
    ("1f1b", (2, 5, 7), None, 1, 4),
    ("1f1b", (4,), (2, 2), 1, 4),             # two replicas of each position: data-parallel groups
    ("interleaved", (2, 4, 6), None, 2, 2),   # 4 stages on 2 processes, 2 chunks each
])
def test_tiny_cnn_pipeline_equals_one_process(schedule, cuts, reps, chunks, procs):
    plan = hand_plan("tiny-cnn", cuts=cuts, schedule=schedule, microbatches=4, microbatch_size=8, chunks=chunks,
                     replicas=reps)
    _check(train_torch(plan, epochs=1, max_iterations=3), procs)


def test_residual_bn_cut_inside_the_block(residual):
    # the cut after relu1 carries two tensors (relu1 for the skip, and the main path)
    model = load_model(residual)
    assert [t.producer for t in model.cut_tensors(2)] == ["relu1"]
    assert [t.producer for t in model.cut_tensors(3)] == ["relu1", "conv2"]
    plan = hand_plan(residual, cuts=(3,), schedule="1f1b", microbatches=4, microbatch_size=8)
    _check(train_torch(plan, epochs=1, max_iterations=3), 2)


def test_onnx_import_runs(tmp_path):
    onnx = tmp_path / "cnn.onnx"
    r = cli_fork.bapipe("export", "tiny-cnn", "-o", str(onnx))
    assert r.returncode == 0, r.stderr
    plan = hand_plan(str(onnx), cuts=(4,), schedule="gpipe", microbatches=2, microbatch_size=16)
    _check(train_torch(plan, epochs=1, max_iterations=3), 2)


@pytest.mark.parametrize("model", ["tiny-cnn", "tiny-mlp"])
def test_torch_layers_equal_numpy_layers(model, residual):
    # an implementation we did not write twice: the numpy backend's forward, layer by layer, same weights
    m = load_model(model)
    mod = whole_model(m, seed=3)
    x = np.random.default_rng(0).random((5,) + m.inputs[0].shape, dtype=np.float32)
    env = {m.inputs[0].name: x}
    for pos, layer in enumerate(m.layers):
        params = L.init_params(layer, np.random.default_rng([3, pos]))
        env[layer.name], _ = L.forward(layer, params, [env[i] for i in layer.inputs], True, L.init_state(layer))
    with torch.no_grad():
        got = mod(torch.from_numpy(x)).numpy()
    # float32 layers, different summation orders (im2col vs direct conv): ~1e-6 relative per
    # layer over <= 10 layers of O(1) values
    np.testing.assert_allclose(got, env[m.layers[-1].name], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # ~20-30 s on the loaded machine: plan, then 5 iterations, the reference and the test set
def test_cli_run_torch_json(tmp_path):
    plan = tmp_path / "p.yaml"
    r = cli_fork.bapipe("plan", "tiny-mlp", "4xU250-ring", "--no-replication", "--schedule", "gpipe",
                        "--microbatches", "4", "--global-batch", "32", "--partition", "0-3,4-6", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = cli_fork.bapipe("run", str(plan), "--backend", "torch", "--epochs", "1", "--global-batch", "256", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend"] == "torch" and out["processes"] == 2 and out["schedule"] == "gpipe"
    assert out["iterations"] == 1437 // 256 and out["matches_single_process"] and out["global_batch"] == 256
    assert out["predicted_iteration_s"] > 0 and out["measured_iteration_s"] > 0
    assert out["final_loss"] < out["history"][0]   # five steps of SGD lower the loss


def test_cli_refusals(tmp_path):
    plan = tmp_path / "p.yaml"
    r = cli_fork.bapipe("plan", "tiny-mlp", "4xU250-ring", "--schedule", "eager-1f1b", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = cli_fork.bapipe("run", str(plan), "--backend", "torch")
    assert r.returncode == 2 and "schedule" in r.stderr and r.stderr.count("\n") == 1
    r = cli_fork.bapipe("run", str(plan), "--backend", "torch", "--ray")
    assert r.returncode == 2 and "--ray" in r.stderr and r.stderr.count("\n") == 1


def test_cli_without_torch_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; from bapipe.cli import main; "
            f"sys.exit(main(['run', {str(tmp_path / 'none.yaml')!r}, '--backend', 'torch']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # a missing plan is named first only if it is checked first; either way one line, exit 2
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.slow  # ~10 s: every layer timed, gloo measured
def test_profile_measure_torch_feeds_the_planner(tmp_path):
    prof, cl, plan = tmp_path / "prof.yaml", tmp_path / "cpu2.yaml", tmp_path / "plan.yaml"
    r = cli_fork.bapipe("profile", "tiny-cnn", str(cl), "--measure", "torch", "--processes", "2", "--batch", "8",
                        "--reps", "3", "-o", str(prof), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["name"] for x in out["layers"]] == [l.name for l in load_model("tiny-cnn").layers]
    assert all(x["fwd_s"] > 0 for x in out["layers"]) and out["transport"]["pair_Bps"] > 0
    r = cli_fork.bapipe("plan", "tiny-cnn", str(cl), "--profile", str(prof), "--format", "fp32", "--global-batch",
                        "32", "--partition", "0-4,5-9", "--schedule", "gpipe", "--microbatches", "4", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = cli_fork.bapipe("run", str(plan), "--backend", "torch", "--epochs", "1", "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["matches_single_process"] and run["processes"] == 2 and run["predicted_iteration_s"] > 0


def test_driver_train_routes_to_the_torch_backend():
    from bapipe.errors import SpecError
    from bapipe.host.driver import train

    plan = hand_plan("tiny-mlp", cuts=(3,), schedule="1f1b", microbatches=2, microbatch_size=16)
    r = train(plan, backend="torch", epochs=1, max_iterations=2)
    assert r["backend"] == "torch" and r["processes"] == 2 and r["matches_single_process"]
    with pytest.raises(SpecError, match="--ray"):
        train(plan, backend="torch", ray=True)
