"""Render a plan's RTL: AXI4-Stream glue, stage engines, per-board tops and a cluster top.

``render_rtl(plan, model, cluster, out_dir)`` writes ``out_dir/rtl/``. All decisions come
from ``codegen.design.dataflow`` (structure, parameters, weights, cycle model); the Jinja templates
in ``hls_templates/rtl/`` hold layout only. Output is deterministic: same plan, same bytes.

Jinja delimiters are ``[@ expr @]``, ``[% stmt %]`` and ``[# comment #]`` so that Verilog's
``{a, b}`` concatenations and ``<<``/``>>`` shifts stay untouched.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bapipe.names import legal, name_map, shown

from bapipe.codegen.design.dataflow import (MvuSpec, Pipeline, clog2, count_bits, link_transport, timing_model,
                                            verilog_hex)
from bapipe.codegen.rtl.env import GENERATOR_VERSION, GENERIC, TRANSPORT, render_template, rtl_env

def render_mvu(spec: MvuSpec, plan_hash: str = "none") -> str:
    """Verilog of one matrix-vector unit; its weights and biases are not in the text but in
    ``<module>_w.hex`` / ``<module>_b.hex`` (written from the stage's weight image when a tool
    reads them: ``codegen.rtl.mem_images``), loaded with $readmemh from the ``BAPIPE_MEM_DIR``
    macro's directory."""
    from bapipe.codegen.rtl.mem_words import mvu_memory_params

    return render_template(
        "mvu", plan_hash, module=spec.module, layer=spec.layer, relu=spec.relu,
        mw=spec.mw, mh=spec.mh, pe=spec.pe, simd=spec.simd, elem_w=spec.elem_w, frac=spec.frac,
        acc_w=spec.acc_w, sf_w=clog2(spec.sf), nf_w=clog2(spec.nf), waddr_w=clog2(spec.cycles_per_vector),
        nf=spec.nf, sf=spec.sf, **mvu_memory_params(spec),
    )


def render_mvu_pe(spec: MvuSpec, plan_hash: str = "none") -> tuple[str, str]:
    """(file name, Verilog) of the processing element the MVU ``spec`` instantiates PE times
    (codegen.rtl.mem_words.pe_module: one module per SIMD width)."""
    from bapipe.codegen.rtl.mem_words import MVU_TREE_FANIN, pe_module, tree_stages

    stages = tree_stages(spec.simd)
    name = pe_module(spec.simd)
    return f"{name}.v", render_template("mvu_pe", plan_hash, module=name, simd=spec.simd, elem_w=spec.elem_w,
                                        acc_w=spec.acc_w, stages=stages, tree_stages=len(stages),
                                        fanin=MVU_TREE_FANIN)


def mvu_files(spec: MvuSpec, plan_hash: str = "none") -> dict[str, str]:
    """File name -> Verilog of one MVU and the processing element it instantiates."""
    pe_file, pe_text = render_mvu_pe(spec, plan_hash)
    return {f"{spec.module}.v": render_mvu(spec, plan_hash), pe_file: pe_text}


def router_table(dests: list[list[int]], n_out: int) -> str:
    """TABLE literal of reshard_router: bit i*N_OUT+k set when beat i goes to output k."""
    v = 0
    for i, outs in enumerate(dests):
        for k in outs:
            v |= 1 << (i * n_out + k)
    return f"{len(dests) * n_out}'h{v:0{(len(dests) * n_out + 3) // 4}x}"


def render_router(module: str, n_out: int, dests: list[list[int]], plan_hash: str = "none") -> str:
    """Verilog of a resharding router with ``n_out`` outputs and a tile table.

    ``dests[i]`` lists the outputs that beat i of each sample goes to (one: scatter,
    several: broadcast); the table repeats every ``len(dests)`` beats.
    """
    if not dests or any(not d or any(k < 0 or k >= n_out for k in d) for d in dests):
        raise ValueError("every beat needs at least one destination among the outputs")
    return render_template("reshard_router", plan_hash, module=module,
                           ports=[f"m{k:02d}_axis" for k in range(n_out)], period=len(dests),
                           idx_w=clog2(len(dests)), table=router_table(dests, n_out))


