"""The `bapipe` command line.

Each subcommand's work lives in the module that owns it (planner, fpga_models, codegen,
host) and is imported lazily; a subcommand is offered only when its module is present.
The commands of the Python API (plan, profile, sim, gen, csim, rtlsim, synth, run) go
through bapipe.api.invoke, the others through their module's ``cmd_<name>(args) -> dict``;
either way the module's ``show_<name>(result) -> str`` prints it for humans. Bad input
raises SpecError: one line, exit 2. Exit codes: 0 done, 1 a check failed (csim/rtlsim
mismatch, a failed worker), 2 bad input or a missing tool/extra, 130 interrupted, 143 SIGTERM.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

from .errors import SpecError
from .options import EXIT_CODES, MAX_GLOBAL_BATCH, SCHEDULE_CHOICES, add_args  # noqa: F401 (the CLI contract)

#: commands whose -o names one file that is not overwritten without --force
_FILE_OUTPUTS = ("plan", "export")

# name -> (handler module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("fpga_models.cli_info", "list the model zoo"),
    "boards": ("fpga_models.cli_info", "list the board catalog"),
    "clusters": ("fpga_models.cli_info", "list the built-in clusters"),
    "profile": ("fpga_models.cli_info", "per-layer cost of MODEL on each board type of CLUSTER"),
    "plan": ("planner.cli_plan", "plan pipeline-parallel training/inference of MODEL on CLUSTER"),
    "sim": ("fpga_models.cli_sim", "event replay of a plan's schedule (its stage times and links)"),
    "reshard": ("planner.cli_reshard", "plan one cross-mesh resharding"),
    "gen": ("codegen.cli_gen", "generate the HLS/RTL project of a plan"),
    "csim": ("codegen.cli_csim", "g++ C-simulation of every generated stage against numpy"),
    "rtlsim": ("codegen.cli_rtlsim", "Verilator run of the generated multi-board pipeline"),
    "synth": ("codegen.cli_synth", "yosys synth_xilinx resource counts of the generated RTL"),
    "run": ("host.cli_run", "run a plan's schedule on a backend (numpy, verilator, xrt)"),
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
                or action.default == [] or action.nargs == 0:   # a flag (--no-stages): on or off, no default
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with only the subcommands whose modules exist."""
    parser = _Parser(prog="bapipe", description="BaPipe: plan, simulate, generate and run pipeline-parallel "
                                                 "DNN training on FPGA clusters.", epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"bapipe {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (_, help_) in COMMANDS.items():
        if not _available(name):
            continue
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=_Formatter, epilog=EXIT_CODES)
        add_args(name, p)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bapipe` console script."""
    from .toolchain import wire_verilator

    wire_verilator()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    mod = importlib.import_module(COMMANDS[args.command][0])
    previous = _handle_sigterm()
    try:
        _check_new_output(args)
        _check_dependent(parser, args, list(sys.argv[1:] if argv is None else argv))
        result, rc = _call(mod, args)
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
    finally:
        signal.signal(signal.SIGTERM, previous)
    if text:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return rc


def _call(mod, args) -> tuple[dict, int]:
    """Run the command: through the Python API (bapipe.api.invoke: one code path for both) for
    the commands it has, else the module's ``cmd_<name>`` handler. The --json object and exit status."""
    from . import api

    if args.command in api.COMMANDS:
        return api.invoke(args.command, args)
    result = getattr(mod, "cmd_" + args.command.replace("-", "_"))(args)
    return result if isinstance(result, tuple) else (result, 0)


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
        raise Terminated()

    return signal.signal(signal.SIGTERM, on_term)


#: options that act only together with another: (command, dest, option, applies(args), what it needs).
#: Given where they do nothing, they are refused in one line instead of silently ignored.
_DEPENDENT = (
    ("run", "build", "--build", lambda a: a.backend in ("verilator", "xrt"),
     "applies to --backend verilator or xrt (the numpy backend uses no generated project)"),
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
