"""The arguments of every `bapipe` command, in one place: the CLI's parser and the Python API
(bapipe.api, whose defaults are these) both read them, so a default is written once."""
from __future__ import annotations

import argparse

from .schedules import MAX_MICROBATCHES, SCHEDULES  # one micro-batch bound for the CLI and the planner

#: --schedule of `bapipe plan` (auto lets the planner pick)
SCHEDULE_CHOICES = ("auto", *SCHEDULES)

def _seed(text: str) -> int:
    """argparse type of --seed: numpy's generators take only non-negative integers."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got '{text}'")
    return v


def _microbatches(text: str) -> str:
    """argparse type of `plan --microbatches`: auto, or an integer 1..MAX_MICROBATCHES."""
    if text.strip() == "auto":
        return "auto"
    try:
        v = int(text)
    except ValueError:
        return text  # the planner names a non-number in its own words
    if v > MAX_MICROBATCHES:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_MICROBATCHES} micro-batches, got {v}")
    return text


#: most samples per iteration `bapipe plan` accepts (2**20): the planner's micro-batch
#: candidates are divisors found in O(sqrt G) and at most MAX_MICROBATCHES, and replays beyond
#: 256 micro-batches are extrapolated, so 10**6 plans in under a second (it took minutes
#: before; 10**9 ran for hours); a pass larger than any plan is not a pass to profile either
MAX_GLOBAL_BATCH = 1 << 20


def _global_batch(text: str) -> int:
    """argparse type of `plan --global-batch`: an integer 1..MAX_GLOBAL_BATCH."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if v > MAX_GLOBAL_BATCH:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_GLOBAL_BATCH} samples per iteration, got {v}")
    return v


