"""The dropout layer type: a mask draw and a product an element in training, the identity
at inference (bapipe.layers._dropout, planner.stagecost.stage_model); gen refuses it."""
from __future__ import annotations

import pytest

from bapipe.errors import SpecError
from bapipe.models import load_model
from bapipe.fpga_models.cluster import load_cluster
from bapipe.planner.planning import make_plan
from bapipe.planner.search import Request

BASE = """name: {name}
inputs:
  - {{name: x, shape: [64]}}
layers:
  - {{name: fc1, type: dense, units: 64}}
  - {{name: relu1, type: relu}}
{drop}  - {{name: fc2, type: dense, units: 10}}
"""


def _model(tmp_path, drop: str | None):
    text = BASE.format(name="with-drop" if drop else "no-drop",
                       drop=f"  - {{name: drop1, type: dropout{drop}}}\n" if drop is not None else "")
    p = tmp_path / ("d.yaml" if drop is not None else "n.yaml")
    p.write_text(text)
    return load_model(str(p)), str(p)


def test_dropout_layer_counts(tmp_path):
    m, _ = _model(tmp_path, ", rate: 0.25")
    d = m.layers[2]
    assert (d.type, d.out_shape, d.params, d.fwd_ops, d.fwd_macs) == ("dropout", (64,), 0, 128, 0)
    assert dict(d.attrs)["rate"] == 0.25
    m, _ = _model(tmp_path, "")
    assert dict(m.layers[2].attrs)["rate"] == 0.5   # the default, as torch.nn.Dropout's
    for bad in (", rate: 1.0", ", rate: -0.1", ", rate: high"):
        with pytest.raises(SpecError, match="rate"):
            _model(tmp_path, bad)


@pytest.mark.parametrize("cluster", ["16xV100", "4xU250-ring"])
def test_dropout_costs_time_in_training_only(tmp_path, cluster):
    """One stage on one board: training with the dropout takes longer than without it;
    inference takes exactly the time of the model without it (time-multiplexed FPGA and GPU
    stages; the planner's stage tables give the dropout 0 s)."""
    cl = load_cluster(cluster)
    drop, dp = _model(tmp_path, "")
    plain, pp = _model(tmp_path, None)

    def stage(model, path, mode):
        req = Request(mode=mode, max_boards=1, global_batch=8, partition=[(0, len(model.layers) - 1, None, None)])
        out = make_plan(model, cl, path, cluster, req)
        return out.plan.stages[0]

    t_drop, t_plain = stage(drop, dp, "train"), stage(plain, pp, "train")
    assert t_drop.fwd_s > t_plain.fwd_s and t_drop.bwd_s > t_plain.bwd_s
    i_drop, i_plain = stage(drop, dp, "inference"), stage(plain, pp, "inference")
    if i_drop.style != "dataflow":   # the dataflow style (fpga_models.allocate) still builds its engine
        assert i_drop.fwd_s == i_plain.fwd_s


@pytest.mark.slow
def test_gen_refuses_dropout_in_one_line(tmp_path):
    from cli_fork import bapipe

    _, dp = _model(tmp_path, "")
    plan = tmp_path / "plan.yaml"
    bapipe("plan", dp, "4xU250-ring", "--partition", "0-3", "-o", plan, check=True)
    r = bapipe("gen", plan, "-o", tmp_path / "build", "--allow-rule-violations")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'dropout'" in lines[0] and "codegen cannot generate" in lines[0]
