"""`bapipe check BUILD`: the vendor rules a board imposes, applied to a generated build.

Reads the files `bapipe gen` wrote (C++ kernels, HLS configs, link configs, plan.yaml), not the
Design; the rules and their sources are codegen.check.physical_rules and docs/check.md. Prints one
line per board (``--json``: one object with per-board and per-kernel figures, the rules and
which failed); exits 1 when a rule fails, 2 on a folder that is not a build.
"""
from __future__ import annotations

from pathlib import Path

from bapipe.errors import SpecError

from bapipe.codegen.check.physical_rules import check_build, summary_lines
from bapipe.codegen.gen_folder import refusal  # noqa: F401  (gen's refusal line, named here by `bapipe check`'s readers)


def run_check(build: str | Path) -> dict:
    """The check of ``build``; SpecError (one line) when it is not a `bapipe gen` folder."""
    b = Path(build)
    if not b.is_dir():
        raise SpecError(str(b), None, "BUILD", "expected a folder written by `bapipe gen`"
                        + (" (it does not exist)" if not b.exists() else " (it is a file)"))
    if not sorted((b / "link").glob("*.cfg")):
        raise SpecError(str(b / "link"), None, "*.cfg", "expected the v++ link configs `bapipe gen` writes "
                                                        "(none found); re-run `bapipe gen`")
    return check_build(b)


def cmd_check(args):
    """CLI handler: (result, exit code 1 when a rule fails)."""
    result = run_check(args.build)
    return result, (0 if result["ok"] else 1)


def show_check(result: dict) -> str:
    """One line per board, then the failed rules."""
    lines = summary_lines(result)
    if not result["ok"]:
        lines.append("rules failed: " + ", ".join(f"{r} ({result['rules'][r]})" for r in result["failed_rules"]))
    return "\n".join(lines)