def _profile_batch(text: str) -> int:
    """argparse type of `profile --batch`: an integer; at most MAX_GLOBAL_BATCH (a larger pass
    than any plan may hold; 10**21 printed times in terasecond units); below 1 the command
    itself refuses it naming --batch."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer 1..{MAX_GLOBAL_BATCH}, got '{text}'") from None
    if v > MAX_GLOBAL_BATCH:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_GLOBAL_BATCH} samples per pass, got {v}")
    return v


def add_args(name: str, p: argparse.ArgumentParser) -> None:
    """Arguments of each subcommand (kept here so the CLI contract reads in one place)."""
    if name in ("csim", "rtlsim", "synth", "check"):
        _build_args(name, p)
    elif name in _ARGS:
        _ARGS[name](p)


def _profile_args(p: argparse.ArgumentParser) -> None:
    """`bapipe profile`: model, cluster, format, batch, a measured profile or --measure torch."""
    p.add_argument("model", help="zoo name or .yaml/.onnx path")
    p.add_argument("cluster", help="built-in cluster name or .yaml path")
    p.add_argument("--format", default="fixed16", help="number format (fixed16, int8, fp16, bf16, fp32)")
    p.add_argument("--batch", type=_profile_batch, default=1,
                   help=f"samples per pass (1..{MAX_GLOBAL_BATCH})")
    p.add_argument("--profile", dest="measured",
                   help="measured per-layer profile (.yaml/.csv) (default: none, the engines' cost model)")
    p.add_argument("--opaque", action="append", default=[], help="ONNX: OP=fwd_s,bwd_s cost for an unsupported op")
    p.add_argument("--measure", choices=("torch",), default=None,
                   help="measure MODEL's layers in PyTorch on this machine instead (the [torch] extra): writes "
                        "the profile to -o and, at CLUSTER (a .yaml path), the cluster of --processes CPU processes "
                        "(default: none, the engines' cost model)")
    p.add_argument("-o", "--output", default=None,
                   help="--measure: the profile .yaml to write (default: none; --measure needs it)")
    p.add_argument("--processes", type=int, default=2, help="--measure: CPU processes the cluster describes")
    p.add_argument("--reps", type=int, default=20, help="--measure: timed runs per layer (the median is kept)")
    p.add_argument("--force", action="store_true", help="--measure: overwrite existing files")


def _plan_args(p: argparse.ArgumentParser) -> None:
    """`bapipe plan`: what to plan for and the search's options."""
    p.add_argument("model", help="zoo name or .yaml/.onnx path")
    p.add_argument("cluster", help="built-in cluster name or .yaml path")
    p.add_argument("-o", "--output", default="plan.yaml", help="plan file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    # choices, so that a typo or an empty string is refused rather than read as auto
    p.add_argument("--schedule", default="auto", choices=SCHEDULE_CHOICES, metavar="SCHEDULE",
                   help="|".join(SCHEDULE_CHOICES))
    p.add_argument("--microbatches", default="auto", type=_microbatches,
                   help=f"auto or N (at most {MAX_MICROBATCHES})")
    p.add_argument("--global-batch", type=_global_batch, default=None,
                   help=f"samples per iteration (at most {MAX_GLOBAL_BATCH}; default: 8 per board)")
    p.add_argument("--mode", default="train", choices=("train", "inference", "infer"), help="what to plan for")
    p.add_argument("--format", default="fixed16", help="number format (fixed16, int8, fp16, bf16, fp32)")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"), help="optimizer whose state is stored")
    p.add_argument("--cap", type=float, default=0.8, help="resource utilisation cap, a fraction in (0, 1]")
    p.add_argument("--no-replication", action="store_true", help="one board per stage")
    p.add_argument("--whole-blocks", action="store_true",
                   help="cut only where one tensor crosses (never inside a residual block): "
                        "plans whose every stage the RTL can build")
    p.add_argument("--boards", type=int, default=None, help="use at most this many boards (default: all of the cluster's)")
    from bapipe.planner.placement import PLACE_WORK, PLACE_WORK_MAX   # lazily: the planner's constants
    p.add_argument("--placements", type=int, default=None,
                   help="search every placement of stages on boards when its patterns x the (schedule, "
                        f"micro-batch count) pairs each is tried with are at most this many (default "
                        f"{PLACE_WORK}, at most {PLACE_WORK_MAX}; 0: board orders only; docs/planner.md section 6)")
    p.add_argument("--pareto", action="store_true", help="also list non-dominated plans")
    p.add_argument("--partition", default=None, help="evaluate a given split, e.g. 0-5,6-11,12-36 (default: searched)")
    p.add_argument("--cost-model", default="bapipe", choices=("bapipe", "pipedream"),
                   help="what the search minimises: bapipe (the planner's model) or pipedream (PipeDream's "
                        "formula over every layout; needs --profile; the plan is then priced by bapipe's model)")
    p.add_argument("--profile", dest="measured",
                   help="measured per-layer profile (.yaml/.csv) (default: none, the engines' cost model)")
    p.add_argument("--opaque", action="append", default=[], help="ONNX: OP=fwd_s,bwd_s cost for an unsupported op")
    p.add_argument("--mesh", default="1", help="tensor-parallel boards per stage: auto (1 and the host size), "
                                               "N, a list 1,4 to explore, or per stage 4+1+1+1+1")


def _sim_args(p: argparse.ArgumentParser) -> None:
    """`bapipe sim`: the plan, iterations, trace and Gantt outputs."""
    p.add_argument("plan", help="plan.yaml written by `bapipe plan`")
    p.add_argument("--iterations", type=int, default=1, help="training iterations to simulate")
    p.add_argument("--trace", help="write a Chrome trace-event JSON (default: none)")
    p.add_argument("--gantt", help="write a Gantt chart (.png, .pdf or .svg: the suffix sets the format; default: none)")


def _reshard_args(p: argparse.ArgumentParser) -> None:
    """`bapipe reshard`: the tensor, both meshes and layouts, and --execute."""
    p.add_argument("--shape", required=True, help="tensor shape, e.g. 1024,1024,512")
    p.add_argument("--dtype", default="fp32", help="element type of the tensor (sets its bytes)")
    p.add_argument("--src-mesh", required=True, help="e.g. 2x4")
    p.add_argument("--src", required=True, help="source layout, e.g. S0RR")
    p.add_argument("--dst-mesh", required=True, help="destination mesh, e.g. 2x4")
    p.add_argument("--dst", required=True, help="destination layout, e.g. RS0R")
    p.add_argument("--cluster", help="cluster whose links to use (default: groups of 4, 100 Gb/s)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the randomised strategies")
    p.add_argument("--execute", action="store_true",
                   help="run the best plan (and the p2p/first baseline) between OS processes, one per device, "
                        "over torch.distributed; check every destination tile bit for bit (needs the [torch] extra)")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                   help="--execute: torch.distributed backend (nccl needs CUDA GPUs)")
    p.add_argument("--repeat", type=int, default=1, help="--execute: runs of each plan (the median is reported)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="--execute: seconds before a silent device process is declared hung")


def _gen_args(p: argparse.ArgumentParser) -> None:
    """`bapipe gen`: the plan, the folder, the stage engines and the physical-rules policy."""
    p.add_argument("plan", help="plan.yaml written by `bapipe plan`")
    p.add_argument("-o", "--output", default="build", help="project folder to write")
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    p.add_argument("--engines", default="hls", choices=("hls", "rtl"),
                   help="stage kernels the Makefile and link configs build: hls (Vitis HLS) or rtl (the "
                        "packaged RTL kernels in rtl/kernels/)")
    p.add_argument("--strict-rules", action="store_true",
                   help="refuse the build (exit 2, nothing written) when `bapipe check` finds a board that "
                        "breaks a physical rule (default: write it and warn per board: the planner's default "
                        "vgg16 and resnet50 builds break them today, issue #32)")
    p.add_argument("--allow-rule-violations", action="store_true",
                   help="write the build when a board breaks a physical rule, warning per board (what gen "
                        "does unless --strict-rules; say it to keep a script's intent explicit)")


def _build_args(name: str, p: argparse.ArgumentParser) -> None:
    """`bapipe csim|rtlsim|synth|check`: the build folder and each command's own options."""
    p.add_argument("build", nargs="?", default="build", help="project folder written by `bapipe gen`")
    if name == "rtlsim":
        p.add_argument("--samples", type=int, default=None,
                       help="inputs to stream (default 16; fewer, at least 3, when boards take turns "
                            "between layers, to keep the run near 4M simulated cycles)")
        p.add_argument("--engine", default="cpp", choices=("cpp", "cocotb"),
                       help="C++ Verilator harness (fast) or the cocotb testbench")
        p.add_argument("--threads", type=int, default=1, help="Verilator model threads (cpp engine)")
        p.add_argument("--stages", dest="stages", action="store_true", default=None,
                       help="run each stage alone (the per-stage plan vs measured report) even when the "
                            "build's engines exceed the budget (by default they run when the MVUs have at "
                            "most 16,384 lanes, PE x SIMD summed)")
        p.add_argument("--no-stages", dest="stages", action="store_false", default=None,
                       help="skip running each stage alone (by default they run when the build is within "
                            "the budget of --stages)")
        p.add_argument("--stage-samples", type=int, default=None,
                       help="samples each stage runs alone (default 3-16, to keep all stages near "
                            "2M simulated cycles)")
        p.add_argument("--iterations", type=int, default=None,
                       help="training builds (mode: train plans): iterations of the schedule to simulate; "
                            "0 runs the forward pipeline only (default: 2 when they take at most 20 M "
                            "simulated cycles, else 0)")
    if name == "csim":
        p.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs")
        p.add_argument("--samples", type=int, default=4, help="random inputs per stage (big stages run 1)")
        p.add_argument("--iterations", type=int, default=None,
                       help="training builds (mode: train plans): run this many iterations of forward, "
                            "backward and weight update and check the weights after each against "
                            "fpga_models.train_fixed (default: the forward check only)")
        p.add_argument("--lr", type=float, default=None,
                       help="--iterations: SGD learning rate (default: the rule `bapipe run` uses for the "
                            "plan's global batch)")
        p.add_argument("--momentum", type=float, default=0.9, help="--iterations: SGD momentum")
    if name == "synth":
        p.add_argument("--board", action="append", help="synthesise only this board (repeatable; default: every board)")
        p.add_argument("--timeout", type=float, default=600.0, help="wall-time limit per board, seconds")


def _run_args(p: argparse.ArgumentParser) -> None:
    """`bapipe run`: backend, epochs, rate, precision, logs and checkpoints."""
    p.add_argument("plan", help="plan.yaml written by `bapipe plan`")
    p.add_argument("--backend", default="numpy", choices=("numpy", "verilator", "xrt", "torch"),
                   help="numpy trains; verilator trains a mode: train plan on the generated training RTL "
                        "(the forward pass with --resume); xrt runs the generated forward pass; torch trains "
                        "in PyTorch, one CPU process per board, with torch.distributed.pipelining (the [torch] extra)")
    p.add_argument("--epochs", type=int, default=None,
                   help="training epochs, counted from the start of training (numpy and verilator backends; "
                        "default 5)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="samples per iteration instead of the plan's (a multiple of its micro-batches; default: the plan's)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the optimizer's rule for the plan's batch)")
    from bapipe.host.optim import DEFAULT_LR_SCHEDULE, LR_SCHEDULES   # lazily: the optimizer's schedules
    p.add_argument("--lr-schedule", default=DEFAULT_LR_SCHEDULE, choices=LR_SCHEDULES,
                   help="the rate over the epochs: linear steps it down once an epoch to 1/epochs of --lr, "
                        "constant keeps it (every backend applies the same steps)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the weights and the data order")
    p.add_argument("--precision", default="plan", choices=("plan", "fixed", "float32"),
                   help="arithmetic of the numpy backend: plan (the plan's number format: fixed for a fixed16 "
                        "or int8 plan with sgd, as the hardware trains; float32 for fp32 or adam plans), "
                        "fixed, or float32")
    p.add_argument("--log", help="write a per-iteration log (.json or .csv; default: none)")
    p.add_argument("--checkpoint", help="save weights and optimizer state here after every epoch (default: none)")
    p.add_argument("--resume", help="resume from a checkpoint (default: start from fresh weights)")
    p.add_argument("--ray", action="store_true", help="run board workers as Ray actors (the 'ray' extra)")
    p.add_argument("--verbose", action="store_true", help="also show third-party warnings (Ray's)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent worker is declared hung")
    p.add_argument("--retries", type=int, default=0,
                   help="worker failures to recover from by restarting the workers and replaying the epoch")
    p.add_argument("--build", default=None, help="generated project (verilator/xrt backends; default: build)")


