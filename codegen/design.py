"""The Design: a plan lowered once to hardware, written by `bapipe gen` as build/design.json.

``codegen.rtl_model.build_pipeline`` is the lowering (small named steps per stage: fused
activations, width converters, window generators, forks and skip FIFOs, gates and the
sequencer of time-multiplexed stages, link credits, weights); this module writes its result
as data: boards -> stages -> nodes (engine kind, module, parameters, lanes, cycles per
sample), the wires between them, FIFO depths, links with their credits, and per stage the
plan's and the Design's cycles per sample. ``bapipe rtlsim`` reads the Design and the
single-stage benches written beside it instead of deriving anything again.

Every cycle figure here comes from ``fpga_models.engines`` through the lowering.
"""
from __future__ import annotations

import json
from dataclasses import replace

DESIGN_VERSION = 1


def plan_cycles_per_sample(plan, index: int) -> float:
    """The planner's forward cycles per sample in steady state for stage ``index``
    (``cycles.fwd_interval``; plans written before it existed: ``cycles.fwd`` per sample)."""
    s = plan.stages[index]
    if "fwd_interval" in s.cycles:
        return float(s.cycles["fwd_interval"])
    return float(s.cycles.get("fwd", 0)) / max(1, plan.microbatch_size)


def _node(blk) -> dict:
    return {"name": blk.inst, "engine": blk.kind, "module": blk.module, "params": dict(blk.params),
            "in_lanes": blk.in_lanes, "out_lanes": blk.out_lanes, "beats_in": blk.beats_in, "cycles": blk.cycles,
            **({"layer": blk.mvu.layer, "pe": blk.mvu.pe, "simd": blk.mvu.simd, "mh": blk.mvu.mh, "mw": blk.mvu.mw}
               if blk.mvu is not None else {}),
            **({"ins": list(blk.ins)} if blk.ins else {}), **({"outs": list(blk.outs)} if blk.outs else {})}


def design_dict(pipe, plan, alone: list[float] | None = None) -> dict:
    """The JSON form of a lowered pipeline (see the module docstring). ``alone``: each stage's
    cycles per sample on its own (its bench, fed at its first engine's width), the figure
    set against the plan; ``pipeline_cycles_per_sample`` is the stage as wired in the whole
    pipeline (its input at the width the previous stage delivers)."""
    stages = []
    for i, st in enumerate(pipe.stages):
        stages.append({
            "index": st.index, "board": st.board, "style": st.style, "layers": list(plan.stages[i].layers),
            "in_lanes": st.in_lanes, "out_lanes": st.out_lanes, "in_elems": st.in_elems, "out_elems": st.out_elems,
            "plan_cycles_per_sample": plan_cycles_per_sample(plan, i),
            "design_cycles_per_sample": float(alone[i] if alone else st.job_cycles),
            "pipeline_cycles_per_sample": float(st.job_cycles),
            "nodes": [_node(b) for b in st.blocks],
            "units": [{"layer": u.layer, "index": u.index, "cycles": u.cycles} for u in st.units],
            "bench": f"rtl/stages/s{i}",
            # off-chip weights of a time-multiplexed stage (codegen.rtl_model.WeightFetch, from
            # fpga_models.allocate); the cycles above include their fetches
            **({"weights": st.weights.as_dict()} if st.weights is not None else {}),
        })
    return {
        "version": DESIGN_VERSION, "plan": plan.fingerprint(), "model": plan.model, "cluster": plan.cluster,
        "number_format": pipe.fmt, "elem_w": pipe.elem_w, "frac": pipe.frac,
        "boards": [{"name": b.name, "module": b.module, "stages": [s.index for s in b.stages]} for b in pipe.boards],
        "stages": stages,
        "links": [None if l is None else {"src": l.src, "dst": l.dst, "beat_bytes": l.beat_bytes,
                                          "bytes_per_cycle": float(l.bytes_per_cycle), "latency": l.latency,
                                          "credits": l.credits} for l in pipe.links],
        "interval": float(pipe.interval),
    }


def merge_placement(out_dir) -> None:
    """Copy the placement pass's result (``placement.json``, codegen.placement: SLRs, banks,
    network channels) into build/design.json as its ``placement`` section, when the Design
    was written (the RTL lowering supports the plan)."""
    from pathlib import Path
    out = Path(out_dir)
    src, dst = out / "placement.json", out / "design.json"
    if not src.is_file() or not dst.is_file():
        return
    d = json.loads(dst.read_text(encoding="utf-8"))
    d["placement"] = json.loads(src.read_text(encoding="utf-8"))
    dst.write_text(json.dumps(d, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def stage_bench_files(plan, model, cluster, params, pipe, plan_hash: str,
                      main_files: dict[str, str] | None = None) -> tuple[dict[str, str], list[float]]:
    """Single-stage RTL builds, one per stage, as ``stages/s<i>/<file>`` -> text (manifest included).

    Each is the stage's engines exactly as the whole pipeline builds them (same blocks, names
    and weight images, read from the main rtl/ folder: ``mem_dir``), fed straight from the
    host at its first engine's width, with nothing after it: run alone, it shows the stage's
    own pace, which the whole pipeline (moving at its bottleneck's) cannot. Modules identical
    to the main build's (``main_files``: the generic glue, the MVUs) are named from there.
    Returns the files and each bench's predicted cycles per sample.
    """
    main_files = main_files or {}
    from .rtl import manifest, render_pipeline
    from .rtl_model import Unsupported, build_pipeline

    out: dict[str, str] = {}
    alone: list[float] = []
    for i, st in enumerate(pipe.stages):
        sub = replace(plan, stages=[plan.stages[i]])
        # fed at its first engine's own width, so the bench shows the stage's engines' pace
        # (the width of the link into it is the previous stage's and the link's affair,
        # measured by the whole-pipeline run); a stage that forks its input at once takes
        # the width the previous stage delivers
        try:
            one = build_pipeline(sub, model, cluster, params, partial=True)
        except Unsupported:
            one = build_pipeline(sub, model, cluster, params, in_lanes=st.in_lanes, partial=True)
        files = render_pipeline(one, plan.cluster, plan_hash)
        own = {n: t for n, t in files.items() if main_files.get(n) != t}
        names = {n: (n if n in own else f"../../{n}") for n in files}
        order = sorted(files, key=lambda n: (n == "cluster_top.v", n.endswith("_top.v"), n))
        man = manifest(one, sub, [names[n] for n in order])
        man["mem_dir"] = "../.."      # the MVU images of the main build (rtl/)
        man["stage"] = st.index
        for name, text in own.items():
            out[f"stages/s{i}/{name}"] = text
        out[f"stages/s{i}/manifest.json"] = json.dumps(man, indent=1, sort_keys=True) + "\n"
        alone.append(float(one.interval))
    return out, alone
