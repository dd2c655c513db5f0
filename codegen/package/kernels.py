"""Board-ready packaging: RTL stages as Vitis RTL kernels, and the build's record of what the
Makefile links and what the xrt backend must load, start and feed.

``rtl_kernel_files`` wraps every RTL stage as the Vitis kernel ``stage<i>`` (the name and
stream argument names of its HLS twin, so the link configs name either): the stage's
engines (the lowering in ``codegen.design.dataflow``, fed one element per beat, as the HLS
kernels and the mm2s/s2mm movers stream) behind ``kernel_top`` (ap_clk, ap_rst_n,
AXI4-Stream with TLAST, an s_axilite slave speaking ap_ctrl_hs), with its kernel.xml and
the Vivado ``package_xo`` script, under ``rtl/kernels/stage<i>/``.

``xrt_manifest`` is the section of ``bapipe-build.json`` the xrt backend reads: per board
its device index, the xclbin the Makefile links, each kernel instance with its control
protocol, its arguments (index, kind, bytes) and the weight image an m_axi argument is
loaded from; the movers the host feeds and drains. Nothing here derives a hardware figure:
sizes come from the project context (``codegen.design.context``) and the lowering.

ap_ctrl_hs rather than ap_ctrl_none for RTL kernels: the host says how many samples a run
streams (``samples`` at 0x10) and learns from ap_done when the last output beat has left,
so a run has an end XRT can wait on and a kernel never takes beats of the next run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from bapipe.errors import SpecError
from bapipe.names import shown

from bapipe.codegen.design.weight_image import image_path

ENGINES = ("hls", "rtl")
KERNELS = "rtl/kernels"
VENDOR = "bapipe.org"
#: the ap_ctrl_hs register map of kernel_control.v (name, byte offset, bits)
REGISTERS = (("CTRL", 0x00, 32), ("GIE", 0x04, 32), ("IER", 0x08, 32), ("ISR", 0x0C, 32),
             ("samples", 0x10, 32), ("status", 0x18, 32))
SAMPLES_OFFSET = 0x10
#: argument indices of the host data movers (hls_templates/hls/mm2s.cpp.j2: mm2s(mem, out, n),
#: s2mm.cpp.j2: s2mm(in, mem, n))
MOVER_ARGS = {"mm2s": {"mem": 0, "n": 2}, "s2mm": {"mem": 1, "n": 2}}


@dataclass(frozen=True)
class RtlKernel:
    """One packaged RTL stage: what kernel_top, kernel.xml and package_xo.tcl print."""

    name: str                 # Vitis kernel name = the HLS kernel's (stage<i>)
    index: int
    layers: list[str]
    in_port: str              # stream argument names (the HLS kernel's: in0, out0)
    out_port: str
    elem_w: int               # bits per beat at the kernel's edge (one element)
    in_beats: int             # beats per sample in and out
    out_beats: int
    core: str                 # the stage's engines as one module
    core_out_w: int

    @property
    def args(self) -> list[dict]:
        """kernel.xml's arguments in id order (XRT's set_arg indices): streams, then samples."""
        t = f"stream&lt;ap_uint&lt;{self.elem_w}&gt;&gt;&amp;"
        return [{"name": self.in_port, "qualifier": 4, "id": 0, "port": f"s_axis_{self.in_port}", "size": "0x0",
                 "offset": "0x0", "type": t, "kind": "stream"},
                {"name": self.out_port, "qualifier": 4, "id": 1, "port": f"m_axis_{self.out_port}", "size": "0x0",
                 "offset": "0x0", "type": t, "kind": "stream"},
                {"name": "samples", "qualifier": 0, "id": 2, "port": "s_axi_control", "size": "0x4",
                 "offset": f"0x{SAMPLES_OFFSET:x}", "type": "uint", "kind": "samples"}]


def _bits(n: int) -> int:
    """Bits holding 0..n."""
    return max(1, int(n).bit_length())


def rtl_kernels(d, main: dict[str, str] | None = None) -> tuple[list[RtlKernel], dict[str, str]]:
    """Render every stage of the Design ``d`` as a packaged RTL kernel: its core is the stage
    lowered alone, fed one element per beat (codegen.design.lower's ``rtl_kernels`` pass).

    ``main``: the main build's rtl/ files (name -> text), checked to hold the shared modules
    unchanged. Returns the kernels and the files ``rtl/kernels/<name>/<file>`` -> text for the
    modules that differ from the main build's (the core; generic blocks and MVUs are named from
    ``rtl/``).
    """
    from bapipe.codegen.rtl.pipeline import render_pipeline
    from bapipe.codegen.rtl.env import GENERATOR_VERSION, render_template
    from bapipe.codegen.rtl.mem_words import pe_module

    plan = d.plan
    plan_hash = plan.fingerprint()[:16]
    kernels, files = [], {}
    for ps, sc, one in zip(plan.stages, d.stages, d.kernels):
        st = one.stages[0]
        name = sc.name
        core = f"{name}_core"
        one = replace(one, boards=[replace(one.boards[0], module=core)])
        ew = one.elem_w
        if ew % 8 or st.in_lanes != 1:
            raise SpecError("plan.yaml", None, "number_format",
                            f"expected whole-byte elements fed one a beat for RTL kernels (stage {ps.index})")
        k = RtlKernel(name=name, index=ps.index, layers=list(ps.layers), in_port=sc.inputs[0].name,
                      out_port=sc.outputs[0].name, elem_w=ew, in_beats=st.in_elems, out_beats=st.out_elems,
                      core=core, core_out_w=st.out_lanes * ew)
        rendered = render_pipeline(one, plan.cluster, plan_hash)
        d = f"{KERNELS}/{name}"
        files[f"{d}/{core}.v"] = rendered[f"{core}.v"]
        ratio = st.out_lanes
        down = {"count_w": _bits(ratio)} if ratio > 1 else None
        cnt_w = 32 + _bits(max(k.in_beats, k.out_beats))
        files[f"{d}/{name}.v"] = render_template(
            "kernel_top", plan_hash, kernel=name, index=ps.index, layers=", ".join(map(shown, ps.layers)), in_port=k.in_port,
            out_port=k.out_port, elem_w=ew, in_beats=k.in_beats, out_beats=k.out_beats, core=core,
            core_in_w=st.in_lanes * ew, core_out_w=k.core_out_w, down=down, cnt_w=cnt_w,
            pos_w=_bits(max(k.in_beats, k.out_beats) - 1))
        modules = sorted({b.module for b in st.blocks} | {pe_module(b.mvu.simd) for b in st.blocks if b.mvu is not None}
                         | ({"tm_sequencer", "ddr_weights"} if st.units else set())
                         | {"kernel_control"} | ({"axis_width_conv"} if down else set()))
        sources = ([f"../{m}.v" if m == "kernel_control" else f"../../{m}.v" for m in modules]
                   + [f"{core}.v", f"{name}.v"])
        memories = [f"../../{b.module}_{x}.hex" for b in st.blocks if b.mvu is not None for x in ("w", "b")]
        for m in modules:   # the shared modules named from rtl/ must be the main build's, byte for byte
            if main is not None and f"{m}.v" in rendered and main.get(f"{m}.v") != rendered[f"{m}.v"]:
                raise RuntimeError(f"{name}: {m}.v differs from the main build's rtl/{m}.v")
        env_ctx = dict(version=GENERATOR_VERSION, plan_hash=plan_hash, name=name, index=ps.index)
        ports = [{"port": f"s_axis_{k.in_port}", "mode": "read_only", "width": ew},
                 {"port": f"m_axis_{k.out_port}", "mode": "write_only", "width": ew}]
        what = dict(what=f"stage {ps.index}", control="ap_ctrl_hs")
        files[f"{d}/kernel.xml"] = _render("kernel.xml.j2", vlnv=f"{VENDOR}:kernel:{name}:1.0", ports=ports,
                                           args=k.args, **what, **env_ctx)
        files[f"{d}/package_xo.tcl"] = _render(
            "package_xo.tcl.j2", part=_part(ps.board_type), xo_path=f"../../../{name}/{name}.xo", sources=sources,
            here=d, plan_fingerprint=plan.fingerprint(), **what,
            memories=memories, vendor=VENDOR, ports=ports,
            registers=[{"name": n, "offset": f"0x{o:03x}", "bits": b} for n, o, b in REGISTERS], **env_ctx)
        files[f"{d}/sources.json"] = json.dumps({"kernel": name, "top": name, "sources": sources,
                                                 "memories": memories, "mem_dir": "../../"}, indent=1) + "\n"
        kernels.append(k)
    files[f"{KERNELS}/kernel_control.v"] = render_template("kernel_control", plan_hash)
    return kernels, files


def _render(template: str, **ctx) -> str:
    from bapipe.codegen.rtl.env import rtl_env

    return rtl_env().get_template(template).render(**ctx)


def _part(board_type: str) -> str:
    from bapipe.codegen.design.context import _board_type_key
    from bapipe.codegen.design.context import PARTS

    return PARTS.get(_board_type_key(board_type), PARTS["U250"])


def check_engines_plan(engines: str, plan) -> None:
    """What the plan alone decides: a known engines value; RTL kernels are forward-only."""
    if engines not in ENGINES:
        raise SpecError(None, None, "--engines", f"expected one of {', '.join(ENGINES)}, got {engines!r}")
    if engines == "rtl" and plan.mode == "train":
        raise SpecError(None, None, "--engines", "expected hls for a training plan (RTL kernels are forward-only)")


def check_engines(engines: str, ctx, rtl_supported: bool, reason: str | None) -> None:
    """``--engines rtl`` needs the RTL of every stage, forward-only, one stream in and out."""
    check_engines_plan(engines, ctx.plan)
    if engines == "hls":
        return
    if not rtl_supported:
        raise SpecError(None, None, "--engines", f"expected hls: the RTL cannot build this plan ({reason})")
    for s in ctx.stages:
        if len(s.inputs) != 1 or len(s.outputs) != 1:
            raise SpecError(None, None, "--engines", f"expected hls: {s.name} has {len(s.inputs)} input and "
                                                     f"{len(s.outputs)} output streams (RTL kernels take one each)")


def strip_rtl_weight_ports(boards, stages):
    """The boards' link lines for RTL kernels: their weights are on-chip ROM, so the m_axi
    weight ``sp`` lines of the HLS kernels go (the rest names the same kernels and ports)."""
    # every m_axi port of a forward stage kernel (per-layer weight arrays or the engine
    # kernels' external ROMs): the RTL kernel has none
    drop = {f"{s.name}_1." for s in stages}
    return [replace(b, sp=[l for l in b.sp if not any(l.startswith(d) for d in drop)]) for b in boards]


def xrt_manifest(ctx, engines: str) -> dict:
    """What the xrt backend loads, starts and feeds, board by board (see the module docstring)."""
    elem_bytes = 2 if ctx.fmt.width > 8 else 1
    by_name = {s.name: s for s in ctx.stages}
    ports = {}
    for s in ctx.stages:
        for p in s.inputs:
            ports[f"mm2s_{s.name}_{p.name}"] = (s, p)
        for p in s.outputs:
            ports[f"s2mm_{s.name}_{p.name}"] = (s, p)
    boards = []
    for dev, b in enumerate(x for x in ctx.boards if x.platform):
        kernels, inputs, outputs = [], [], []
        for kname in b.stages:
            if kname not in by_name:
                continue   # backward kernels: the xrt backend runs the forward pass
            s = by_name[kname]
            streams = [{"index": i, "name": p.name, "kind": "stream"} for i, p in enumerate(s.inputs + s.outputs)]
            if engines == "rtl":
                control, starts = "hs", "once"
                args = streams + [{"index": len(streams), "name": "samples", "kind": "samples"}]
            elif getattr(s, "engine", None) is not None:   # HLS engine kernels: n samples per call
                control, starts = "hs", "once"
                args = list(streams)
                for r in s.engine.external:   # m_axi weight arrays (stages beyond on-chip ROM), from the image
                    args.append({"index": len(args), "name": r.name, "kind": "weights", "bytes": r.size * elem_bytes,
                                 "file": image_path(s.name), "offset": r.offset * elem_bytes})
                for f in s.engine.frames:   # off-chip frame buffers: device memory the kernel writes and reads
                    args.append({"index": len(args), "name": f.name, "kind": "scratch", "bytes": f.bytes})
                args.append({"index": len(args), "name": "n", "kind": "samples"})
            elif s.embed_weights:
                control, starts, args = "none", "never", streams
            else:
                control, starts = "hs", "per_sample"
                args = list(streams)
                for w in s.weights:   # kernel layout in the image (codegen.design.weight_image)
                    args.append({"index": len(args), "name": w.name, "kind": "weights",
                                 "bytes": int(w.kernel_q.size) * elem_bytes, "file": image_path(s.name),
                                 "offset": w.offset * elem_bytes})
            kernels.append({"name": kname, "instance": f"{kname}_1", "stage": s.index, "engine": engines,
                            "control": control, "starts": starts, "args": args})
        for line in b.nk:
            kernel, _, insts = line.split(":")
            if kernel not in MOVER_ARGS:
                continue
            for inst in insts.split("."):
                if inst not in ports:
                    continue   # movers of backward kernels: the xrt backend runs the forward pass
                s, p = ports[inst]
                entry = {"kernel": kernel, "instance": inst, "stage": s.index, "port": p.name,
                         "tensor": p.tensor, "elements": p.elements, "args": dict(MOVER_ARGS[kernel])}
                (inputs if kernel == "mm2s" else outputs).append(entry)
        boards.append({"name": b.name, "device": dev, "xclbin": b.xclbin, "kernels": kernels,
                       "inputs": inputs, "outputs": outputs})
    from bapipe.codegen.package.xrt_train import train_manifest   # training builds: what the xrt host trains with

    return {"engines": engines, "elem_bytes": elem_bytes, "boards": boards, "train": train_manifest(ctx, elem_bytes)}


#: the build's record (codegen/cli_gen.py writes it as STAMP)
BUILD_STAMP = "bapipe-build.json"


def read_xrt_manifest(build: Path, plan_fingerprint: str) -> dict:
    """The ``xrt`` section of a build's stamp; SpecError (one line) when the folder is not a
    `bapipe gen` build of the plan with that fingerprint, or predates the section."""
    path = Path(build) / BUILD_STAMP
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(stamp, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        raise SpecError(str(path), None, "--build", "expected a folder written by `bapipe gen` (no "
                                                    f"{BUILD_STAMP}); run `bapipe gen PLAN -o {build}`") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError(str(path), None, "(document)", f"expected the JSON written by `bapipe gen` "
                                                       f"({type(e).__name__}); re-run it") from None
    if stamp.get("plan_fingerprint") != plan_fingerprint:
        raise SpecError(str(path), None, "plan_fingerprint", "expected a build of this plan (it was generated from "
                                                             "another plan or an earlier version); re-run `bapipe gen`")
    if not isinstance(stamp.get("xrt"), dict):
        raise SpecError(str(path), None, "xrt", "expected the xrt section of a current `bapipe gen`; re-run it")
    return stamp["xrt"]


__all__ = ["read_xrt_manifest", "ENGINES", "RtlKernel", "rtl_kernels", "check_engines", "strip_rtl_weight_ports",
           "xrt_manifest"]
