"""Replays of the cases of issue 38 that broke the contract, each recreated from its text.

Each is refused in one line on stderr (exit 2: bad input; exit 1: a run that went wrong)
or handled. The name-injection cases are in tests/test_names_injection.py, the signal cases
in tests/test_signals.py, the tour's backends in tests/test_tour_backends.py and the
imports-equal-their-source cases in tests/test_onnx_torch.py (counts), tests/test_onnx_outputs.py
(forward output against torch) and tests/test_onnx_weights_flow.py (the weights in gen and run).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bapipe.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(capsys, args, *words, rc_want: int = 2) -> str:
    rc, _out, err = _cli(capsys, *args)
    lines = err.strip().splitlines()
    assert rc == rc_want, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("trust") / "plan.yaml"
    assert main(["plan", "tiny-mlp", "4xU250-ring", "--no-replication", "-o", str(p)]) == 0
    return p


# ---------------------------------------------------------------- long names and paths

@pytest.mark.parametrize("cmd", ["plan", "gen", "export", "run-log"])
def test_a_300_character_output_name_is_refused_up_front(tmp_path, capsys, mlp_plan, cmd):
    """-o with a 300-character name ended in an internal OSError (ENAMETOOLONG)."""
    long = str(tmp_path / ("x" * 300))
    args = {"plan": ["plan", "tiny-mlp", "4xU250-ring", "-o", long + ".yaml"],
            "gen": ["gen", mlp_plan, "-o", long],
            "export": ["export", "tiny-mlp", "-o", long + ".onnx"],
            "run-log": ["run", mlp_plan, "--epochs", "1", "--log", long + ".json"]}[cmd]
    line = _refused(capsys, args, "200 bytes")
    assert len(line) < 400   # the name itself is cut in the message


def test_a_5000_character_layer_name_plans_and_generates(tmp_path, capsys):
    """A 5,000-character layer name ended in ENAMETOOLONG in gen; identifiers are bounded now."""
    from bapipe.zoo import tiny_mlp

    doc = tiny_mlp()
    doc["layers"][0]["name"] = "L" * 5000
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc))
    assert main(["plan", str(tmp_path / "m.yaml"), "4xU250-ring", "--mode", "inference", "-o",
                 str(tmp_path / "p.yaml")]) == 0
    assert main(["gen", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert max(len(p.name) for p in (tmp_path / "b").rglob("*")) < 120


# ---------------------------------------------------------------- silent wrong answers

@pytest.mark.slow   # the numpy backend's board workers start and stop (~4 s CPU); the rule is tested below
def test_run_lr_1e10_stops_as_diverged(capsys, mlp_plan):
    """--lr 1e10: the loss went 2.4 -> 1e35 and the run exited 0 with chance accuracy (float32)."""
    line = _refused(capsys, ["run", mlp_plan, "--epochs", "1", "--lr", "1e10", "--precision", "float32"],
                    "diverged", "--lr", rc_want=1)
    assert "100x" in line


def test_run_lr_1e10_in_fixed_point_is_refused_up_front(capsys, mlp_plan):
    """The plan's fixed16 arithmetic (the default precision) cannot represent the step: refused
    on --lr before any worker starts, not a worker's ValueError mid-run."""
    _refused(capsys, ["run", mlp_plan, "--epochs", "1", "--lr", "1e10"], "--lr", "fixed-point update")


def test_divergence_rules():
    """host/diverge.py on the numbers of real runs (tiny-cnn, 10 classes)."""
    from bapipe.host.diverge import learned_nothing, loss_diverged

    assert loss_diverged(6.0e36, 2.42, 0, 1, 1e10) and not loss_diverged(5.0, 2.42, 0, 1, 0.1)
    assert not loss_diverged(50.0, 0.01, 3, 0, 0.1)    # a resumed run near 0: the reference is 1.0
    assert loss_diverged(101.0, 0.01, 3, 0, 0.1)
    # lr 1e-9 on tiny-cnn: accuracy 0.131, loss 2.422 -> 2.355: learned nothing
    assert learned_nothing(0.131, 10, 2.422, 2.355, 1, 1e-9)
    # the default rate: 0.574 after one epoch, loss 2.42 -> 1.96: fine
    assert not learned_nothing(0.574, 10, 2.422, 1.963, 1, 0.05)
    assert not learned_nothing(0.10, 10, 2.422, 2.40, 0, 0.05)   # fewer than one whole epoch: no verdict


@pytest.mark.slow   # imports torch and forks one training process (~8 s CPU)
def test_run_lr_1e10_on_the_torch_backend_stops_as_diverged(capsys, mlp_plan):
    """--backend torch --lr 1e10 ended at loss NaN, test accuracy 0.078 and exit 0: the torch
    backend reports its losses after the run and checked none of them."""
    pytest.importorskip("torch", reason="the torch backend needs the [torch] extra")
    line = _refused(capsys, ["run", mlp_plan, "--backend", "torch", "--epochs", "1", "--lr", "1e10"],
                    "training diverged", "epoch 1, iteration 1", "lower --lr", rc_want=1)
    assert "loss inf" in line or "loss nan" in line or "100x" in line


