"""Per-stage agreement of the plan, the Design and the hardware, in cycles per sample.

For every stage of a build, three figures of the same quantity, forward cycles per sample in
steady state (a long stream of samples through the stage: its initiation interval):

- ``plan``: what the planner promised (plan.yaml ``cycles.fwd_interval``; plans written
  before it existed: ``cycles.fwd`` over the micro-batch size);
- ``design``: the RTL lowering's cycle model of the engines it built for the stage
  (``codegen.rtl_model``: the slowest block of a dataflow stage, the sum of the units' turns
  of a time-multiplexed one), every formula from ``fpga_models.engines``;
- ``measured``: Verilator, running the stage alone (its replica 0, its engines and weights
  exactly as in the build) with its input always valid and its output always ready, so
  neither neighbour limits it: (last output beat of sample n - of sample 1) / (n - 1).

A stage runs alone because in the whole pipeline every stage moves at the bottleneck's pace,
which says nothing of the others. ``plan_error`` is the worst |measured / plan - 1|.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from bapipe.plan import Plan

#: simulated cycles the per-stage runs aim for in all by default (each stage gets >= 3 samples)
STAGE_BUDGET_CYCLES = 2_000_000


def plan_cycles_per_sample(plan: Plan, index: int) -> float:
    """The planner's forward cycles per sample in steady state for stage ``index``."""
    s = plan.stages[index]
    if "fwd_interval" in s.cycles:
        return float(s.cycles["fwd_interval"])
    return float(s.cycles.get("fwd", 0)) / max(1, plan.microbatch_size)


def stage_samples(design_cycles: list[float], samples: int | None) -> int:
    """Samples each stage runs alone: ``samples`` if given, else as many (3..16) as the budget allows."""
    if samples is not None:
        return int(samples)
    total = max(1.0, sum(design_cycles))
    return int(min(16, max(3, STAGE_BUDGET_CYCLES // total)))


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def stage_builds(plan: Plan, model, cluster, params, full, out: Path) -> list[tuple[object, Path, dict]]:
    """One single-stage RTL build per stage under ``out/s<i>``: (its pipeline, rtl dir, manifest).

    Each is the stage exactly as the whole pipeline builds it (same blocks, names and weight
    images, which are linked from the main build rather than copied), fed at the lanes the
    previous stage delivers.
    """
    from .rtl import GENERATOR_VERSION, manifest, render_pipeline
    from .rtl_model import build_pipeline

    builds = []
    plan_hash = plan.fingerprint()[:16]
    for i, st in enumerate(full.stages):
        sub = replace(plan, stages=[plan.stages[i]])
        pipe = build_pipeline(sub, model, cluster, params, in_lanes=st.in_lanes if i else None, partial=True)
        d = out / f"s{i}"
        d.mkdir(parents=True, exist_ok=True)
        files = render_pipeline(pipe, plan.cluster, plan_hash)
        for name, text in files.items():
            _write_if_changed(d / name, text)
        man = manifest(pipe, sub, sorted(files, key=lambda n: (n == "cluster_top.v", n.endswith("_top.v"), n)))
        man["generator"] = f"bapipe {GENERATOR_VERSION}"
        builds.append((pipe, d, man))
    return builds


def _link_mem_files(rtl: Path, d: Path) -> None:
    """The MVUs' $readmemh images of the main build, visible from a stage's folder."""
    for f in rtl.iterdir():
        if f.suffix in (".hex", ".mem"):
            link = d / f.name
            if not link.exists():
                os.symlink(f.resolve(), link)


def measure_stages(build: Path, plan: Plan, model, cluster, params, full, samples: int | None = None,
                   threads: int = 1) -> list[dict]:
    """Run every stage alone in Verilator; per stage: index, board, style, samples, and plan,
    design and measured cycles per sample (see the module docstring)."""
    from fpga_models.fixedpoint import quantize

    from .rtlsim_cpp import simulate_cpp

    out = build / "rtlsim" / "stages"
    builds = stage_builds(plan, model, cluster, params, full, out)
    design = [st.job_cycles for st in full.stages]
    n = stage_samples(design, samples)
    rows = []
    for i, (pipe, d, man) in enumerate(builds):
        _link_mem_files(build / "rtl", d)
        in_elems = pipe.in_elems
        seed = int(hashlib.sha256(f"{plan.fingerprint()}:{i}".encode()).hexdigest()[:8], 16)
        x = quantize(np.random.default_rng(seed).uniform(-1.0, 1.0, (n, in_elems)), plan.number_format)
        res = simulate_cpp(d, man, x, cache=build / "rtlsim", threads=threads)
        per = pipe.out_elems // pipe.out_lanes
        last = [res["out_cycles"][(k + 1) * per - 1] for k in range(n)]
        measured = (last[-1] - last[0]) / (n - 1)
        p = plan_cycles_per_sample(plan, i)
        rows.append({"index": plan.stages[i].index, "board": full.stages[i].board, "style": full.stages[i].style,
                     "samples": n, "plan_cycles_per_sample": p, "design_cycles_per_sample": float(design[i]),
                     "measured_cycles_per_sample": measured,
                     "error": (measured / p - 1) if p else None})
    return rows


def plan_error(rows: list[dict]) -> float | None:
    """Worst |measured / plan - 1| over the stages (None when no stage has a plan figure)."""
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    return max(errs) if errs else None
