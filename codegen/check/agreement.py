"""Per-stage agreement of the plan, the Design and the hardware, in cycles per sample.

For every stage of a build, three figures of the same quantity, forward cycles per sample in
steady state (a long stream of samples through the stage: its initiation interval):

- ``plan``: what the planner promised (plan.yaml ``cycles.fwd_interval``);
- ``design``: the lowering's figure for the engines it built (build/design.json: the slowest
  node of a dataflow stage, the units' turns plus the sequencer's switch of a
  time-multiplexed one), every formula from ``fpga_models.engines``;
- ``measured``: Verilator running the stage's single-stage bench (build/rtl/stages/s<i>,
  written by `bapipe gen`: the stage's replica 0 exactly as built, its input always valid,
  its output always ready, so neither neighbour limits it): (last output beat of sample n -
  of sample 1) / (n - 1).

A stage runs alone because in the whole pipeline every stage moves at the bottleneck's pace,
which says nothing of the others. When a stage's bench is the whole pipeline's RTL file for
file (a one-stage plan: same sources, same input and output widths, the same always-valid
source and always-ready sink), the pipeline run already measured it and is not repeated
(``measured_by: "pipeline"``): for all of VGG-16 on one board that is 10 M simulated cycles
saved. ``plan_error`` is the worst |measured / plan - 1|.
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError

#: simulated cycles the per-stage runs aim for in all by default (each stage gets >= 3 samples)
STAGE_BUDGET_CYCLES = 2_000_000


def load_design(build: Path) -> dict:
    """build/design.json, or one clear error naming it."""
    path = Path(build) / "design.json"
    if not path.exists():
        raise SpecError(str(path), None, "design", "expected the Design written by `bapipe gen` (re-run it)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(str(path), None, "design", f"expected JSON written by `bapipe gen`: {e}") from None


def stage_samples(design_cycles: list[float], samples: int | None) -> int:
    """Samples each stage runs alone: ``samples`` if given, else as many (3..16) as the budget
    allows, or 2 (the fewest that time one interval) when the stages' samples alone exceed it
    twice over (VGG-16 halves of 2.6 M cycles a sample: about 35 s of Verilator each)."""
    if samples is not None:
        if int(samples) < 2:
            raise SpecError(None, None, "--stage-samples", f"expected at least 2, got {samples}")
        return int(samples)
    total = max(1.0, sum(design_cycles))
    if total > 2 * STAGE_BUDGET_CYCLES:
        return 2
    return int(min(16, max(3, STAGE_BUDGET_CYCLES // total)))


def same_rtl(bench: dict, pipeline: dict) -> bool:
    """True when a stage bench's manifest names exactly the pipeline's sources (every file the
    main build's, ``../../<name>``) with the same stream widths: the two are one RTL."""
    files = bench.get("files", [])
    keys = ("in_elems", "in_lanes", "out_elems", "out_lanes", "elem_w", "top")
    return (all(f.startswith("../../") for f in files) and [f[6:] for f in files] == pipeline.get("files")
            and all(bench.get(k) == pipeline.get(k) for k in keys))


def measure_stages(build: Path, design: dict, samples: int | None = None, threads: int = 1,
                   pipeline: tuple[dict, object, int] | None = None) -> list[dict]:
    """Run every stage's bench in Verilator; per stage: index, board, style, samples, and plan,
    design and measured cycles per sample, and the error against the plan.

    ``pipeline`` = (manifest, result, samples) of a whole-pipeline run: a bench that is the
    same RTL (``same_rtl``) takes its figure from it instead of running again. ``result`` may
    be a ``concurrent.futures.Future`` of the run still going: the other benches run
    meanwhile (one simulation per core), and only the reused rows wait for it."""
    from bapipe.fpga_models.fixedpoint import quantize

    from bapipe.codegen.check.rtlsim_cpp import simulate_cpp

    build = Path(build)
    n = stage_samples([s["design_cycles_per_sample"] for s in design["stages"]], samples)
    rows: dict[int, dict] = {}
    runs, reused = [], []
    for k, s in enumerate(design["stages"]):
        d = build / s["bench"]
        try:
            man = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError):
            raise SpecError(str(d / "manifest.json"), None, "bench",
                            "expected the single-stage bench written by `bapipe gen` (re-run it)") from None
        if pipeline is not None and samples in (None, pipeline[2]) and pipeline[2] >= 2 and same_rtl(man, pipeline[0]):
            reused.append((k, s))
        else:
            runs.append((k, s, d, man))

    def run(item):
        k, s, d, man = item
        seed = int(hashlib.sha256(f"{design['plan']}:{s['index']}".encode()).hexdigest()[:8], 16)
        x = quantize(np.random.default_rng(seed).uniform(-1.0, 1.0, (n, man["in_elems"])), design["number_format"])
        res = simulate_cpp(d, man, x, cache=build / "rtlsim", threads=threads)
        return k, _row(s, n, _interval(man, res, n), "bench")

    # the benches are independent single-threaded simulations: one per core at a time, leaving
    # one core to a pipeline run still going (on 2 cores, 3 simulations at once slowed the
    # pipeline, the longest, by a third)
    busy = 1 if pipeline is not None and hasattr(pipeline[1], "result") else 0
    workers = max(1, min(len(runs), ((os.cpu_count() or 1) - busy) // max(1, int(threads))))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows.update(dict(pool.map(run, runs)))
    if reused:
        pman, pres, pn = pipeline
        pres = pres.result() if hasattr(pres, "result") else pres
        for k, s in reused:
            rows[k] = _row(s, pn, _interval(pman, pres, pn), "pipeline")
    return [rows[k] for k in sorted(rows)]


def _interval(man: dict, res: dict, n: int) -> float:
    """Cycles per sample between the last output beats of the first and the n-th sample."""
    per = man["out_elems"] // man["out_lanes"]
    last = [res["out_cycles"][(k + 1) * per - 1] for k in range(n)]
    return (last[-1] - last[0]) / (n - 1)


def _row(s: dict, n: int, measured: float, by: str) -> dict:
    p = s["plan_cycles_per_sample"]
    return {"index": s["index"], "board": s["board"], "style": s["style"], "samples": n,
            "plan_cycles_per_sample": p, "design_cycles_per_sample": s["design_cycles_per_sample"],
            "measured_cycles_per_sample": measured, "error": (measured / p - 1) if p else None,
            "measured_by": by}


def unmeasured_rows(design: dict) -> list[dict]:
    """One row per stage with the plan's and the Design's cycles per sample and no measurement
    (``measured_by`` None): the stages a run did not simulate alone."""
    return [{"index": s["index"], "board": s["board"], "style": s["style"], "samples": 0,
             "plan_cycles_per_sample": s["plan_cycles_per_sample"],
             "design_cycles_per_sample": s["design_cycles_per_sample"], "measured_cycles_per_sample": None,
             "error": None, "measured_by": None} for s in design["stages"]]


def plan_error(rows: list[dict]) -> float | None:
    """Worst |measured / plan - 1| over the stages (None when no stage has a plan figure)."""
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    return max(errs) if errs else None
