"""`bapipe gen plan.yaml -o build/`: render the plan's HLS project (and RTL, when present).

The project is written into a temporary sibling folder and swapped in whole, so an
interrupted or refused gen leaves the previous folder as it was and a finished one holds no
stale file of an earlier, larger plan. ``bapipe-build.json`` in the folder records the
plan's fingerprint and the sha256 of every generated file; csim, rtlsim, synth and run
call :func:`check_build` and refuse a folder whose plan or Design changed since gen.
"""
from __future__ import annotations

from pathlib import Path

from bapipe.plan import load_plan
from bapipe.fpga_models.plancheck import resolve

# the build-folder library (codegen.gen_folder), re-exported: the commands and tests name them here
from bapipe.codegen.gen_folder import (CYCLE_WARN, STAMP, check_build, check_generable,  # noqa: F401
                                       cycle_warnings, generate_folder, generate_plan, write_stamp)


def generate(plan_path: str | Path, out_dir: str | Path, engines: str = "hls") -> dict:
    """Check, render in memory, then write: a refused plan leaves the output folder untouched."""
    plan_file = str(plan_path)
    plan = load_plan(plan_file)
    model, cluster = resolve(plan, plan_file)
    check_generable(plan, plan_file)
    return generate_plan(plan, model, cluster, out_dir, Path(plan_file).read_text(encoding="utf-8"), plan_file,
                         engines)




def _cycles(x) -> str:
    """Cycles a sample as people read them: whole cycles with thousands separators
    (3,864,380, not 3.86438e+06), a fraction only below 100."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:g}"


def show_gen(r: dict) -> str:
    """Human summary: per stage the Design's forward cycles per sample next to the plan's."""
    lines = [f"generated {r['files']} files in {r['output']} ({r['format']}, plan {r['fingerprint'][:12]})"
             + (f" + {r['rtl_files']} RTL files" if r["rtl_files"] else "")
             + (f"; stage kernels: {len(r['rtl_kernels'])} packaged RTL kernels (rtl/kernels/)"
                if r.get("rtl_kernels") else "; stage kernels: Vitis HLS")]
    lines.append(f"{'stage':<10}{'layers':>7}{'weights':>13}{'Design fwd cyc/sample':>23}{'plan fwd cyc/sample':>21}"
                 "  boards")
    for s in r["stages"]:
        lines.append(f"{s['name']:<10}{s['layers']:>7}{s['weights']:>13,}{_cycles(s['design_cycles_per_sample']):>23}"
                     f"{_cycles(s['plan_fwd_cycles_per_sample']):>21}  {', '.join(s['boards'])}")
    lines.append("Design: the engines the kernels are built from (design.json; `bapipe csim` counts the kernels' "
                 "loops, `bapipe rtlsim` measures the RTL); plan: the planner's cycle model (per sample)")
    for sk in r["skipped"]:
        lines.append(f"skipped {sk}")
    return "\n".join(lines)
