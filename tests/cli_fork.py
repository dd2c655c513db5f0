"""Run the `bapipe` console script many times without paying its imports each time.

A server process imports ``bapipe.cli`` and every subcommand's handler module once, then
forks one child per call. The child does what the installed console script does
(``sys.argv = ["bapipe", *args]; sys.exit(main())``) in its own process, with its own cwd,
environment, stdin from /dev/null and file descriptors 1 and 2 captured (so the output of
anything it starts is captured too, as with ``subprocess.run(capture_output=True)``). An
uncaught exception prints its traceback and exits 1, as the interpreter would.

What differs from a fresh process: the handler modules are imported before the fork, with
the server's environment (the one the caller passes to every call). One call costs a fork
plus the command's own work (~60 ms of CPU for a refused `bapipe plan`) instead of also
starting Python and importing numpy and the toolkit (~0.5 s of CPU more).
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile

_SERVER = r'''
import atexit, importlib, json, os, signal, sys, tempfile, time, traceback
import bapipe.cli as cli
for _mod, _help in cli.COMMANDS.values():
    try:
        importlib.import_module(_mod)
    except ImportError:
        pass   # main() offers only the subcommands whose module is present
out = sys.stdout
out.write("ready\n")
out.flush()
for line in sys.stdin:
    req = json.loads(line)
    fo = tempfile.TemporaryFile()
    fe = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:   # the child: the console script
        code = 1
        try:
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(fo.fileno(), 1)
            os.dup2(fe.fileno(), 2)
            sys.stdin = open(0, closefd=False)
            sys.argv = ["bapipe", *req["args"]]
            try:
                code = cli.main()
            except SystemExit as e:
                code = e.code
            except BaseException:
                traceback.print_exc()
                code = 1
            if code is None:
                code = 0
            elif not isinstance(code, int):
                sys.stderr.write(str(code) + "\n")
                code = 1
            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + req["timeout"]
    status = None
    cpu = 0.0
    while status is None:
        done, st, ru = os.wait4(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
            cpu = ru.ru_utime + ru.ru_stime
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.005)
    fo.seek(0)
    fe.seek(0)
    res = {"returncode": status, "stdout": fo.read().decode("utf-8", "replace"),
           "stderr": fe.read().decode("utf-8", "replace"), "cpu_s": cpu}
    fo.close()
    fe.close()
    out.write(json.dumps(res) + "\n")
    out.flush()
'''


#: CPU seconds of the calls run so far in this process (user + system of each child and what
#: it waited for), which a profile of the tests can add to each test's own
child_cpu_s = 0.0


def _text(s: str) -> str:
    """Universal newlines, as subprocess.run(text=True) reads them."""
    return s.replace("\r\n", "\n").replace("\r", "\n")


class ForkServer:
    """``run(args, cwd, timeout)`` -> subprocess.CompletedProcess of one `bapipe` call."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=self.env,
                                     cwd=tempfile.gettempdir())
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the bapipe fork server did not start (exit {self.proc.wait()})")

    def run(self, args: list[str], cwd, timeout: float = 120) -> subprocess.CompletedProcess:
        req = {"args": [str(a) for a in args], "cwd": str(cwd), "env": self.env, "timeout": timeout}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        res = json.loads(self.proc.stdout.readline())
        global child_cpu_s
        child_cpu_s += res["cpu_s"]
        if res["returncode"] == "timeout":
            raise subprocess.TimeoutExpired(["bapipe", *args], timeout)
        return subprocess.CompletedProcess(["bapipe", *args], res["returncode"], _text(res["stdout"]),
                                           _text(res["stderr"]))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def __del__(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:   # the server ends when its stdin closes
            proc.stdin.close()


_shared: ForkServer | None = None


@atexit.register
def _close_shared() -> None:
    """Wait for the shared server at exit, so its CPU time is counted with this process's."""
    if _shared is not None and _shared.proc.poll() is None:
        _shared.close()


def bapipe(*args, cwd=None, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    """`bapipe *args` as ``subprocess.run([sys.executable, "-m", "bapipe.cli", *args],
    capture_output=True, text=True, check=check)`` runs it (this process's cwd and environment
    at the time of the call), through one fork server per test process."""
    global _shared
    if _shared is None or _shared.proc.poll() is not None:
        _shared = ForkServer(dict(os.environ))
    _shared.env = dict(os.environ)
    r = _shared.run([str(a) for a in args], os.getcwd() if cwd is None else cwd, timeout)
    if check:
        r.check_returncode()
    return r
