"""Child processes that never outlive an interrupted command, and swaps a signal cannot cut.

A compiler is a tree of processes (g++ starts cc1plus and as; Verilator's build runs make,
which runs several g++). ``subprocess.run`` kills only the process it started when the
caller is interrupted, so Ctrl-C or SIGTERM during `bapipe csim` used to leave a cc1plus
running. ``run`` starts the child as the leader of its own process group and, whatever
ends the wait (Ctrl-C, SIGTERM raised as ``bapipe.cli.Terminated``, a timeout), kills the
whole group before the exception goes on. The group also keeps a terminal's Ctrl-C away
from the children: the command decides what stops, and stops all of it.

Every live group is also registered: ``stop_all`` (called by bapipe.cli's SIGINT and SIGTERM
handlers before they raise) kills the ones started by other threads too, such as rtlsim's
pipeline build that runs beside its stage benches, which an exception in the main thread
does not reach (the thread pool would wait for the build to finish), and no child starts
after it. A child being started (inside ``subprocess.Popen``, not yet registered) cannot be
killed by it: a signal then is deferred (``defer``) and re-sent to this process as soon as
the child is registered, so it is killed with the rest instead of outliving the command.

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
# reentrant: the signal handlers run in the main thread and take it, possibly while the main
# thread holds it (a plain Lock would deadlock there)
_lock = threading.RLock()
#: set by stop_all: the command is stopping, no further child may start
_stopping = False
#: children being started now (any thread): a signal meanwhile waits in _pending
_starting = 0
_pending: list[int] = []


def reset() -> None:
    """A new command in this process (bapipe.cli.main): children may start again."""
    global _stopping
    with _lock:
        _stopping = False
        _pending.clear()


def defer(signum: int) -> bool:
    """True when a child is being started: ``signum`` is kept and re-sent to this process once
    the child is registered (bapipe.cli's handlers then return without acting)."""
    with _lock:
        if _starting:
            _pending.append(signum)
            return True
    return False


def stop_all() -> None:
    """The command is stopping (SIGINT, SIGTERM): no child starts from now on, and every live
    process group is killed."""
    global _stopping
    _stopping = True
    kill_all()


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
    proc = _start(cmd, kw)
    try:
        with proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except BaseException:
                kill_group(proc)
                raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        with _lock:
            _live.discard(proc)


def _start(cmd, kw: dict) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kw)``, registered before a signal is acted on (module docstring)."""
    global _starting
    with _lock:
        if _stopping:
            raise ChildProcessError(f"not starting {_cmd_text(cmd)}: the command is stopping")
        _starting += 1
    try:
        proc = subprocess.Popen(cmd, **kw)
        with _lock:
            _live.add(proc)
    finally:
        with _lock:
            _starting -= 1
            sig = _pending[0] if _pending and not _starting else None
            if sig is not None:
                _pending.clear()
        if sig is not None:   # deferred while the child started: handled now, the child is killed with the rest
            os.kill(os.getpid(), sig)
    return proc


def _cmd_text(cmd) -> str:
    """``cmd`` shortened for a message."""
    text = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
    return text if len(text) <= 80 else text[:77] + "..."


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
