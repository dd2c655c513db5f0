"""Ctrl-C and SIGTERM at any moment (issue 38): one line, exit 130 / 143, no traceback, no
child left running (g++'s cc1plus, Verilator's make and compilers), no hidden leftovers.

Each case starts the console script, waits until the toolkit's first code has run (the
process catches SIGTERM: bapipe/__init__.py's handler, installed before anything else is
imported) and sends the signal at a moment: at once, after a delay (the imports), or when
the world shows the command at a given step (gen's hidden folder appears, its stamp is
written; a compiler or Verilator's make runs on the case's folder), so the moments hold on
a loaded machine too. Before the toolkit's first instruction Python itself is starting (its
``site`` imports, ~30-120 ms here); a signal then is the interpreter's to handle, not the
toolkit's. Moments that random sweeps hit once in a hundred runs (a signal during an import,
inside a weakref callback, while a child is being started, during the cleanup) are placed
exactly at the end, by a stand-in for the command's work.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

BAPIPE = str(Path(sys.executable).with_name("bapipe"))
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "BAPIPE_DEBUG"}
    env["BAPIPE_CSIM_CACHE"] = str(tmp_path / "cache")   # a cold cache: the compilers run
    return env


def _stray(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (a test's own folder)."""
    return [cmd for _pid, cmd in _stray_pids(marker)]


