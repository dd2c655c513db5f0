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
import threading
from pathlib import Path

from .errors import BapipeError, SpecError
from .options import EXIT_CODES, MAX_GLOBAL_BATCH, SCHEDULE_CHOICES, add_args  # noqa: F401 (the CLI contract)

#: commands whose -o names one file that is not overwritten without --force
_FILE_OUTPUTS = ("plan", "export")

# name -> (handler module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("bapipe.fpga_models.cli_info", "list the model zoo"),
    "boards": ("bapipe.fpga_models.cli_info", "list the board catalog"),
    "clusters": ("bapipe.fpga_models.cli_info", "list the built-in clusters"),
    "profile": ("bapipe.fpga_models.cli_info", "per-layer cost of MODEL on each board type of CLUSTER"),
    "plan": ("bapipe.planner.cli_plan", "plan pipeline-parallel training/inference of MODEL on CLUSTER"),
    "sim": ("bapipe.fpga_models.cli_sim", "event replay of a plan's schedule (its stage times and links)"),
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
    """Entry point of the `bapipe` console script.

    Ctrl-C and SIGTERM at any moment, also while the command's modules are still being
    imported, end it with one line and exit 130 / 143 (no traceback). The handlers are
    installed and removed inside the ``try`` (with both signals blocked while they change), so
    no moment is left where a signal would raise outside it."""
    global _stopping, _told
    _stopping = _told = False   # (the API and the tests call main more than once in one process)
    if "bapipe.proc" in sys.modules:
        sys.modules["bapipe.proc"].reset()
    main_thread = threading.current_thread() is threading.main_thread()
    previous, previous_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    previous_hook = sys.unraisablehook
    try:
        if main_thread:
            with _blocked():
                _handle_sigterm()
                if previous_int is not signal.SIG_IGN:   # an ignored Ctrl-C stays ignored: nohup, &
                    signal.signal(signal.SIGINT, _on_sigint)
                sys.unraisablehook = _resend_if_swallowed(previous_hook)
        return _main(argv)
    except Terminated:   # before or after the command ran (its own handler names it)
        _say("bapipe: terminated (SIGTERM)")
        return 143
    except KeyboardInterrupt:
        _say("bapipe: interrupted")
        return 130
    finally:
        if main_thread:
            # blocked: a signal now waits for the previous handler (the console script's
            # _early_exit: one line), instead of raising here, outside every except
            with _blocked():
                signal.signal(signal.SIGTERM, previous)
                if signal.getsignal(signal.SIGINT) is _on_sigint:
                    signal.signal(signal.SIGINT, previous_int)
                sys.unraisablehook = previous_hook


#: set by the first SIGINT / SIGTERM of a command: the unwinding has begun
_stopping = False
#: the command's closing line on stderr was written (an interrupt after it adds no second one)
_told = False
#: the unraisable hook is running (a signal handled there must not raise: it would be lost)
_in_hook = False


def _say(line: str) -> None:
    """Write the command's one closing line on stderr, unless one was written already."""
    global _told
    if not _told:
        _told = True
        sys.stderr.write(line + "\n")


class _blocked:
    """SIGINT and SIGTERM held back for a few statements (delivered right after the block)."""

    def __enter__(self):
        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


def _stop_children(signum: int) -> bool:
    """What both handlers do first: kill every compiler and simulator (any thread's). False when
    the signal must wait (a child is being started; bapipe.proc re-sends it once the child can
    be killed) or the command is already unwinding from an earlier signal (it would only
    interrupt the cleanup: a second Ctrl-C left the hidden .gen-PID folder behind)."""
    global _stopping
    if _in_hook:   # inside _resend_if_swallowed's hook: raising here would be dropped; try again later
        _send_later(signum)
        return False
    # no import here: a signal during an import (of subprocess, by bapipe.proc) would import
    # a half-initialised module; a command that never imported bapipe.proc started no child
    # (getattr: bapipe.proc may itself be half imported, and then has started nothing)
    proc = sys.modules.get("bapipe.proc")
    if getattr(proc, "defer", None) is not None and proc.defer(signum):
        return False
    if getattr(proc, "stop_all", None) is not None:
        proc.stop_all()
    if _stopping:
        return False
    _stopping = True
    return True


