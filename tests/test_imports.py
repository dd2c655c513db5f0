"""Imports point down the flow only: spec -> hardware models -> planner -> codegen -> host.

Every import in the product packages is read from the source (module level and inside
functions alike: a lazy import is still a dependency), and one that reaches a package later
in the flow than its own fails the test, naming file, line and target. The CLI entry points
(bapipe.cli, bapipe.demo), the Python API (bapipe.api) and the commands' arguments
(bapipe.options) dispatch to every command and are the only modules allowed to.
Command modules (``cli_*``) hold arguments, handlers and printing; library code does not
import them (it imports the library they call).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the flow, first to last: a package may import itself and packages before it
FLOW = ["bapipe", "fpga_models", "planner", "codegen", "host"]
#: entry points: parse arguments and call every package's handler
ENTRY_POINTS = {"bapipe/cli.py", "bapipe/demo.py", "bapipe/__main__.py", "bapipe/api.py", "bapipe/options.py"}
#: packages that are not product code and must not be imported by it
TEST_ONLY = {"tests", "cocotb_tests", "bench"}


def _imports(path: Path, root: Path):
    """(line, imported module) of every import statement in ``path`` (relative ones resolved)."""
    rel = path.relative_to(root)
    pkg = list(rel.parent.parts)
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.lineno, node.module


def violations(root: Path = ROOT) -> list[str]:
    """Every import under ``root`` that points up the flow or into test code, as
    'file:line: what'."""
    out = []
    for own in FLOW:
        for path in sorted((root / own).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ENTRY_POINTS:
                continue
            for line, mod in _imports(path, root):
                top = mod.split(".")[0]
                if top in TEST_ONLY:
                    out.append(f"{rel}:{line}: product code imports test code {mod}")
                elif mod.split(".")[-1].startswith("cli_") and not path.name.startswith("cli_"):
                    out.append(f"{rel}:{line}: a library imports the command module {mod}")
                elif top in FLOW and FLOW.index(top) > FLOW.index(own):
                    out.append(f"{rel}:{line}: {own} imports {mod}, later in the flow")
    return out


def test_imports_point_down_the_flow():
    assert violations() == []


def test_walk_finds_lazy_and_relative_imports(tmp_path):
    """The walk itself, on a made-up tree: a lazy upward import inside a function and a
    relative one are both found; a downward one and the entry point are not."""
    for pkg in FLOW:
        (tmp_path / pkg).mkdir()
    (tmp_path / "fpga_models" / "probe.py").write_text(
        "from bapipe.spec import Model\n"
        "def f():\n    from codegen.rtl import render_rtl\n    from ..host import driver\n")
    (tmp_path / "bapipe" / "cli.py").write_text("from host.driver import train\n")
    (tmp_path / "host" / "x.py").write_text("from cocotb_tests.plans import tiny_mlp_plan\n"
                                            "from codegen.cli_rtlsim import simulate\n")
    (tmp_path / "host" / "cli_y.py").write_text("from codegen.cli_gen import check_build\n")
    assert violations(tmp_path) == [
        "fpga_models/probe.py:3: fpga_models imports codegen.rtl, later in the flow",
        "fpga_models/probe.py:4: fpga_models imports host, later in the flow",
        "host/x.py:1: product code imports test code cocotb_tests.plans",
        "host/x.py:2: a library imports the command module codegen.cli_rtlsim"]
