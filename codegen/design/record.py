"""The Design: a plan lowered once to hardware, written by `bapipe gen` as build/design.json.

``codegen.design.dataflow.build_pipeline`` is the lowering (small named steps per stage: fused
activations, width converters, window generators, forks and skip FIFOs, gates and the
sequencer of time-multiplexed stages, link credits, weights); this module writes its result
as data: boards -> stages -> nodes (engine kind, module, parameters, lanes, cycles per
sample), the wires between them, FIFO depths, links with their credits, and per stage the
plan's and the Design's cycles per sample. ``bapipe rtlsim`` reads the Design and the
single-stage benches written beside it instead of deriving anything again.

Every cycle figure here comes from ``fpga_models.engines`` through the lowering.
"""
from __future__ import annotations


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
            # off-chip weights of a time-multiplexed stage (codegen.design.dataflow.WeightFetch, from
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


def tail_record(update, plan_stage) -> dict | None:
    """A training stage's per-iteration tail as the Design's kernels take it (the backward's
    flush, the all-reduce, the update kernel: codegen.design.train_kernels.UpdateCtx, priced by
    fpga_models.update / fpga_models.allreduce) beside the plan's cycles of the same (None
    without an update kernel)."""
    if update is None:
        return None
    return {"flush_cycles": update.flush_cycles, "allreduce_cycles": update.allreduce_cycles,
            "update_cycles": update.cycles,
            "plan_cycles": {k: plan_stage.cycles.get(k) for k in ("flush", "allreduce", "update")}}


def design_json(pipe, plan, alone: list[float], backward_memory=(), train: dict | None = None,
                train_error: str | None = None, placement: dict | None = None, tails=()) -> dict:
    """build/design.json, assembled once: :func:`design_dict` with each backward kernel's memory
    record (fpga_models.bwd_memory), each training stage's tail (:func:`tail_record`), the
    training RTL's record (or why it cannot build the plan) and the placement pass's section
    (codegen.design.placement: SLRs, banks, network channels)."""
    out = design_dict(pipe, plan, alone)
    for rec, sd in zip(backward_memory, out["stages"]):
        if rec is not None:
            sd["backward_memory"] = rec
    for rec, sd in zip(tails, out["stages"]):
        if rec is not None:
            sd["tail"] = rec
    if plan.mode == "train":
        out["train"] = train
        if train_error:
            out["train_unsupported"] = train_error
    if placement is not None:
        out["placement"] = placement
    return out
