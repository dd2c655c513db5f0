"""Child processes that never outlive an interrupted command, and swaps a signal cannot cut.

A compiler is a tree of processes (g++ starts cc1plus and as; Verilator's build runs make,
which runs several g++). ``subprocess.run`` kills only the process it started when the
caller is interrupted, so Ctrl-C or SIGTERM during `bapipe csim` used to leave a cc1plus
running. ``run`` starts the child as the leader of its own process group and, whatever
ends the wait (Ctrl-C, SIGTERM raised as ``bapipe.cli.Terminated``, a timeout), kills the
whole group before the exception goes on. The group also keeps a terminal's Ctrl-C away
from the children: the command decides what stops, and stops all of it.

Every live group is also registered: ``kill_all`` (called by bapipe.cli's SIGINT and SIGTERM
handlers before they raise) stops the ones started by other threads too, such as rtlsim's
pipeline build that runs beside its stage benches, which an exception in the main thread
does not reach (the thread pool would wait for the build to finish).

``signals_held`` defers SIGINT and SIGTERM while a few file-system steps that must happen
together run (the swap of a finished build into place and the removal of the old one);
the signal is delivered, and handled as usual, right after.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

_live: set[subprocess.Popen] = set()
_lock = threading.Lock()


def kill_all() -> None:
    """Kill every process group ``run`` has started and not yet seen end (any thread's)."""
    with _lock:
        procs = list(_live)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process in its group (it was started by ``run``), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(Exception):
        proc.kill()
    proc.wait()


def run(cmd, *, input=None, timeout: float | None = None, capture_output: bool = False,
        **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, ...)`` with the child in its own process group, killed with all
    its descendants if the wait ends by an exception (module docstring). Raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds, as subprocess.run does."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    kw.setdefault("start_new_session", True)
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    with subprocess.Popen(cmd, **kw) as proc:
        with _lock:
            _live.add(proc)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            kill_group(proc)
            raise
        finally:
            with _lock:
                _live.discard(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextlib.contextmanager
def signals_held():
    """Defer SIGINT and SIGTERM for the duration of the block (main thread only; elsewhere
    a no-op, as Python runs signal handlers in the main thread anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
