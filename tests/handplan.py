"""Hand-made plans for every test and benchmark: the one fixture module that builds plans.

``bapipe plan`` is the real source of plans; these build the same Plan object directly (with
correct fingerprints) so a test can pick any cut, folding and schedule:

- :func:`hand_plan`: a model cut after layer positions, any schedule, replicas, chunks (host tests);
- :func:`make_plan`: cut after layer positions, one board a stage, foldings; returns
  (plan, model, cluster) (codegen and csim tests);
- :func:`named_plan`: stages as lists of layer names with foldings, and the named plans built
  from it (``tiny_mlp_plan``, ``tiny_cnn_plan``, ...: RTL tests, cocotb and benchmarks).

cocotb testbenches and benchmarks import it as ``tests.handplan``.
"""
from __future__ import annotations

from pathlib import Path

from bapipe.fpga_models.cluster import load_cluster
from bapipe.models import load_model
from bapipe.plan import Folding, Plan, Stage


def hand_plan(model: str, cluster: str = "4xU250-ring", cuts: tuple[int, ...] = (), schedule: str = "1f1b",
              microbatches: int = 4, microbatch_size: int = 16, chunks: int = 1, optimizer: str = "sgd",
              number_format: str = "fixed16", replicas: tuple[int, ...] | None = None) -> Plan:
    """A plan that cuts ``model`` after each layer position in ``cuts``.

    Non-interleaved: stage i on device i. Interleaved: ``len(cuts)+1`` must be p*chunks,
    and stage i sits on device i % p, chunk i // p. ``replicas`` gives each stage's
    data-parallel copies; boards are handed out in cluster order (wrapping around).
    """
    from bapipe.fpga_models.cluster import load_cluster

    mdl = load_model(model)
    cl = load_cluster(cluster)
    bounds = [-1, *cuts, len(mdl.layers) - 1]
    n = len(bounds) - 1
    v = chunks if schedule == "interleaved" else 1
    if n % v:
        raise ValueError(f"{n} stages do not split into {v} chunks")
    p = n // v
    boards = [b.name for b in cl.boards]
    reps = list(replicas) if replicas else [1] * n
    stages = []
    nxt = 0
    dev_boards: dict[int, list[str]] = {}
    for i in range(n):
        first, last = bounds[i] + 1, bounds[i + 1]
        d, c = i % p, i // p
        if d not in dev_boards:  # chunks of one device share its boards
            dev_boards[d] = [boards[(nxt + k) % len(boards)] for k in range(reps[i])]
            nxt += reps[i]
        stages.append(Stage(index=i, layers=[l.name for l in mdl.layers[first:last + 1]], first=first, last=last,
                            boards=dev_boards[d], board_type=cl.boards[0].board.name, replicas=reps[i],
                            chunk=c, device=d))
    return Plan(model=model, model_fingerprint=mdl.fingerprint(), cluster=cluster,
                cluster_fingerprint=cl.fingerprint(), schedule=schedule, chunks=v, microbatches=microbatches,
                microbatch_size=microbatch_size, global_batch=microbatches * microbatch_size,
                number_format=number_format, optimizer=optimizer, stages=stages)


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


def named_plan(model_name: str, cluster_name: str, cuts: list[list[str]],
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
    return named_plan("tiny-mlp", cluster, cuts, fold)


CONV_MINI = str(Path(__file__).resolve().parent.parent / "cocotb_tests" / "models" / "conv-mini.yaml")


def conv_mini_plan(cluster: str = "4xU250-ring") -> Plan:
    """conv-mini over 3 boards: conv1 | relu1 (standalone), conv2+relu2, flatten | fc."""
    fold = {"conv1": (2, 2), "conv2": (4, 4), "fc": (3, 8)}
    cuts = [["conv1"], ["relu1", "conv2", "relu2", "flatten"], ["fc"]]
    return named_plan(CONV_MINI, cluster, cuts, fold)


def tiny_cnn_plan(cluster: str = "4xU250-ring") -> Plan:
    """tiny-cnn over 3 boards with small foldings (pools, flatten and a width change inside)."""
    fold = {"conv1": (4, 3), "conv2": (4, 8), "pool1": (2, 1), "conv3": (8, 4), "pool2": (4, 1), "fc": (2, 16)}
    cuts = [["conv1", "relu1", "conv2", "relu2"], ["pool1", "conv3", "relu3"], ["pool2", "flatten", "fc"]]
    return named_plan("tiny-cnn", cluster, cuts, fold)


def tiny_cnn_interleaved_plan(cluster: str = "4xU250-ring") -> Plan:
    """tiny-cnn as 4 time-multiplexed stages on 2 boards (fpga0: stages 0 and 2, fpga1: 1 and 3),
    the shape of an interleaved plan: boards that take turns between stages and layers."""
    fold = {"conv1": (4, 3), "relu1": (1, 8), "conv2": (4, 8), "relu2": (1, 8), "pool1": (1, 4), "conv3": (8, 4),
            "relu3": (1, 16), "pool2": (2, 4), "fc": (2, 16)}
    cuts = [["conv1", "relu1"], ["conv2", "relu2", "pool1"], ["conv3", "relu3"], ["pool2", "flatten", "fc"]]
    return named_plan("tiny-cnn", cluster, cuts, fold, boards=[0, 1, 0, 1], style="time-multiplexed")


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
    return named_plan(SMALL_RESNET, cluster, [names[a:b] for a, b in zip(bounds, bounds[1:])], fold, style=style)
