"""An ONNX model with an op we don't map, planned with --opaque, reloads from plan.yaml."""
import json

import onnx
import pytest
from onnx import TensorProto, helper
import cli_fork


def _model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [16, 16], [0.0] * 256)
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [8, 16], [0.0] * 128)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Sin", ["h"], ["s"], name="weird"),
             helper.make_node("Gemm", ["s", "w2"], ["y"], name="fc2", transB=1)]
    g = helper.make_graph(nodes, "g", [x], [y], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def run(*args):
    return cli_fork.bapipe(*args)   # the console script, forked (tests/cli_fork.py)


@pytest.mark.slow  # plan + reload subprocesses: ~2 s
def test_opaque_op_planned_and_reloaded(tmp_path):
    m = tmp_path / "m.onnx"
    _model(str(m))
    r = run("plan", str(m), "4xU250-ring", "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2 and "Sin" in r.stderr and r.stderr.count("\n") == 1
    r = run("plan", str(m), "4xU250-ring", "-o", str(tmp_path / "p.yaml"), "--opaque", "Sin=1e-6,2e-6", "--json")
    assert r.returncode == 0, r.stderr
    assert "Sin" in (tmp_path / "p.yaml").read_text()
    r = run("sim", str(tmp_path / "p.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["iteration_time_s"] > 0