def _resend_if_swallowed(previous_hook):
    """A sys.unraisablehook that gives a swallowed interrupt a second chance.

    A handler runs in whatever Python code is executing when the signal comes, and some code
    cannot raise: an exception in a weakref callback or a ``__del__`` is printed as
    "Exception ignored in ..." and dropped. A SIGTERM landing in importlib's module-lock
    callback was lost that way (gen finished, exit 0, a traceback on stderr). Such an
    interrupt is not shown; the signal is sent again from a helper thread once this hook has
    returned (sent from here, it would be handled inside the hook and dropped again)."""
    def hook(u):
        global _stopping, _in_hook
        if isinstance(u.exc_value, KeyboardInterrupt) and _stopping:
            _in_hook = True   # a signal handled inside this hook would be dropped too: see _stop_children
            _stopping = False
            _send_later(signal.SIGTERM if isinstance(u.exc_value, Terminated) else signal.SIGINT)
            _in_hook = False   # (nothing between this and the return runs a handler)
            return
        previous_hook(u)
    return hook


def _send_later(sig: int) -> None:
    """Send ``sig`` to this process from a helper thread, a few milliseconds from now: the main
    thread has left the unraisable hook by then, or the handler sends it once more."""
    def send():
        import time

        time.sleep(0.005)
        os.kill(os.getpid(), sig)

    threading.Thread(target=send, daemon=True).start()


def _on_sigint(signum, frame):
    """Ctrl-C: stop every compiler and simulator first (any thread's), then unwind as usual."""
    if _stop_children(signum):
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
    try:
        _check_paths(args)
        _check_new_output(args)
        _check_dependent(parser, args, list(sys.argv[1:] if argv is None else argv))
        result, rc = _call(mod, args)
        if args.json:
            text = json.dumps(result, default=_jsonable)
        else:  # formatting is inside the try too: a show_* bug must not print a traceback
            show = getattr(mod, "show_" + args.command.replace("-", "_"), None) or getattr(mod, "show", None)
            text = show(result) if show else json.dumps(result, indent=2, default=_jsonable)
    except SpecError as e:
        _say(str(e))
        return 2
    except BapipeError as e:   # raised on purpose (a missing extra, a failed run): its line, its code
        _say(f"bapipe {args.command}: {e}")
        return e.exit_code
    except Terminated:
        _say(f"bapipe {args.command}: terminated (SIGTERM)")
        return 143
    except KeyboardInterrupt:
        _say(f"bapipe {args.command}: interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal bug, not bad input: still one line unless debugging
        if os.environ.get("BAPIPE_DEBUG"):
            raise
        _say(f"bapipe {args.command}: internal error: {type(e).__name__}: {e} "
             f"(set BAPIPE_DEBUG=1 for the traceback)")
        return 1
    if text:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return rc


def _call(mod, args) -> tuple[dict, int]:
    """Run the command: through the Python API (bapipe.api.invoke: one code path for both) for
    the commands it has, else the module's ``cmd_<name>`` handler. The --json object and exit status."""
    from . import api

    # profile --measure and run --backend torch have their own results (host.cli_profile, host.cli_run)
    own = getattr(args, "measure", None) or (args.command == "run" and getattr(args, "backend", None) == "torch")
    if args.command in api.COMMANDS and not own:
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
        if _stop_children(signum):   # compilers and simulators of every thread, before the main thread unwinds
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
    # refused before the work, not after it (a plan can take seconds to search)
    if out and Path(out).is_dir():
        raise SpecError(str(out), None, "-o", "expected a file name, got a folder")
    parent = Path(out).parent if out else None
    if parent is not None and not parent.is_dir():
        raise SpecError(str(out), None, "-o", f"expected a file in an existing folder: {parent} is not one")


def _jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dict__"):
        return o.__dict__
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
