"""The on-chip memory of a stage's backward (training) kernel, decided once for the planner and
the lowering: which gradient frames of a time-multiplexed stage go off chip, the cycles those
frames and the tiled matrix engines cost, and the kernel's blocks as the plan states them.

The backward kernel (codegen.design.backward builds it) keeps on chip, besides its stream FIFOs,
its matrix engines' memories -- weight-gradient stores, weight store, chunk buffers
(fpga_models.bwd_tiles decides them) -- the convs' col2im row buffers and window line buffers,
and an unflatten's double buffer.

A time-multiplexed stage runs its layers' backward as turns (last layer first); the gradient one
turn hands to a later one is a whole frame (one sample's gradient of that tensor), on chip while
it fits beside the fixed bytes (fpga_models.allocate.frames_offchip, the forward kernels' rule),
else in off-chip memory: written in 512-bit words by its writer's turn, read back by its
reader's, each taking at least fpga_models.engines.frame_io_cycles -- cycles the plan charges
(:func:`tm_bwd_spill_cycles`) and the kernel spends. The tiled engines' cycles beyond the plan's
per-layer figure (:func:`tm_bwd_engine_cycles`), its flush (:func:`bwd_flush_cycles`), a dataflow
stage's backward (:func:`dataflow_bwd_cycles`) and the kernel's BRAM36 / URAM / DSP
(:func:`bwd_kernel_resources`) come from the same decision.

A time-multiplexed kernel's figure counts all it builds: its turns' own two-deep streams
(:func:`bwd_stream_bytes`, walked as codegen.design.backward lays them out) and an off-chip frame's
two-deep ends (:func:`frame_pipe_bytes`), so ``BwdMemory.onchip_bytes`` is the Design's figure
(codegen.design.onchip).

Read by the planner (planner.search: the stage's backward time; planner.planning: its resources)
and codegen.design.backward (which frames it puts off chip), so the two cannot disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod
from typing import Collection, Sequence

from bapipe.layers import Layer
from bapipe.spec import Model

from .allocate import frames_offchip, frames_offchip_blocks, weights_all_resident
from .bwd_tiles import (ACC_URAM_SHARE, WEIGHT_URAM_SHARE, col2im_buffer, col2im_plan, matrix_layers, col2im_reader_extra,
                        engine_extra_cycles, engine_folding, stage_tiles)
from .boards import Board, bytes_per_element, on_chip_bytes
from .cost import layer_cost, matrix_shape
from .engines import conv_window_lanes, frame_io_cycles
from .gradients import backward_work, gradient_tensors, no_input_gradient

#: share of the board's usable BRAM+URAM the weight-gradient accumulators of one backward
#: kernel may take on chip (the forward kernel, stashes and FIFOs share the rest) [design choice]
ACC_ONCHIP_SHARE = 0.5
#: the turn of a time-multiplexed backward kernel that sums the gradients of the stage's inputs
#: for its dx ports (codegen.design.backward names it so)
PORTS_TURN = "ports"
#: widest lanes of a backward port whose producer asks for none (codegen.design.backward)
PORT_LANES = 16
#: depth of a backward kernel's streams inside a turn (and of an off-chip frame's stream in its
#: writer's and its reader's turn): two beats, the FIFO HLS gives a DATAFLOW channel (codegen.design.backward)
STREAM_DEPTH = 2


def acc_width(terms: int, a_width: int, b_width: int) -> int:
    """Bits of a signed accumulator that sums ``terms`` products exactly (fpga_models.train_fixed)."""
    return a_width + b_width - 1 + math.ceil(math.log2(max(1, terms) + 1))


def divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` not above ``cap``."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _window(l: Layer):
    a = l.attr
    return _pair(a.get("kernel", 1)), _pair(a.get("stride", 1)), _pair(a.get("padding", 0) or 0)


@dataclass(frozen=True)
class GradFrame:
    """The gradient of ``tensor`` one backward turn (``writer``, a layer) hands to a later one
    (``reader``: a layer, or :data:`PORTS_TURN`): one sample, ``nbytes`` on chip, ``lanes`` a beat."""

    tensor: str
    writer: str
    reader: str
    nbytes: int
    lanes: int


@dataclass(frozen=True)
class BwdMemory:
    """A stage's backward kernel memory decision (:func:`bwd_memory`)."""

    budget: int | None                 # the kernel's on-chip bytes (None: no board, no limit)
    acc_onchip: dict                   # matrix layer -> its per-layer accumulator stays on chip (dataflow's record)
    acc_bytes: dict                    # matrix layer -> the accumulator's bytes
    other_bytes: int                   # the fixed buffers besides the streams (the tiled engines' arrays included)
    frames: tuple = ()                 # GradFrame, time-multiplexed stages only
    frames_off: tuple = ()             # per frame: off chip
    stream_bytes: int = 0              # time-multiplexed: the turns' two-deep streams (bwd_stream_bytes)
    frame_pipes: tuple = ()            # per frame: its two-deep ends when off chip (frame_pipe_bytes)
    elem_bytes: int = 2                # bytes of one element

    @property
    def fixed_bytes(self) -> int:
        """On-chip bytes besides the frames: the other buffers, the on-chip accumulators and the
        turns' two-deep streams."""
        return (self.other_bytes + sum(b for n, b in self.acc_bytes.items() if self.acc_onchip[n])
                + self.stream_bytes)

    @property
    def onchip_bytes(self) -> int:
        """The kernel's on-chip bytes as planned and built (codegen.design.onchip's figure): fixed bytes,
        the frames kept on chip and the two-deep ends of those off chip."""
        pipes = self.frame_pipes or (0,) * len(self.frames)
        return self.fixed_bytes + sum(p if o else f.nbytes for f, o, p in zip(self.frames, self.frames_off, pipes))

    def offchip(self, writer: str, reader: str) -> bool | None:
        """Whether the frame ``writer`` -> ``reader`` is off chip; None when there is no such frame."""
        for f, o in zip(self.frames, self.frames_off):
            if f.writer == writer and f.reader == reader:
                return o
        return None

    def as_dict(self) -> dict:
        """The Design's record of it (design.json, a stage's ``backward_memory``)."""
        return {"budget_bytes": self.budget, "onchip_bytes": self.onchip_bytes,
                "accumulators": [{"layer": n, "bytes": b, "onchip": self.acc_onchip[n]}
                                 for n, b in self.acc_bytes.items()],
                "frames": [{"tensor": f.tensor, "writer": f.writer, "reader": f.reader, "bytes": f.nbytes,
                            "lanes": f.lanes, "offchip": o} for f, o in zip(self.frames, self.frames_off)]}


