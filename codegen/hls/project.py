"""Render a ProjectCtx into the Vitis project tree (templates in hls_templates/hls/).

Layout of the output folder::

    plan.yaml             the plan the project was generated from
    host_config.json      stages, ports, shapes, formats and weight offsets for the host driver
    Makefile              csim / hls / xclbin
    common/               bapipe_types.h, bapipe_layers.h, bapipe_engines.h, bapipe_csim.h (dataflow/loop-count macros,
                          bounded csim streams), mm2s.cpp, s2mm.cpp
    common/csim/          hls_stream.h: csim-only shadow of the vendor header (bapipe csim)
    stage<i>/             stage<i>.{h,cpp}, stage<i>_weights.h, stage<i>_roms.h (engine kernels), tb_stage<i>.cpp, tb_stage<i>_io.h,
                          training: stage<i>_bwd.cpp, stage<i>_update.cpp (codegen.design.train_kernels) and their tb_*.cpp,
                          run_hls.tcl, hls_config.cfg, weights.bin (the stage's one weight image: raw
                          little-endian ints as the forward kernel reads them, codegen.design.weight_image),
                          csim_in.bin (testbench stimulus: little-endian int32)
    link/<board>.cfg      v++ link config per board
"""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import numpy as np

from bapipe.codegen.design.context import EMBED_LIMIT, PARTS, PLATFORMS, ProjectCtx, StageCtx, _board_type_key
from bapipe.codegen.design.mac_share import share_mac
from bapipe.codegen.design.train_kernels import loss_config, update_config
from bapipe.codegen.hls.training import render_loss
from bapipe.codegen.hls.training import render as render_train
from bapipe.codegen.design.placement import link_lines, place_project
from bapipe.codegen.design.weight_image import IMAGE, image_path, raw_dtype, write_image
from bapipe import hls_templates as templates


#: FPGA part per board type (set_part / part=)
DEFAULT_CLOCK_HZ = 300e6


