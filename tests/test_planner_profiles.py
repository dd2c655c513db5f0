"""Measured profiles in the planner (issue 19): bytes used as given, batch required,
PipeDream graph.txt imported as a model + profile pair."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bapipe.errors import SpecError
from bapipe.profiles import import_pipedream_graph, load_profiles
from bapipe.spec import model_from_text
from bapipe.fpga_models.cluster import load_cluster
from bapipe.planner.planning import make_plan
from bapipe.planner.search import Request
from tolerances import f64_sum
import cli_fork

# PipeDream's graph.txt layout (node lines, then tab-indented edges), numbers made up:
# a conv, a residual add reading the input of the block, a view, a linear head
GRAPH = """\
node1 -- Input -- forward_compute_time=5.000, backward_compute_time=0.000, activation_size=3145728.000, parameter_size=0.000
node2 -- Conv2d(3, 16, kernel_size=(3, 3)) -- forward_compute_time=2.000, backward_compute_time=4.000, activation_size=16777216.000, parameter_size=1792.000
node3 -- ReLU(inplace) -- forward_compute_time=0.500, backward_compute_time=0.500, activation_size=16777216.000, parameter_size=0.000
node4 -- Conv2d(16, 16, kernel_size=(3, 3)) -- forward_compute_time=3.000, backward_compute_time=6.000, activation_size=16777216.000, parameter_size=9280.000
node5 -- Add -- forward_compute_time=0.250, backward_compute_time=0.250, activation_size=16777216.000, parameter_size=0.000
node6 -- View(-1) -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=16777216.000, parameter_size=0.000
node7 -- Dropout(p=0.5) -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=16777216.000, parameter_size=0.000
node8 -- Linear(in_features=16384, out_features=10, bias=True) -- forward_compute_time=1.000, backward_compute_time=2.000, activation_size=2560.000, parameter_size=655400.000
\tnode1 -- node2
\tnode2 -- node3
\tnode3 -- node4
\tnode4 -- node5
\tnode3 -- node5
\tnode5 -- node6
\tnode6 -- node7
\tnode7 -- node8
"""


def _pair(tmp_path, batch=64):
    g = tmp_path / "graph.txt"
    g.write_text(GRAPH)
    mtext, ptext = import_pipedream_graph(str(g), batch)
    (tmp_path / "model.yaml").write_text(mtext)
    (tmp_path / "profile.yaml").write_text(ptext)
    return model_from_text(mtext), tmp_path / "model.yaml", tmp_path / "profile.yaml"


def test_graph_txt_imports_as_model_and_profile(tmp_path):
    model, _m, prof = _pair(tmp_path)
    assert [l.name for l in model.layers] == [f"node{i}" for i in range(2, 9)]
    assert [i.name for i in model.inputs] == ["node1"] and model.inputs[0].shape == (3 * 64 * 64,)
    assert model.layers[3].inputs == ("node4", "node3")          # the skip of the add
    assert model.layers[0].out_shape == (16777216 // 64 // 4,)   # per sample, 4 bytes per element
    assert model.layers[-1].params == 655400 // 4
    p = load_profiles(str(prof), model, batch=1, require_batch=True)[None]
    # the recorded milliseconds / 1e3 / batch: two roundings on each side
    assert p["node4"]["fwd_s"] == pytest.approx(3e-3 / 64, rel=f64_sum(3), abs=0)
    assert p["node4"]["bwd_s"] == pytest.approx(6e-3 / 64, rel=f64_sum(3), abs=0)
    assert p["node8"]["param_bytes"] == 655400
    assert p["node2"]["activation_bytes"] == 16777216 // 64


def test_profile_bytes_are_used_as_given(tmp_path):
    """A fp32 profile planned in fixed16 moves and stashes the profile's bytes, not half."""
    model, _m, prof = _pair(tmp_path)
    meas = load_profiles(str(prof), model, batch=1, require_batch=True)
    outs = {}
    for fmt in ("fixed16", "fp32"):
        req = Request(measured=meas, fmt=fmt, schedule="gpipe", microbatches=4, global_batch=32,
                      partition=[(0, 2, None, None), (3, 6, None, None)])
        outs[fmt] = make_plan(model, load_cluster("4xU250-ring"), "m", "4xU250-ring", req)
    a, b = outs["fixed16"].plan.stages, outs["fp32"].plan.stages
    beta = 32 // 4
    # the cut after node4 carries node4's output and the skip from node3: 2 x 16777216 / 64 bytes per sample
    assert a[0].send_bytes == b[0].send_bytes == 2 * 16777216 // 64 * beta
    assert a[0].weight_bytes == b[0].weight_bytes == 1792 + 9280
    # memory: equal but for the model input the first stage stashes (a profile has no bytes for
    # model inputs: their elements x the plan's format), 2 more bytes per element in fp32
    assert a[1].memory_bytes == b[1].memory_bytes
    assert b[0].memory_bytes - a[0].memory_bytes == a[0].stashes * 2 * model.inputs[0].shape[0] * beta


def test_plan_cli_with_imported_pair(tmp_path):
    _model, mpath, prof = _pair(tmp_path)
    r = cli_fork.bapipe("plan", mpath, "4xU250-ring", "--profile", prof, "-o", tmp_path / "plan.yaml")
    assert r.returncode == 0, r.stderr


def test_profile_without_batch_is_one_line(tmp_path):
    _model, mpath, prof = _pair(tmp_path)
    prof.write_text(prof.read_text().replace("batch: 64\n", ""))
    r = cli_fork.bapipe("plan", mpath, "4xU250-ring", "--profile", prof, "-o", tmp_path / "plan.yaml")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "batch" in r.stderr and "profile.yaml" in r.stderr


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace("activation_size=2560.000, ", ""), "activation_size"),
    (lambda t: t.replace("\tnode7 -- node8", "\tnode7 -- node9"), "node9"),
    (lambda t: t.replace("forward_compute_time=2.000", "forward_compute_time=x"), "forward_compute_time"),
    (lambda t: t.replace("node1 -- Input", "node1 -- Foo"), "Input"),
])
def test_graph_errors_name_the_field(tmp_path, edit, needle):
    g = tmp_path / "graph.txt"
    g.write_text(edit(GRAPH))
    with pytest.raises(SpecError) as e:
        import_pipedream_graph(str(g), 64)
    assert needle in str(e.value)


def test_importer_cli_requires_batch(tmp_path):
    g = tmp_path / "graph.txt"
    g.write_text(GRAPH)
    r = subprocess.run([sys.executable, "-m", "bapipe.profiles", str(g), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--batch" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bapipe.profiles", str(g), "--batch", "64", "-o",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0 and (tmp_path / "out" / "model.yaml").exists()