def _active(model: Model, layers: Sequence[Layer]) -> tuple[set[str], set[str]]:
    """(layers whose backward runs, tensors whose gradient the kernel carries): a layer runs when
    it learns a matrix or passes on a gradient (codegen.design.backward's rule: fpga_models.gradients)."""
    inside = {l.name for l in layers}
    grads = gradient_tensors(model)
    needed = {i for l in layers for i in l.inputs if i not in inside and i in grads}
    active: set[str] = set()
    for l in layers:
        if l.type in ("dense", "conv2d") or any(i in needed for i in l.inputs):
            active.add(l.name)
            needed.add(l.name)
    return active, needed


def stage_outputs(model: Model, layers: Sequence[Layer]) -> list[str]:
    """The tensors a stage (a contiguous run of the model's layers) sends on: every tensor crossing
    the cut after its last layer (its own outputs and skip connections it passes through), the
    model's output for the last stage (codegen.design.context.stage_ports)."""
    last = model.index[layers[-1].name]
    if last >= len(model.layers) - 1:
        return [model.layers[-1].name]
    return [t.producer for t in model.cut_tensors(last)]


def _ew_lanes(fold: tuple[int, int]) -> int:
    return fold[0] * fold[1]


def bwd_frames(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]],
               fmt: str) -> list[GradFrame]:
    """The gradient frames between a time-multiplexed backward kernel's turns, in turn order
    (the writer's; then the reader's input order): every gradient a layer's turn computes for an
    input that a later turn reads (the input's producer, or the dx ports' sum when several
    layers read a stage input). A layer that only passes its gradient on (a flatten of a
    vector, an add with one input to feed) has no turn of its own: its frame goes straight to
    the next reader. ``folding``: (PE, SIMD) of matrix layers, (1, lanes) of the others."""
    return _walk(model, layers, folding, fmt)[0]


