"""Render a plan's RTL: AXI4-Stream glue, stage engines, per-board tops and a cluster top.

``render_rtl(plan, model, cluster, out_dir)`` writes ``out_dir/rtl/``. All decisions come
from ``codegen.rtl_model`` (structure, parameters, weights, cycle model); the Jinja templates
in ``hls_templates/rtl/`` hold layout only. Output is deterministic: same plan, same bytes.

Jinja delimiters are ``[@ expr @]``, ``[% stmt %]`` and ``[# comment #]`` so that Verilog's
``{a, b}`` concatenations and ``<<``/``>>`` shifts stay untouched.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import jinja2
import numpy as np

from .rtl_model import LinkSpec, MvuSpec, Pipeline, Unsupported, build_pipeline, clog2, count_bits

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "hls_templates" / "rtl"
#: the generic modules every project gets, one per file
GENERIC = ("axis_fifo", "axis_width_conv", "axis_relu", "link_tx", "link_rx", "link_emulator", "swg",
           "pool_unit")
GENERATOR_VERSION = "0.1.0"


@lru_cache(maxsize=1)
def rtl_env() -> jinja2.Environment:
    """The Jinja environment for Verilog templates (delimiters that never clash with Verilog)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        block_start_string="[%", block_end_string="%]",
        variable_start_string="[@", variable_end_string="@]",
        comment_start_string="[#", comment_end_string="#]",
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False,
    )


def render_template(name: str, plan_hash: str = "none", **ctx) -> str:
    """Render ``hls_templates/rtl/<name>.v.j2`` with a file header naming the plan."""
    return rtl_env().get_template(f"{name}.v.j2").render(version=GENERATOR_VERSION, plan_hash=plan_hash, **ctx)


def verilog_hex(lanes: list[int], elem_w: int) -> str:
    """Sized Verilog literal packing ``lanes`` (two's complement), lane 0 in the low bits."""
    mask = (1 << elem_w) - 1
    v = 0
    for i, x in enumerate(lanes):
        v |= (int(x) & mask) << (i * elem_w)
    width = len(lanes) * elem_w
    return f"{width}'h{v:0{(width + 3) // 4}x}"


def render_mvu(spec: MvuSpec, plan_hash: str = "none") -> str:
    """Verilog of one matrix-vector unit with its weights and biases baked into ROMs."""
    words = spec.cycles_per_vector
    return render_template(
        "mvu", plan_hash, module=spec.module, layer=spec.layer, relu=spec.relu,
        mw=spec.mw, mh=spec.mh, pe=spec.pe, simd=spec.simd, elem_w=spec.elem_w, frac=spec.frac,
        acc_w=spec.acc_w, sf_w=clog2(spec.sf), nf_w=clog2(spec.nf), waddr_w=clog2(words),
        weight_rows=[(a, verilog_hex(spec.weight_word(a), spec.elem_w)) for a in range(words)],
        bias_rows=[(n, verilog_hex(spec.bias_word(n), spec.elem_w)) for n in range(spec.nf)],
    )


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


def _board_ctx(b, elem_w: int) -> dict:
    return {
        "board": b.name, "module": b.module, "stage": b.stage, "has_rx": b.has_rx, "has_tx": b.has_tx,
        "in_w": b.in_lanes * elem_w, "out_w": b.out_lanes * elem_w,
        "blocks": [{"kind": k.kind, "inst": k.inst, "module": k.module, "params": list(k.params.items()),
                    "in_w": k.in_lanes * elem_w} for k in b.blocks],
    }


def _link_ctx(link: LinkSpec, lanes: int, elem_w: int) -> dict:
    bw = link.bytes_per_cycle
    return {"src": link.src, "dst": link.dst, "latency": link.latency,
            "bw": f"{bw.numerator}/{bw.denominator}" if bw.denominator != 1 else str(bw.numerator),
            "params": list(link.emulator_params(lanes, elem_w).items())}