def pack_unsigned(values: list[int], width: int) -> str:
    """Sized Verilog literal packing unsigned ``values`` of ``width`` bits, values[0] lowest."""
    for x in values:
        if not 0 <= x < (1 << width):
            raise ValueError(f"{x} does not fit {width} bits")
    return verilog_hex(values, width)


def _sequencer_ctx(b) -> dict | None:
    """tm_sequencer parameters and the handshakes it watches, for a board with units."""
    tm = [st for st in b.stages if st.units]
    if not tm:
        return None
    units = b.units
    cnt_w = count_bits(max([u.out_beats for u in units] + [st.in_beats for st in tm]))
    unit_w = clog2(len(units))
    # off-chip weights (ddr_weights): words each unit's turn fetches, then each stage's fill
    # (codegen.design.dataflow.WeightFetch, the plan's fpga_models.allocate.tm_weight_turns)
    words = [st.weights.fetch.get(u.layer, 0) if st.weights else 0 for st in tm for u in st.units]
    fills = [st.weights.fill if st.weights else 0 for st in tm]
    w_cnt = count_bits(max(words + fills))
    return {
        "n_units": len(units), "n_stages": len(tm), "unit_w": unit_w,
        "weight_params": [("N_REQ", len(words) + len(fills)), ("SEL_W", unit_w + 1), ("CNT_W", w_cnt),
                          ("WORDS", pack_unsigned(words + fills, w_cnt))],
        "units": [shown(u.layer) for u in units],
        "unit_fire": [f"s{st.index}_c{u.out_wire}" for st in tm for u in st.units],
        "in_fire": [f"s{st.index}_c{st.in_wire}" for st in tm],
        "params": [("N_UNITS", len(units)), ("N_STAGES", len(tm)), ("UNIT_W", unit_w),
                   ("STAGE_W", clog2(len(tm))), ("CNT_W", cnt_w), ("FRAMES_W", 2),
                   ("OUT_BEATS", pack_unsigned([u.out_beats for u in units], cnt_w)),
                   ("FIRST", pack_unsigned([st.units[0].index for st in tm], unit_w)),
                   ("LAST", pack_unsigned([st.units[-1].index for st in tm], unit_w)),
                   ("IN_BEATS", pack_unsigned([st.in_beats for st in tm], cnt_w)),
                   ("FILL", pack_unsigned([1 if f else 0 for f in fills], 1))],
    }


def stage_wiring(st) -> tuple[list[tuple[list[str], list[str]]], str, str]:
    """Wire names (suffixes of ``s<i>_c``) of every block's inputs and outputs, the stage's
    input and output wire.

    A block without explicit ``ins`` reads the previous block's first output (the stage
    input for block 0) and without explicit ``outs`` writes wire ``<j+1>``, so a linear chain
    is c0 -> block 0 -> c1 -> ... as before; forks, adds and skip paths name their wires.
    The stage output is the last block's first output.
    """
    out, prev = [], "0"
    for j, b in enumerate(st.blocks):
        ins = list(b.ins) if b.ins is not None else [prev]
        outs = list(b.outs) if b.outs is not None else [str(j + 1)]
        out.append((ins, outs))
        prev = outs[0]
    return out, "0", prev


#: AXI-Stream port prefixes of blocks with more than one input or output
_PORTS = {"fork": (["s_axis"], ["m0_axis", "m1_axis"]), "add": (["s0_axis", "s1_axis"], ["m_axis"]),
          "concat": (["s0_axis", "s1_axis"], ["m_axis"])}