def bwd_stream_bytes(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str) -> int:
    """On-chip bytes of the two-deep streams a time-multiplexed backward kernel's turns keep
    inside themselves (codegen.design.backward builds them, :data:`STREAM_DEPTH` beats each): the width
    converters and sums in front of a turn's engine, its stash and window streams, a
    convolution's exact dx beats into col2im, a pool's contributions, a dense turn's unused dx;
    not the frames between turns (:func:`bwd_frames`) nor an off-chip frame's two-deep ends
    (:func:`frame_pipe_bytes`)."""
    return sum(STREAM_DEPTH * -(-bits // 8) for _turn, bits in _walk(model, layers, folding, fmt)[1])


def frame_pipe_bytes(frame: GradFrame, fmt: str) -> int:
    """On-chip bytes an off-chip frame keeps: its stream, two deep, in its writer's turn (into
    frame_write) and in its reader's (from frame_read) (codegen.design.backward._sequence_turns)."""
    return 2 * STREAM_DEPTH * frame.lanes * bytes_per_element(fmt)


def _walk(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]],
          fmt: str, c2i: dict | None = None, tiles: dict | None = None) -> tuple[list[GradFrame], list[tuple[str, int]]]:
    """The backward kernel's streams as codegen.design.backward.build_bwd lays them out, layers walked
    last first: (the frames between turns, :func:`bwd_frames`; per two-deep stream inside one
    turn, (turn, beat bits))."""
    eb = bytes_per_element(fmt)
    active, needed = _active(model, layers)
    names = {l.name: l for l in layers}
    elems = {l.name: int(l.out_elems) for l in layers}
    for l in layers:
        for i, s in zip(l.inputs, l.in_shapes):
            elems.setdefault(i, int(prod(s)))

    def dy_lanes(t: str) -> int | None:
        p = names.get(t)
        if p is None or p.type in ("add", "flatten"):
            return None
        return folding[t][0] if matrix_shape(p) is not None else _ew_lanes(folding[t])

    contrib: dict[str, list[tuple[str | None, int]]] = {}
    for t in stage_outputs(model, layers):
        if t in needed:
            contrib.setdefault(t, []).append((None, dy_lanes(t) or divisor_at_most(elems[t], PORT_LANES)))
    frames: list[GradFrame] = []
    local: list[tuple[str, int]] = []
    bits = 8 * eb

    def two_deep(turn: str, lanes: int, beat_bits: int = 0) -> None:
        local.append((turn, beat_bits or lanes * bits))

    def resize(turn: str, a: int, bl: int) -> None:
        """codegen.design.backward's resize from a to bl lanes: one stream, or two through gcd(a, bl)."""
        if a == bl:
            return
        if a % bl and bl % a:
            g = math.gcd(a, bl)
            resize(turn, a, g)
            resize(turn, g, bl)
            return
        two_deep(turn, bl)

    def read(t: str, reader: str, lanes: int | None) -> int:
        """The reader's turn reads the gradient of t: each part another turn wrote is a frame;
        the parts come to the wanted lanes and are summed in the reader's turn."""
        parts = contrib.get(t, [])
        for w, ln in parts:
            if w is not None:
                frames.append(GradFrame(t, w, reader, elems[t] * eb, ln))
        if not parts:   # no contribution: a stream of zeros
            L = lanes or divisor_at_most(elems[t], PORT_LANES)
            two_deep(reader, L)
            return L
        L = lanes or parts[0][1]
        resize(reader, parts[0][1], L)
        for _w, a in parts[1:]:
            resize(reader, a, L)
            two_deep(reader, L)   # grad_sum
        return L

    def give(t: str, writer: str | None, lanes: int) -> None:
        contrib.setdefault(t, []).append((writer, lanes))

    def window(l: Layer, turn: str, lanes_taps: tuple[int, int], simd: int) -> None:
        """codegen.design.backward's window: stash_read, swg and a resize to SIMD, else window_read."""
        if _swg_rows(l, lanes_taps, simd, eb):
            lanes, taps = lanes_taps
            two_deep(turn, lanes)
            two_deep(turn, lanes * taps)
            resize(turn, lanes * taps, simd)
        else:
            two_deep(turn, simd)

    for l in reversed(layers):
        if l.name not in active:
            continue
        src = l.inputs[0]
        dx = [i in needed for i in l.inputs]
        fo = folding[l.name]
        t = l.name
        if l.type in ("dense", "conv2d"):
            read(l.name, t, fo[0])
            simd = fo[1]
            if l.type == "dense":
                two_deep(t, simd)                                   # the stashed input
            else:
                c, _h, w = l.in_shapes[0]
                (kh, _kw), _s, _p = _window(l)
                job = tiles[l.name].job(l.name) if tiles and l.name in tiles else None
                window(l, t, conv_window_lanes(c, kh, job.wsimd if job is not None and job.wsimd else simd), simd)
            if not dx[0]:
                two_deep(t, simd)                                   # the MVU's unused dx beats
                continue
            if l.type == "dense":
                give(src, l.name, simd)
            else:
                mh, _mw, _pix = matrix_shape(l)
                (kh, kw), _s, _p = _window(l)
                xbits = acc_width(int(mh) * kh * kw, bits, bits)
                two_deep(t, simd, simd * xbits)   # exact dx into col2im
                if c2i and l.name in c2i:   # the tiled engines' col2im (fpga_models.bwd_tiles.col2im_plan)
                    p2 = c2i[l.name]
                    if p2.lin < simd:
                        two_deep(t, p2.lin, p2.lin * xbits)
                    give(src, l.name, p2.lout)
                else:
                    want = dy_lanes(src) or c
                    give(src, l.name, want if (w * c) % want == 0 else math.gcd(w * c, want))
        elif l.type == "flatten" and len(l.in_shapes[0]) == 3:
            lin = read(l.name, t, None)
            n_in = elems[src]
            want = dy_lanes(src) or lin
            give(src, l.name, want if n_in % want == 0 else math.gcd(n_in, want))
        elif l.type in ("flatten", "add"):
            outs = [i for i, d in zip(l.inputs, dx) if d]
            parts = contrib.get(l.name, [])
            if len(parts) == 1 and len(outs) == 1:   # no engine of its own: the gradient passes on
                contrib.setdefault(outs[0], []).append(parts[0])
                continue
            L = read(l.name, t, None)
            for j in range(max(0, len(outs) - 2)):   # a third input on: dup2's fan-out inside the turn
                two_deep(t, L)
            for i in outs:
                give(i, l.name, L)
        else:   # relu, batchnorm, pools: their element-wise lanes
            L = _ew_lanes(fo)
            read(l.name, t, L)
            if l.type in ("relu", "batchnorm"):
                two_deep(t, L)                                      # the stashed input
            elif l.type in ("maxpool", "avgpool"):
                c, h, w = l.in_shapes[0]
                (kh, kw), (sh, sw), (ph, pw) = _window(l)
                if kh == kw == sh == sw and ph == pw == 0 and h % kh == 0 and w % kw == 0:
                    if l.type == "maxpool":
                        two_deep(t, L)                              # the stashed input
                        two_deep(t, L, L * (bits + 8))              # the argmax beats
                else:
                    two_deep(t, L, L * (bits + math.ceil(math.log2(kh * kw + 1)) + 1))   # contributions
                    if l.type == "maxpool":
                        window(l, t, (L, 1), L)
            give(src, l.name, L)
    inside = set(names)
    for t in sorted({i for l in layers for i in l.inputs if i not in inside and i in needed}, key=str):
        if len(contrib.get(t, [])) > 1:   # several readers: their gradients meet in the ports' turn
            read(t, PORTS_TURN, None)
            local.pop()                   # the last sum is the dx port itself
    turn = {l.name: k for k, l in enumerate(reversed(layers))}
    last = len(turn)
    return sorted(frames, key=lambda f: (turn.get(f.writer, last), turn.get(f.reader, last))), local


