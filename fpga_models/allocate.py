"""Inside one board: choose every layer's folding for a stage, in one of two execution styles.

- time-multiplexed: the layers take turns on one shared engine; each layer runs at the
  fastest legal folding within the whole budget (DSP, LUT), so the stage time is the sum of
  the layers' times. Resources are the largest layer's (the engine is shared).
- dataflow (FINN's layer-pipelined style): every layer has its own engine and all are
  resident; a micro-batch of ``batch`` samples streams through them, taking
  ``sum_l t_l + (batch - 1) * max_l t_l`` per pass (the flow-shop time of identical samples
  through the layer engines). The budget is shared, so the folding minimises the slowest
  layer: bisection on a target interval, each layer taking its cheapest folding that meets
  it (FINN's SetFolding targets a cycle count the same way), within sum DSP and sum LUT.

``allocate_stage`` evaluates both and returns the faster.

The board budget (one rule, :func:`board_kernels` / :func:`engine_share`): a board holds,
for every plan stage placed on it (interleaved plans place ``chunks`` stages on each board),
the stage's forward kernel and, in training, its backward kernel, as the generators build
them: the forward kernel has one PE x SIMD array per matrix layer (codegen.design.context: the
``stage<i>`` HLS kernel; codegen.design.dataflow), the backward kernel two more at the same
folding, the input-gradient and the weight-gradient array (codegen.rtl.train:
``mvu_bwd_in``, ``mvu_bwd_w``; codegen.design.backward: ``stage<i>_bwd``'s ``mvu_bwd``, whose dW and
dx loops each unroll PE x SIMD MACs). The board's capped DSP and LUT (``cap`` x usable) are
split evenly: each stage's forward engines are folded within ``engine_share`` of it
(1 / (stages on the board x arrays per matrix layer)), so the sum over the board's kernels
of the DSP they instantiate (:func:`board_dsp`) stays within the capped budget. On-chip
memory (BRAM, URAM) is split over the stages on the board only (planner.stagecost:
``share`` = chunks): the stage's memory figure already holds what both its kernels keep
(weights, gradients, stashes, line buffers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Collection, Sequence

from bapipe.layers import Layer

from .boards import Board, bytes_per_element
from .fixedpoint import get_fmt
from .gradients import backward_work
from .engines import (DDR_WORD_BITS, MAX_LANES, TM_SWITCH, WEIGHT_TILE_SHARE, conv_window_lanes, elementwise_lut,
                      engine_kind, frame_io_cycles, line_buffer_bytes, mvu_dsp, mvu_lut, swg_rows, turn_fill,
                      weight_stream_beats,
                      WEIGHT_FILL_LAG, fetch_turn_cycles,
                      weight_words, window_stream_fill)
from .memory_blocks import Blocks, WeightBanks, bank_blocks, storage_impl, weight_banks
from .cost import (best_folding, divisors, layer_cost, onchip_capacity,
                   matrix_shape, lane_dim)


#: PE x SIMD arrays per matrix layer in a stage's forward kernel (the forward MVU)
FWD_ARRAYS = 1
#: PE x SIMD arrays per matrix layer in a stage's backward kernel: input gradient (dx = W^T dy)
#: and weight gradient (dW += dy x^T), at the forward's folding (codegen.rtl.train, codegen.design.backward)
BWD_ARRAYS = 2


def board_kernels(stages: Sequence[int], train: bool) -> list[tuple[int, str]]:
    """The compute kernels a board holds for the plan stages placed on it: (stage, "fwd") for
    each, and (stage, "bwd") too when training (in stage order)."""
    roles = ("fwd", "bwd") if train else ("fwd",)
    return [(s, r) for s in sorted(stages) for r in roles]


def kernel_arrays(role: str) -> int:
    """PE x SIMD arrays per matrix layer of a kernel of ``role`` ("fwd" | "bwd")."""
    return {"fwd": FWD_ARRAYS, "bwd": BWD_ARRAYS}[role]


def engine_share(stages_on_board: int = 1, train: bool = True) -> float:
    """The fraction of a board's capped DSP and LUT one stage's forward engines are folded
    within: the board's kernels (:func:`board_kernels`) split it evenly, a stage taking
    FWD_ARRAYS (+ BWD_ARRAYS when training) arrays at that folding."""
    arrays = sum(kernel_arrays(r) for _s, r in board_kernels([0], train))
    return 1.0 / (max(1, stages_on_board) * arrays)


def stage_budget(board: Board, cap: float, stages_on_board: int = 1, train: bool = True) -> tuple[float, float]:
    """(DSP, LUT) one stage's forward engines may take on ``board`` (:func:`engine_share` of
    the capped budget)."""
    share = engine_share(stages_on_board, train)
    return board.usable_dsp * cap * share, board.usable_lut * cap * share


def engines_dsp(layer_dsp: Sequence[int], style: str) -> int:
    """DSP of one kernel's arrays given each matrix layer's PE x SIMD array DSP: summed when every
    layer has its engine (dataflow), the largest when the layers take turns on one."""
    return sum(layer_dsp) if style == "dataflow" else max(layer_dsp, default=0)


def kernel_dsp(layer_dsp: Sequence[int], style: str, role: str, dx: Sequence[bool] | None = None) -> int:
    """DSP a stage's kernel of ``role`` instantiates (:func:`engines_dsp` x its arrays per layer).
    A backward kernel builds the input-gradient array only for the layers ``dx`` flags (default
    all; fpga_models.gradients: none for a layer fed by the model input): the weight-gradient
    arrays are :func:`engines_dsp` of every layer, the input-gradient ones of the flagged layers
    (time-multiplexed: the largest of them, the turns share one)."""
    if role != "bwd" or dx is None:
        return kernel_arrays(role) * engines_dsp(layer_dsp, style)
    return (engines_dsp(layer_dsp, style)
            + (BWD_ARRAYS - 1) * engines_dsp([d for d, x in zip(layer_dsp, dx) if x], style))


def board_dsp(stages: Sequence[tuple], train: bool) -> int:
    """DSP of every kernel of a board: ``stages`` lists, per stage on it, (each matrix layer's
    array DSP, style[, each layer's input-gradient flag: :func:`kernel_dsp`])."""
    return sum(kernel_dsp(stages[s][0], stages[s][1], role, stages[s][2] if len(stages[s]) > 2 else None)
               for s, role in board_kernels(range(len(stages)), train))


# ---------------------------------------------------------------- on-chip memory of a kernel
# One rule for the planner and the lowering (codegen.design.tm_kernel): a kernel keeps on chip its
# fixed buffers (line buffers, ROMs, FIFOs) and as many of its time-multiplexed frame buffers as
# fit its share of the board's on-chip memory; the others are off-chip (one m_axi port each,
# read and written in 512-bit bursts: fpga_models.engines.frame_io_cycles).


def kernel_onchip_budget(board: Board, cap: float, stages_on_board: int = 1, train: bool = True) -> int:
    """On-chip bytes one kernel may keep: the board's capped on-chip bytes
    (fpga_models.cost.onchip_capacity) split evenly over its kernels (:func:`board_kernels`:
    the forward and, in training, the backward kernel of every stage on the board)."""
    return kernel_share(onchip_capacity(board, cap), stages_on_board, train)


def stage_onchip_budget(plan, stage, board: Board | None) -> int | None:
    """On-chip bytes one kernel of ``stage`` may keep on ``board`` (:func:`kernel_onchip_budget`
    over the kernels of every stage sharing the board): the one rule the forward and backward
    kernels' lowering reads; None off an FPGA."""
    if board is None or getattr(board, "kind", "fpga") != "fpga":
        return None
    on_board = sum(1 for x in plan.stages if stage.boards and stage.boards[0] in x.boards) or 1
    return kernel_onchip_budget(board, plan.utilisation_cap, on_board, plan.mode == "train")


def kernel_share(onchip_bytes: int, stages_on_board: int = 1, train: bool = True) -> int:
    """``onchip_bytes`` split evenly over the kernels of ``stages_on_board`` stages (:func:`board_kernels`)."""
    return int(onchip_bytes) // (max(1, stages_on_board) * len(board_kernels([0], train)))


def frames_offchip(frame_bytes: Sequence[int], fixed_bytes: int, budget: int,
                   ends: Sequence[int] | None = None) -> list[bool]:
    """Which frame buffers of a time-multiplexed kernel go off chip (True): the smallest stay
    on chip (ties: the earlier) while the kernel's fixed bytes and they fit ``budget``; the
    rest, the biggest, spill (the most bytes freed per m_axi port). ``ends``: the on-chip bytes a
    frame still takes off chip (its two-deep ends, :func:`tm_frame_ends`), counted until it stays."""
    ends = list(ends) if ends is not None else [0] * len(frame_bytes)
    order = sorted(range(len(frame_bytes)), key=lambda i: (frame_bytes[i], i))
    off, used = [True] * len(frame_bytes), fixed_bytes + sum(ends)
    for i in order:
        if used - ends[i] + frame_bytes[i] > budget:
            break
        used += frame_bytes[i] - ends[i]
        off[i] = False
    return off


def kernel_onchip_bytes(fixed_bytes: int, frame_bytes: Sequence[int], budget: int) -> int:
    """A time-multiplexed kernel's on-chip bytes: fixed plus the frames :func:`frames_offchip`
    keeps (the figure the planner prices and the Design states, codegen.design.onchip)."""
    off = frames_offchip(frame_bytes, fixed_bytes, budget)
    return fixed_bytes + sum(b for b, o in zip(frame_bytes, off) if not o)


def _out_lanes(l: Layer, folding: tuple[int, int]) -> int:
    """Elements per beat of a layer's output stream: PE of an MVU, the lanes of the others."""
    pe, simd = folding
    return pe if matrix_shape(l) is not None else pe * simd


def _in_lanes(l: Layer, folding: tuple[int, int]) -> int:
    """Elements per beat a layer's engine reads: a conv's window generator whole pixels or
    gcd(C, SIMD) channels (fpga_models.engines.conv_window_lanes), a dense MVU SIMD, the
    lanes of the others."""
    pe, simd = folding
    if l.type == "conv2d":
        return conv_window_lanes(l.in_shapes[0][0], l.attr["kernel"][0], simd)[0]
    return simd if matrix_shape(l) is not None else pe * simd


def tm_frame_readers(layers: Sequence[Layer]) -> tuple[list[Layer], dict[str, list[Layer]], list[Layer]]:
    """(turns, {turn: the later turns reading its output}, the turns reading the stage input) of a
    time-multiplexed stage (a flatten is a stream, not a turn: its readers read its producer)."""
    turns = [l for l in layers if l.type != "flatten"]
    alias = {l.name: l.inputs[0] for l in layers if l.type == "flatten" and l.inputs}
    readers: dict[str, list[Layer]] = {t.name: [] for t in turns}
    inputs: list[Layer] = []
    for t in turns:
        for i in t.inputs:
            while i in alias:
                i = alias[i]
            if i in readers:
                readers[i].append(t)
            elif t not in inputs:
                inputs.append(t)
    return turns, readers, inputs


def tm_frame_copies(layers: Sequence[Layer], folding: dict[str, tuple[int, int]]) -> list[list[tuple[Layer, int]]]:
    """Per frame of :func:`tm_frames`: (reader turn, lanes) of each copy the lowering builds: a
    layer output read by k later turns is forked into k frame buffers, one a reader
    (codegen.design.tm_kernel), each at the wider of the producer's and that reader's beats."""
    turns, readers, _inputs = tm_frame_readers(layers)
    out = []
    for l, n in zip(turns, turns[1:]):
        rs = readers[l.name] or [n]
        out.append([(r, max(_out_lanes(l, folding[l.name]), _in_lanes(r, folding[r.name]))) for r in rs])
    return out


def tm_frames(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> list[tuple[int, int]]:
    """(bytes, lanes) of the frame buffers of a time-multiplexed stage, one per layer output a
    later turn reads (every layer but the last; a flatten is a stream, not a turn): its copies'
    bytes (:func:`tm_frame_copies`, one whole frame per reading turn) at the first copy's
    lanes (the lowering converts in the producer's turn); the copies go on or off chip together
    (codegen.design.dataflow.offchip_frames names the layer)."""
    eb = bytes_per_element(fmt)
    turns = [l for l in layers if l.type != "flatten"]
    return [(int(l.out_elems) * eb * len(cs), cs[0][1]) for l, cs in zip(turns, tm_frame_copies(layers, folding))]


def tm_frame_ends(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> list[int]:
    """Per frame of :func:`tm_frames`: the on-chip bytes of its copies when off chip, the
    two-deep stream each copy becomes in its writer's and in its reader's turn (codegen.design.tm_kernel._spill)."""
    eb = bytes_per_element(fmt)
    return [sum(2 * 2 * lanes * eb for _r, lanes in cs) for cs in tm_frame_copies(layers, folding)]


def tm_feed_bytes(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> int:
    """On-chip bytes of a time-multiplexed stage's feed: a stage input read by more than one
    turn is forked beside the turns (codegen.design.tm_kernel: the feed's streams, declared in the
    kernel's top function) into a two-deep stream per reading turn at the port's beat
    (:func:`tm_port_lanes`; counted even where the port turns out as wide as the reader and
    needs no converter) and, behind each, one whole-frame FIFO; 0 when one turn reads it."""
    _turns, _readers, inputs = tm_frame_readers(layers)
    if len(inputs) < 2:
        return 0
    eb = bytes_per_element(fmt)
    return sum(int(math.prod(t.in_shapes[0])) * eb + 2 * tm_port_lanes(layers, folding) * eb for t in inputs)


def tm_fixed_bytes(layers: Sequence[Layer], fmt: str) -> int:
    """The planner's figure of a time-multiplexed forward kernel's fixed on-chip bytes: the
    window generators' line buffers (fpga_models.engines.line_buffer_bytes, with the ring's
    STRIDE - 1 rows as the lowering builds them)."""
    eb, total = bytes_per_element(fmt), 0
    for l in layers:
        if l.type in ("conv2d", "maxpool", "avgpool") and len(l.in_shapes[0]) == 3:
            c, _h, w = l.in_shapes[0]
            k, st = l.attr.get("kernel", 1), l.attr.get("stride", 1)
            k, st = int(k if isinstance(k, int) else k[0]), int(st if isinstance(st, int) else st[0])
            total += line_buffer_bytes(k, w, c, eb, st)
    return total


#: weight elements up to which an inference stage's weights are on-chip ROMs (codegen.design.context's
#: EMBED_LIMIT); training keeps every weight array in writable m_axi memory, which the update
#: kernel rewrites every iteration (codegen.design.train_kernels)
WEIGHT_ROM_LIMIT = 1 << 16
#: layer types whose weights the HLS lowering fetches into the MVU's tiles (codegen.design.weight_memory)
_TILED = ("conv2d", "dense")


def weights_offchip(layers: Sequence[Layer], train: bool) -> bool:
    """A stage's weights live in off-chip memory (m_axi): in training, or beyond WEIGHT_ROM_LIMIT."""
    return train or sum(int(l.params) for l in layers) > WEIGHT_ROM_LIMIT


def weight_resident(elems: int, elem_bytes: int, budget: int | None, vectors: int = 1) -> bool:
    """A matrix a time-multiplexed kernel holds on chip for its turn (one tile of the ping-pong
    buffer, :data:`fpga_models.engines.WEIGHT_TILE_SHARE`); otherwise it streams through a FIFO,
    read once per input vector, which only a layer of one vector a sample (a dense layer) may:
    a convolution's matrix is always a tile (else it would be read once per output pixel)."""
    return budget is None or vectors > 1 or elems * elem_bytes <= budget // WEIGHT_TILE_SHARE


#: layer types of the stages the HLS engine lowering builds (codegen.design.dataflow, codegen.design.tm_kernel);
#: other stages get the library kernels, which read their m_axi weights in place
ENGINE_TYPES = frozenset({"conv2d", "dense", "maxpool", "avgpool", "globalavgpool", "batchnorm", "add", "relu",
                          "flatten", "concat"})


def engine_built(layers: Sequence[Layer]) -> bool:
    """The stage is built from the streaming engines: every layer of a kind they have, dense
    layers on a vector, convolutions ungrouped (codegen.design.dataflow raises Unsupported otherwise)."""
    for l in layers:
        if l.type not in ENGINE_TYPES:
            return False
        if l.type == "dense" and len(l.in_shapes[0]) != 1:
            return False
        if l.type == "conv2d" and l.attr.get("groups", 1) != 1:
            return False
    return True


def weights_all_resident(elems: Sequence[int], elem_bytes: int, budget: int | None) -> bool:
    """All of a time-multiplexed kernel's matrices stay on chip for a whole call (fetched once
    at its start, no per-sample traffic): they fit in what two tiles may take."""
    return budget is None or sum(elems) * elem_bytes <= 2 * (budget // WEIGHT_TILE_SHARE)


def tm_weight_tiles(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str,
                    budget: int | None) -> list[tuple[Layer, int, bool]]:
    """(layer, matrix elements, resident) of a time-multiplexed stage's MVU layers in turn order
    when its weights are off chip (codegen.design.weight_memory builds the same); none for a stage the
    engines do not build (:func:`engine_built`)."""
    eb = bytes_per_element(fmt)
    if not engine_built(layers):
        return []
    mats = [(l, int(ms[0]) * int(ms[1])) for l in layers if l.type in _TILED
            for ms in [matrix_shape(l)] if ms is not None]
    if weights_all_resident([e for _l, e in mats], eb, budget):
        return [(l, e, True) for l, e in mats]
    return [(l, e, weight_resident(e, eb, budget, _vectors(l))) for l, e in mats]


def _vectors(l: Layer) -> int:
    """Input vectors a sample of an MVU layer (output pixels of a conv, 1 for a dense layer)."""
    return int(l.out_elems) // int(matrix_shape(l)[0])


def tm_weight_bytes(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str, budget: int | None,
                    train: bool) -> int:
    """On-chip bytes a time-multiplexed kernel spends on off-chip weights: every matrix when they
    all stay on chip for the call (:func:`weights_all_resident`), else the ping-pong buffer
    (two halves of the largest resident matrix) and each streamed matrix's two-deep FIFO of
    PE x SIMD words; 0 when the weights are on-chip ROMs (:func:`weights_offchip`)."""
    if not weights_offchip(layers, train):
        return 0
    eb = bytes_per_element(fmt)
    tiles = tm_weight_tiles(layers, folding, fmt, budget)
    if weights_all_resident([e for _l, e, _r in tiles], eb, budget):   # one copy of each, for the call
        return sum(e for _l, e, _r in tiles) * eb
    res = [e for _l, e, r in tiles if r]
    fifo = sum(2 * folding[l.name][0] * folding[l.name][1] for l, _e, r in tiles if not r)
    return (2 * max(res) if res else 0) * eb + fifo * eb


def tm_weight_turns(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str,
                    budget: int | None) -> tuple[int, dict[str, int]]:
    """(fill, {layer: cycles}) of a time-multiplexed stage's weight fetches per sample; none when
    all its matrices stay on chip for the call (:func:`weights_all_resident`). Otherwise the
    resident matrices take turns in the two halves of the buffer (the first is fetched before
    the first turn, the fill; each MVU's turn fetches the next one's,
    fpga_models.engines.weight_tiles_cycles), a streamed matrix is read once per input vector in
    its own turn."""
    bits = 8 * bytes_per_element(fmt)
    tiles = tm_weight_tiles(layers, folding, fmt, budget)
    if weights_all_resident([e for _l, e, _r in tiles], bits // 8, budget):   # fetched once a call
        return 0, {}
    res = [(l, e) for l, e, r in tiles if r]
    turn = {}
    for (l, _e), (_n, e_next) in zip(res, res[1:]):
        turn[l.name] = weight_words(e_next, bits)
    for l, e, r in tiles:
        if not r:
            pe, simd = folding[l.name]
            turn[l.name] = weight_stream_beats(e, pe * simd, bits) * _vectors(l)
    return (weight_words(res[0][1], bits) if res else 0), turn


def tm_weight_bank_bytes(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str,
                         budget: int | None, train: bool = True) -> int:
    """Bytes per sample a time-multiplexed forward kernel's weight loads read from off-chip
    memory, all through one m_axi bundle, so one bank (codegen.design.bundles: the fill, each
    turn's fetch and each stream never run two at once): every resident matrix's 512-bit words
    once a sample, a streamed matrix's once per input vector; 0 when its weights are on-chip
    ROMs or all stay on chip for the call (read once a call, not per sample)."""
    if not weights_offchip(layers, train):
        return 0
    bits = 8 * bytes_per_element(fmt)
    tiles = tm_weight_tiles(layers, folding, fmt, budget)
    if weights_all_resident([e for _l, e, _r in tiles], bits // 8, budget):
        return 0
    words = sum(weight_words(e, bits) * (1 if r else _vectors(l)) for l, e, r in tiles)
    return words * DDR_WORD_BITS // 8


def tm_weight_bank_seconds(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                           cap: float, chunks: int = 1, train: bool = True) -> float:
    """Seconds per sample the forward kernel's weight loads hold their bank
    (:func:`tm_weight_bank_bytes` at the board's slowest bank, fpga_models.boards.Bank): a floor
    under the stage's forward time (planner.search), which the fetch turns' one word a cycle
    (:func:`tm_weight_cycles`) meets on a DDR4 bank (19.2 GB/s = 64 bytes x 300 MHz) but not on
    an HBM pseudo-channel (14.375 GB/s)."""
    nbytes = tm_weight_bank_bytes(layers, folding, fmt, kernel_onchip_budget(board, cap, chunks, train), train)
    bw = min((b.bw_Bps for b in board.banks), default=board.offchip_bw_Bps)
    return nbytes / bw if nbytes and bw else 0.0


def tm_turn_bytes(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> int:
    """On-chip bytes of a time-multiplexed forward kernel's engines inside its turns, as
    codegen.design.tm_kernel builds them (two-deep streams, DEFAULT_DEPTH): a window generator's output
    (its beat: channels x taps of a conv, the lanes of a pool); a producer's output stream (an
    MVU's PE lanes, :func:`_out_lanes`) in front of a fork or a width converter into its frame
    copies (:func:`tm_frame_copies`; the last turn writes the output port) and each fork output
    converted; a pool's per-channel accumulators (acc_t, bapipe::pool); the shared MAC array's
    kept input vector (the largest MW, codegen.design.mac_share)."""
    eb = bytes_per_element(fmt)
    acc_b = -(-get_fmt(fmt).acc_width // 8)
    turns = [l for l in layers if l.type != "flatten"]
    total, mw = 0, 0
    for l in turns:
        pe, simd = folding[l.name]
        if l.type in ("conv2d", "maxpool", "avgpool") and len(l.in_shapes[0]) == 3:
            k = l.attr.get("kernel", 1)
            k = int(k if isinstance(k, int) else k[0])
            lanes = math.prod(conv_window_lanes(l.in_shapes[0][0], k, simd)) if l.type == "conv2d" else pe * simd
            total += 2 * lanes * eb
        if l.type in ("maxpool", "avgpool", "globalavgpool"):
            total += int(l.out_shape[0]) * acc_b
        if matrix_shape(l) is not None and l.type in _TILED:
            mw = max(mw, int(matrix_shape(l)[1]))
    for l, cs in zip(turns, tm_frame_copies(layers, folding)):
        out = _out_lanes(l, folding[l.name])
        if len(cs) > 1 or any(lanes != out for _r, lanes in cs):
            total += 2 * out * eb
        if len(cs) > 1:
            total += sum(2 * out * eb for _r, lanes in cs if lanes != out)
    return total + mw * eb


def tm_port_lanes(layers: Sequence[Layer], folding: dict[str, tuple[int, int]]) -> int:
    """The planner's figure of a time-multiplexed stage's input beat: the widest its first
    readers take (the lowering's port carries the previous stage's output beat, which a stage's
    own cost does not know)."""
    _turns, _readers, inputs = tm_frame_readers(layers)
    return max((_in_lanes(t, folding[t.name]) for t in inputs), default=1)


def tm_stashed(layers: Sequence[Layer]) -> list[str]:
    """The tensors a training stage's backward kernel reads from its stashes (codegen.design.backward: a
    convolution, dense layer, batchnorm or max pool its input, a relu its output), each once,
    a flatten's as the tensor behind it."""
    alias = {l.name: l.inputs[0] for l in layers if l.type == "flatten" and l.inputs}
    out: list[str] = []
    for l in layers:
        if l.type in ("conv2d", "dense", "batchnorm", "maxpool") and l.inputs:
            t = l.inputs[0]
        elif l.type == "relu":
            t = l.name
        else:
            continue
        while t in alias:
            t = alias[t]
        if t not in out:
            out.append(t)
    return out


def tm_stash_bytes(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> int:
    """On-chip bytes of a training time-multiplexed forward kernel's stash tees (codegen.design.stash:
    the stream carrying each stashed tensor, :func:`tm_stashed`, is teed through a two-deep copy
    at its beat: its producer's output lanes, :func:`_out_lanes`, or the input port's,
    :func:`tm_port_lanes`); none when the stash is the stage input and more than one turn reads
    it (the lowering then leaves the stage without stash writers)."""
    eb = bytes_per_element(fmt)
    turns, _readers, inputs = tm_frame_readers(layers)
    by_name = {t.name: t for t in turns}
    tensors = tm_stashed(layers)
    if len(inputs) > 1 and any(t not in by_name for t in tensors):
        return 0
    return sum(2 * (_out_lanes(by_name[t], folding[t]) if t in by_name else tm_port_lanes(layers, folding)) * eb
               for t in tensors)


def tm_onchip_parts(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                    cap: float, chunks: int = 1, train: bool = True) -> dict:
    """The planner's figure of a time-multiplexed forward kernel's on-chip bytes, item by item,
    as codegen.design.tm_kernel builds it (codegen.design.onchip states the Design's): ``line_buffers``
    (:func:`tm_fixed_bytes`), ``weights`` (the weight buffer or FIFOs, :func:`tm_weight_bytes`)
    and, for a stage the engines build (:func:`engine_built`), ``feed`` (:func:`tm_feed_bytes`),
    ``turns`` (:func:`tm_turn_bytes`) and in training ``stashes`` (:func:`tm_stash_bytes`);
    their sum ``fixed``; ``frames`` and ``ends`` per frame (:func:`tm_frames`,
    :func:`tm_frame_ends`), ``off`` (:func:`frames_offchip` on the kernel's share,
    :func:`kernel_onchip_budget`) and ``onchip_bytes``: fixed, the frames kept, the ends of the
    others."""
    budget = kernel_onchip_budget(board, cap, chunks, train)
    frames = [b for b, _l in tm_frames(layers, folding, fmt)]
    ends = tm_frame_ends(layers, folding, fmt)
    built = engine_built(layers)
    parts = {"budget": budget, "line_buffers": tm_fixed_bytes(layers, fmt),
             "weights": tm_weight_bytes(layers, folding, fmt, budget, train),
             "feed": tm_feed_bytes(layers, folding, fmt) if built else 0,
             "turns": tm_turn_bytes(layers, folding, fmt) if built else 0,
             "stashes": tm_stash_bytes(layers, folding, fmt) if built and train else 0}
    fixed = sum(parts[k] for k in ("line_buffers", "weights", "feed", "turns", "stashes"))
    off = frames_offchip(frames, fixed, budget, ends)
    return parts | {"fixed": fixed, "frames": frames, "ends": ends, "off": off,
                    "onchip_bytes": fixed + sum(e if o else b for b, e, o in zip(frames, ends, off))}


# ---------------------------------------------------------------- on-chip memory in blocks
# The forward kernel's memory as the device holds it: banks in BRAM18 units and URAMs
# (fpga_models.memory_blocks, UG573), not bytes. The Design (codegen.design.onchip.kernel_blocks)
# states the same banks; `bapipe check` reads them back from the generated C++.


def kernel_block_budget(board: Board, cap: float, stages_on_board: int = 1, train: bool = True) -> Blocks:
    """BRAM18 units and URAMs one kernel may take: the board's capped usable blocks split evenly
    over its kernels (:func:`board_kernels`, as :func:`kernel_onchip_budget` splits bytes)."""
    k = max(1, stages_on_board) * len(board_kernels([0], train))
    return Blocks(bram18=int(2 * board.usable_bram36 * cap) // k, uram=int(board.usable_uram * cap) // k)


def stage_block_budget(board: Board, cap: float, chunks: int = 1) -> Blocks:
    """BRAM18 units and URAMs a stage's kernels (forward and backward) may take together: the
    board's capped usable blocks (UG573 primitives; the catalog's usable figures) split over the
    ``chunks`` stages on it."""
    k = max(1, chunks)
    return Blocks(bram18=int(2 * board.usable_bram36 * cap) // k, uram=int(board.usable_uram * cap) // k)


def bwd_block_room(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                   cap: float, chunks: int = 1, port_lanes: int | None = None,
                   style: str = "time-multiplexed") -> Blocks:
    """The blocks a stage's backward kernel may take: :func:`stage_block_budget` less what the
    forward kernel takes (:func:`fwd_kernel_blocks`, whose frames stay within its half,
    :func:`kernel_block_budget`). The backward kernel's stores and frames are decided within it
    (fpga_models.bwd_memory), so the two kernels fit the board together (`bapipe check`'s
    ``blocks`` rule; vgg16's default plan had 1,300 and 1,542 URAM of 1,280 on fpga1 and fpga2,
    each kernel within its own share)."""
    b = stage_block_budget(board, cap, chunks)
    f = fwd_kernel_blocks(layers, board, folding, fmt, cap, chunks, True, style, port_lanes)
    return Blocks(bram18=max(0, b.bram18 - f.bram18), uram=max(0, b.uram - f.uram))


def _plan_fold(stage, layers: Sequence[Layer]) -> dict[str, tuple[int, int]]:
    """A plan stage's folding as the models read it: (PE, SIMD) of an MVU, (1, lanes) of the others."""
    fold = {l.name: (1, 1) for l in layers}
    fold.update({n: (f.pe, f.simd) if f.lanes is None else (1, f.lanes) for n, f in stage.folding.items()})
    return fold


def plan_port_lanes(plan, model, stage) -> int | None:
    """:func:`stage_port_lanes` of a plan's stage (the stage before it in the plan: its last
    layer at its folding); what the planner priced (planner.search.Explorer.port_lanes)."""
    prev = next((s for s in plan.stages if s.index == stage.index - 1), None)
    if prev is None:   # the first stage (or one lowered alone, as a bench of its own)
        return None
    last = model.layers[model.index[prev.layers[-1]]]
    return stage_port_lanes(last, _plan_fold(prev, [last])[last.name])


def plan_bwd_room(plan, model, stage, board: Board | None) -> Blocks | None:
    """:func:`bwd_block_room` of a plan's time-multiplexed training stage on ``board`` (None for
    other stages): the blocks the lowering of its backward kernel may take."""
    if board is None or getattr(board, "kind", "fpga") != "fpga" or plan.mode != "train" \
            or stage.style != "time-multiplexed":
        return None
    layers = [model.layers[model.index[n]] for n in stage.layers]
    return bwd_block_room(layers, board, _plan_fold(stage, layers), plan.number_format, plan.utilisation_cap,
                          plan.chunks, plan_port_lanes(plan, model, stage))


def _usable(board: Board) -> dict:
    return {"usable_bram36": board.usable_bram36, "usable_uram": board.usable_uram}


def fifo_blocks(width: int, depth: int, board: Board) -> Blocks:
    """A FIFO of ``width`` bits x ``depth`` where the Design binds it (memory_blocks.storage_impl)."""
    return bank_blocks(storage_impl(width, depth, fifo=True, **_usable(board)), width, depth)


def _window(l: Layer, folding: dict[str, tuple[int, int]]) -> tuple[int, int, int, int, int] | None:
    """(rows, k, w, c, lanes) of a window layer's generator (lanes: channels a beat), else None."""
    if l.type not in ("conv2d", "maxpool", "avgpool") or len(l.in_shapes[0]) != 3:
        return None
    c, _h, w = (int(x) for x in l.in_shapes[0])
    k, st = l.attr.get("kernel", 1), l.attr.get("stride", 1) or l.attr.get("kernel", 1)
    k, st = int(k if isinstance(k, int) else k[0]), int(st if isinstance(st, int) else st[0])
    pe, simd = folding[l.name]
    if l.type == "conv2d":
        lanes = conv_window_lanes(c, k, simd)[0]
    else:   # a pool's window generator takes the plan's lanes when they divide C (codegen.design.dataflow)
        lanes = pe * simd if c % (pe * simd) == 0 else math.gcd(pe * simd, c)
    return swg_rows(k, st), k, w, c, lanes


def ring_banks(rows: int, k: int, w: int, c: int, lanes: int, elem_bits: int,
               board: Board | None = None) -> tuple[int, int, int, str]:
    """(banks, bank width bits, bank depth, storage) of a window generator's ring as bapipe::swg
    builds it: a bank per ring row and window column (rows x K: a window's taps read K x K banks
    at once), LANES channels a word, ceil(W / K) x C / LANES words a bank, its storage by
    memory_blocks.storage_impl (the Design binds it: swg_<impl>)."""
    banks, width, depth = rows * k, lanes * elem_bits, math.ceil(w / k) * math.ceil(c / lanes)
    return banks, width, depth, storage_impl(width, depth, banks, **(_usable(board) if board else {}))


def line_buffer_blocks(l: Layer, folding: dict[str, tuple[int, int]], fmt: str, board: Board | None = None) -> Blocks:
    """A window generator's ring in blocks (:func:`ring_banks`); none for other layers."""
    g = _window(l, folding)
    if g is None:
        return Blocks()
    banks, width, depth, impl = ring_banks(*g, 8 * bytes_per_element(fmt), board)
    return bank_blocks(impl, width, depth).scaled(banks)


def tm_weight_banks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str, budget: int | None,
                    board: Board) -> WeightBanks | None:
    """The packed weight buffer of a time-multiplexed kernel whose weights are off chip
    (codegen.design.weight_memory builds it): every matrix's PE x SIMD words one after another when
    all stay on chip (:func:`weights_all_resident`), else two halves of the largest resident
    matrix; None when no matrix is a tile."""
    bits = 8 * bytes_per_element(fmt)
    tiles = tm_weight_tiles(layers, folding, fmt, budget)
    res = [(l, e) for l, e, r in tiles if r]
    if not res:
        return None
    ps = [folding[l.name][0] * folding[l.name][1] for l, _e in res]
    words = [e // p for (_l, e), p in zip(res, ps)]
    every = weights_all_resident([e for _l, e, _r in tiles], bits // 8, budget)
    return weight_banks(max(ps), bits, sum(words) if every else max(words), 1 if every else 2, sorted(set(ps)),
                        DDR_WORD_BITS // bits, **_usable(board))


def tm_param_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str, board: Board,
                    train: bool = True) -> Blocks:
    """A forward kernel's per-channel parameters on chip: every MVU's bias, NF x PE in PE banks
    (the lowering gives each MVU one, zeros for a layer without: a training kernel's copy,
    codegen.design.weight_memory, an inference kernel's ROM), and in training each batchnorm's
    scale and shift copies, C/L x L in L banks (L: its lanes, gcd(planned, C) as
    codegen.design.dataflow builds it; inference: LUTRAM ROMs); storage by memory_blocks.storage_impl."""
    bits, out = 8 * bytes_per_element(fmt), Blocks()
    for l in layers:
        ms = matrix_shape(l)
        if ms is not None and l.type in _TILED:
            pe = folding[l.name][0]
            nf = int(ms[0]) // pe
            out = out + bank_blocks(storage_impl(bits, nf, pe, **_usable(board)), bits, nf).scaled(pe)
        elif l.type == "batchnorm" and train:
            sh = l.in_shapes[0]
            c = int(sh[0] if len(sh) == 3 else sh[-1])
            lanes = math.gcd(folding[l.name][0] * folding[l.name][1], c)
            out = out + bank_blocks(storage_impl(bits, c // lanes, lanes, **_usable(board)), bits,
                                    c // lanes).scaled(2 * lanes)
    return out


def tm_frame_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str,
                    board: Board) -> list[Blocks]:
    """Per frame of :func:`tm_frames`: the blocks of its copies on chip, each a FIFO of a frame
    at its beat (:func:`fifo_blocks`)."""
    bits = 8 * bytes_per_element(fmt)
    turns = [l for l in layers if l.type != "flatten"]
    out = []
    for l, cs in zip(turns, tm_frame_copies(layers, folding)):
        b = Blocks()
        for _r, lanes in cs:
            b = b + fifo_blocks(lanes * bits, math.ceil(int(l.out_elems) / lanes), board)
        out.append(b)
    return out


def tm_feed_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str, board: Board) -> Blocks:
    """The feed's whole-frame FIFOs (:func:`tm_feed_bytes`), one a reading turn, in blocks."""
    _turns, _readers, inputs = tm_frame_readers(layers)
    if len(inputs) < 2:
        return Blocks()
    bits, lanes = 8 * bytes_per_element(fmt), tm_port_lanes(layers, folding)
    out = Blocks()
    for t in inputs:
        out = out + fifo_blocks(lanes * bits, math.ceil(int(math.prod(t.in_shapes[0])) / lanes), board)
    return out


def tm_input_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str, board: Board,
                    port_lanes: int | None = None) -> Blocks:
    """The frame buffer in front of a time-multiplexed stage's first turn when one turn reads the
    stage input (codegen.design.dataflow.tm_chain): a window generator's input holds a whole frame
    (its turn waits for it: codegen.design.tm_kernel) where converters widen the port's
    ``port_lanes`` (the previous stage's output beat, :func:`stage_port_lanes`; None: the stage
    input comes at the reader's lanes) to the generator's; any other first turn reads a FIFO of
    two frames at the wider of the two beats. Bound as the Design binds a deep FIFO
    (:func:`fifo_blocks`). vgg16's default plan: stage 2's conv10 input (256 -> 512 lanes, a
    frame of 784 beats: 114 URAM) and stage 3's relu13 FIFO (57 URAM) were not counted."""
    _turns, _readers, inputs = tm_frame_readers(layers)
    if len(inputs) != 1:
        return Blocks()
    t = inputs[0]
    lin = _in_lanes(t, folding[t.name])
    port = port_lanes or lin
    bits, elems = 8 * bytes_per_element(fmt), int(math.prod(t.in_shapes[0]))
    if _window(t, folding) is not None:
        return fifo_blocks(lin * bits, math.ceil(elems / lin), board) if port != lin else Blocks()
    fl = max(port, lin)
    return fifo_blocks(fl * bits, 2 * math.ceil(elems / fl), board)


def stage_port_lanes(prev_last: Layer | None, folding: tuple[int, int] | None) -> int | None:
    """Lanes of a stage's input port: the previous stage's last layer's output beat
    (:func:`_out_lanes` at its folding); None for the first stage (the host feeds it at its
    first reader's lanes)."""
    return _out_lanes(prev_last, folding) if prev_last is not None and folding is not None else None


def pool_acc_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> Blocks:
    """The pools' exact accumulators (bapipe::pool: acc_t acc[C / SIMD][SIMD], SIMD banks of C / SIMD
    words of the format's accumulator width), where Vitis leaves an unbound array."""
    out, acc = Blocks(), get_fmt(fmt).acc_width
    for l in layers:
        if l.type not in ("maxpool", "avgpool", "globalavgpool") or len(l.in_shapes[0]) != 3:
            continue
        c = int(l.in_shapes[0][0])
        pe, simd = folding[l.name]
        lanes = pe * simd if c % (pe * simd) == 0 else math.gcd(pe * simd, c)
        out = out + bank_blocks("auto", acc, c // lanes).scaled(lanes)
    return out


def tm_mac_input_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> Blocks:
    """The shared MAC array's kept input vector (codegen.design.mac_share: the largest MW, cyclic
    banks of the largest SIMD), where Vitis leaves an unbound array (memory_blocks 'auto')."""
    mats = [(int(matrix_shape(l)[1]), folding[l.name][1]) for l in layers
            if l.type in _TILED and matrix_shape(l) is not None]
    if not mats:
        return Blocks()
    xb, xw = max(m for m, _s in mats), max(s for _m, s in mats)
    return bank_blocks("auto", 8 * bytes_per_element(fmt), math.ceil(xb / xw)).scaled(xw)


def frames_offchip_blocks(frame_blocks: Sequence[Blocks], frame_bytes: Sequence[int], fixed: Blocks,
                          budget: Blocks) -> list[bool]:
    """:func:`frames_offchip` in blocks: the smallest frames (by bytes; ties: the earlier) stay on
    chip while the kernel's fixed blocks and theirs fit ``budget`` in BRAM18 units and URAMs."""
    order = sorted(range(len(frame_bytes)), key=lambda i: (frame_bytes[i], i))
    off, used = [True] * len(frame_bytes), fixed
    for i in order:
        nxt = used + frame_blocks[i]
        if nxt.bram18 > budget.bram18 or nxt.uram > budget.uram:
            break
        used = nxt
        off[i] = False
    return off


def tm_onchip_blocks(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                     cap: float, chunks: int = 1, train: bool = True, port_lanes: int | None = None) -> dict:
    """The planner's figure of a time-multiplexed forward kernel's on-chip memory in blocks, item
    by item as codegen.design.tm_kernel builds it: ``weights`` (the packed buffer,
    :func:`tm_weight_banks`), ``params`` (biases, batchnorm copies: :func:`tm_param_blocks`),
    ``line_buffers`` (:func:`line_buffer_blocks`),
    ``feed`` (:func:`tm_feed_blocks`, :func:`tm_input_blocks` at ``port_lanes``), ``mac_input``
    (:func:`tm_mac_input_blocks`), ``pool_accs`` (:func:`pool_acc_blocks`);
    their sum ``fixed``; ``frames`` (per frame, :func:`tm_frame_blocks`) and ``off``
    (:func:`frames_offchip_blocks` on the kernel's share, :func:`kernel_block_budget`);
    ``onchip``: fixed and the frames kept."""
    budget = kernel_block_budget(board, cap, chunks, train)
    built = engine_built(layers)
    wb = (tm_weight_banks(layers, folding, fmt, kernel_onchip_budget(board, cap, chunks, train), board)
          if built and weights_offchip(layers, train) else None)
    parts = {"budget": budget, "weights": wb.blocks if wb is not None else Blocks(),
             "params": tm_param_blocks(layers, folding, fmt, board, train) if built else Blocks(),
             "line_buffers": sum((line_buffer_blocks(l, folding, fmt, board) for l in layers), Blocks()),
             "feed": (tm_feed_blocks(layers, folding, fmt, board) + tm_input_blocks(layers, folding, fmt, board,
                                                                                      port_lanes)
                      if built else Blocks())}
    parts["mac_input"] = tm_mac_input_blocks(layers, folding, fmt) if built else Blocks()
    parts["pool_accs"] = pool_acc_blocks(layers, folding, fmt) if built else Blocks()
    fixed = (parts["weights"] + parts["params"] + parts["line_buffers"] + parts["feed"] + parts["mac_input"]
             + parts["pool_accs"])
    frames = tm_frame_blocks(layers, folding, fmt, board)
    off = frames_offchip_blocks(frames, [b for b, _l in tm_frames(layers, folding, fmt)], fixed, budget)
    kept = sum((b for b, o in zip(frames, off) if not o), Blocks())
    return parts | {"weight_banks": wb, "fixed": fixed, "frames": frames, "off": off, "onchip": fixed + kept}


def df_onchip_blocks(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                     train: bool = True) -> Blocks:
    """The planner's figure of a dataflow forward kernel's on-chip memory in blocks: each MVU's
    packed weight copy (off-chip weights: memory_blocks.weight_banks of its own PE x SIMD) or
    its ROM banks (PE x SIMD banks of NF x SF words), the per-channel parameters
    (:func:`tm_param_blocks`), the pools' accumulators, the window generators' rings and the
    skip FIFOs (:func:`df_skip_blocks`; its other FIFOs are two deep: shift registers)."""
    bits, out = 8 * bytes_per_element(fmt), Blocks()
    off = weights_offchip(layers, train)
    for l in layers:
        out = out + line_buffer_blocks(l, folding, fmt, board)
        ms = matrix_shape(l)
        if ms is None or l.type not in _TILED:
            continue
        pe, simd = folding[l.name]
        words = (int(ms[0]) // pe) * (int(ms[1]) // simd)
        if off:
            out = out + weight_banks(pe * simd, bits, words, 1, [pe * simd], DDR_WORD_BITS // bits,
                                     **_usable(board)).blocks
        else:
            out = out + bank_blocks(storage_impl(bits, words, pe * simd, **_usable(board)), bits, words).scaled(pe * simd)
    return (out + tm_param_blocks(layers, folding, fmt, board, train) + pool_acc_blocks(layers, folding, fmt)
            + df_skip_blocks(layers, folding, fmt, board))


def df_skip_blocks(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str, board: Board) -> Blocks:
    """A dataflow stage's skip FIFOs (codegen.design.dataflow._dag_dataflow): the skip input of
    an add (the one behind fewer window generators) waits in a FIFO of (difference + 1) whole
    frames + 2 beats at the add's lanes (the plan's when they divide C, else what the main input
    carries), bound where the Design binds a deep FIFO (:func:`fifo_blocks`)."""
    bits, out = 8 * bytes_per_element(fmt), Blocks()
    depth: dict[str, int] = {}
    lanes_of: dict[str, int] = {}
    for l in layers:
        ins = [depth.get(i, 0) for i in l.inputs]
        pe, simd = folding[l.name]
        if l.type == "add" and len(l.inputs) == 2:
            dm, dk = max(ins), min(ins)
            main = l.inputs[ins.index(dm)]
            sh = l.out_shape
            c = int(sh[0] if len(sh) == 3 else sh[-1])
            lm = pe * simd if c % (pe * simd) == 0 else math.gcd(lanes_of.get(main, 1), c)
            beats = int(l.out_elems) // lm
            out = out + fifo_blocks(lm * bits, (dm - dk + 1) * beats + 2, board)
            depth[l.name], lanes_of[l.name] = dm, lm
            continue
        d = max(ins, default=0) + (1 if _window(l, folding) is not None else 0)
        depth[l.name] = d
        lanes_of[l.name] = _out_lanes(l, (pe, simd))
    return out


def fwd_kernel_blocks(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                      cap: float, chunks: int = 1, train: bool = True, style: str = "time-multiplexed",
                      port_lanes: int | None = None) -> Blocks:
    """A stage's forward kernel's on-chip memory in blocks, the figure plan.yaml states
    (``resources.fwd_bram36``, ``fwd_uram``): :func:`tm_onchip_blocks` or :func:`df_onchip_blocks`."""
    if style == "dataflow":
        return df_onchip_blocks(layers, board, folding, fmt, train)
    return tm_onchip_blocks(layers, board, folding, fmt, cap, chunks, train, port_lanes)["onchip"]


def tm_offchip(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
               cap: float, chunks: int = 1, train: bool = True, port_lanes: int | None = None) -> list[bool]:
    """Which frame buffers of a time-multiplexed stage (:func:`tm_frames`, in turn order) go off
    chip: :func:`frames_offchip_blocks` on the kernel's share of the board's blocks
    (:func:`tm_onchip_blocks`). The planner prices it (:func:`tm_spill_cycles`) and the lowering
    builds it (codegen.design.dataflow)."""
    return tm_onchip_blocks(layers, board, folding, fmt, cap, chunks, train, port_lanes)["off"]


def tm_spill_cycles(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                    cap: float, chunks: int = 1, train: bool = True, frame_io: dict | None = None,
                    port_lanes: int | None = None) -> int:
    """Forward cycles per sample a time-multiplexed stage loses to its off-chip frame buffers:
    a turn that writes or reads one takes at least :func:`fpga_models.engines.frame_io_cycles`
    (512-bit words, one a cycle), beyond the layer's own cycles when that is longer.
    ``frame_io``: filled with each such turn's longest transfer."""
    copies = tm_frame_copies(layers, folding)
    off = tm_offchip(layers, board, folding, fmt, cap, chunks, train, port_lanes)
    bits = 8 * bytes_per_element(fmt)
    turns = [l for l in layers if l.type != "flatten"]
    io = {}   # turn -> the longest of its off-chip frame transfers (its input's and its output's)
    extra = 0
    for k, (cs, o) in enumerate(zip(copies, off)):
        if o:
            for reader, lanes in cs:   # the producer's turn writes each copy, its reader reads it
                c = frame_io_cycles(int(turns[k].out_elems) // lanes, lanes, bits)
                for t in (turns[k], reader):
                    io[t.name] = max(io.get(t.name, 0), c)
                extra += _stream_fill(reader, lanes, bits)
    for t in turns:
        if t.name in io:
            pe, simd = folding[t.name]
            extra += max(0, io[t.name] - layer_cost(t, board, pe, simd, fmt, 1).fwd_cycles)
    if frame_io is not None:
        frame_io.update(io)
    return extra


def tm_weight_cycles(layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                     cap: float, chunks: int = 1, train: bool = True, port_lanes: int | None = None) -> int:
    """Forward cycles per sample a time-multiplexed stage loses to fetching its off-chip weights
    (:func:`tm_weight_turns`: the fill, and each turn's fetch beyond the longer of the layer's
    own cycles and its frame transfers, :func:`tm_spill_cycles`); 0 when its weights are
    on-chip ROMs or all stay on chip for the call (fetched once per call, not per sample)."""
    if not weights_offchip(layers, train):
        return 0
    fill, fetch = tm_weight_turns(layers, folding, fmt, kernel_onchip_budget(board, cap, chunks, train))
    if not fetch and not fill:
        return 0
    io: dict[str, int] = {}
    tm_spill_cycles(layers, board, folding, fmt, cap, chunks, train, io, port_lanes)
    extra = fill + WEIGHT_FILL_LAG if fill else 0
    for t in layers:
        if t.name in fetch:   # the turn as the RTL's sequencer runs it (engines.fetch_turn_cycles)
            pe, simd = folding[t.name]
            own = max(layer_cost(t, board, pe, simd, fmt, 1).fwd_cycles, io.get(t.name, 0))
            tf = turn_fill(engine_kind(t.type), simd)
            extra += fetch_turn_cycles(own, tf, fetch[t.name]) - (own + tf)
    return extra


def _stream_fill(t: Layer, lanes: int, bits: int) -> int:
    """The rows a window layer ``t`` waits for before its first window when it reads its image
    from an off-chip frame (fpga_models.engines.window_stream_fill); 0 for other layers."""
    if t.type not in ("conv2d", "maxpool", "avgpool") or len(t.in_shapes[0]) != 3:
        return 0
    c, h, w = t.in_shapes[0]
    k, pad = t.attr.get("kernel", 1), t.attr.get("padding", 0) or 0
    k, pad = int(k if isinstance(k, int) else k[0]), int(pad if isinstance(pad, int) else pad[0])
    return window_stream_fill(k, pad, h, w, c, lanes, bits)


@dataclass
class Allocation:
    """A stage's folding and compute time on one board (per micro-batch of ``batch`` samples)."""

    style: str                       # "dataflow" | "time-multiplexed"
    folding: dict[str, tuple[int, int]]
    fwd_cycles: int
    bwd_cycles: int
    dsp: int
    lut: int
    clock_hz: float

    @property
    def fwd_s(self) -> float:
        """Forward compute seconds per micro-batch."""
        return self.fwd_cycles / self.clock_hz

    @property
    def bwd_s(self) -> float:
        """Backward compute seconds per micro-batch."""
        return self.bwd_cycles / self.clock_hz


def time_multiplexed(layers: list[Layer], board: Board, fmt: str = "fixed16", batch: int = 1,
                     cap: float = 0.8, train: bool = True, chunks: int = 1,
                     no_dx: Collection[str] = frozenset()) -> Allocation:
    """Each layer at its fastest folding within the stage's share of the capped budget
    (:func:`stage_budget`, ``chunks`` stages on the board); times add up.

    Every sample costs each layer's turn (its cycles plus the engine's fill) and the
    sequencer's switch between jobs (fpga_models.engines), as the generated RTL runs it.
    ``no_dx``: layers whose backward computes no input gradient
    (fpga_models.gradients.no_input_gradient: the model input's is never built).
    """
    fold, fc, bc, dsp, lut = {}, 0, 0, 0, 0
    dsp_b, lut_b = stage_budget(board, cap, chunks, train)
    for l in layers:
        pe, simd = best_folding(l, board, fmt, dsp_b, lut_b)
        c = layer_cost(l, board, pe, simd, fmt, batch)
        fill = turn_fill(engine_kind(l.type)) * batch
        # the inference MVU's adder tree adds register stages with SIMD (engines.mvu_fill); a
        # training plan runs the training engines (rtl_train), which keep the SIMD = 1 fill
        fill_f = fill if train else turn_fill(engine_kind(l.type), simd) * batch
        fold[l.name] = (pe, simd)
        fc += c.fwd_cycles + (fill_f if c.fwd_cycles else 0)
        b = backward_work(c.bwd_in_cycles, c.bwd_w_cycles, l.name not in no_dx)
        bc += (b + (fill if b else 0)) if train else 0
        dsp, lut = max(dsp, c.dsp), max(lut, c.lut)
    fc += TM_SWITCH * batch if fc else 0
    bc += TM_SWITCH * batch if bc else 0
    return Allocation("time-multiplexed", fold, fc, bc, dsp, lut, board.clock_hz)


@lru_cache(maxsize=8192)
def _options(kind: str, a: int, b: int) -> tuple[tuple[int, int, int], ...]:
    """(lanes, pe, simd) options sorted by lanes; for each lane count the widest SIMD."""
    best: dict[int, tuple[int, int]] = {}
    if kind == "mvu":
        for p in divisors(a):
            for s in divisors(b):
                k = p * s
                if k not in best or s > best[k][1]:
                    best[k] = (p, s)
    else:
        for s in divisors(a):
            if s <= MAX_LANES:
                best[s] = (1, s)
    return tuple((k, *best[k]) for k in sorted(best))


def df_onchip_bytes(layers: Sequence[Layer], fmt: str) -> int:
    """The planner's figure of a dataflow kernel's on-chip bytes: every layer computes at once,
    so every MVU holds its whole matrix on chip (a ROM, or in training the copy it fetches from
    its m_axi array at the start of each call: codegen.design.weight_memory.load_weights_once),
    plus the window generators' line buffers (:func:`tm_fixed_bytes`)."""
    return sum(int(l.params) for l in layers) * bytes_per_element(fmt) + tm_fixed_bytes(layers, fmt)


def _layer_options(l: Layer):
    ms = matrix_shape(l)
    if ms is not None:
        return _options("mvu", ms[0], ms[1])
    return _options("ew", lane_dim(l), 0)


def dataflow(layers: list[Layer], board: Board, fmt: str = "fixed16", batch: int = 1, cap: float = 0.8,
             train: bool = True, chunks: int = 1, no_dx: Collection[str] = frozenset()) -> Allocation | None:
    """All layers resident; minimise the slowest layer's cycles within sum DSP / sum LUT of
    the stage's share of the capped budget (:func:`stage_budget`, ``chunks`` stages on the board).
    ``no_dx``: as :func:`time_multiplexed`.

    None when even the smallest folding of every layer exceeds the budget, or when the
    kernel's on-chip bytes (:func:`df_onchip_bytes`: every engine keeps its whole matrix) exceed
    its share of the board's (:func:`kernel_onchip_budget`).
    """
    if df_onchip_bytes(layers, fmt) > kernel_onchip_budget(board, cap, chunks, train):
        return None
    dsp_b, lut_b = stage_budget(board, cap, chunks, train)
    dpm = board.dsp_per_mac.get(fmt, 1.0)
    work, opts, mvu = [], [], []
    for l in layers:
        c1 = layer_cost(l, board, 1, 1, fmt, 1)
        b1 = backward_work(c1.bwd_in_cycles, c1.bwd_w_cycles, l.name not in no_dx)
        w = c1.fwd_cycles + (b1 if train else 0)   # one engine does F and B: balance both
        work.append(w)
        opts.append(_layer_options(l))
        mvu.append(None if matrix_shape(l) is None else True)
    ew_ops = [max(1.0, l.fwd_ops / max(1, l.out_elems)) for l in layers]

    def pick(tau: float):
        choice, dsp, lut = [], 0.0, 0.0
        for w, op, is_mvu, ops in zip(work, opts, mvu, ew_ops):
            need = w / tau
            sel = next((o for o in op if o[0] >= need - 1e-9), op[-1])
            choice.append(sel)
            if w:  # resources of the engine at that many lanes (fpga_models.engines)
                if is_mvu:
                    dsp += mvu_dsp(sel[1], sel[2], dpm)
                    lut += mvu_lut(sel[1], sel[2])
                else:
                    lut += elementwise_lut(sel[0], ops)
        return choice, dsp, lut

    lo, hi = 1.0, float(max(work) or 1)
    choice, dsp, lut = pick(hi)
    if dsp > dsp_b or lut > lut_b:
        return None
    for _ in range(60):  # bisection on the target interval (cycles per sample)
        if hi - lo <= max(1.0, 1e-6 * hi):
            break
        mid = math.sqrt(lo * hi)
        _c, d, u = pick(mid)
        if d <= dsp_b and u <= lut_b:
            hi = mid
        else:
            lo = mid
    choice, dsp, lut = pick(hi)
    fold, f_cyc, b_cyc = {}, [], []
    for l, (_k, pe, simd) in zip(layers, choice):
        c = layer_cost(l, board, pe, simd, fmt, 1)
        fold[l.name] = (pe, simd)
        f_cyc.append(c.fwd_cycles)
        b_cyc.append(backward_work(c.bwd_in_cycles, c.bwd_w_cycles, l.name not in no_dx) if train else 0)
    fwd = sum(f_cyc) + (batch - 1) * max(f_cyc, default=0)
    bwd = sum(b_cyc) + (batch - 1) * max(b_cyc, default=0)
    return Allocation("dataflow", fold, int(fwd), int(bwd), int(dsp), int(lut), board.clock_hz)


def allocate_stage(layers: list[Layer], board: Board, fmt: str = "fixed16", batch: int = 1, cap: float = 0.8,
                   train: bool = True, style: str = "auto", chunks: int = 1,
                   no_dx: Collection[str] = frozenset()) -> Allocation:
    """The faster of the two styles (``style`` may force one); ties go to time-multiplexed.
    ``chunks``: stages on the board (each folded within its share, :func:`stage_budget`);
    ``no_dx``: layers without an input gradient (fpga_models.gradients.no_input_gradient)."""
    tm = time_multiplexed(layers, board, fmt, batch, cap, train, chunks, no_dx)
    if style == "time-multiplexed":
        return tm
    df = dataflow(layers, board, fmt, batch, cap, train, chunks, no_dx)
    if style == "dataflow":
        return df if df is not None else tm
    if df is not None and df.fwd_cycles + df.bwd_cycles < tm.fwd_cycles + tm.bwd_cycles:
        return df
    return tm
