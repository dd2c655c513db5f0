"""The `bapipe` command line.

Each subcommand's work lives in the module that owns it (planner, fpga_models, codegen,
host) and is imported lazily; a subcommand is offered only when its module is present.
A handler module exposes ``run(args) -> dict`` (the ``--json`` object) and optionally
``show(result) -> str`` for humans. Bad input raises SpecError: one line, exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
from pathlib import Path

from . import _early_exit
from .errors import SpecError
from .schedules import MAX_MICROBATCHES, SCHEDULES  # one micro-batch bound for the CLI and the planner

#: --schedule of `bapipe plan` (auto lets the planner pick)
SCHEDULE_CHOICES = ("auto", *SCHEDULES)
#: commands whose -o names one file that is not overwritten without --force
_FILE_OUTPUTS = ("plan", "export")

# name -> (handler module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("bapipe.fpga_models.cli_info", "list the model zoo"),
    "boards": ("bapipe.fpga_models.cli_info", "list the board catalog"),
    "clusters": ("bapipe.fpga_models.cli_info", "list the built-in clusters"),
    "profile": ("bapipe.fpga_models.cli_info", "per-layer cost of MODEL on each board type of CLUSTER"),
    "plan": ("bapipe.planner.cli_plan", "plan pipeline-parallel training/inference of MODEL on CLUSTER"),
    "sim": ("bapipe.fpga_models.cli_sim", "cycle-approximate simulation of a plan"),
    "reshard": ("bapipe.planner.cli_reshard", "plan one cross-mesh resharding"),
    "gen": ("bapipe.codegen.cli_gen", "generate the HLS/RTL project of a plan"),
    "check": ("bapipe.codegen.cli_check", "apply the vendor's physical rules to a generated build (blocks, II, ports)"),
    "csim": ("bapipe.codegen.cli_csim", "g++ C-simulation of every generated stage against numpy"),
    "rtlsim": ("bapipe.codegen.cli_rtlsim", "Verilator run of the generated multi-board pipeline"),
    "synth": ("bapipe.codegen.cli_synth", "yosys synth_xilinx resource counts of the generated RTL"),
    "run": ("bapipe.host.cli_run", "run a plan's schedule on a backend (numpy, verilator, xrt)"),
    "export": ("bapipe.cli_export", "write a zoo model as ONNX"),
}


def _available(name: str) -> bool:
    mod = COMMANDS[name][0]
    try:
        return importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:
        return False


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        sys.stderr.write(f"{self.prog}: {message}\n")
        sys.exit(2)


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


def _add_args(name: str, p: argparse.ArgumentParser) -> None:
    """Arguments of each subcommand (kept here so the CLI contract reads in one place)."""
    if name == "profile":
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
                            "the profile to -o and, at CLUSTER (a .yaml path), the cluster of --processes CPU processes")
        p.add_argument("-o", "--output", default=None, help="--measure: the profile .yaml to write")
        p.add_argument("--processes", type=int, default=2, help="--measure: CPU processes the cluster describes")
        p.add_argument("--reps", type=int, default=20, help="--measure: timed runs per layer (the median is kept)")
        p.add_argument("--force", action="store_true", help="--measure: overwrite existing files")
    elif name == "plan":
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
    elif name == "sim":
        p.add_argument("plan", help="plan.yaml written by `bapipe plan`")
        p.add_argument("--iterations", type=int, default=1, help="training iterations to simulate")
        p.add_argument("--trace", help="write a Chrome trace-event JSON (default: none)")
        p.add_argument("--gantt", help="write a Gantt chart (.png, .pdf or .svg: the suffix sets the format; default: none)")
    elif name == "reshard":
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
    elif name == "gen":
        p.add_argument("plan", help="plan.yaml written by `bapipe plan`")
        p.add_argument("-o", "--output", default="build", help="project folder to write")
        p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
        p.add_argument("--engines", default="hls", choices=("hls", "rtl"),
                       help="stage kernels the Makefile and link configs build: Vitis HLS (default) or the "
                            "packaged RTL kernels (rtl/kernels/)")
        p.add_argument("--allow-rule-violations", action="store_true",
                       help="write the build even when `bapipe check` finds a board that breaks a physical rule")
    elif name == "check":
        p.add_argument("build", nargs="?", default="build", help="project folder written by `bapipe gen`")
    elif name in ("csim", "rtlsim", "synth"):
        p.add_argument("build", nargs="?", default="build", help="project folder written by `bapipe gen`")
        if name == "rtlsim":
            p.add_argument("--samples", type=int, default=None,
                           help="inputs to stream (default 16; fewer, at least 3, when boards take turns "
                                "between layers, to keep the run near 4M simulated cycles)")
            p.add_argument("--engine", default="cpp", choices=("cpp", "cocotb"),
                           help="C++ Verilator harness (fast) or the cocotb testbench")
            p.add_argument("--threads", type=int, default=1, help="Verilator model threads (cpp engine)")
            p.add_argument("--no-stages", dest="stages", action="store_false",
                           help="skip running each stage alone (the per-stage plan vs measured report)")
            p.add_argument("--stage-samples", type=int, default=None,
                           help="samples each stage runs alone (default 3-16, to keep all stages near "
                                "2M simulated cycles)")
            p.add_argument("--iterations", type=int, default=None,
                           help="training builds (mode: train plans): iterations of the schedule to simulate "
                                "(default: codegen.cli_rtlsim.DEFAULT_ITERATIONS when they fit its "
                                "TRAIN_BUDGET_CYCLES of simulated cycles, else 0; 0 runs the forward "
                                "pipeline only)")
        if name == "csim":
            p.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs")
            p.add_argument("--samples", type=int, default=4, help="random inputs per stage (big stages run 1)")
            p.add_argument("--iterations", type=int, default=None,
                           help="training builds (mode: train plans): run this many iterations of forward, "
                                "backward and weight update and check the weights after each against "
                                "fpga_models.train_fixed (default: the forward check only)")
            p.add_argument("--lr", type=float, default=0.05, help="--iterations: SGD learning rate")
            p.add_argument("--momentum", type=float, default=0.9, help="--iterations: SGD momentum")
        if name == "synth":
            p.add_argument("--board", action="append", help="synthesise only this board (repeatable; default: every board)")
            p.add_argument("--timeout", type=float, default=600.0, help="wall-time limit per board, seconds")
    elif name == "run":
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
                            f"constant keeps it (default: {DEFAULT_LR_SCHEDULE}; every backend applies the same steps)")
        p.add_argument("--seed", type=_seed, default=0, help="seed of the weights and the data order")
        p.add_argument("--precision", default="float32", choices=("float32", "fixed"),
                       help="float32, or fixed to round to the plan's number format")
        p.add_argument("--log", help="write a per-iteration log (.json or .csv; default: none)")
        p.add_argument("--checkpoint", help="save weights and optimizer state here after every epoch (default: none)")
        p.add_argument("--resume", help="resume from a checkpoint (default: start from fresh weights)")
        p.add_argument("--ray", action="store_true", help="run board workers as Ray actors")
        p.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent worker is declared hung")
        p.add_argument("--retries", type=int, default=0,
                       help="worker failures to recover from by restarting the workers and replaying the epoch")
        p.add_argument("--build", default=None, help="generated project (verilator/xrt backends; default: build)")
    elif name == "export":
        p.add_argument("model", help="zoo name or .yaml path")
        p.add_argument("-o", "--output", required=True, help=".onnx file to write")
        p.add_argument("--force", action="store_true", help="overwrite an existing output file")
        p.add_argument("--weights", default="random", choices=("random", "zero"), help="initial weights")
        p.add_argument("--seed", type=_seed, default=0, help="seed of the random weights")


def version() -> str:
    """The installed package's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version as _version

    try:
        return _version("bapipe")
    except PackageNotFoundError:
        return "0+unknown"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default, except where it is None or a flag's False (nothing to say)."""

    def _get_help_string(self, action):
        # identity, not ==: a default of 0 (--seed, --retries) equals False and must be shown
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS \
                or action.default == []:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with only the subcommands whose modules exist."""
    parser = _Parser(prog="bapipe", description="BaPipe: plan, simulate, generate and run pipeline-parallel "
                                                 "DNN training on FPGA clusters.")
    parser.add_argument("--version", action="version", version=f"bapipe {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (_, help_) in COMMANDS.items():
        if not _available(name):
            continue
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=_Formatter)
        _add_args(name, p)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bapipe` console script.

    Ctrl-C and SIGTERM at any moment, also while the command's modules are still being
    imported, end it with one line and exit 130 / 143 (no traceback)."""
    previous = _handle_sigterm()
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is not signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)   # (an ignored Ctrl-C stays ignored: nohup, &)
    try:
        return _main(argv)
    except Terminated:   # before or after the command ran (its own handler names it)
        sys.stderr.write("bapipe: terminated (SIGTERM)\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("bapipe: interrupted\n")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler if previous_int is _early_exit else previous_int)


def _on_sigint(signum, frame):
    """Ctrl-C: stop every compiler and simulator first (any thread's), then unwind as usual."""
    from .proc import kill_all

    kill_all()
    raise KeyboardInterrupt


def _main(argv: list[str] | None) -> int:
    from .toolchain import wire_verilator

    wire_verilator()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    modname = COMMANDS[args.command][0]
    if args.command == "profile" and getattr(args, "measure", None):
        modname = "bapipe.host.cli_profile"  # measured in PyTorch on this machine: the host's job
    mod = importlib.import_module(modname)
    handler = getattr(mod, "cmd_" + args.command.replace("-", "_"), None) or getattr(mod, "run")
    try:
        _check_paths(args)
        _check_new_output(args)
        _check_dependent(parser, args, list(sys.argv[1:] if argv is None else argv))
        result = handler(args)
        rc = 0
        if isinstance(result, tuple):
            result, rc = result
        if args.json:
            text = json.dumps(result, default=_jsonable)
        else:  # formatting is inside the try too: a show_* bug must not print a traceback
            show = getattr(mod, "show_" + args.command.replace("-", "_"), None) or getattr(mod, "show", None)
            text = show(result) if show else json.dumps(result, indent=2, default=_jsonable)
    except SpecError as e:
        sys.stderr.write(str(e) + "\n")
        return 2
    except Terminated:
        sys.stderr.write(f"bapipe {args.command}: terminated (SIGTERM)\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write(f"bapipe {args.command}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal bug, not bad input: still one line unless debugging
        if os.environ.get("BAPIPE_DEBUG"):
            raise
        sys.stderr.write(f"bapipe {args.command}: internal error: {type(e).__name__}: {e} "
                         f"(set BAPIPE_DEBUG=1 for the traceback)\n")
        return 1
    if text:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return rc


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main process like Ctrl-C so the same cleanup runs (child
    processes such as yosys or the board workers are killed, temporary folders removed)."""


def _handle_sigterm():
    """Turn SIGTERM into Terminated in this process; returns the previous handler."""
    main_pid = os.getpid()

    def on_term(signum, frame):
        if os.getpid() != main_pid:  # a forked worker inherited this: die as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        from .proc import kill_all

        kill_all()   # compilers and simulators of every thread, before the main thread unwinds
        raise Terminated()

    return signal.signal(signal.SIGTERM, on_term)


#: options that act only together with another: (command, dest, option, applies(args), what it needs).
#: Given where they do nothing, they are refused in one line instead of silently ignored.
_DEPENDENT = (
    ("run", "build", "--build", lambda a: a.backend in ("verilator", "xrt"),
     "applies to --backend verilator or xrt (the numpy backend uses no generated project)"),
    ("reshard", "backend", "--backend", lambda a: a.execute, "applies to --execute"),
    ("profile", "output", "-o", lambda a: a.measure, "applies to --measure torch"),
    ("profile", "processes", "--processes", lambda a: a.measure, "applies to --measure torch"),
    ("profile", "reps", "--reps", lambda a: a.measure, "applies to --measure torch"),
    ("profile", "force", "--force", lambda a: a.measure, "applies to --measure torch"),
    ("profile", "measured", "--profile", lambda a: not a.measure, "does not apply to --measure torch"),
    ("run", "precision", "--precision", lambda a: a.backend != "torch", "the torch backend trains in float32 only"),
    ("run", "checkpoint", "--checkpoint", lambda a: a.backend != "torch", "does not apply to --backend torch"),
    ("run", "resume", "--resume", lambda a: a.backend != "torch", "does not apply to --backend torch"),
    ("run", "retries", "--retries", lambda a: a.backend != "torch", "does not apply to --backend torch"),
    ("run", "log", "--log", lambda a: a.backend != "torch", "does not apply to --backend torch"),
    ("run", "ray", "--ray", lambda a: a.backend != "torch", "does not apply to --backend torch (it starts its own "
                                                            "processes)"),
    ("reshard", "repeat", "--repeat", lambda a: a.execute, "applies to --execute"),
    ("reshard", "timeout", "--timeout", lambda a: a.execute, "applies to --execute"),
    ("csim", "lr", "--lr", lambda a: a.iterations is not None, "applies to a training run: add --iterations K"),
    ("csim", "momentum", "--momentum", lambda a: a.iterations is not None,
     "applies to a training run: add --iterations K"),
    ("export", "seed", "--seed", lambda a: a.weights == "random", "applies to --weights random"),
    ("plan", "optimizer", "--optimizer", lambda a: a.mode == "train",
     "applies to --mode train (an inference plan stores no optimizer state)"),
    ("plan", "opaque", "--opaque", lambda a: str(a.model).lower().endswith(".onnx"),
     "applies to an .onnx MODEL (costs of the ONNX ops the toolkit cannot price)"),
    ("profile", "opaque", "--opaque", lambda a: str(a.model).lower().endswith(".onnx"),
     "applies to an .onnx MODEL (costs of the ONNX ops the toolkit cannot price)"),
)


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the options written on ``argv`` (not defaulted), argparse's unique
    prefixes (``--epo`` for ``--epochs``) and ``--opt=value`` included."""
    names = {s: a.dest for a in parser._actions for s in a.option_strings}
    given = set()
    for tok in map(str, argv):   # callers may pass Paths
        if tok == "--":
            break
        if not tok.startswith("--"):
            continue  # a positional, a value, or a short option (only -o and -h exist)
        name = tok.split("=", 1)[0]
        hits = {names[name]} if name in names else {d for o, d in names.items() if o.startswith(name)}
        if len(hits) == 1:
            given |= hits
    return given


def _check_dependent(parser: argparse.ArgumentParser, args, argv: list[str]) -> None:
    """Refuse an option given where it has no effect (see _DEPENDENT)."""
    sub = next(a for a in parser._actions if a.dest == "command").choices[args.command]
    given = given_options(sub, argv)
    for cmd, dest, opt, applies, needs in _DEPENDENT:
        if cmd == args.command and dest in given and not applies(args):
            raise SpecError(None, None, opt, f"{needs}; it has no effect here")


#: arguments that name a file or folder (checked up front by _check_paths)
PATH_ARGS = {"output": "-o", "plan": "PLAN", "model": "MODEL", "cluster": "CLUSTER", "measured": "--profile",
             "build": "BUILD", "trace": "--trace", "gantt": "--gantt", "log": "--log", "checkpoint": "--checkpoint",
             "resume": "--resume"}
#: longest file or folder name accepted: Linux file systems take 255 bytes (NAME_MAX), and
#: commands write beside an output under a longer name (gen's ``.<name>.gen-<pid>``)
MAX_PATH_NAME = 200
#: longest path accepted (PATH_MAX is 4096 bytes, the generated files go below it)
MAX_PATH = 3000


def _check_paths(args) -> None:
    """A path no file system takes (a 300-character name, a NUL) is refused in one line
    before any work, instead of failing with ENAMETOOLONG halfway."""
    for dest, opt in PATH_ARGS.items():
        v = getattr(args, dest, None)
        if not isinstance(v, (str, Path)):
            continue
        text = str(v)
        raw = os.fsencode(text)
        shown = text if len(text) <= 60 else text[:40] + "..." + text[-12:]
        if b"\0" in raw:
            raise SpecError(None, None, opt, f"expected a path, got one with a NUL character: {shown!r}")
        longest = max((len(c) for c in raw.split(b"/")), default=0)
        if longest > MAX_PATH_NAME:
            raise SpecError(None, None, opt, f"expected file and folder names of at most {MAX_PATH_NAME} bytes, "
                                             f"got one of {longest}: {shown!r}")
        if len(raw) > MAX_PATH:
            raise SpecError(None, None, opt, f"expected a path of at most {MAX_PATH} bytes, got {len(raw)}")


def _check_new_output(args) -> None:
    """plan and export never replace an existing file unless --force is given."""
    if args.command not in _FILE_OUTPUTS:
        return
    out = getattr(args, "output", None)
    if out is not None and not str(out).strip():
        raise SpecError(None, None, "-o", "expected a file name, got an empty string")
    if out and Path(out).is_file() and not getattr(args, "force", False):
        raise SpecError(str(out), None, "-o", "expected a new file: it exists (add --force to overwrite it)")


def _jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dict__"):
        return o.__dict__
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
