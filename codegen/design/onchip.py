"""The Design's on-chip bytes per kernel: what each generated HLS kernel keeps in BRAM/URAM,
from the decisions ``codegen.design.context`` made (stream depths, on-chip arrays, on-chip weights)
and the engines' buffers (``fpga_models.engines.line_buffer_bytes`` for window generators).

``codegen.check.cxx_memory`` computes the same figure independently, from the generated C++
declarations; tests/test_onchip_bytes.py holds the two within 10% of each other and
against the board's usable BRAM/URAM.
"""
from __future__ import annotations

import math
import re

from bapipe.fpga_models.engines import line_buffer_bytes

#: window engines: layer types that slide a K x K window over an image (a line buffer each)
WINDOW_TYPES = ("conv2d", "maxpool", "avgpool")


def elem_bytes(fmt) -> int:
    """Bytes of one element of the stage's number format (its C data_t)."""
    return math.ceil(fmt.width / 8)


def _kernel_size(layer) -> int:
    k = layer.attr.get("kernel", 1)
    return int(k if isinstance(k, int) else k[0])


def window_bytes(layer, eb: int) -> int:
    """The line buffer of a layer's window generator (K rows of its input image), 0 for others."""
    if layer is None or layer.type not in WINDOW_TYPES or not layer.in_shapes:
        return 0
    shape = layer.in_shapes[0]
    if len(shape) != 3:
        return 0
    c, _h, w = shape
    return line_buffer_bytes(_kernel_size(layer), w, c, eb)


_STREAM_DEPTH = re.compile(r"#pragma HLS STREAM variable=(\w+) depth=(\d+)")

#: BArray storage classes that take no BRAM/URAM/LUTRAM (codegen.design.backward)
_NOT_MEMORY = ("registers", "off-chip")


def _roms_bytes(stage_ctx, eb: int) -> int:
    """On-chip weight ROMs of the stage (weights small enough to embed: codegen.design.context)."""
    return sum(int(w.kernel_q.size) * eb for w in stage_ctx.weights) if stage_ctx.embed_weights else 0


def kernel_onchip_bytes(stage_ctx, fmt, bwd: bool = False) -> int:
    """On-chip bytes of a stage's forward (or backward) kernel as the Design states them.

    Forward kernels read off the Design (``stage_ctx.engine``, codegen.design.tm_kernel): every
    packed stream's FIFO (depth x lanes x element bytes; a time-multiplexed stage's frame
    buffers between turns, its turns' and its feed's own streams), the engines' on-chip ROMs (not the
    m_axi weight arrays) and the window generators' line buffers. Other forward kernels: the
    context's streams, on-chip weights and one line buffer per window layer
    (fpga_models.engines). Backward (codegen.design.backward.BwdCtx): its
    on-chip arrays and FIFOs, plus the on-chip weight ROMs it reads."""
    eb = elem_bytes(fmt)
    if bwd:
        b = stage_ctx.bwd
        if hasattr(b, "arrays"):
            arrays = sum(a.bytes for a in b.arrays if a.storage not in _NOT_MEMORY)
            return arrays + sum(st.bytes for st in b.streams) + _roms_bytes(stage_ctx, eb)
        total = sum(int(a.count) * eb for a in getattr(b, "buffers", [])) + _roms_bytes(stage_ctx, eb)
        return total + sum(int(m.group(2)) * eb for line in b.statements for m in _STREAM_DEPTH.finditer(line))
    e = getattr(stage_ctx, "engine", None)
    if e is not None:   # read off the Design (codegen.design.tm_kernel); m_axi weight arrays are off chip
        frames = frame_bytes(e, eb)
        if e.onchip_budget is None:
            return engine_fixed_bytes(e, eb) + sum(frames)
        # the frames the lowering kept on chip (placed by the rule, fpga_models.allocate, on the
        # Design's figures or by the Design's ddr_frame nodes), plus the two-deep streams of the
        # off-chip ones in their writer's and reader's turns
        local = {f.stream for f in e.frames}
        two_deep = sum(v.depth * v.lanes * eb for u in e.units for v in u.streams if v.name in local)
        kept = sum(v.depth * v.lanes * eb for v in e.turn_streams)
        return engine_fixed_bytes(e, eb) + kept + two_deep
    total = sum(window_bytes(lc.layer, eb) for lc in stage_ctx.layers) + _roms_bytes(stage_ctx, eb)
    return total + sum(int(st.depth) * eb * int(getattr(st, "lanes", 1)) for st in stage_ctx.streams)