def _export_args(p: argparse.ArgumentParser) -> None:
    """`bapipe export`: the model, the .onnx file and its weights."""
    p.add_argument("model", help="zoo name or .yaml path")
    p.add_argument("-o", "--output", required=True, help=".onnx file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--weights", default="random", choices=("random", "zero"), help="initial weights")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random weights")


_ARGS = {"profile": _profile_args, "plan": _plan_args, "sim": _sim_args, "reshard": _reshard_args,
         "gen": _gen_args, "run": _run_args, "export": _export_args}


def actions(name: str) -> dict:
    """Command ``name``'s argparse actions by dest (their type, choices and default)."""
    p = argparse.ArgumentParser(add_help=False)
    add_args(name, p)
    return {a.dest: a for a in p._actions if a.dest != argparse.SUPPRESS}


def convert(action: argparse.Action, value):
    """``value`` given in Python for ``action``'s option, checked as the parser checks typed text:
    its type (bounds included) and choices. ValueError with argparse's message when refused."""
    if action.nargs == 0:   # a flag; None where the flag's default is None (--stages: "let rtlsim decide")
        if value is None and action.default is None:
            return value
        if not isinstance(value, bool):
            raise ValueError(f"expected True or False, got {value!r}")
        return value
    if value is None or isinstance(value, list):
        return value
    if action.type is not None and not isinstance(value, bool):
        try:
            value = action.type(str(value) if not isinstance(value, str) else value)
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise ValueError(str(e)) from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"expected one of {', '.join(map(str, action.choices))}, got {value!r}")
    return value


def defaults(name: str) -> dict:
    """Every option of command ``name`` (its dests) with its default, as the CLI parses them."""
    p = argparse.ArgumentParser(add_help=False)
    add_args(name, p)
    return {a.dest: a.default for a in p._actions if a.dest != argparse.SUPPRESS}


#: what every command's exit status means (shown at the end of each --help)
EXIT_CODES = ("exit status: 0 done; 1 a check failed (csim/rtlsim mismatch, synth failure, a failed or diverged "
              "run); 2 bad input, or a tool or extra that is missing; 130 interrupted (Ctrl-C); 143 terminated "
              "(SIGTERM)")
