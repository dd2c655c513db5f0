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


SMALL_RESNET = "examples/models/small-resnet.yaml"
#: small-resnet folding: the 3x3 convs take 3072 cycles per sample (32x32: 3 cycles per pixel,
#: 16x16: 12), SIMD a multiple of C so the window generators move whole pixels; batchnorm,
#: relu and add run on the conv's PE lanes
SMALL_RESNET_FOLD = {"stem": (16, 9), "b1_conv1": (16, 48), "b1_conv2": (16, 48), "b2_conv1": (8, 48),
                     "b2_conv2": (8, 96), "b2_down": (4, 16), "fc": (2, 8)}


def small_resnet_plan(style: str = "dataflow", cluster: str = "4xU250-ring", boards: int = 2) -> Plan:
    """small-resnet over 2 boards, cut after block 1 (block 2's input forks into its main
    path and its 1x1 projection right at the second board's input), or over 3 boards, also
    cut after the stem (block 1's identity skip then forks at the second board's input)."""
    names = [l.name for l in load_model(SMALL_RESNET).layers]
    cuts = [names.index("b1_relu") + 1] if boards == 2 else [names.index("stem_relu") + 1, names.index("b1_relu") + 1]
    fold = dict(SMALL_RESNET_FOLD)
    if style == "time-multiplexed":
        # element-wise layers take their own turns at PE*SIMD lanes
        fold.update({n: (1, 16) for n in names if n.endswith(("bn", "bn1", "bn2", "relu", "relu1", "add"))
                     or n == "pool"})
    bounds = [0, *cuts, len(names)]
    return hand_plan(SMALL_RESNET, cluster, [names[a:b] for a, b in zip(bounds, bounds[1:])], fold, style=style)