def test_torch_backend_applies_the_divergence_rules():
    """host/torch_train.py's checks on the loss histories of real torch runs of tiny-mlp (44
    iterations an epoch): --lr 1e10 (2.34, inf), --lr 3 (2.34 ... 1.18e4 at iteration 4), the
    default rate (2.34 -> 0.69, accuracy 0.80) and a rate so low nothing moved."""
    from bapipe.host.pipeline import TrainingDiverged
    from bapipe.host.torch_train import _check_learned, _check_losses

    with pytest.raises(TrainingDiverged, match="loss inf at epoch 1, iteration 1"):
        _check_losses([2.341, float("inf")], 44, 1e10)
    with pytest.raises(TrainingDiverged, match="iteration 4 is over 100x"):
        _check_losses([2.341, 2.9, 40.0, 200.0, 1.177e4], 44, 3.0)
    _check_losses([2.341] + [1.0] * 43 + [0.69], 44, 0.05)
    with pytest.raises(TrainingDiverged, match="did not learn"):
        _check_learned([2.341] * 44, 0.092, 10, 44, 1e-9)
    _check_learned([2.341] + [0.69] * 43, 0.80, 10, 44, 0.05)
    _check_learned([2.341] * 20, 0.092, 10, 44, 1e-9)    # fewer than one whole epoch: no verdict


def _profile(path: Path, names, batch: int | None, fwd_ms: str = "0.1") -> Path:
    lines = ([f"batch: {batch}"] if batch else []) + ["layers:"]
    lines += [f"  - {{name: {n}, fwd_ms: {fwd_ms}, bwd_ms: 0.2, activation_bytes: 256, param_bytes: 16}}"
              for n in names]
    path.write_text("\n".join(lines) + "\n")
    return path


MLP_LAYERS = ["fc1", "relu1", "fc2", "relu2", "fc3", "relu3", "fc4"]


@pytest.mark.parametrize("cmd", ["profile", "plan"])
def test_profile_and_plan_read_a_profile_by_one_rule(tmp_path, capsys, cmd):
    """No `batch`: `plan` refused it while `profile` read it as batch 1 (64x off)."""
    p = _profile(tmp_path / "p.yaml", MLP_LAYERS, None)
    extra = ["-o", tmp_path / "out.yaml"] if cmd == "plan" else []
    _refused(capsys, [cmd, "tiny-mlp", "4xU250-ring", "--profile", p, *extra], "p.yaml", "batch")


def test_a_profile_of_1e300_ms_is_refused(tmp_path, capsys):
    """fwd_ms: 1e300 wrote a plan that `sim` then refused."""
    p = _profile(tmp_path / "p.yaml", MLP_LAYERS, 32, "1e300")
    _refused(capsys, ["plan", "tiny-mlp", "4xU250-ring", "--profile", p, "-o", tmp_path / "out.yaml"],
             "fwd_ms", "3600 s")
    assert not (tmp_path / "out.yaml").exists()


# ---------------------------------------------------------------- ONNX files

def _onnx(path: Path, nodes, inputs, outputs, inits=(), opset: int = 17) -> Path:
    import onnx
    from onnx import helper

    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def test_an_onnx_file_with_an_empty_graph_is_refused(tmp_path, capsys):
    p = _onnx(tmp_path / "empty.onnx", [], [], [])
    _refused(capsys, ["profile", p, "4xU250-ring"], "empty.onnx", "graph", "no inputs, nodes, outputs")


def test_a_zero_byte_onnx_file_is_refused(tmp_path, capsys):
    (tmp_path / "zero.onnx").write_bytes(b"")
    _refused(capsys, ["profile", tmp_path / "zero.onnx", "4xU250-ring"], "zero.onnx", "0 bytes")


def test_an_onnx_file_declaring_opset_99_is_refused(tmp_path, capsys):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    p = _onnx(tmp_path / "op99.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")], [x], [y], opset=99)
    _refused(capsys, ["profile", p, "4xU250-ring"], "op99.onnx", "opset_import", "got 99")


def test_an_onnx_embedding_over_a_float_input_is_refused(tmp_path, capsys):
    import numpy as np
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])
    w = helper.make_tensor("W", TensorProto.FLOAT, [100, 16], np.zeros(1600, np.float32).tolist())
    p = _onnx(tmp_path / "embf.onnx", [helper.make_node("Gather", ["W", "x"], ["y"], name="emb")], [x], [y], [w])
    _refused(capsys, ["profile", p, "4xU250-ring"], "embf.onnx", "integer indices")


def test_a_yaml_embedding_over_a_float_input_is_refused(tmp_path, capsys):
    (tmp_path / "e.yaml").write_text("name: e\ninputs:\n  - {name: tokens, shape: [32], dtype: float}\nlayers:\n"
                                     "  - {name: embed, type: embedding, vocab: 500, dim: 64}\n"
                                     "  - {name: fl, type: flatten}\n  - {name: out, type: dense, units: 5}\n")
    _refused(capsys, ["profile", tmp_path / "e.yaml", "4xU250-ring"], "e.yaml", "inputs", "dtype: int")


