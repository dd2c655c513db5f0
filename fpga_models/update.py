"""What a training stage pays once per iteration beside its micro-batches, as the HLS kernels
build it: the backward kernel's flush of the exact weight-gradient sums, the all-reduce between
replicas (fpga_models.allreduce) and the SGD update kernel (``bapipe::sgd_words``,
hls_templates/hls/library/bapipe_update.h.j2). The one home of their cycles: the planner
(planner.search, planner.breakdown), the simulator (fpga_models.sim), the Design
(codegen.design.train_kernels) and csim read these.

Update kernel: per weight array (kernel layout, one after another), one **word** of
:data:`LANES` elements a trip: the gradient sums (int64) and velocities (int64) as one 512-bit
beat each, the master weights (int32) as 256 bits, the backward's 16-bit copy as 128 bits and,
for an engine kernel, the forward's banked copy (``[NF*SF][PE][SIMD]``): one 128-bit write when
the word's 8 elements land on 8 consecutive, aligned places there (:func:`wide`), else 8
writes of one element (a dense layer reading a flattened image in HWC order, SIMD not a
multiple of 8: the port takes one a cycle, and each costs a whole burst of the bank), or, for
a dense layer reading a flattened image in HWC order, a PE-row block at a time through an
on-chip staging buffer that transposes it (:func:`write_mode`: vgg16's fc6). The
trip's II is the larger of that and the busiest bank's bytes per word at the bank's bandwidth,
the streams spread over the board's banks heaviest first (:func:`spread`): the kernel's
``#pragma HLS PIPELINE II``.

Flush: the backward kernel's flush call, once an iteration. A stage with tiled matrix engines
(fpga_models.bwd_tiles) flushes as its engines do (fpga_models.bwd_memory.bwd_flush_cycles, the
one home of that figure: on-chip dW stores written out, kept vectors made into dW, bias sums);
the callers that know the stage's style and batch pass it to :func:`stage_tail`. Without it
(the layout DP's per-layer prefix sums, a stage with no matrix engine): each array's sums one
512-bit beat (8 sums) a cycle, at most the gradient bank's bandwidth (:func:`flush_cycles`).

Every buffer these kernels read as words is allocated in whole 64-byte words
(:func:`padded_elements`); the pad lanes hold zeros and stay zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .allreduce import LANES, MEM_WORD_BITS, ring_timing

#: pipeline depth of one array's update loop (its BAPIPE_LOOP depth): reads, the two products,
#: the saturations, the writes
UPDATE_DEPTH = 6
#: pipeline depth of one flush loop of the backward kernel (its BAPIPE_LOOP depth)
FLUSH_DEPTH = 2
#: bytes a 64-byte memory beat moves
BEAT_BYTES = MEM_WORD_BITS // 8


def bank_Bps(board) -> float:
    """Bandwidth of one memory bank of ``board`` (bytes/s): the banks its placement uses
    (HBM pseudo-channels when the board has them, else its DDR banks), the slowest; a board
    without a bank table: its whole off-chip bandwidth as one bank."""
    banks = [b for b in board.banks if b.kind == "hbm"] or list(board.banks)
    return min(b.bw_Bps for b in banks) if banks else float(board.offchip_bw_Bps)


def bank_count(board) -> int:
    """Banks the update's streams can spread over (:func:`bank_Bps`'s kind)."""
    banks = [b for b in board.banks if b.kind == "hbm"] or list(board.banks)
    return max(1, len(banks))


def padded_elements(n: int, lanes: int = LANES) -> int:
    """Elements of a buffer the kernels read as words of ``lanes``: n rounded up."""
    return -(-int(n) // lanes) * lanes


def wide(count: int, banked: bool, cols: int = 1, simd: int = 1, permuted: bool = False) -> bool:
    """Does every word of an array land whole in the forward's banked copy? Always when there
    is none (``banked`` False); else when the array is whole words and (a weight matrix of
    ``cols`` columns in SIMD-wide runs, ``cols`` 1 for biases and batchnorm arrays, which are
    laid out as they are) no column permutation moves its elements apart and the runs are
    whole words."""
    if not banked:
        return True
    if count % LANES:
        return False
    if cols == 1:
        return True
    return not permuted and simd % LANES == 0 and cols % LANES == 0


#: largest staging buffer (bytes) of a transposed array's block (:func:`write_mode`): vgg16's fc6
#: needs 4 x 25,088 x 2 = 196 KiB
TRANSPOSE_BYTES = 1 << 20
#: pipeline depth of a transposed block's write-out loop (its BAPIPE_LOOP depth)
TRANSPOSE_DEPTH = 4


def write_mode(count: int, banked: bool, cols: int = 1, simd: int = 1, permuted: bool = False,
               flat: tuple[int, int] | None = None, pe: int = 1, elem_bytes: int = 2) -> str:
    """How the update kernel writes an array's forward copy: "wide" (:func:`wide`, a word a
    trip), "transpose" or "narrow" (an element a cycle). "transpose": a dense layer reading a
    flattened C x HW image in HWC order (``flat`` = (C, HW)) whose PE-row blocks (PE x cols
    elements, contiguous in both layouts) fit a staging buffer of TRANSPOSE_BYTES: the update
    writes a block's forward values to the buffer, 8 banks by kernel-layout index mod 8, then
    reads it out a forward word a cycle; 8 consecutive forward columns (one pixel, channels
    c..c+7) sit HW apart in the kernel layout, in 8 distinct banks when HW is odd, so C, SIMD
    and cols must be whole words and HW odd."""
    if wide(count, banked, cols, simd, permuted):
        return "wide"
    if flat is not None and permuted and count % LANES == 0 and cols % LANES == 0 and simd % LANES == 0:
        c, hw = flat
        if c % LANES == 0 and hw % 2 == 1 and c * hw == cols and pe * cols * elem_bytes <= TRANSPOSE_BYTES:
            return "transpose"
    return "narrow"


def stream_bytes(elem_bytes: int, banked: bool, is_wide: bool) -> dict[str, float]:
    """Bytes each of the update's memory streams moves per element: gradient read (8), master
    read and write (4 + 4), velocity read and write (8 + 8), the backward's copy, and the
    forward's banked copy (a burst per element when the word does not land whole)."""
    out = {"grad": 8.0, "master": 8.0, "vel": 16.0, "w": float(elem_bytes)}
    if banked:
        out["rom"] = float(elem_bytes) if is_wide else float(BEAT_BYTES)
    return out