def _stage_ctx(st, elem_w: int, first: bool, last: bool) -> dict:
    wiring, w_in, w_out = stage_wiring(st)
    widths: dict[str, int] = {w_in: st.in_lanes * elem_w}
    blocks = []
    for k, (ins, outs) in zip(st.blocks, wiring):
        for w in ins:
            widths.setdefault(w, k.in_lanes * elem_w)
        for w in outs:
            widths.setdefault(w, k.out_lanes * elem_w)
        pin, pout = _PORTS.get(k.kind, (["s_axis"], ["m_axis"]))
        blocks.append({"kind": k.kind, "inst": k.inst, "module": k.module, "params": list(k.params.items()),
                       "in_w": k.in_lanes * elem_w, "unit": k.unit,
                       "ports": list(zip(pin, ins)) + list(zip(pout, outs))})
    widths.setdefault(w_out, st.out_lanes * elem_w)
    return {
        "index": st.index, "board": st.board, "style": st.style, "has_rx": st.has_rx, "has_tx": st.has_tx,
        "from_host": first, "to_host": last,
        "in_w": st.in_lanes * elem_w, "out_w": st.out_lanes * elem_w,
        "wire_in": w_in, "wire_out": w_out,
        "wires": [{"name": n, "width": w} for n, w in widths.items()],
        "blocks": blocks,
    }


def _board_ctx(b, pipe) -> dict:
    first, last = pipe.stages[0], pipe.stages[-1]
    return {"board": b.name, "module": b.module, "seq": _sequencer_ctx(b),
            "stages": [_stage_ctx(st, pipe.elem_w, st is first, st is last) for st in b.stages]}


def _link_ctx(pipe: Pipeline, i: int) -> dict:
    """cluster_top context of the transport (net_link) after stage i."""
    link = pipe.links[i]
    bw = link.bytes_per_cycle
    t = link_transport(pipe, i)
    return {"src": link.src, "dst": link.dst, "latency": link.latency, "words": t.words, "window": t.window,
            "bw": f"{bw.numerator}/{bw.denominator}" if bw.denominator != 1 else str(bw.numerator),
            "params": list(t.link_params().items())}


def _transport_facts(pipe: Pipeline, i: int) -> dict:
    """The transport after stage i as the manifest records it (codegen.design.links)."""
    t = link_transport(pipe, i)
    return {"words_per_beat": t.words, "slices": t.slices, "window": t.window, "timeout": t.timeout, "dest": t.dest,
            "cycles_per_sample": float(t.cycles_per_sample), "delivery_latency": t.delivery_latency}


def render_pipeline(pipe: Pipeline, cluster_name: str, plan_hash: str) -> dict[str, str]:
    """File name -> Verilog text for every module of the pipeline (generic ones included)."""
    files = {f"{name}.v": render_template(name, plan_hash) for name in GENERIC}
    if any(l is not None for l in pipe.links):
        files.update({f"{name}.v": render_template(name, plan_hash) for name in TRANSPORT})
    if any(blk.kind == "ddr_frame" for st in pipe.stages for blk in st.blocks):   # off-chip frame buffers
        files["ddr_frame.v"] = render_template("ddr_frame", plan_hash)
    if any(blk.kind == "concat" for st in pipe.stages for blk in st.blocks):   # imported CNNs' concat
        files["axis_concat.v"] = render_template("axis_concat", plan_hash)
    for b in pipe.boards:
        for st in b.stages:
            for blk in st.blocks:
                if blk.mvu is not None:
                    files.update(mvu_files(blk.mvu, plan_hash))
        files[f"{b.module}.v"] = render_template("board_top", plan_hash, **_board_ctx(b, pipe))
    ew = pipe.elem_w
    files["cluster_top.v"] = render_template(
        "cluster_top", plan_hash, module="cluster_top", cluster=cluster_name,
        in_w=pipe.in_lanes * ew, out_w=pipe.out_lanes * ew,
        first=pipe.stages[0].index, last=pipe.stages[-1].index,
        stages=[_stage_ctx(st, ew, False, False) for st in pipe.stages],
        boards=[{"name": b.name, "module": b.module, "stages": [_stage_ctx(st, ew, False, False) for st in b.stages]}
                for b in pipe.boards],
        links=[_link_ctx(pipe, i) if l is not None else None for i, l in enumerate(pipe.links)],
    )
    return files


