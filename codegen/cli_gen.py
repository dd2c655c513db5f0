"""`bapipe gen plan.yaml -o build/`: render the plan's HLS project (and RTL, when present)."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from bapipe.errors import SpecError
from bapipe.plan import load_plan, resolve

from .context import build_project
from .hls import render_files, write_files


def generate(plan_path: str | Path, out_dir: str | Path) -> dict:
    """Check, render in memory, then write: a refused plan leaves the output folder untouched."""
    plan_file = str(plan_path)
    plan = load_plan(plan_file)
    model, cluster = resolve(plan, plan_file)
    return generate_plan(plan, model, cluster, out_dir, Path(plan_file).read_text(encoding="utf-8"), plan_file)


def generate_plan(plan, model, cluster, out_dir: str | Path, plan_text: str | None = None,
                  plan_file: str = "plan.yaml") -> dict:
    """Generate from in-memory objects (tests build plans by hand)."""
    ctx = build_project(plan, model, cluster, plan_file)
    files = render_files(ctx, plan_text if plan_text is not None else plan.dumps(), cluster)
    out = Path(out_dir)
    paths = write_files(files, out)
    rtl_files: list[Path] = []
    if importlib.util.find_spec("codegen.rtl") is not None:
        rtl = importlib.import_module("codegen.rtl")
        rtl_files = list(rtl.render_rtl(plan, model, cluster, out / "rtl") or [])
    return {
        "output": str(out), "fingerprint": ctx.fingerprint, "files": len(paths), "rtl_files": len(rtl_files),
        "format": ctx.fmt.name,
        "stages": [{"name": s.name, "layers": len(s.layers), "boards": s.boards, "inputs": len(s.inputs),
                    "outputs": len(s.outputs), "weights": s.weight_elements,
                    # dataflow: the slowest layer sets the interval; time-multiplexed: the layers add up
                    "cycles_per_sample": (max((l.cycles for l in s.layers), default=0) if s.dataflow
                                          else sum(l.cycles for l in s.layers))} for s in ctx.stages],
        "boards": [b.name for b in ctx.boards],
        "skipped": ctx.skipped,
    }


def cmd_gen(args) -> dict:
    """CLI handler: returns the --json object."""
    out = Path(args.output)
    try:
        return generate(args.plan, out)
    except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError, FileNotFoundError) as e:
        # the output folder cannot be made or written: bad -o, not a bug
        raise SpecError(str(out), None, "-o", f"expected a writable folder: {e.strerror or e}") from None


def show_gen(r: dict) -> str:
    """Human summary."""
    lines = [f"generated {r['files']} files in {r['output']} ({r['format']}, plan {r['fingerprint'][:12]})"
             + (f" + {r['rtl_files']} RTL files" if r["rtl_files"] else "")]
    lines.append(f"{'stage':<10}{'layers':>7}{'weights':>10}{'cycles/sample':>15}  boards")
    for s in r["stages"]:
        lines.append(f"{s['name']:<10}{s['layers']:>7}{s['weights']:>10}{s['cycles_per_sample']:>15}  "
                     f"{', '.join(s['boards'])}")
    for sk in r["skipped"]:
        lines.append(f"skipped {sk}")
    return "\n".join(lines)