def spread(loads: dict[str, float], banks: int) -> float:
    """The busiest bank's load when the streams go heaviest first to the least-loaded bank."""
    fill = [0.0] * max(1, banks)
    for _name, b in sorted(loads.items(), key=lambda kv: (-kv[1], kv[0])):
        k = min(range(len(fill)), key=lambda i: (fill[i], i))
        fill[k] += b
    return max(fill)


def update_ii(elem_bytes: int, banked: bool, is_wide: bool, banks: int, bank_bytes_per_cycle: float) -> int:
    """II of one array's update loop: 1 a word, or :data:`LANES` when the forward's copy is
    written element by element; at least the busiest bank's bytes per word at its bandwidth."""
    compute = 1 if is_wide else LANES
    busiest = spread(stream_bytes(elem_bytes, banked, is_wide), banks) * LANES
    # 1e-9: bandwidths are float quotients (64 bytes a cycle can come out 1 ulp off)
    return max(compute, math.ceil(busiest / bank_bytes_per_cycle - 1e-9))


@dataclass(frozen=True)
class UpdArray:
    """One array the update kernel rewrites, as timing sees it: its elements, whether it has a
    banked forward copy, how that is written (:func:`write_mode`) and, transposed, its blocks."""

    count: int
    banked: bool = False
    mode: str = "wide"
    blocks: int = 1

    @property
    def wide(self) -> bool:
        """Is its forward copy written a word a trip (wide, or transposed through the buffer)?"""
        return self.mode != "narrow"


