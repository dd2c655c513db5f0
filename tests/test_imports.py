"""The import graph of the product: one top-level package, imports down the flow, no circle.

The installed package is ``bapipe``; the design card's folders are mapped under it
(``bapipe.fpga_models``, ``bapipe.planner``, ``bapipe.codegen``, ``bapipe.host``,
``bapipe.hls_templates``). Every import in the product folders is read from the source
(module level and inside functions alike: a lazy import is still a dependency) and checked:

- it names ``bapipe.*`` (never a bare ``codegen`` / ``planner`` / ...: those are not installed);
- it points down the flow: spec (``bapipe``) -> fpga_models -> planner -> codegen -> host, and
  inside codegen: design -> hls -> rtl -> package -> check -> the command modules;
- no module reaches a command module (``cli_*``) but the entry points and other commands;
- the module graph has no circle (Tarjan's strongly connected components).

The CLI entry points (bapipe.cli, bapipe.demo, bapipe.__main__), the Python API (bapipe.api) and
the commands' arguments (bapipe.options) dispatch to every command and are the only modules
allowed to point up.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the flow, first to last: folder -> its name under bapipe
FLOW = ["bapipe", "fpga_models", "planner", "codegen", "host", "hls_templates"]
#: codegen's rooms, first to last (modules directly in codegen/ are its commands: last)
ROOMS = ["design", "hls", "rtl", "package", "check", ""]
#: entry points: parse arguments and call every package's handler
ENTRY_POINTS = {"bapipe/cli.py", "bapipe/demo.py", "bapipe/__main__.py", "bapipe/api.py", "bapipe/options.py"}
#: packages that are not product code and must not be imported by it
TEST_ONLY = {"tests", "cocotb_tests", "bench"}
#: bare names that would only import from a source checkout, never from the installed package
NOT_INSTALLED = set(FLOW[1:])


def module_name(path: Path, root: Path) -> str:
    """'codegen/design/lower.py' -> 'bapipe.codegen.design.lower'."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "bapipe" else ["bapipe"] + parts)


def _imports(path: Path, root: Path):
    """(line, imported module, names) of every import statement in ``path`` (relative ones resolved)."""
    own = module_name(path, root).split(".")
    pkg = own if path.name == "__init__.py" else own[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else [])), \
                    tuple(a.name for a in node.names)
            else:
                yield node.lineno, node.module, tuple(a.name for a in node.names)


def _place(mod: str) -> tuple[int, int] | None:
    """(position in FLOW, room in codegen) of a bapipe module; None outside the product."""
    parts = mod.split(".")
    if parts[0] != "bapipe":
        return None
    if len(parts) == 1 or parts[1] not in FLOW[1:]:
        return 0, 0
    top = FLOW.index(parts[1])
    room = 0
    if parts[1] == "codegen" and len(parts) > 2:
        room = ROOMS.index(parts[2]) if parts[2] in ROOMS else len(ROOMS) - 1
    return top, room


def product_files(root: Path = ROOT) -> list[Path]:
    """Every Python file of the product folders."""
    return sorted(p for own in FLOW for p in (root / own).rglob("*.py"))


def violations(root: Path = ROOT) -> list[str]:
    """Every import under ``root`` that names an uninstalled top level, points up the flow or
    into test code, as 'file:line: what'."""
    out = []
    for path in product_files(root):
        rel = path.relative_to(root).as_posix()
        me = _place(module_name(path, root))
        for line, mod, _names in _imports(path, root):
            top = mod.split(".")[0]
            if top in TEST_ONLY:
                out.append(f"{rel}:{line}: product code imports test code {mod}")
            elif top in NOT_INSTALLED:
                out.append(f"{rel}:{line}: imports {mod}, which is not installed (bapipe.{mod})")
            elif rel in ENTRY_POINTS:
                continue
            elif mod.split(".")[-1].startswith("cli_") and not path.name.startswith("cli_"):
                out.append(f"{rel}:{line}: a library imports the command module {mod}")
            elif _place(mod) is not None and _place(mod) > me:
                out.append(f"{rel}:{line}: {module_name(path, root)} imports {mod}, later in the flow")
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the product modules it imports (lazy imports included; ``from pkg import mod``
    counts as importing ``pkg.mod``)."""
    mods = {module_name(p, root): p for p in product_files(root)}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for _line, mod, names in _imports(path, root):
            for cand in [mod] + [f"{mod}.{n}" for n in names]:
                if cand in mods and cand != name:
                    deps.add(cand)
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down_the_flow():
    assert violations() == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_walk_finds_lazy_relative_upward_and_bare_imports(tmp_path):
    """The walk itself, on a made-up tree: a lazy upward import inside a function, a relative
    one, an upward one between codegen's rooms and a bare (uninstalled) top level are all found;
    a downward one and the entry point are not."""
    for pkg in FLOW:
        (tmp_path / pkg).mkdir()
    (tmp_path / "codegen" / "design").mkdir()
    (tmp_path / "codegen" / "rtl").mkdir()
    (tmp_path / "fpga_models" / "probe.py").write_text(
        "from bapipe.spec import Model\n"
        "def f():\n    from bapipe.codegen.rtl.write import render_rtl\n    from ..host import driver\n")
    (tmp_path / "bapipe" / "cli.py").write_text("from bapipe.host.driver import train\n")
    (tmp_path / "host" / "x.py").write_text("from cocotb_tests.plans import tiny_mlp_plan\n"
                                            "from bapipe.codegen.cli_rtlsim import simulate\n"
                                            "from codegen.rtl import render_rtl\n")
    (tmp_path / "codegen" / "design" / "lower.py").write_text("from bapipe.codegen.design import context\n"
                                                              "def g():\n    from bapipe.codegen.rtl import env\n")
    assert violations(tmp_path) == [
        "codegen/design/lower.py:3: bapipe.codegen.design.lower imports bapipe.codegen.rtl, later in the flow",
        "fpga_models/probe.py:3: bapipe.fpga_models.probe imports bapipe.codegen.rtl.write, later in the flow",
        "fpga_models/probe.py:4: bapipe.fpga_models.probe imports bapipe.host, later in the flow",
        "host/x.py:1: product code imports test code cocotb_tests.plans",
        "host/x.py:2: a library imports the command module bapipe.codegen.cli_rtlsim",
        "host/x.py:3: imports codegen.rtl, which is not installed (bapipe.codegen.rtl)"]


def test_circles_found_lazy_ones_included(tmp_path):
    """Tarjan on a made-up tree: a two-module circle closed by a lazy import is found."""
    (tmp_path / "bapipe").mkdir()
    (tmp_path / "bapipe" / "a.py").write_text("from bapipe import b\n")
    (tmp_path / "bapipe" / "b.py").write_text("def f():\n    from bapipe.a import x\n")
    (tmp_path / "bapipe" / "c.py").write_text("from bapipe.a import y\n")
    for pkg in FLOW[1:]:
        (tmp_path / pkg).mkdir()
    assert circles(import_graph(tmp_path)) == [["bapipe.a", "bapipe.b"]]
