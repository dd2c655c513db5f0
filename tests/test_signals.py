"""Ctrl-C and SIGTERM at any moment (issue 38): one line, exit 130 / 143, no traceback, no
child left running (g++'s cc1plus, Verilator's make and compilers), no hidden leftovers.

Each case starts the console script, waits until the toolkit's first code has run (the
process catches SIGTERM: bapipe/__init__.py's handler, installed before anything else is
imported), sends the signal after a further delay (at once, during the imports, the
command's work, a compiler run, the final swap of a build) and checks what is left. Before
that moment Python itself is starting (its ``site`` imports, ~30-120 ms here); a signal
then is the interpreter's to handle, not the toolkit's. The delays are moments, not
guarantees: on a loaded machine a command may still be importing at 0.5 s; every moment
must end the same way.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
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
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((l for l in (d / "status").read_text().splitlines() if l.startswith("State:")), "")
        except OSError:
            continue
        if marker in cmd and "zombie" not in state:
            out.append(cmd[:200])
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
@pytest.mark.parametrize("after_s", [0.0, 0.25])
def test_signal_while_starting(tmp_path, sig, after_s):
    """At the toolkit's first instruction and during its imports: one line, 130 / 143."""
    rc, err, _ = _interrupt(["plan", "tiny-mlp", "4xU250-ring", "-o", tmp_path / "p.yaml"], tmp_path, sig, after_s,
                            _env(tmp_path))
    _check(rc, err, sig, f"plan at {after_s}s")
    assert rc != 0 or (tmp_path / "p.yaml").exists()


@pytest.fixture(scope="module")
def tiny_cnn_plan(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sigplan")
    r = subprocess.run([BAPIPE, "plan", "tiny-cnn", "4xU250-ring", "--no-replication", "-o", d / "plan.yaml"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d / "plan.yaml"


@pytest.mark.slow   # 6 runs of gen of about 2 s each
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
@pytest.mark.parametrize("after_s", [0.3, 1.0, 1.8])
def test_signal_during_gen_force_keeps_the_previous_build(tmp_path, tiny_cnn_plan, sig, after_s):
    """`gen --force` over an existing build, interrupted: the previous build is still there
    whole (or the new one, if it finished), and no hidden .build.gen-PID / .build.old-PID."""
    env = _env(tmp_path)
    r = subprocess.run([BAPIPE, "gen", tiny_cnn_plan, "-o", "build"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rc, err, _ = _interrupt(["gen", tiny_cnn_plan, "-o", "build", "--force"], tmp_path, sig, after_s, env)
    _check(rc, err, sig, f"gen at {after_s}s")
    assert (tmp_path / "build" / "bapipe-build.json").is_file()
    _no_leftovers(tmp_path, str(tmp_path))


@pytest.mark.slow
@pytest.mark.csim
@pytest.mark.parametrize("sig, after_s", [(signal.SIGTERM, 1.5), (signal.SIGINT, 4.0)], ids=["TERM-1.5s", "INT-4s"])
def test_signal_during_csim_stops_the_compiler(tmp_path, tiny_cnn_plan, sig, after_s):
    """csim compiles with g++ (cc1plus does the work): interrupted, none of them runs on."""
    env = _env(tmp_path)
    r = subprocess.run([BAPIPE, "gen", tiny_cnn_plan, "-o", "build"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rc, err, stop_s = _interrupt(["csim", "build"], tmp_path, sig, after_s, env)
    _check(rc, err, sig, f"csim at {after_s}s")
    assert rc != 0, "csim finished before the signal: move the moment earlier"
    assert stop_s < 10
    _no_leftovers(tmp_path, str(tmp_path))


@pytest.mark.slow
@pytest.mark.verilator
@pytest.mark.parametrize("sig, after_s", [(signal.SIGINT, 1.5), (signal.SIGTERM, 5.0)], ids=["INT-1.5s", "TERM-5s"])
def test_signal_during_rtlsim_stops_verilator(tmp_path, tiny_cnn_plan, sig, after_s):
    """rtlsim builds the pipeline with Verilator (make and g++): interrupted, none runs on."""
    env = _env(tmp_path)
    r = subprocess.run([BAPIPE, "gen", tiny_cnn_plan, "-o", "build"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rc, err, stop_s = _interrupt(["rtlsim", "build"], tmp_path, sig, after_s, env)
    _check(rc, err, sig, f"rtlsim at {after_s}s")
    assert rc != 0, "rtlsim finished before the signal: move the moment earlier"
    assert stop_s < 10
    _no_leftovers(tmp_path, str(tmp_path))
