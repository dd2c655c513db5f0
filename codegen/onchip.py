"""The Design's on-chip bytes per kernel: what each generated HLS kernel keeps in BRAM/URAM,
from the decisions ``codegen.context`` made (stream depths, on-chip arrays, on-chip weights)
and the engines' buffers (``fpga_models.engines.line_buffer_bytes`` for window generators).

``codegen.cxx_memory`` computes the same figure independently, from the generated C++
declarations; tests/test_onchip_bytes.py holds the two within 10% of each other and
against the board's usable BRAM/URAM.
"""
from __future__ import annotations

import math
import re

from fpga_models.engines import line_buffer_bytes

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


def kernel_onchip_bytes(stage_ctx, fmt, bwd: bool = False) -> int:
    """On-chip bytes of a stage's forward (or backward) kernel as the Design states them:
    stream FIFOs (depth x beat bytes), on-chip arrays and on-chip weight ROMs, and one line
    buffer per window engine (forward; the backward kernel recomputes the forward layers too)."""
    eb = elem_bytes(fmt)
    total = sum(window_bytes(lc.layer, eb) for lc in stage_ctx.layers)
    if stage_ctx.embed_weights:
        total += sum(int(w.kernel_q.size) * eb for w in stage_ctx.weights)
    if not bwd:
        for st in stage_ctx.streams:
            total += int(st.depth) * eb * int(getattr(st, "lanes", 1))
        return total
    b = stage_ctx.bwd
    total += sum(int(a.count) * eb for a in getattr(b, "buffers", []))
    streams = getattr(b, "streams", None)
    if streams is not None:
        total += sum(int(st.depth) * eb * int(getattr(st, "lanes", 1)) for st in streams)
    else:   # depths as the context wrote them into the statement list
        total += sum(int(m.group(2)) * eb for line in b.statements for m in _STREAM_DEPTH.finditer(line))
    return total