def _stray_pids(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes that mention ``marker``. The tests poll this every
    10 ms while a command runs, so it reads a process's status only when its command line matches
    (reading both for every process cost a core while polling: 45 s of CPU in one rtlsim case)."""
    out, me, key = [], os.getpid(), marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                raw = f.read().replace(b"\0", b" ")
            if key not in raw:
                continue
            with open(f"/proc/{name}/status", encoding="utf-8", errors="replace") as f:
                state = next((l for l in f if l.startswith("State:")), "")
        except OSError:
            continue
        if "zombie" not in state:
            out.append((int(name), raw.decode(errors="replace")[:200]))
    return out


def _interrupt(args, cwd: Path, sig: int, after_s: float, env: dict) -> tuple[int, str, float]:
    """Start ``bapipe ARGS``, send ``sig`` after ``after_s`` seconds (unless it ended); returns
    (exit code, stderr, seconds it took to stop after the signal)."""
    # a suite started in the background inherits an ignored SIGINT, which the command keeps
    # ignoring (as it should: nohup, &): give the child the default a terminal would
    p = subprocess.Popen([BAPIPE, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_toolkit(p)
    time.sleep(after_s)
    t0 = time.perf_counter()
    if p.poll() is None:
        p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, err, time.perf_counter() - t0


def _wait_for_toolkit(p: subprocess.Popen) -> None:
    """Until ``p`` catches SIGTERM (bit 15 of SigCgt in /proc/PID/status) or ends."""
    deadline = time.time() + 20
    while p.poll() is None and time.time() < deadline:
        try:
            cgt = next(l for l in Path(f"/proc/{p.pid}/status").read_text().splitlines() if l.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return
        if int(cgt.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.002)


def _check(rc: int, err: str, sig: int, what: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, (what, err)
    if rc == 0:   # it finished before the signal came: fine, nothing to check
        return
    assert rc == EXIT[sig], (what, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ("interrupted" in lines[0] or "terminated" in lines[0]), (what, err)


def _no_leftovers(folder: Path, marker: str) -> None:
    deadline = time.time() + 5
    while _stray(marker) and time.time() < deadline:   # a killed group is reaped by init, not at once
        time.sleep(0.1)
    assert _stray(marker) == []
    hidden = [p.name for p in folder.iterdir() if p.name.startswith(".") and (".gen-" in p.name or ".old-" in p.name)]
    assert hidden == []
    tmp = [str(p) for p in (folder / "cache").rglob("*.tmp")] if (folder / "cache").exists() else []
    assert tmp == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
@pytest.mark.parametrize("after_s", [0.0, 0.1, 0.15, 0.25])   # the issue: Ctrl-C in the first 0.1-0.2 s
def test_signal_while_starting(tmp_path, sig, after_s):
    """At the toolkit's first instruction and during its imports: one line, 130 / 143."""
    rc, err, _ = _interrupt(["plan", "tiny-mlp", "4xU250-ring", "-o", tmp_path / "p.yaml"], tmp_path, sig, after_s,
                            _env(tmp_path))
    _check(rc, err, sig, f"plan at {after_s}s")
    assert rc != 0 or (tmp_path / "p.yaml").exists()


@pytest.fixture(scope="module")
def tiny_cnn_build(tmp_path_factory) -> Path:
    """tiny-cnn's training plan (one board) and its build, made once; each case copies the build."""
    d = tmp_path_factory.mktemp("sigplan")
    for args in (["plan", "tiny-cnn", "4xU250-ring", "--no-replication", "-o", d / "plan.yaml"],
                 ["gen", d / "plan.yaml", "-o", d / "build"]):
        r = subprocess.run([BAPIPE, *map(str, args)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return d


def _interrupt_at(args, cwd: Path, sig: int, moment, env: dict) -> tuple[int, str, list[str]]:
    """Start ``bapipe ARGS`` in ``cwd``, send ``sig`` at ``moment`` (a test of the world, polled
    every 10 ms once the toolkit's handler is in: a folder appears, a compiler runs); returns
    (exit code, stderr, processes left that mention ``cwd``). The leftovers are read as soon as
    the command has ended, before its pipes are drained: a child left holding them would
    otherwise make the wait last as long as the child, and be gone when looked for."""
    p = subprocess.Popen([BAPIPE, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    drained: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, f=f: drained.__setitem__(n, f.read()), daemon=True)
               for n, f in (("out", p.stdout), ("err", p.stderr))]
    for t in readers:
        t.start()
    _wait_for_toolkit(p)
    deadline = time.time() + 300
    while p.poll() is None and not moment() and time.time() < deadline:
        time.sleep(0.01)
    if p.poll() is None:
        p.send_signal(sig)
    p.wait(timeout=120)
    deadline = time.time() + 5
    while _stray(str(cwd)) and time.time() < deadline:   # a killed group is reaped by init, not at once
        time.sleep(0.1)
    left = _stray(str(cwd))
    for pid, _cmd in _stray_pids(str(cwd)):   # don't leave them to the next test
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for t in readers:
        t.join(timeout=60)
    return p.returncode, drained.get("err", ""), left


def _hidden(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".") and (".gen-" in p.name or ".old-" in p.name)]


def _case(tmp_path: Path, tiny_cnn_build: Path) -> dict:
    shutil.copytree(tiny_cnn_build / "build", tmp_path / "build")
    shutil.copy(tiny_cnn_build / "plan.yaml", tmp_path / "plan.yaml")
    return _env(tmp_path)


#: moments of `gen --force` over an existing build: its first instruction, while it renders
#: into the hidden .build.gen-PID folder, while it checks the finished files (the stamp is
#: written, the physical-rules check runs; the swap after it holds signals)
GEN_MOMENTS = {
    "start": lambda d: True,
    "rendering": lambda d: any(d.glob(".build.gen-*")),
    "checking": lambda d: any(d.glob(".build.gen-*/bapipe-build.json")),
}


@pytest.mark.slow   # one gen, then 6 interrupted ones (each up to ~2 s)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
@pytest.mark.parametrize("moment", list(GEN_MOMENTS))
def test_signal_during_gen_force_keeps_the_previous_build(tmp_path, tiny_cnn_build, sig, moment):
    """`gen --force` over an existing build, interrupted: the previous build is still there
    whole (or the new one, if it finished), and no hidden .build.gen-PID / .build.old-PID."""
    env = _case(tmp_path, tiny_cnn_build)
    before = (tmp_path / "build" / "bapipe-build.json").read_text()
    rc, err, left = _interrupt_at(["gen", "plan.yaml", "-o", "build", "--force"], tmp_path, sig,
                                  lambda: GEN_MOMENTS[moment](tmp_path), env)
    _check(rc, err, sig, f"gen at {moment}")
    assert left == [] and _hidden(tmp_path) == []
    stamp = tmp_path / "build" / "bapipe-build.json"
    assert stamp.is_file() and (rc == 0 or stamp.read_text() == before)


def _compiling(d: Path) -> bool:
    """A compiler or Verilator's make works on the case's folder (its command line names it)."""
    return bool(_stray(str(d)))


@pytest.mark.slow
@pytest.mark.csim
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
@pytest.mark.parametrize("moment", ["start", "compiling"])
def test_signal_during_csim_stops_the_compiler(tmp_path, tiny_cnn_build, sig, moment):
    """csim compiles with g++ (cc1plus does the work): interrupted, none of them runs on."""
    env = _case(tmp_path, tiny_cnn_build)
    when = (lambda: True) if moment == "start" else (lambda: _compiling(tmp_path))
    rc, err, left = _interrupt_at(["csim", "build"], tmp_path, sig, when, env)
    _check(rc, err, sig, f"csim at {moment}")
    assert rc != 0, "csim finished before the signal"
    assert left == [] and _hidden(tmp_path) == []
    assert [str(p) for p in (tmp_path / "cache").rglob("*.tmp")] == []   # no half-written binary


@pytest.mark.slow
@pytest.mark.verilator
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
@pytest.mark.parametrize("moment", ["start", "compiling"])
def test_signal_during_rtlsim_stops_verilator(tmp_path, tiny_cnn_build, sig, moment):
    """rtlsim builds the pipeline with Verilator (make and g++): interrupted, none runs on."""
    env = _case(tmp_path, tiny_cnn_build)
    when = (lambda: True) if moment == "start" else (lambda: _compiling(tmp_path))
    rc, err, left = _interrupt_at(["rtlsim", "build"], tmp_path, sig, when, env)
    _check(rc, err, sig, f"rtlsim at {moment}")
    assert rc != 0, "rtlsim finished before the signal"
    assert left == [] and _hidden(tmp_path) == []


# ---------------------------------------------------------------- moments placed exactly
# Random moments found these (1 in 120 to 1 in 150 interrupted gens); each is now placed
# exactly by a stand-in for the command's work (bapipe.cli._main replaced in a fresh Python),
# so the test fails on every run if the handling breaks.

def _scripted(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run bapipe.cli.main in a fresh Python with ``_main`` replaced by ``body`` (a function
    body; ``os``, ``signal``, ``sys``, ``Path`` and ``TMP`` are in scope)."""
    code = ("import os, signal, sys\nfrom pathlib import Path\nimport bapipe.cli as cli\nTMP = Path(sys.argv[1])\n"
            "def fake(argv):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
            + "cli._main = fake\nsys.exit(cli.main([]))\n")
    env = {k: v for k, v in os.environ.items() if k != "BAPIPE_DEBUG"}
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _one_line(r: subprocess.CompletedProcess, rc: int, word: str) -> None:
    assert r.returncode == rc and "Traceback" not in r.stderr and "Exception" not in r.stderr, (r.returncode, r.stderr)
    assert r.stderr.strip().splitlines() == [f"bapipe: {word}"], r.stderr


def _spin() -> str:
    # a few bytecodes after os.kill, so that Python runs the handler right there
    return "[0 for _ in range(100)]"   # a Python loop: its backward jumps run pending handlers


def test_signal_while_bapipe_proc_is_half_imported(tmp_path):
    """The handler looked up bapipe.proc while it was being imported (gen's first import of it):
    AttributeError 'partially initialized module' and a traceback; before that, it imported
    bapipe.proc itself in the middle of subprocess's own import."""
    r = _scripted(tmp_path, f"""
import types
sys.modules['bapipe.proc'] = types.ModuleType('bapipe.proc')   # as during its first lines
os.kill(os.getpid(), signal.SIGINT)
{_spin()}
return 0""")
    _one_line(r, 130, "interrupted")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_signal_inside_a_weakref_callback_is_not_lost(tmp_path, sig):
    """A SIGTERM handled inside a weakref callback (importlib's module-lock callback, during an
    import) raised where Python drops exceptions: 'Exception ignored in ...', then gen went on
    and exited 0. The swallowed interrupt is sent again and stops the command."""
    r = _scripted(tmp_path, f"""
import weakref, time
class A: pass
a = A()
def cb(_):
    os.kill(os.getpid(), {int(sig)})
    {_spin()}
keep = weakref.ref(a, cb)
del a
{_spin()}
time.sleep(5)
(TMP / 'finished').write_text('the interrupt was lost')
return 0""")
    _one_line(r, EXIT[sig], "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)")
    assert not (tmp_path / "finished").exists()


def test_signal_while_a_child_starts_kills_it(tmp_path):
    """A signal inside subprocess.Popen (the child forked, not yet registered) left the child
    running: the handler killed the registered groups only and the exception skipped the rest.
    The signal now waits until the child is registered, then it is killed with the others."""
    marker = f"bapipe-test-child-{os.getpid()}-{tmp_path.name}"
    r = _scripted(tmp_path, f"""
import subprocess
from bapipe import proc
real = subprocess.Popen
def popen(*a, **k):
    p = real(*a, **k)
    os.kill(os.getpid(), signal.SIGTERM)   # the child exists; Popen has not returned
    {_spin()}
    return p
subprocess.Popen = popen
# (not our stdout/stderr: a child holding them would make subprocess.run wait for it)
proc.run([sys.executable, '-c', 'import time; time.sleep(30)', {marker!r}], stdout=subprocess.DEVNULL,
         stderr=subprocess.DEVNULL)
(TMP / 'finished').write_text('the signal waited for the child')
return 0""")
    _one_line(r, 143, "terminated (SIGTERM)")
    _no_leftovers(tmp_path, marker)


def test_no_child_starts_once_the_command_stops(tmp_path):
    """After the first signal (a thread's compiler starting late: rtlsim's pipeline build), a
    new child is refused instead of running on while the command exits."""
    from bapipe import proc

    proc.stop_all()
    try:
        with pytest.raises(ChildProcessError, match="the command is stopping"):
            proc.run(["true"])
    finally:
        proc.reset()
    assert proc.run(["true"]).returncode == 0


def test_a_second_signal_does_not_cut_the_cleanup(tmp_path):
    """Ctrl-C, then SIGTERM while the command cleans up (gen removing its half-written folder):
    the second signal interrupted the cleanup and left the hidden folder behind. It is ignored
    now: the first one is already stopping everything (its children killed again)."""
    r = _scripted(tmp_path, f"""
(TMP / '.build.gen-1').mkdir()
try:
    os.kill(os.getpid(), signal.SIGINT)
    {_spin()}
finally:
    os.kill(os.getpid(), signal.SIGTERM)
    {_spin()}
    (TMP / '.build.gen-1').rmdir()
return 0""")
    _one_line(r, 130, "interrupted")
    assert not (tmp_path / ".build.gen-1").exists()