def array_cycles(a: UpdArray, elem_bytes: int, banks: int, bank_bytes_per_cycle: float) -> int:
    """Cycles of one array's update: its words at its II plus the loop's depth; transposed,
    per block the update loop then the write-out loop (a word a cycle)."""
    words = -(-a.count // LANES)
    ii = update_ii(elem_bytes, a.banked, a.wide, banks, bank_bytes_per_cycle)
    if a.mode == "transpose":
        return words * (ii + 1) + a.blocks * (UPDATE_DEPTH + TRANSPOSE_DEPTH)
    return words * ii + UPDATE_DEPTH


def update_cycles(arrays, elem_bytes: int, banks: int, bank_bytes_per_cycle: float) -> int:
    """Cycles of one update call: the arrays one after another (:func:`array_cycles`)."""
    return sum(array_cycles(a, elem_bytes, banks, bank_bytes_per_cycle) for a in arrays if a.count > 0)


def flush_cycles(counts, bank_bytes_per_cycle: float) -> float:
    """Cycles of the backward kernel's flush: per gradient array its 512-bit beats, one a
    cycle or the bank's bandwidth if slower, plus the loop's depth."""
    per = max(1.0, BEAT_BYTES / bank_bytes_per_cycle) if bank_bytes_per_cycle > 0 else 1.0
    return sum(-(-int(n) // LANES) * per + FLUSH_DEPTH for n in counts if n > 0)


# ---------------------------------------------------------------- a stage's arrays from the spec

def layer_arrays(layer, banked: bool, simd: int = 1, permuted: bool = False, pe: int = 1,
                 flat: tuple[int, int] | None = None, elem_bytes: int = 2) -> tuple[list[int], list[UpdArray]]:
    """(gradient sums per array the backward kernel writes and the all-reduce reduces, arrays the
    update rewrites) of one model layer: a dense or conv2d layer's MH x MW matrix and MH bias
    sums (the bias updated when the layer has one), a batchnorm's scale and shift; other
    weighted layers one array of their parameters. ``banked``: the forward kernel keeps its
    weights in banked m_axi arrays (a time-multiplexed engine kernel) that the update rewrites
    too; ``simd``: the layer's SIMD; ``permuted``: its columns are read in another order (a
    dense layer behind a flatten of an H x W > 1 image; ``flat``: that image's (C, H x W)); ``pe``
    its PE."""
    t, n = layer.type, int(layer.weight_params)
    if n <= 0:
        return [], []
    mode = lambda k, cols=1: write_mode(k, banked, cols, simd, permuted, flat, pe, elem_bytes)  # noqa: E731
    if t in ("dense", "conv2d"):
        a = layer.attr
        mh = int(a["units"] if t == "dense" else a["out_channels"])
        bias = bool(a.get("bias", True))
        mw = (n - (mh if bias else 0)) // mh
        w = UpdArray(mh * mw, banked, mode(mh * mw, mw), max(1, mh // max(1, pe)))
        upd = [w] + ([UpdArray(mh, banked, mode(mh))] if bias else [])
        return [mh * mw, mh], upd
    if t == "batchnorm":
        c = n // 2
        return [c, c], [UpdArray(c, banked, mode(c)), UpdArray(c, banked, mode(c))]
    return [n], [UpdArray(n, banked, mode(n))]


def flattened_image(model, index: int) -> tuple[int, int] | None:
    """(C, H x W) of the image layer ``index`` (of ``model``) reads flattened, when it is a
    dense layer behind a flatten of an H x W > 1 image: the forward reads its columns in HWC
    order (codegen.design.dataflow.flatten_perm); else None."""
    layer = model.layers[index]
    if layer.type != "dense" or not layer.inputs:
        return None
    src = layer.inputs[0]
    if src not in model.index:
        return None
    prev = model.layers[model.index[src]]
    if prev.type != "flatten" or len(prev.in_shapes[0]) != 3:
        return None
    c, h, w = prev.in_shapes[0]
    return (int(c), int(h * w)) if h * w > 1 else None


def permuted_columns(model, index: int) -> bool:
    """Does the forward read layer ``index``'s columns in another order (:func:`flattened_image`)?"""
    return flattened_image(model, index) is not None


def engine_kernel(model, first: int, last: int) -> bool:
    """Is a stage of layers ``first..last`` one engine kernel, whose forward keeps its weights
    in banked m_axi arrays the update rewrites too? When one tensor enters and one leaves it
    (codegen.design.lower's engine positions)."""
    ins = 1 if first == 0 else len(model.cut_tensors(first - 1))
    outs = 1 if last >= len(model.layers) - 1 else len(model.cut_tensors(last))
    return ins == 1 and outs == 1


@dataclass(frozen=True)
class LayerTail:
    """One layer's share of a stage's tail: its gradient arrays (sums each), the flush's and
    the update's cycles."""

    grads: tuple[int, ...]
    flush: float
    update: int


def layer_tail(model, index: int, board, elem_bytes: int, banked: bool, simd: int = 1, pe: int = 1) -> LayerTail:
    """Layer ``index`` of ``model`` in a training stage on ``board`` (:func:`layer_arrays`;
    ``banked``: the stage's forward is an engine kernel with banked weight arrays)."""
    layer = model.layers[index]
    flat = flattened_image(model, index)
    grads, upd = layer_arrays(layer, banked and layer.type in ("dense", "conv2d", "batchnorm"), int(simd),
                              flat is not None, int(pe), flat, elem_bytes)
    bank = bank_Bps(board) / board.clock_hz
    return LayerTail(tuple(grads), flush_cycles(grads, bank),
                     update_cycles(upd, elem_bytes, bank_count(board), bank))


@dataclass(frozen=True)
class Tail:
    """A stage's per-iteration tail after its last backward, in seconds: the flush, the
    all-reduce (0 for one replica) and the update."""

    flush_s: float
    allreduce_s: float
    update_s: float
    ring_occ_s: float = 0.0     # seconds a ring step holds its hop (the event replays' rings)
    ring_lat_s: float = 0.0     # seconds of a ring step's latency

    @property
    def total_s(self) -> float:
        return self.flush_s + self.allreduce_s + self.update_s


def stage_tail(model, first: int, last: int, board, elem_bytes: int, replicas: int, banked: bool,
               folding: dict | None = None, ring_hop: tuple[float, float] | None = None,
               flush: float | None = None) -> Tail:
    """The tail of a training stage of layers ``first..last`` on ``board`` (an FPGA: its clock
    and banks), ``replicas`` copies joined by a ring whose slowest hop is ``ring_hop`` =
    (bytes/s, latency s); ``folding``: layer name -> (PE, SIMD) (for :func:`write_mode`);
    ``flush``: the backward kernel's flush cycles as its tiled engines build it
    (fpga_models.bwd_memory.bwd_flush_cycles), None or 0 (no matrix engine): each gradient
    array a beat of 8 sums a cycle (:func:`flush_cycles`)."""
    folding = folding or {}
    parts = []
    for k in range(first, last + 1):
        pe, simd = folding.get(model.layers[k].name, (1, 1))
        parts.append(layer_tail(model, k, board, elem_bytes, banked, int(simd), int(pe)))
    grads = [n for p in parts for n in p.grads]
    clk = board.clock_hz
    flush = (flush or sum(p.flush for p in parts)) / clk
    update = sum(p.update for p in parts) / clk
    ar = occ = lat = 0.0
    if replicas > 1 and grads and ring_hop is not None:
        bw, lat_s = ring_hop
        t = ring_timing(grads, replicas, bw / clk, max(1, round(lat_s * clk)), bank_Bps(board) / clk)
        o, lc = t.hop()
        ar, occ, lat = t.cycles / clk, o / clk, lc / clk
    return Tail(flush, ar, update, occ, lat)
