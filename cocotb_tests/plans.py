"""Hand-built plans for the RTL tests and benchmarks (no planner needed).

A plan here is what `bapipe plan` would write for a one-board-per-stage pipeline: the
model's layers cut into contiguous stages, a folding per MAC layer.
"""
from __future__ import annotations

from bapipe.plan import Folding, Plan, Stage
from bapipe.spec import load_model
from fpga_models.cluster import load_cluster


def hand_plan(model_name: str, cluster_name: str, cuts: list[list[str]],
              folding: dict[str, tuple[int, int]], mode: str = "inference", boards: list[int] | None = None,
              style: str = "dataflow") -> Plan:
    """A plan with stage i = the layers ``cuts[i]`` on board ``boards[i]`` (default i) of the cluster."""
    boards = list(range(len(cuts))) if boards is None else boards
    model = load_model(model_name)
    cluster = load_cluster(cluster_name)
    stages = []
    for i, names in enumerate(cuts):
        first = model.index[names[0]]
        stages.append(Stage(index=i, layers=list(names), first=first, last=first + len(names) - 1,
                            boards=[cluster.boards[boards[i]].name], board_type=cluster.boards[boards[i]].board.name,
                            device=boards[i], style=style,
                            folding={n: Folding(*folding[n]) for n in names if n in folding}))
    return Plan(model=model_name if model_name.endswith((".yaml", ".onnx")) else model.name, model_fingerprint=model.fingerprint(), cluster=cluster.name,
                cluster_fingerprint=cluster.fingerprint(), mode=mode, schedule="gpipe", stages=stages)


def tiny_mlp_plan(boards: int = 4, cluster: str = "4xU250-ring") -> Plan:
    """tiny-mlp over 3 or 4 boards with the folding used by the tests and the benchmark."""
    fold = {"fc1": (8, 8), "fc2": (8, 8), "fc3": (4, 8), "fc4": (2, 4)}
    if boards == 4:
        cuts = [["fc1", "relu1"], ["fc2", "relu2"], ["fc3", "relu3"], ["fc4"]]
    elif boards == 3:
        cuts = [["fc1", "relu1"], ["fc2", "relu2"], ["fc3", "relu3", "fc4"]]
    else:
        raise ValueError("boards must be 3 or 4")
    return hand_plan("tiny-mlp", cluster, cuts, fold)


CONV_MINI = str(__import__("pathlib").Path(__file__).with_name("models") / "conv-mini.yaml")


def conv_mini_plan(cluster: str = "4xU250-ring") -> Plan:
    """conv-mini over 3 boards: conv1 | relu1 (standalone), conv2+relu2, flatten | fc."""
    fold = {"conv1": (2, 2), "conv2": (4, 4), "fc": (3, 8)}
    cuts = [["conv1"], ["relu1", "conv2", "relu2", "flatten"], ["fc"]]
    return hand_plan(CONV_MINI, cluster, cuts, fold)


def tiny_cnn_plan(cluster: str = "4xU250-ring") -> Plan:
    """tiny-cnn over 3 boards with small foldings (pools, flatten and a width change inside)."""
    fold = {"conv1": (4, 3), "conv2": (4, 8), "pool1": (2, 1), "conv3": (8, 4), "pool2": (4, 1), "fc": (2, 16)}
    cuts = [["conv1", "relu1", "conv2", "relu2"], ["pool1", "conv3", "relu3"], ["pool2", "flatten", "fc"]]
    return hand_plan("tiny-cnn", cluster, cuts, fold)


def tiny_cnn_interleaved_plan(cluster: str = "4xU250-ring") -> Plan:
    """tiny-cnn as 4 time-multiplexed stages on 2 boards (fpga0: stages 0 and 2, fpga1: 1 and 3),
    the shape of an interleaved plan: boards that take turns between stages and layers."""
    fold = {"conv1": (4, 3), "relu1": (1, 8), "conv2": (4, 8), "relu2": (1, 8), "pool1": (1, 4), "conv3": (8, 4),
            "relu3": (1, 16), "pool2": (2, 4), "fc": (2, 16)}
    cuts = [["conv1", "relu1"], ["conv2", "relu2", "pool1"], ["conv3", "relu3"], ["pool2", "flatten", "fc"]]
    return hand_plan("tiny-cnn", cluster, cuts, fold, boards=[0, 1, 0, 1], style="time-multiplexed")