def engine_fixed_bytes(e, eb: int) -> int:
    """On-chip bytes of an engine kernel (codegen.design.tm_kernel.EngineStage) besides the frame
    buffers between its turns: its streams and its turns' (not the two-deep ones that stand for
    an off-chip frame buffer), the on-chip ROMs (not the m_axi arrays), the line buffers and
    the pools' accumulators."""
    local = {f.stream for f in getattr(e, "frames", [])}
    units = list(getattr(e, "units", [])) + ([e.feed] if getattr(e, "feed", None) is not None else [])
    # the top function declares the feed's streams (codegen.design.tm_kernel): count each once
    streams = list({v.name: v for v in list(e.streams) + [v for u in units for v in u.streams
                                                           if v.name not in local]}.values())
    roms = sum(math.prod(r.shape) * eb for r in e.roms if not getattr(r, "external", False))
    return (sum(v.depth * v.lanes * eb for v in streams) + roms + e.line_buffer_elems * eb + e.acc_bytes
            + mac_buffer_bytes(e, eb))


def mac_buffer_bytes(e, eb: int) -> int:
    """A time-multiplexed kernel's shared MAC array keeps its input vector (the largest MW of its
    MVU turns) for the row folds after the first (codegen.design.mac_share); 0 without one."""
    from bapipe.codegen.design.mac_share import share_mac

    share = share_mac(e, 0) if getattr(e, "units", None) else None
    return share.xb * eb if share is not None else 0


def frame_order(e) -> list[str]:
    """The frame buffers between a time-multiplexed kernel's turns (on and off chip), in the
    order of the turns that write them (then by name), as the planner lists a stage's layer
    outputs (fpga_models.allocate.tm_frames)."""
    first: dict[str, int] = {}
    for k, u in enumerate(getattr(e, "units", [])):
        for name in [v.name for v in u.params] + [f.stream for f in u.frames]:
            first.setdefault(name, k)
    names = [v.name for v in getattr(e, "turn_streams", [])] + [f.stream for f in getattr(e, "frames", [])]
    return sorted(names, key=lambda n: (first.get(n, -1), n))


def frame_bytes(e, eb: int) -> list[int]:
    """On-chip bytes of each frame buffer of :func:`frame_order`, were it on chip (the off-chip
    ones too): what fpga_models.allocate.frames_offchip places."""
    sizes = {v.name: v.depth * v.lanes * eb for v in getattr(e, "turn_streams", [])}
    sizes.update({f.stream: f.depth * f.lanes * eb for f in getattr(e, "frames", [])})
    return [sizes[k] for k in frame_order(e)]


def kernel_blocks(stage_ctx, fmt):
    """The Design's BRAM18 units, URAMs and LUTs of a stage's forward engine kernel
    (fpga_models.memory_blocks.Blocks), from the storage it chose: the packed weight buffers
    (their WeightBanks), the bias copies and ROMs (banks along their partitioned dims), every
    FIFO at its bound storage (or where Vitis would put it), the window generators' rings
    (fpga_models.allocate.ring_banks), the pools' accumulators and the shared MAC array's kept
    input vector. None for a
    kernel the engines do not build. `bapipe check` reads the same from the generated C++."""
    from bapipe.fpga_models.memory_blocks import Blocks, array_blocks, bank_blocks, fifo_impl

    e = getattr(stage_ctx, "engine", None)
    if e is None:
        return None
    bits = fmt.width
    total = Blocks()
    for r in e.roms:
        if r.external:
            continue
        if r.bank is not None:
            total = total + r.bank.blocks
            continue
        banks = math.prod(r.shape[d - 1] for d in r.partition_dims) if r.partition_dims else 1
        total = total + array_blocks(r.impl, bits, math.prod(r.shape), banks)
    units = list(getattr(e, "units", [])) + ([e.feed] if getattr(e, "feed", None) is not None else [])
    streams = {v.name: v for v in list(e.streams) + list(e.turn_streams) + [v for u in units for v in u.streams]}
    for v in streams.values():
        width = v.lanes * bits
        total = total + bank_blocks(v.impl or fifo_impl(width, v.depth), width, v.depth)
    for banks, width, depth, impl in getattr(e, "rings", []):
        total = total + bank_blocks(impl, width, depth).scaled(banks)
    for banks, width, depth in getattr(e, "pool_accs", []):   # unbound: where Vitis leaves them
        total = total + bank_blocks("auto", width, depth).scaled(banks)
    from bapipe.codegen.design.mac_share import share_mac

    share = share_mac(e, 0) if getattr(e, "units", None) else None
    if share is not None:
        total = total + bank_blocks("auto", bits, math.ceil(share.xb / share.xw)).scaled(share.xw)
    return total