def environment() -> jinja2.Environment:
    """The Jinja environment: strict (a missing field is an error), whitespace-tidy."""
    from bapipe.names import shown

    env = jinja2.Environment(loader=templates.loader("hls"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["shown"] = shown   # a model's own names in comments and strings (bapipe.names)
    return env


def comment(lines: list[str], marker: str) -> str:
    """The provenance header (``header_lines``: its names already ``shown``) as comment lines."""
    return "\n".join(f"{marker} {l}" for l in lines)


def _clock_ns(board_type: str, cluster) -> float:
    hz = DEFAULT_CLOCK_HZ
    if cluster is not None:
        for cb in cluster.boards:
            if cb.board.name == board_type:
                hz = cb.board.clock_hz
                break
    return round(1e9 / hz, 3)


def tb_file(count: int, arrays: list[np.ndarray]) -> bytes:
    """A testbench input file: int32 count, then every array's raw values (little-endian int32)."""
    parts = [np.array([count], dtype="<i4")] + [np.asarray(a).reshape(-1).astype("<i4") for a in arrays]
    return b"".join(p.tobytes() for p in parts)


def csim_input(ctx: ProjectCtx, s: StageCtx, samples: int = 1) -> bytes:
    """A deterministic stimulus for the Vitis csim/cosim runs in run_hls.tcl (raw ints, tb format)."""
    rng = np.random.default_rng([ctx.seed, s.index])
    lim = 2 << ctx.fmt.frac  # values in [-2, 2)
    return tb_file(samples, [rng.integers(-lim, lim, size=samples * p.elements) for p in s.inputs])


def host_config(ctx: ProjectCtx) -> dict:
    """What the host driver needs: stages, ports, shapes, formats, boards, weight files."""
    p = ctx.plan
    return {
        "generator": "bapipe gen", "plan_fingerprint": ctx.fingerprint, "model": p.model, "cluster": p.cluster,
        "mode": p.mode, "schedule": p.schedule, "microbatches": p.microbatches, "microbatch_size": p.microbatch_size,
        "format": {"name": ctx.fmt.name, "width": ctx.fmt.width, "frac": ctx.fmt.frac,
                   "rounding": "half-up", "saturate": True, "stream_order": "HWC for (C,H,W) images",
                   "port_bits": ctx.fmt.port_bits},
        "weight_seed": ctx.seed,
        "stages": [{
            "index": s.index, "kernel": s.name, "boards": s.boards, "board_type": s.board_type, "style": s.style,
            "inputs": [{"port": q.name, "tensor": q.tensor, "shape": list(q.shape), "elements": q.elements,
                        "lanes": s.port_lanes(q)} for q in s.inputs],
            "outputs": [{"port": q.name, "tensor": q.tensor, "shape": list(q.shape), "elements": q.elements,
                         "lanes": s.port_lanes(q)} for q in s.outputs],
            # engine kernels stream n samples per call (scalar argument n); the others one
            "samples_per_call": "n" if s.engine is not None else 1,
            "layers": [{"name": l.name, "type": l.type, "func": l.func, "tparams": l.tparams}
                       for l in s.layers],
            # the stage's one weight image (codegen.design.weight_image): every array where it lies
            # and how (kernel layout, or an MVU's banked words), in the order the forward kernel reads them
            "weights_file": image_path(s.name),
            "weights_dtype": raw_dtype(ctx.fmt.width).str,
            # engine kernels whose weights are m_axi arguments: those arrays (in argument order) in the image
            "roms": [{"name": r.name, "shape": list(r.shape), "elements": r.size, "offset": r.offset}
                     for r in (s.engine.external if s.engine is not None else [])],
            "weights": [w.describe(image_path(s.name), raw_dtype(ctx.fmt.width)) for w in s.image],
            "embedded_weights": s.embed_weights,
            "backward": None if s.bwd is None else s.bwd.host_config(),   # codegen.design.backward
            "update": update_config(s),   # codegen.design.train_kernels: the SGD update kernel (training)
            # codegen.design.stash: the stashes the forward kernel writes for the backward (training)
            "stashes": [b.host_config() for b in s.engine.stashes] if s.engine is not None else [],
            "stash_note": s.stash_note,
        } for s in ctx.stages],
        "boards": [{"name": b.name, "board_type": b.board_type, "platform": b.platform, "kernels": b.stages,
                    "link_config": f"link/{b.name}.cfg"} for b in ctx.boards],
        "skipped": ctx.skipped,
        "loss": loss_config(p, ctx.stages),   # codegen.design.train_kernels: the loss-gradient kernel (training)
    }


def render_kernels(ctx: ProjectCtx, plan_text: str, cluster=None) -> tuple[dict[str, bytes], dict]:
    """Every HLS file of the project, path -> bytes (kernels, testbenches, HLS scripts, host
    config, link configs), and the placement pass's result (nothing touches the disk here).
    codegen.package.project adds the network kernels and the Makefile."""
    from bapipe.fpga_models import allreduce as ar_model

    env = environment()
    c_hdr = comment(ctx.header, "//")
    h_hdr = comment(ctx.header, "#")
    files: dict[str, bytes] = {}

    def put(path: str, tpl: str, **kw) -> None:
        files[path] = env.get_template(tpl).render(fmt=ctx.fmt, **kw).encode()

    files["plan.yaml"] = plan_text.encode()
    loss = ctx.stages[-1].loss if ctx.stages else None   # the loss kernel (codegen.design.lower)
    files["host_config.json"] = (json.dumps(host_config(ctx), indent=2, sort_keys=False) + "\n").encode()
    put("common/bapipe_types.h", "bapipe_types.h.j2", header=c_hdr)
    put("common/bapipe_layers.h", "bapipe_layers.h.j2", header=c_hdr)
    put("common/bapipe_csim.h", "bapipe_csim.h.j2", header=c_hdr)
    put("common/bapipe_engines.h", "bapipe_engines.h.j2", header=c_hdr)
    put("common/csim/hls_stream.h", "hls_stream_csim.h.j2", header=c_hdr)
    if any(s.bwd is not None for s in ctx.stages):
        put("common/bapipe_layers_bwd.h", "bapipe_layers_bwd.h.j2", header=c_hdr)
        put("common/bapipe_update.h", "bapipe_update.h.j2", header=c_hdr, lanes=ar_model.LANES,
            wire_bits=ar_model.WIRE_BITS)
        put("common/bapipe_stash.h", "bapipe_stash.h.j2", header=c_hdr)
    put("common/mm2s.cpp", "mm2s.cpp.j2", header=c_hdr)
    put("common/s2mm.cpp", "s2mm.cpp.j2", header=c_hdr)
    for s in ctx.stages:
        d = s.name
        key = _board_type_key(s.board_type)
        part = PARTS.get(key, PARTS["U250"])
        clk = _clock_ns(s.board_type, cluster)
        put(f"{d}/{d}.h", "stage.h.j2", header=c_hdr, s=s)
        put(f"{d}/{d}_layers.h", "stage_layers.h.j2", header=c_hdr, s=s)
        # time-multiplexed: the MVU turns share one MAC array (codegen.design.mac_share, the DSP rule)
        put(f"{d}/{d}.cpp", "stage.cpp.j2", header=c_hdr, s=s, mac=share_mac(s.engine, s.index))
        put(f"{d}/{d}_weights.h", "weights.h.j2", header=c_hdr, s=s, embed_limit=EMBED_LIMIT)
        if s.engine is not None:
            put(f"{d}/{d}_roms.h", "stage_roms.h.j2", header=c_hdr, s=s)
        put(f"{d}/tb_{d}_io.h", "tb_io.h.j2", header=c_hdr, s=s)
        put(f"{d}/tb_{d}.cpp", "tb.cpp.j2", header=c_hdr, s=s)
        # external weights: the testbenches read the stage's weight image from the csim run folder
        wb = [] if s.embed_weights else [IMAGE]
        stim, stim_files = " ".join(["csim_in.bin", "csim_out.bin"] + wb), ["csim_in.bin"] + wb
        put(f"{d}/run_hls.tcl", "run_hls.tcl.j2", header=h_hdr, top=d, kernel_file=f"{d}.cpp",
            tb_file=f"tb_{d}.cpp", part=part, clock_ns=clk, tcl_name="run_hls.tcl", stim=stim, stim_files=stim_files)
        put(f"{d}/hls_config.cfg", "hls_config.cfg.j2", header=h_hdr, top=d, kernel_file=f"{d}.cpp",
            tb_file=f"tb_{d}.cpp", part=part, clock_ns=clk, cfg_name="hls_config.cfg", stim=stim, stim_files=stim_files)
        if s.bwd is not None:
            b = s.bwd
            put(f"{d}/{b.name}.cpp", "stage_bwd.cpp.j2", header=c_hdr, s=s, b=b)
            put(f"{d}/tb_{b.name}.cpp", "tb_bwd.cpp.j2", header=c_hdr, s=s, b=b)
            # stimulus: the testbench's own pattern ("-"), not a file (VGG-16's first stage: 95 MB)
            stim, stim_files = " ".join(["-", "csim_bwd_out.bin"] + wb), wb
            put(f"{d}/run_hls_bwd.tcl", "run_hls.tcl.j2", header=h_hdr, top=b.name, kernel_file=f"{b.name}.cpp",
                tb_file=f"tb_{b.name}.cpp", part=part, clock_ns=clk, tcl_name="run_hls_bwd.tcl",
                stim=stim, stim_files=stim_files)
            put(f"{d}/hls_config_bwd.cfg", "hls_config.cfg.j2", header=h_hdr, top=b.name,
                kernel_file=f"{b.name}.cpp", tb_file=f"tb_{b.name}.cpp", part=part, clock_ns=clk,
                cfg_name="hls_config_bwd.cfg", stim=stim, stim_files=stim_files)
            # the update and all-reduce kernels (codegen.design.train_kernels)
            files.update(render_train(s, put, c_hdr, h_hdr, part, clk))
            if s is ctx.stages[-1]:   # the loss gradient behind the last stage
                render_loss(loss, put, c_hdr, h_hdr, part, clk)
        files[f"{d}/csim_in.bin"] = csim_input(ctx, s)
    pl = place_project(ctx, cluster, sources=files)   # SLRs, banks, network glue (codegen.design.placement)
    files["placement.json"] = (json.dumps(pl, indent=1, sort_keys=True) + "\n").encode()
    for b in ctx.boards:
        if b.platform is None:
            continue  # no Vitis platform for this board type (e.g. VCU118): RTL flow only
        put(f"link/{b.name}.cfg", "link.cfg.j2", header=h_hdr, b=b,
            link=link_lines(b, pl["boards"][b.name], pl["channels"], pl["local"]))
    return files, pl


def write_images(ctx: ProjectCtx, out_dir: Path) -> list[Path]:
    """Each stage's weight image (codegen.design.weight_image), written a block at a time."""
    return [write_image(Path(out_dir) / image_path(s.name), s.image, ctx.fmt.width) for s in ctx.stages]


def write_files(files: dict[str, bytes], out_dir: Path) -> list[Path]:
    """Write the tree; unchanged files are left alone so mtimes (and make) stay quiet."""
    written = []
    for rel in sorted(files):
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != files[rel]:
            path.write_bytes(files[rel])
        written.append(path)
    return written


__all__ = ["render_kernels", "write_files", "write_images", "host_config", "environment", "PLATFORMS"]