# ---------------------------------------------------------------- plans and options

def test_gen_of_a_plan_with_1e9_microbatches_is_refused(tmp_path, capsys, mlp_plan):
    """gen ended in a ValueError (a 67-bit gradient accumulator); sim and run refused it."""
    doc = yaml.safe_load(mlp_plan.read_text())
    doc["microbatches"], doc["global_batch"] = 10 ** 9, 10 ** 9 * doc["microbatch_size"]
    p = tmp_path / "mb.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    for args in (["gen", p, "-o", tmp_path / "b"], ["sim", p], ["run", p, "--epochs", "1"]):
        _refused(capsys, args, "mb.yaml", "microbatches")
    assert not (tmp_path / "b").exists()


def test_a_partition_with_an_empty_board_list_is_refused(tmp_path, capsys):
    """--partition 0-4@,5-6 dropped the empty list and placed the range anywhere."""
    _refused(capsys, ["plan", "tiny-mlp", "4xU250-ring", "--partition", "0-4@,5-6", "-o", tmp_path / "p.yaml"],
             "--partition", "'0-4@'")


def test_board_names_that_are_not_identifiers_are_refused(tmp_path, capsys):
    c = tmp_path / "c.yaml"
    c.write_text("name: c\ntopology: ring\nboards:\n- {name: 'a/b', type: U250}\n- {name: b1, type: U250}\n")
    _refused(capsys, ["plan", "tiny-mlp", c, "-o", tmp_path / "p.yaml"], "boards[0].name")


# ---------------------------------------------------------------- PipeDream import

PD = """node1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=4096.000, parameter_size=0.000
true -- Linear(in_features=32, out_features=32) -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=4096.0, parameter_size=4224.0
null -- ReLU -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=4096.0, parameter_size=0.0
12 -- Linear(in_features=32, out_features=10) -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=1280.0, parameter_size=1320.0
\tnode1 -- true
\ttrue -- null
\tnull -- 12
"""


def _profiles_cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bapipe.profiles", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_pipedream_node_ids_that_read_as_yaml_values_stay_names(tmp_path, capsys):
    """Node ids 'true', 'null', '12' became a bool, None and an int in model.yaml, which
    `bapipe plan` then refused; they are quoted now and the pair plans."""
    from bapipe.profiles import import_pipedream_graph
    from bapipe.spec import model_from_text

    (tmp_path / "graph.txt").write_text(PD)
    model_text, prof_text = import_pipedream_graph(str(tmp_path / "graph.txt"), 32)
    assert [l.name for l in model_from_text(model_text).layers] == ["true", "null", "12"]
    (tmp_path / "model.yaml").write_text(model_text)
    (tmp_path / "profile.yaml").write_text(prof_text)
    rc, _out, err = _cli(capsys, "plan", tmp_path / "model.yaml", "4xU250-ring", "--profile", tmp_path / "profile.yaml",
                         "-o", tmp_path / "p.yaml")
    assert rc == 0, err


def test_pipedream_node_ids_equal_to_type_names_stay_names(tmp_path, capsys):
    """Node ids that are layer type names of the model spec or PipeDream's own ('conv2d',
    'Input', 'Linear' read as a layer of type Linear): the import keeps them as names (opaque
    layers with the file's costs) and the pair plans and simulates."""
    from bapipe.profiles import import_pipedream_graph
    from bapipe.spec import model_from_text

    text = PD.replace("true", "conv2d").replace("null", "Input").replace("12 --", "Linear --") \
             .replace("-- 12", "-- Linear")
    (tmp_path / "graph.txt").write_text(text)
    model_text, prof_text = import_pipedream_graph(str(tmp_path / "graph.txt"), 32)
    layers = model_from_text(model_text).layers
    assert [(l.name, l.type) for l in layers] == [("conv2d", "opaque"), ("Input", "opaque"), ("Linear", "opaque")]
    (tmp_path / "model.yaml").write_text(model_text)
    (tmp_path / "profile.yaml").write_text(prof_text)
    rc, _out, err = _cli(capsys, "plan", tmp_path / "model.yaml", "4xU250-ring", "--profile", tmp_path / "profile.yaml",
                         "-o", tmp_path / "p.yaml")
    assert rc == 0, err
    rc, _out, err = _cli(capsys, "sim", tmp_path / "p.yaml")
    assert rc == 0, err


def test_pipedream_import_onto_an_existing_file_is_refused(tmp_path):
    """-o naming an existing file: a FileExistsError traceback."""
    (tmp_path / "graph.txt").write_text(PD)
    (tmp_path / "taken").write_text("x")
    r = _profiles_cli("graph.txt", "--batch", "32", "-o", "taken", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "-o" in r.stderr and (tmp_path / "taken").read_text() == "x"