def render_pipeline(pipe: Pipeline, cluster_name: str, plan_hash: str) -> dict[str, str]:
    """File name -> Verilog text for every module of the pipeline (generic ones included)."""
    files = {f"{name}.v": render_template(name, plan_hash) for name in GENERIC}
    for b in pipe.boards:
        for blk in b.blocks:
            if blk.mvu is not None:
                files[f"{blk.module}.v"] = render_mvu(blk.mvu, plan_hash)
        files[f"{b.module}.v"] = render_template("board_top", plan_hash, **_board_ctx(b, pipe.elem_w))
    files["cluster_top.v"] = render_template(
        "cluster_top", plan_hash, module="cluster_top", cluster=cluster_name,
        in_w=pipe.in_lanes * pipe.elem_w, out_w=pipe.out_lanes * pipe.elem_w, last=len(pipe.boards) - 1,
        boards=[{"name": b.name, "module": b.module, "has_rx": b.has_rx, "has_tx": b.has_tx,
                 "in_w": b.in_lanes * pipe.elem_w, "out_w": b.out_lanes * pipe.elem_w} for b in pipe.boards],
        links=[_link_ctx(l, pipe.boards[i].out_lanes, pipe.elem_w) for i, l in enumerate(pipe.links)],
    )
    return files


def manifest(pipe: Pipeline, plan, files: list[str]) -> dict:
    """What `bapipe rtlsim` needs to drive the cluster top and check it (no re-derivation)."""
    return {
        "generator": f"bapipe {GENERATOR_VERSION}", "plan": plan.fingerprint(), "model": plan.model,
        "cluster": plan.cluster, "supported": True, "top": "cluster_top",
        "files": files, "number_format": pipe.fmt, "elem_w": pipe.elem_w, "frac": pipe.frac,
        "in_lanes": pipe.in_lanes, "out_lanes": pipe.out_lanes,
        "in_elems": pipe.in_elems, "out_elems": pipe.out_elems,
        "boards": [b.name for b in pipe.boards],
        "replicas": [s.replicas for s in plan.stages],   # the RTL is replica 0 of each stage
        "first_layer": plan.stages[0].layers[0], "last_layer": plan.stages[-1].layers[-1],
        "links": [{"src": l.src, "dst": l.dst, "bytes_per_cycle": float(l.bytes_per_cycle), "latency": l.latency,
                   "credits": l.credits, "beat_bytes": l.beat_bytes} for l in pipe.links],
        "predicted_cycles_per_sample": pipe.interval,
        "breakdown": [[n, c] for n, c in pipe.breakdown],
        "ops": [{k: v for k, v in op.items() if k not in ("w", "b")} for op in pipe.ops],
        "plan_stage_cycles": [dict(s.cycles) for s in plan.stages],
        "plan_resources": {s.boards[0]: dict(s.resources) for s in plan.stages},
        "board_tops": {b.name: b.module for b in pipe.boards},
    }


def render_rtl(plan, model, cluster, out_dir: Path, params=None) -> list[Path]:
    """Write ``out_dir/rtl/``: every module, board tops, cluster top, manifest.json, params.json.

    When the plan needs what the RTL cannot build yet, only the generic glue is written with
    ``manifest.json`` saying ``supported: false`` and why (`bapipe rtlsim` reports it).
    Returns the paths written, sorted. (An ``out_dir`` already named ``rtl`` is used as is,
    so callers passing ``build/rtl`` get the same tree.)
    """
    out_dir = Path(out_dir)
    rtl = out_dir if out_dir.name == "rtl" else out_dir / "rtl"
    rtl.mkdir(parents=True, exist_ok=True)
    plan_hash = plan.fingerprint()[:16]
    written: dict[str, str] = {}
    try:
        pipe = build_pipeline(plan, model, cluster, params)
    except Unsupported as e:
        written = {f"{name}.v": render_template(name, plan_hash) for name in GENERIC}
        written["manifest.json"] = json.dumps({"generator": f"bapipe {GENERATOR_VERSION}", "plan": plan.fingerprint(),
                                               "supported": False, "reason": str(e),
                                               "files": sorted(written)}, indent=1, sort_keys=True) + "\n"
    else:
        written = render_pipeline(pipe, plan.cluster, plan_hash)
        # Order matters to some tools: leaves first, tops last.
        order = sorted(written, key=lambda n: (n == "cluster_top.v", n.endswith("_top.v"), n))
        written["manifest.json"] = json.dumps(manifest(pipe, plan, order), indent=1, sort_keys=True) + "\n"
        written["params.json"] = json.dumps(
            {op["layer"]: {"w": np.asarray(op["w"]).tolist(), "b": np.asarray(op["b"]).tolist()}
             for op in pipe.ops if "w" in op}, sort_keys=True) + "\n"
    paths = []
    for name in sorted(written):
        p = rtl / name
        p.write_text(written[name], encoding="utf-8")
        paths.append(p)
    return paths


__all__ = ["render_rtl", "render_template", "render_mvu", "render_router", "render_pipeline", "rtl_env",
           "verilog_hex", "router_table", "count_bits"]
