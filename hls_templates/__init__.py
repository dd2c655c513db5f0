"""Jinja templates, layout only (no decisions): ``hls/`` the Vitis HLS kernels, their library
headers, testbenches and project files; ``rtl/`` the Verilog engines, stream glue, network
transport, board tops, packaged-kernel wrappers and training engines; ``harness/`` the
Verilator C++ harness. Each kind is split into subfolders by concern; templates are named by
file name alone (a loader searches the kind's subfolders), so a template can move between
subfolders without its callers changing."""
from __future__ import annotations

from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parent


def folders(kind: str) -> list[str]:
    """The search path of one kind (``hls``, ``rtl`` or ``harness``): its folder and subfolders."""
    base = ROOT / kind
    return [str(base)] + sorted(str(p) for p in base.iterdir() if p.is_dir())


def loader(kind: str) -> jinja2.FileSystemLoader:
    """A loader finding a template of ``kind`` by its file name in any of its subfolders."""
    return jinja2.FileSystemLoader(folders(kind))
