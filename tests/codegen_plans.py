"""Hand-built plans for the codegen and csim tests (no planner needed)."""
from __future__ import annotations

from bapipe.spec import load_model
from bapipe.plan import Folding, Plan, Stage
from fpga_models.cluster import load_cluster


def make_plan(model_name: str = "tiny-cnn", cluster_name: str = "4xU250-ring",
              cuts: tuple[int, ...] = (3, 6), folding: dict | None = None, fmt: str = "fixed16",
              style: str = "dataflow", mode: str = "train", microbatch_size: int = 2) -> tuple[Plan, object, object]:
    """A plan splitting the model after the given layer positions, one stage per board."""
    model = load_model(model_name)
    cluster = load_cluster(cluster_name)
    bounds = [-1, *cuts, len(model.layers) - 1]
    stages = []
    folding = folding or {}
    for i in range(len(bounds) - 1):
        first, last = bounds[i] + 1, bounds[i + 1]
        names = [l.name for l in model.layers[first:last + 1]]
        cb = cluster.boards[i % len(cluster.boards)]
        stages.append(Stage(index=i, layers=names, first=first, last=last, boards=[cb.name],
                            board_type=cb.board.name, device=i, style=style,
                            folding={n: Folding(*folding[n]) for n in names if n in folding}))
    plan = Plan(model=model_name, model_fingerprint=model.fingerprint(), cluster=cluster_name,
                cluster_fingerprint=cluster.fingerprint(), number_format=fmt, stages=stages,
                mode=mode, microbatch_size=microbatch_size, global_batch=microbatch_size)
    return plan, model, cluster


RESIDUAL_YAML = """
name: tiny-res
input: [2, 6, 6]
layers:
  - {name: c1, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: bn1, type: batchnorm}
  - {name: r1, type: relu}
  - {name: c2, type: conv2d, out_channels: 4, kernel: 3, padding: 1, bias: false}
  - {name: add1, type: add, inputs: [bn1, c2]}
  - {name: mp, type: maxpool, kernel: 2}
  - {name: c3, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: add2, type: add, inputs: [mp, c3, mp]}
  - {name: gap, type: globalavgpool}
  - {name: fc, type: dense, units: 5}
"""


def residual_model_file(tmp_path) -> str:
    """A small residual CNN with batchnorm, skips across stage cuts and a 3-input add."""
    p = tmp_path / "tiny-res.yaml"
    p.write_text(RESIDUAL_YAML)
    return str(p)