def _acc_bytes(l: Layer, terms: int, bits: int) -> int:
    mh, mw, pix = matrix_shape(l)
    vec = int(round(pix)) if l.type == "conv2d" else int(prod(l.in_shapes[0][:-1]))
    return int(mh) * int(mw) * -(-acc_width(terms * max(1, vec), bits, bits) // 8)


def bwd_other_bytes(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str,
                    time_multiplexed: bool = False) -> int:
    """On-chip bytes of a backward kernel's fixed buffers other than the weight-gradient
    accumulators (registers not counted): the MVUs' input vectors (one, the widest, when the
    layers take turns on shared arrays: codegen.design.mac_share), col2im line buffers,
    window-generator rows of stashed images, unflatten double buffers."""
    eb = bytes_per_element(fmt)
    bits = 8 * eb
    active, needed = _active(model, layers)
    total, vectors = 0, []
    for l in layers:
        if l.name not in active:
            continue
        fo = folding[l.name]
        src = l.inputs[0]
        if l.type in ("dense", "conv2d"):
            mh, mw, _p = matrix_shape(l)
            vectors.append(int(mw) * eb)                                # the input vector
            if l.type == "conv2d":
                c, _h, w = l.in_shapes[0]
                (kh, kw), (sh, _sw), _pad = _window(l)
                total += _swg_rows(l, conv_window_lanes(c, kh, fo[1]), fo[1], eb)
                if src in needed:                                       # col2im of dx
                    total += (kh + sh) * w * c * -(-acc_width(int(mh) * kh * kw, bits, bits) // 8)
        elif l.type in ("maxpool", "avgpool"):
            c, h, w = l.in_shapes[0]
            (kh, kw), (sh, sw), (ph, pw) = _window(l)
            if not (kh == kw == sh == sw and ph == pw == 0 and h % kh == 0 and w % kw == 0):
                gb = bits + math.ceil(math.log2(kh * kw + 1)) + 1
                total += (kh + sh) * w * c * -(-gb // 8)
                if l.type == "maxpool":
                    L = _ew_lanes(fo)
                    total += _swg_rows(l, (L, 1), L, eb)
        elif l.type == "flatten" and len(l.in_shapes[0]) == 3:
            total += 2 * int(prod(l.in_shapes[0])) * eb
    return total + (max(vectors, default=0) if time_multiplexed else sum(vectors))


def _swg_rows(l: Layer, lanes_taps: tuple[int, int], simd: int, eb: int) -> int:
    """Rows a backward window generator keeps of a stashed image (codegen.design.backward's window:
    square windows whose beats it can build), else 0 (it reads the windows from memory)."""
    c, _h, w = l.in_shapes[0]
    (kh, kw), (sh, sw), (ph, pw) = _window(l)
    lanes, taps = lanes_taps
    if kh == kw and sh == sw and ph == pw and simd % (lanes * taps) == 0 and c % lanes == 0:
        return (kh + sh - 1) * w * c * eb
    return 0


def bwd_weight_elems(model: Model, layers: Sequence[Layer]) -> list[int]:
    """Elements of each weight array a backward kernel's engines read: every matrix (W^T dy for
    dx), a trained batchnorm's scale (never the biases)."""
    active, _needed = _active(model, layers)
    out = []
    for l in layers:
        if l.name in active and l.type in ("dense", "conv2d"):
            mh, mw, _p = matrix_shape(l)
            out.append(int(mh) * int(mw))
        elif l.name in active and l.type == "batchnorm":
            s = l.in_shapes[0]
            out.append(int(s[0] if len(s) == 3 else s[-1]))
    return out


def bwd_weight_bytes(model: Model, layers: Sequence[Layer], fmt: str, budget: int | None) -> int:
    """On-chip bytes of the backward kernel's weight copies (codegen.design.backward fills them in 512-bit
    bursts at the start of a call): all the arrays its engines read when they fit what the
    forward's rule gives a kernel's weights (fpga_models.allocate.weights_all_resident), else
    none (the engines read them in place)."""
    eb = bytes_per_element(fmt)
    elems = bwd_weight_elems(model, layers)
    return sum(elems) * eb if elems and weights_all_resident(elems, eb, budget) else 0


def place_accumulators(acc_bytes: dict[str, int], room: float) -> dict[str, bool]:
    """Which accumulators stay on chip: smallest first (ties: layer order) while they fit ``room``."""
    used, out = 0, {}
    for n in sorted(acc_bytes, key=lambda n: acc_bytes[n]):
        out[n] = used + acc_bytes[n] <= room
        if out[n]:
            used += acc_bytes[n]
    return {n: out[n] for n in acc_bytes}


def engine_uram(room, board: Board | None) -> int | None:
    """The URAMs a backward kernel's stores take their shares of (fpga_models.bwd_tiles:
    ACC_URAM_SHARE for the weight-gradient sums, WEIGHT_URAM_SHARE for the weights dx reads) when
    the forward kernel leaves the stage ``room`` blocks (fpga_models.allocate.bwd_block_room):
    the board's usable URAMs, or fewer so that both shares fit the room (the stores then pass
    more rows through off-chip memory and hold one turn's weights, which the plan prices);
    None without a room (the shares of the board's usable)."""
    if room is None or board is None:
        return None
    return max(0, min(board.usable_uram, int(room.uram / (ACC_URAM_SHARE + WEIGHT_URAM_SHARE))))


def bwd_fixed_blocks(model: Model, layers: Sequence[Layer], board: Board | None,
                     folding: dict[str, tuple[int, int]], fmt: str, tiles: dict, tm: bool) -> "Blocks":
    """The backward kernel's blocks besides its frames: its matrix engines' memories
    (fpga_models.bwd_tiles.kernel_blocks), the convs' col2im row buffers and their window
    generators' line buffers (ROWS x K x lanes banks, bapipe_engines.h swg), by memory_blocks'
    rules (UG573), as `bapipe check` counts the generated C++."""
    from .bwd_tiles import col2im_buffer, kernel_blocks
    from .memory_blocks import array_blocks

    bits = 8 * bytes_per_element(fmt)
    efold = engine_folding(tiles, folding)
    total = kernel_blocks(tiles)
    if tm:
        plans = list(tm_col2im(model, layers, tiles, efold).values())
    else:
        _a, needed = _active(model, layers)
        names = {l.name: l for l in layers}
        plans = []
        for l in layers:
            if l.type == "conv2d" and l.name in tiles and l.inputs[0] in needed:
                p = names.get(l.inputs[0])
                want = None
                if p is not None and p.type not in ("add", "flatten"):
                    want = efold[p.name][0] if matrix_shape(p) is not None else _ew_lanes(efold[p.name])
                plans.append(col2im_plan(l, tiles[l.name].job(l.name), want or int(l.in_shapes[0][0]), False))
    for a in col2im_buffer(plans, tm):
        total = total + a.blocks
    for l in layers:
        if l.type != "conv2d" or l.name not in tiles:
            continue
        j = tiles[l.name].job(l.name)
        c, _h, w = l.in_shapes[0]
        (kh, kw), (sh, sw), (ph, pw) = _window(l)
        lanes, taps = conv_window_lanes(c, kh, j.wsimd or j.lsimd)
        if kh == kw and sh == sw and ph == pw and j.lsimd % (lanes * taps) == 0 and c % lanes == 0:
            rows = kh + sh - 1
            banks = rows * min(kh, w) * lanes
            total = total + array_blocks("auto", bits, rows * w * c, banks)
    return total


def frame_blocks(f: GradFrame, fmt: str) -> "Blocks":
    """A gradient frame kept on chip: a FIFO of the frame at its lanes, bound as the Design binds
    it (fpga_models.bwd_tiles.fifo_storage; UG573 modes)."""
    from .bwd_tiles import fifo_storage
    from .memory_blocks import bank_blocks, fifo_impl

    bits = 8 * bytes_per_element(fmt)
    width, depth = f.lanes * bits, f.nbytes // bytes_per_element(fmt) // f.lanes
    return bank_blocks(fifo_impl(width, depth, fifo_storage(width, depth)), width, depth)


def _frames_off(frames, keep, base: int, budget: int | None, room, fixed, fmt: str) -> list[bool]:
    """Which gradient frames go off chip: in blocks within ``room`` beside the kernel's ``fixed``
    blocks when a room is given (fpga_models.allocate.frames_offchip_blocks), else in bytes within
    ``budget`` (fpga_models.allocate.frames_offchip); a frame with nothing to free stays."""
    if room is not None:
        off = frames_offchip_blocks([frame_blocks(f, fmt) for f in frames], [f.nbytes for f in frames],
                                    fixed, room)
    elif budget is not None:
        off = frames_offchip(keep, base, budget)
    else:
        off = [False] * len(frames)
    return [o and k > 0 for o, k in zip(off, keep)]


def bwd_memory(model: Model, layers: Sequence[Layer], board: Board | None, folding: dict[str, tuple[int, int]],
               fmt: str, budget: int | None, samples: int, time_multiplexed: bool, room=None) -> BwdMemory:
    """The backward kernel's memory decision. ``budget``: its on-chip share
    (fpga_models.allocate.kernel_onchip_budget; None: unlimited); ``samples``: samples whose
    gradients an accumulator sums in an iteration (micro-batches x the replica's micro-batch).

    A time-multiplexed kernel's decision counts what it builds besides the frames: its tiled
    engines' arrays (fpga_models.bwd_tiles), the convs' shared col2im row buffer, its turns'
    two-deep streams and an off-chip frame's two-deep ends; frames at the engines' lanes
    (fpga_models.bwd_tiles.engine_folding). A dataflow kernel's record: its accumulators (bytes)."""
    eb = bytes_per_element(fmt)
    bits = 8 * eb
    active, _needed = _active(model, layers)
    acc = {l.name: _acc_bytes(l, samples, bits) for l in layers
           if l.name in active and l.type in ("dense", "conv2d")}
    other = bwd_other_bytes(model, layers, folding, fmt, time_multiplexed) + bwd_weight_bytes(model, layers, fmt,
                                                                                                budget)
    acc_room = ACC_ONCHIP_SHARE * on_chip_bytes(board) if board is not None else float("inf")
    if not time_multiplexed:
        if budget is not None:
            acc_room = min(acc_room, budget - other)
        return BwdMemory(budget, place_accumulators(acc, acc_room), acc, other)
    # the tiled matrix engines (fpga_models.bwd_tiles) hold the weight-gradient sums, the weights dx
    # reads and the engines' buffers: their bytes are fixed; no per-layer accumulator, tile or stream
    tiles = stage_tiles(model, layers, folding, "tm", 1, samples, board, bits, engine_uram(room, board))
    fixed = bwd_fixed_blocks(model, layers, board, folding, fmt, tiles, True) if room is not None else None
    if tiles:
        folding = engine_folding(tiles, folding)
        # bytes as the Design counts its arrays: elements x whole bytes an element
        eng = sum(a.depth * a.banks * -(-a.width // 8) for a in next(iter(tiles.values())).arrays)
        c2i = tm_col2im(model, layers, tiles, folding)
        frames, local = _walk(model, layers, folding, fmt, c2i, tiles)
        streams = sum(STREAM_DEPTH * -(-b // 8) for _t, b in local)
        pipes = [frame_pipe_bytes(f, fmt) for f in frames]
        # the convs' col2im share one row buffer (fpga_models.bwd_tiles.col2im_buffer)
        own_lb = sum(c2.rows * c2.wc * -(-c2.xb // 8) for c2 in c2i.values())
        shared = sum(a.banks * a.depth * -(-a.width // 8) for a in col2im_buffer(list(c2i.values()), True))
        # (and the engines' own buffers replace the shared MVU's input vector bwd_other_bytes counts)
        vec = max((m.mw for m in matrix_layers(model, layers, folding)), default=0) * eb
        # the on-chip copies besides the matrices (a trained batchnorm's scale) when the weights fit
        scales = (sum(bwd_weight_elems(model, layers)) - sum(m.elems for m in matrix_layers(model, layers, folding))) \
            * eb if bwd_weight_bytes(model, layers, fmt, budget) else 0
        base = (bwd_other_bytes(model, layers, folding, fmt, True) - own_lb - vec + shared + eng + streams
                + sum(pipes) + scales)
        keep = [f.nbytes - p for f, p in zip(frames, pipes)]
        off = _frames_off(frames, keep, base, budget, room, fixed, fmt)
        return BwdMemory(budget, {n: False for n in acc}, acc, base - streams - sum(pipes), tuple(frames),
                         tuple(off), streams, tuple(pipes), eb)
    # no matrix layer: the turns' streams and frames beside the other buffers
    frames, local = _walk(model, layers, folding, fmt)
    streams = sum(STREAM_DEPTH * -(-b // 8) for _t, b in local)
    pipes = [frame_pipe_bytes(f, fmt) for f in frames]
    base = other + streams + sum(pipes)
    keep = [f.nbytes - p for f, p in zip(frames, pipes)]
    off = _frames_off(frames, keep, base, budget, room, fixed, fmt)
    return BwdMemory(budget, {n: False for n in acc}, acc, other, tuple(frames), tuple(off), streams, tuple(pipes), eb)


def tm_bwd_extra_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                        fmt: str, budget: int | None, samples: int, room=None) -> int:
    """Backward cycles per sample a time-multiplexed stage spends beyond its layers' own at
    ``folding``: its off-chip gradient frames (:func:`tm_bwd_spill_cycles`) and its tiled engines
    (:func:`tm_bwd_engine_cycles`); what the planner adds to the stage's backward time. ``room``:
    the blocks the forward kernel leaves (fpga_models.allocate.bwd_block_room; None: the shares
    of the whole board and the bytes ``budget``)."""
    mem = bwd_memory(model, layers, board, folding, fmt, budget, samples, True, room)
    return (tm_bwd_spill_cycles(model, layers, board, folding, fmt, budget, samples, mem)
            + tm_bwd_engine_cycles(model, layers, board, folding, fmt, samples, room))


def tm_bwd_engine_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                         fmt: str, samples: int, room=None) -> int:
    """Backward cycles per sample a time-multiplexed stage's tiled matrix engines (fpga_models.bwd_tiles:
    one grid, chunks, off-chip passes, row engines at their port's rate, weight fills) take beyond
    the plan's per-layer figure at ``folding`` (their stores within :func:`engine_uram` of ``room``)."""
    tiles = stage_tiles(model, layers, folding, "tm", 1, samples, board, 8 * bytes_per_element(fmt),
                        engine_uram(room, board))
    names = {l.name: l for l in layers}
    no_dx = no_input_gradient(model)
    plan = {n: _own_cycles(n, names[n], board, folding, fmt, no_dx) for n in tiles}
    c2i = tm_col2im(model, layers, tiles, engine_folding(tiles, folding))
    elems = {n: int(prod(names[n].in_shapes[0])) for n in c2i}
    readers = {}
    for n in c2i:   # the turn reading the conv's dx: an element-wise layer at its planned lanes
        r = names.get(names[n].inputs[0])
        if r is not None and matrix_shape(r) is None and r.type not in ("add", "flatten"):
            readers[n] = _ew_lanes(folding[r.name])
    return engine_extra_cycles(tiles, plan, 1) + col2im_reader_extra(list(c2i.values()), elems, readers)


def tm_col2im(model: Model, layers: Sequence[Layer], tiles: dict, folding: dict[str, tuple[int, int]]) -> dict:
    """conv layer -> its col2im (fpga_models.bwd_tiles.col2im_plan) in a time-multiplexed kernel:
    the convs with an input gradient, their reader's lanes at the engines' ``folding``."""
    _active_l, needed = _active(model, layers)
    names = {l.name: l for l in layers}
    out = {}
    for l in layers:
        if l.type != "conv2d" or l.name not in tiles or l.inputs[0] not in needed:
            continue
        p = names.get(l.inputs[0])
        want = None
        if p is not None and p.type not in ("add", "flatten"):
            want = folding[p.name][0] if matrix_shape(p) is not None else _ew_lanes(folding[p.name])
        out[l.name] = col2im_plan(l, tiles[l.name].job(l.name), want or int(l.in_shapes[0][0]), True)
    return out


def _frame_io(mem: BwdMemory, fmt: str) -> dict[str, int]:
    """Per turn (a layer, or the ports' turn): the 512-bit words of its longest off-chip frame."""
    eb = bytes_per_element(fmt)
    io: dict[str, int] = {}
    for f, o in zip(mem.frames, mem.frames_off):
        if o:
            c = frame_io_cycles(f.nbytes // eb // f.lanes, f.lanes, 8 * eb)
            for t in (f.writer, f.reader):
                io[t] = max(io.get(t, 0), c)
    return io


def _own_cycles(name: str, layer: Layer, board: Board, folding: dict[str, tuple[int, int]], fmt: str,
                no_dx: Collection[str]) -> int:
    pe, simd = folding[name]
    lc = layer_cost(layer, board, pe, simd, fmt, 1)
    return int(backward_work(lc.bwd_in_cycles, lc.bwd_w_cycles, name not in no_dx))


def tm_bwd_spill_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                        fmt: str, budget: int | None, samples: int, mem: BwdMemory | None = None) -> int:
    """Backward cycles per sample a time-multiplexed stage loses to its off-chip gradient frames:
    a turn that writes or reads one takes at least the transfer's 512-bit words
    (fpga_models.engines.frame_io_cycles), beyond the layer's own backward cycles when that is
    longer (the dx ports' turn has none of its own the plan charges)."""
    if mem is None:
        mem = bwd_memory(model, layers, board, folding, fmt, budget, samples, True)
    names = {l.name: l for l in layers}
    no_dx = no_input_gradient(model)
    extra = 0
    for t, c in _frame_io(mem, fmt).items():
        own = _own_cycles(t, names[t], board, folding, fmt, no_dx) if t in names else 0
        extra += max(0, c - own)
    return int(extra)


def bwd_kernel_resources(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                         fmt: str, style: str, samples: int, iteration_samples: int, budget: int | None,
                         room=None) -> dict:
    """The backward kernel's BRAM36, URAM and DSP as the plan states them (plan.yaml ``resources``
    ``bwd_*``): :func:`bwd_fixed_blocks`, a time-multiplexed kernel's whole frames kept on chip
    (:func:`frame_blocks`) and the engines' DSP; all in blocks by memory_blocks' rules (UG573), as
    `bapipe check` counts the generated C++. ``samples``: a call's (dataflow);
    ``iteration_samples``: an iteration's; ``room``: what the forward kernel leaves (a
    time-multiplexed kernel's stores and frames fit it: :func:`bwd_memory`)."""
    from .bwd_tiles import kernel_dsp

    bits = 8 * bytes_per_element(fmt)
    tm = style != "dataflow"
    tiles = stage_tiles(model, layers, folding, "tm" if tm else "dataflow", samples, iteration_samples, board, bits,
                        engine_uram(room, board) if tm else None)
    total = bwd_fixed_blocks(model, layers, board, folding, fmt, tiles, tm)
    if tm:
        mem = bwd_memory(model, layers, board, folding, fmt, budget, iteration_samples, True, room)
        for f, off in zip(mem.frames, mem.frames_off):
            if not off:
                total = total + frame_blocks(f, fmt)
    per = board.dsp_per_mac.get(fmt, 1.0) if board is not None else 1.0
    dsp = kernel_dsp(tiles, per) + elementwise_dsp(layers, folding, per)
    return {"bram36": total.bram36, "uram": total.uram, "dsp": dsp}


def stage_blocks_fit(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                     fmt: str, cap: float, chunks: int, train: bool, style: str, samples: int,
                     iteration_samples: int, port_lanes: int | None = None, room=None) -> bool:
    """Whether a stage's forward kernel (fpga_models.allocate.fwd_kernel_blocks, its MAC arrays'
    DSP) and, in training, its backward kernel (:func:`bwd_kernel_resources` within ``room``)
    fit the stage's share of the board's usable BRAM, URAM and DSP (fpga_models.allocate.stage_block_budget at cap 1), as
    `bapipe check`'s ``blocks`` rule counts them (UG573 primitives). The cap shapes the shares
    the kernels decide within (frames, stores); a plan is refused only when its kernels exceed
    what the board has: a backward kernel's stores have a floor (a bank per drain lane and per
    weight word: vgg16's conv10-13 at 3,072 lanes take 302 URAM however little room is left,
    1,184 URAM with the forward kernel's 882; refusing at the cap's 1,024 leaves vgg16 on 4
    U250s no plan at the table's foldings). True for a stage the streaming engines do not build
    (fpga_models.allocate.engine_built: codegen refuses it, so no kernel's blocks exist to count)."""
    from .allocate import engine_built, fwd_kernel_blocks, kernel_onchip_budget, stage_block_budget

    if not engine_built(layers):   # no kernel the engines build (transformers' attention, embeddings): no blocks to count
        return True
    budget = stage_block_budget(board, 1.0, chunks)
    f = fwd_kernel_blocks(layers, board, folding, fmt, cap, chunks, train, style, port_lanes)
    bram18, uram = f.bram18, f.uram
    # the forward MAC arrays' DSP (the largest layer's when the layers take turns on one array)
    per = [layer_cost(l, board, *folding[l.name], fmt, 1).dsp for l in layers]
    dsp = sum(per) if style == "dataflow" else max(per, default=0)
    if train:
        r = bwd_kernel_resources(model, layers, board, folding, fmt, style, samples, iteration_samples,
                                 kernel_onchip_budget(board, cap, chunks, True), room)
        bram18, uram, dsp = bram18 + 2 * r["bram36"], uram + r["uram"], dsp + r["dsp"]
    return bram18 <= budget.bram18 and uram <= budget.uram and dsp <= board.usable_dsp // max(1, chunks)


def elementwise_dsp(layers: Sequence[Layer], folding: dict[str, tuple[int, int]], per_mac: float = 1.0) -> int:
    """DSP of the backward kernel's element-wise engines (the matrix engines' are
    fpga_models.bwd_tiles.kernel_dsp): a trained batchnorm takes two 16 x 16 products a lane at
    its folding's lanes, dy x scale (dx) and dy x x (the scale's sum) (bapipe_layers_bwd.h
    ``batchnorm_bwd_train``; a DSP48E2 takes 27 x 18, UG579), ``per_mac`` DSP a product (the
    board's, as kernel_dsp). A time-multiplexed kernel's turns are separate functions, so every
    batchnorm counts (resnet50 --whole-blocks stage 0-35: 2,944 DSP the plan left out)."""
    return int(sum(2 * _ew_lanes(folding.get(l.name, (1, 1))) for l in layers if l.type == "batchnorm") * per_mac)


def bwd_flush_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                     fmt: str, style: str, samples: int, iteration_samples: int, room=None) -> int:
    """Cycles of the backward kernel's flush call, once an iteration after its last micro-batch
    (fpga_models.bwd_tiles.kernel_flush_cycles): what the planner adds to the stage's end of
    iteration, before its all-reduce reads the sums."""
    from .bwd_tiles import kernel_flush_cycles

    tiles = stage_tiles(model, layers, folding, "dataflow" if style == "dataflow" else "tm", samples,
                        iteration_samples, board, 8 * bytes_per_element(fmt),
                        engine_uram(room, board) if style != "dataflow" else None)
    return kernel_flush_cycles(tiles)


def dataflow_bwd_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                        fmt: str, batch: int, iteration_samples: int) -> int:
    """Backward cycles of a dataflow stage's micro-batch of ``batch`` samples as its engines run:
    every layer's engine at once, so the first sample through all of them, then a sample per the
    slowest (fpga_models.allocate.dataflow's rule); a matrix layer's figure its tiled engine's in
    steady state (fpga_models.bwd_tiles.steady_cycles), the others' at the plan's ``folding``."""
    from .bwd_tiles import steady_cycles

    tiles = stage_tiles(model, layers, folding, "dataflow", batch, iteration_samples, board,
                        8 * bytes_per_element(fmt))
    no_dx = no_input_gradient(model)
    per = []
    for l in layers:
        bt = tiles.get(l.name)
        per.append(steady_cycles(bt, bt.job(l.name)) if bt is not None
                   else _own_cycles(l.name, l, board, folding, fmt, no_dx))
    return int(sum(per) + (max(1, batch) - 1) * max(per, default=0))