def mvu_specs(pipe: Pipeline) -> list:
    """Every matrix-vector unit of the pipeline, in stage order."""
    return [blk.mvu for st in pipe.stages for blk in st.blocks if blk.mvu is not None]


def manifest(pipe: Pipeline, plan, files: list[str], mem_files: list[str] = ()) -> dict:
    """What `bapipe rtlsim` needs to drive the cluster top and check it (no re-derivation)."""
    return {
        "generator": f"bapipe {GENERATOR_VERSION}", "plan": plan.fingerprint(), "model": plan.model,
        "cluster": plan.cluster, "supported": True, "top": "cluster_top",
        "files": files, "number_format": pipe.fmt, "elem_w": pipe.elem_w, "frac": pipe.frac,
        "in_lanes": pipe.in_lanes, "out_lanes": pipe.out_lanes,
        "in_elems": pipe.in_elems, "out_elems": pipe.out_elems,
        "boards": [b.name for b in pipe.boards],
        "stage_boards": [[st.index, st.board, st.style] for st in pipe.stages],
        "timing": timing_model(pipe),
        "replicas": [s.replicas for s in plan.stages],   # the RTL is replica 0 of each stage
        "first_layer": plan.stages[0].layers[0], "last_layer": plan.stages[-1].layers[-1],
        "links": [{"src": l.src, "dst": l.dst, "bytes_per_cycle": float(l.bytes_per_cycle), "latency": l.latency,
                   "credits": l.credits, "beat_bytes": l.beat_bytes, "transport": _transport_facts(pipe, i)}
                  for i, l in enumerate(pipe.links) if l is not None],
        "predicted_cycles_per_sample": pipe.interval,
        "time_multiplexed": pipe.time_multiplexed,
        "breakdown": [[n, c] for n, c in pipe.breakdown],
        "ops": [{k: v for k, v in op.items() if k not in PARAM_KEYS} for op in pipe.ops],
        "plan_stage_cycles": [dict(s.cycles) for s in plan.stages],
        "plan_resources": {s.boards[0]: dict(s.resources) for s in plan.stages},
        "board_tops": {b.name: b.module for b in pipe.boards},
        "mem_files": list(mem_files),
        "param_layers": [op["layer"] for op in pipe.ops if any(k in op for k in PARAM_KEYS)],
        # generated identifier -> layer name, for names that had to be sanitised (imported models)
        "identifiers": {k: v for k, v in name_map(dict.fromkeys(op["layer"] for op in pipe.ops)).items() if k != v},
    }


#: per-layer parameter arrays the RTL bakes in: dense/conv weights and biases, batchnorm scale/shift
PARAM_KEYS = ("w", "b", "scale", "shift")


def read_params(rtl: Path, layers: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """The named layers' parameters (int64, model layout, the keys each has), read from the
    stages' weight images where ``rtl/manifest.json`` says they lie (``params``): the arrays the
    MVU memories hold, which `bapipe rtlsim`'s numpy reference runs on."""
    from bapipe.codegen.design.weight_image import read_model

    rtl = Path(rtl)
    table = json.loads((rtl / "manifest.json").read_text(encoding="utf-8")).get("params") or {}
    return {n: {k: read_model(rtl.parent, e) for k, e in table.get(n, {}).items()} for n in layers}


__all__ = ["render_template", "render_mvu", "mvu_files", "render_router", "render_pipeline", "rtl_env",
           "verilog_hex", "router_table", "count_bits"]
