"""The on-chip memory of a stage's backward (training) kernel, decided once for the planner and
the lowering: which weight-gradient accumulators stay on chip, which gradient frames of a
time-multiplexed stage go off chip, and the cycles those frames cost.

The backward kernel (codegen.design.backward builds it) keeps on chip, besides its stream FIFOs:

- per matrix layer (dense, conv2d) a weight-gradient accumulator ``aw`` of MH x MW exact sums
  (:func:`acc_width` bits for the iteration's vectors), the MVU's input vector (MW elements)
  and, for a convolution that passes dx on, a col2im line buffer of KH + SH rows of exact
  input-gradient sums; a convolution (or overlapping max pool) that streams its stash through
  the window generator keeps KH + SH - 1 rows of its input;
- an overlapping pool's col2im line buffer, an unflatten's double buffer.

The accumulators go on chip smallest first while they fit :data:`ACC_ONCHIP_SHARE` of the board
and what the kernel's share (fpga_models.allocate.kernel_onchip_budget) leaves beside the other
buffers; the rest are read-modify-written in off-chip memory. A time-multiplexed stage runs its
layers' backward as turns (last layer first); the gradient one turn hands to a later one is a
whole frame (one sample's gradient of that tensor), on chip while it fits beside the fixed
bytes (fpga_models.allocate.frames_offchip, the forward kernels' rule), else in off-chip
memory: written in 512-bit words by its writer's turn, read back by its reader's, each taking
at least fpga_models.engines.frame_io_cycles -- cycles the plan charges
(:func:`tm_bwd_spill_cycles`) and the kernel spends.

A time-multiplexed kernel whose weights are not all copied on chip reads the smaller matrices
of its turns with an input gradient from an on-chip weight tile (:func:`choose_tile`: what
the share leaves), filled every sample in 512-bit beats. When two such tiles fit what the share
leaves and two or more turns read one (:func:`double_tile`), the tile is a ping-pong pair: the
first tiled turn's matrix is filled before it, and every later one's during the previous tiled
turn, into the other tile; else one tile, filled before each tiled turn, not overlapped with it.
The plan charges what the kernel waits on the fills (:func:`tile_stall_cycles`,
:func:`tm_bwd_fill_cycles`) beside the frames (:func:`tm_bwd_extra_cycles`); a one-vector
matrix with an input gradient that the tile does not hold streams through a two-deep FIFO, its
dx summed in MW exact sums (:func:`weight_stream_layers`, :func:`weight_stream_bytes`).

A time-multiplexed kernel's figure counts all it builds: besides the above, its turns' own
two-deep streams (:func:`bwd_stream_bytes`, walked as codegen.design.backward lays them out) and an
off-chip frame's two-deep ends (:func:`frame_pipe_bytes`), so ``BwdMemory.onchip_bytes`` is
the Design's figure (codegen.design.onchip) and within the share.

Read by the planner (planner.search: the stage's backward time) and codegen.design.backward (which
frames and accumulators it puts off chip, which matrices its tile holds and which stream), so
the two cannot disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod
from typing import Collection, Sequence

from bapipe.layers import Layer
from bapipe.spec import Model

from .allocate import frames_offchip, weight_resident, weights_all_resident
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
    acc_onchip: dict                   # matrix layer -> its weight-gradient accumulator stays on chip
    acc_bytes: dict                    # matrix layer -> the accumulator's bytes
    other_bytes: int                   # the fixed buffers besides the accumulators, streams and tile
    frames: tuple = ()                 # GradFrame, time-multiplexed stages only
    frames_off: tuple = ()             # per frame: off chip
    tile: "WeightTile | None" = None   # time-multiplexed, weights not all copied: the tile built
    stream_bytes: int = 0              # time-multiplexed: the turns' two-deep streams (bwd_stream_bytes)
    frame_pipes: tuple = ()            # per frame: its two-deep ends when off chip (frame_pipe_bytes)
    elem_bytes: int = 2                # bytes of one element (the tile's)
    streamed: tuple = ()               # matrix layers whose dx turn streams its matrix (weight_stream_layers)
    wstream_bytes: int = 0             # their FIFO and the row-order dx sums (weight_stream_bytes)

    @property
    def tile_bytes(self) -> int:
        """The weight tile's bytes: both tiles of a ping-pong pair."""
        return self.tile.buffers * self.tile.rows * self.tile.cols * self.elem_bytes if self.tile is not None else 0

    @property
    def fixed_bytes(self) -> int:
        """On-chip bytes besides the frames: the other buffers, the on-chip accumulators, the
        turns' two-deep streams, the weight tile and the weight stream's FIFO and sums."""
        return (self.other_bytes + sum(b for n, b in self.acc_bytes.items() if self.acc_onchip[n])
                + self.stream_bytes + self.tile_bytes + self.wstream_bytes)

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
                            "lanes": f.lanes, "offchip": o} for f, o in zip(self.frames, self.frames_off)],
                **({"weight_tile": {"rows": self.tile.rows, "columns": self.tile.cols,
                                    "layers": list(self.tile.layers), "buffers": self.tile.buffers}}
                   if self.tile is not None else {}),
                **({"weight_stream": {"layers": list(self.streamed)}} if self.streamed else {})}


@dataclass(frozen=True)
class WeightTile:
    """The on-chip weight tile of a time-multiplexed backward kernel (:func:`choose_tile`,
    :func:`double_tile`): ``rows`` x ``cols`` elements, holding for the turn of each of
    ``layers`` that layer's matrix (MH x MW) -- ``fills``, (layer, MH, MW), layer order -- every
    sample. ``buffers`` 1: one tile, filled before each tiled turn; 2: a ping-pong pair, the
    k-th tiled turn (turn order: :attr:`turn_fills`) reads tile k % 2, and the (k+1)-th's matrix
    is filled into the other one during the k-th turn (the first's before it)."""

    rows: int
    cols: int
    fills: tuple                       # (layer, MH, MW) per tiled turn, layer order
    buffers: int = 1                   # 1: one tile; 2: a ping-pong pair

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(n for n, _h, _w in self.fills)

    @property
    def turn_fills(self) -> tuple:
        """``fills`` in turn order (the backward's turns run the layers last first)."""
        return tuple(reversed(self.fills))


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
          fmt: str) -> tuple[list[GradFrame], list[tuple[str, int]]]:
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
                window(l, t, conv_window_lanes(c, kh, simd), simd)
            if not dx[0]:
                two_deep(t, simd)                                   # the MVU's unused dx beats
                continue
            if l.type == "dense":
                give(src, l.name, simd)
            else:
                mh, _mw, _pix = matrix_shape(l)
                (kh, kw), _s, _p = _window(l)
                two_deep(t, simd, simd * acc_width(int(mh) * kh * kw, bits, bits))   # exact dx into col2im
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


def bwd_weight_tile(model: Model, layers: Sequence[Layer], fmt: str, budget: int | None) -> tuple[int, int] | None:
    """(rows, columns) of a time-multiplexed backward kernel's weight tile (codegen.design.backward
    ._tile_weights fills it before each turn that reads it) when its weights are not all copied
    on chip (:func:`bwd_weight_bytes` 0): the largest MH and the largest MW of the matrix layers
    computing dx whose matrix is a tile by the forward's rule (fpga_models.allocate
    .weight_resident); None when there is none."""
    tiled = [(h, w) for _n, h, w in tile_candidates(model, layers, fmt, budget)]
    return (max(r for r, _c in tiled), max(c for _r, c in tiled)) if tiled else None


def tile_candidates(model: Model, layers: Sequence[Layer], fmt: str, budget: int | None) -> list[tuple[str, int, int]]:
    """(layer, MH, MW) of the matrix layers computing dx whose matrix is a tile by the forward's
    rule (fpga_models.allocate.weight_resident), layer order, when the backward kernel's weights
    are not all copied on chip (:func:`bwd_weight_bytes` 0); else none."""
    eb = bytes_per_element(fmt)
    if bwd_weight_bytes(model, layers, fmt, budget):
        return []
    active, needed = _active(model, layers)
    out = []
    for l in layers:
        if l.name in active and l.type in ("dense", "conv2d") and l.inputs[0] in needed:
            mh, mw, pix = matrix_shape(l)
            vec = int(round(pix)) if l.type == "conv2d" else int(prod(l.in_shapes[0][:-1]))
            if weight_resident(int(mh) * int(mw), eb, budget, vec):
                out.append((l.name, int(mh), int(mw)))
    return out


def choose_tile(cands: Sequence[tuple[str, int, int]], eb: int, left: float | None) -> WeightTile | None:
    """The tile's matrices among ``cands`` ((layer, MH, MW) in layer order): smallest MH x MW
    first (ties: the earlier turn, i.e. the later layer) while the largest MH x the largest MW of
    those taken fits ``left`` bytes (None: no limit); the rest are read in place or streamed
    (codegen.design.backward). None when none fits."""
    pos = {n: k for k, (n, _h, _w) in enumerate(cands)}
    keep: list = []
    for c in sorted(cands, key=lambda c: (c[1] * c[2], -pos[c[0]])):
        if left is None or max(x[1] for x in keep + [c]) * max(x[2] for x in keep + [c]) * eb <= left:
            keep.append(c)
    if not keep:
        return None
    fills = tuple(c for c in cands if c in keep)
    return WeightTile(max(h for _n, h, _w in fills), max(w for _n, _h, w in fills), fills)


def double_tile(tile: WeightTile | None, eb: int, left: float | None) -> WeightTile | None:
    """The tile as built: a ping-pong pair (``buffers`` 2) of the same matrices when two tiles
    fit ``left`` bytes (None: no limit) and two or more turns read it (with one, the only fill
    is before its turn either way); else the one tile. The decision the planner prices
    (:func:`tile_stall_cycles`) and codegen.design.backward._tile_weights builds."""
    if tile is None or len(tile.fills) < 2:
        return tile
    if left is None or 2 * tile.rows * tile.cols * eb <= left:
        return WeightTile(tile.rows, tile.cols, tile.fills, 2)
    return tile


def tile_fill_cycles(tile: WeightTile | None, fmt: str) -> int:
    """Cycles a sample the tile's fills take end to end (codegen's bapipe::weight_tile): per
    tiled matrix its 512-bit beats plus the loop's 2 cycles of pipeline depth (its BAPIPE_LOOP).
    What one tile waits on (:func:`tile_stall_cycles`)."""
    return sum(_fill_cycles(tile, fmt).values()) if tile is not None else 0


def _fill_cycles(tile: WeightTile, fmt: str) -> dict[str, int]:
    bits = 8 * bytes_per_element(fmt)
    return {n: -(-mh * mw * bits // 512) + 2 for n, mh, mw in tile.fills}


def tile_stall_cycles(tile: WeightTile | None, fmt: str, busy: dict[str, int] | None = None) -> int:
    """Cycles a sample the kernel waits on its tile's fills. One tile: every fill
    (:func:`tile_fill_cycles`), before its turn. A ping-pong pair: the first tiled turn's fill,
    before it, then per later tiled turn what its fill (a process of the previous tiled turn's
    DATAFLOW region) takes beyond that turn's own: ``max(0, fill[k+1] - busy[k])``, ``busy``
    (layer -> cycles) the previous tiled turn's region without the fill (its layer's backward
    cycles, or its off-chip frames' words when longer: :func:`turn_busy_cycles`)."""
    if tile is None:
        return 0
    fill = _fill_cycles(tile, fmt)
    if tile.buffers == 1:
        return sum(fill.values())
    order = [n for n, _h, _w in tile.turn_fills]
    return fill[order[0]] + sum(max(0, fill[b] - (busy or {}).get(a, 0)) for a, b in zip(order, order[1:]))


def place_accumulators(acc_bytes: dict[str, int], room: float) -> dict[str, bool]:
    """Which accumulators stay on chip: smallest first (ties: layer order) while they fit ``room``."""
    used, out = 0, {}
    for n in sorted(acc_bytes, key=lambda n: acc_bytes[n]):
        out[n] = used + acc_bytes[n] <= room
        if out[n]:
            used += acc_bytes[n]
    return {n: out[n] for n in acc_bytes}


def weight_stream_layers(model: Model, layers: Sequence[Layer], fmt: str, budget: int | None,
                         tile: "WeightTile | None" = None) -> list[str]:
    """The matrix layers of a time-multiplexed backward kernel whose dx turn streams its matrix
    (codegen.design.backward._stream_weights): one vector a sample, an input gradient, the tile
    (``tile``) not holding it, when the weights are not all copied on chip
    (:func:`bwd_weight_bytes` 0). Layer order."""
    eb = bytes_per_element(fmt)
    if bwd_weight_bytes(model, layers, fmt, budget):
        return []
    active, needed = _active(model, layers)
    tiled = set(tile.layers) if tile is not None else set()
    out = []
    for l in layers:
        if l.name in active and l.type in ("dense", "conv2d") and l.inputs[0] in needed and l.name not in tiled:
            _mh, _mw, pix = matrix_shape(l)
            vec = int(round(pix)) if l.type == "conv2d" else int(prod(l.in_shapes[0][:-1]))
            if vec == 1:
                out.append(l.name)
    return out


def weight_stream_bytes(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]], fmt: str,
                        streamed: Collection[str]) -> int:
    """On-chip bytes of the weight stream of a time-multiplexed backward kernel whose ``streamed``
    turns read their matrices from it (codegen.design.backward._stream_weights), 0 without one: its
    two-deep FIFO of the widest PE x SIMD word, and the MW exact dx sums (``accw``: the largest
    MW of the kernel's matrices, each of the widest dx accumulator's bytes)."""
    if not streamed:
        return 0
    bits = 8 * bytes_per_element(fmt)
    ls = max(folding[n][0] * folding[n][1] for n in streamed)
    active, _needed = _active(model, layers)
    mats = [l for l in layers if l.name in active and l.type in ("dense", "conv2d")]
    mw = max(int(matrix_shape(l)[1]) for l in mats)
    xb = max(acc_width(int(matrix_shape(l)[0]) * (prod(_window(l)[0]) if l.type == "conv2d" else 1), bits, bits)
             for l in mats)
    return STREAM_DEPTH * -(-ls * bits // 8) + mw * -(-xb // 8)


def bwd_memory(model: Model, layers: Sequence[Layer], board: Board | None, folding: dict[str, tuple[int, int]],
               fmt: str, budget: int | None, samples: int, time_multiplexed: bool) -> BwdMemory:
    """The backward kernel's memory decision. ``budget``: its on-chip share
    (fpga_models.allocate.kernel_onchip_budget; None: unlimited); ``samples``: samples whose
    gradients an accumulator sums in an iteration (micro-batches x the replica's micro-batch).

    A time-multiplexed kernel's decision counts what it builds besides: its turns' two-deep
    streams, an off-chip frame's two-deep ends, the weight tile and the weight stream (FIFO and
    dx sums). Until the tile is chosen (last: what the share leaves) the largest tile and a
    stream of every matrix that may stream are reserved; the figure is of those built."""
    eb = bytes_per_element(fmt)
    bits = 8 * eb
    active, _needed = _active(model, layers)
    acc = {l.name: _acc_bytes(l, samples, bits) for l in layers
           if l.name in active and l.type in ("dense", "conv2d")}
    other = bwd_other_bytes(model, layers, folding, fmt, time_multiplexed) + bwd_weight_bytes(model, layers, fmt,
                                                                                                budget)
    room = ACC_ONCHIP_SHARE * on_chip_bytes(board) if board is not None else float("inf")
    if not time_multiplexed:
        if budget is not None:
            room = min(room, budget - other)
        return BwdMemory(budget, place_accumulators(acc, room), acc, other)
    frames, local = _walk(model, layers, folding, fmt)
    streams = sum(STREAM_DEPTH * -(-b // 8) for _t, b in local)
    pipes = [frame_pipe_bytes(f, fmt) for f in frames]
    tile = bwd_weight_tile(model, layers, fmt, budget)
    reserved = tile[0] * tile[1] * eb if tile is not None else 0
    ws_reserved = weight_stream_bytes(model, layers, folding, fmt, weight_stream_layers(model, layers, fmt, budget))
    base = other + streams + reserved + ws_reserved + sum(pipes)   # every frame off chip
    if budget is not None:
        room = min(room, budget - base)
    onchip = place_accumulators(acc, room)
    base += sum(b for n, b in acc.items() if onchip[n])
    # a frame kept on chip takes its bytes instead of its two-deep ends
    keep = [f.nbytes - p for f, p in zip(frames, pipes)]
    off = frames_offchip(keep, base, budget) if budget is not None else [False] * len(frames)
    off = [o and k > 0 for o, k in zip(off, keep)]   # one no bigger than its two-deep ends never spills
    built = None
    if tile is not None:   # the tile built: what the share leaves beside the rest (the reservation aside)
        left = None if budget is None else budget - (base - reserved + sum(k for k, o in zip(keep, off) if not o))
        built = double_tile(choose_tile(tile_candidates(model, layers, fmt, budget), eb, left), eb, left)
    streamed = tuple(weight_stream_layers(model, layers, fmt, budget, built))
    return BwdMemory(budget, onchip, acc, other, tuple(frames), tuple(off), built, streams, tuple(pipes), eb,
                     streamed, weight_stream_bytes(model, layers, folding, fmt, streamed))


def tm_bwd_extra_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                        fmt: str, budget: int | None, samples: int) -> int:
    """Backward cycles per sample a time-multiplexed stage spends beyond its layers' own: its
    off-chip gradient frames (:func:`tm_bwd_spill_cycles`) and what it waits on its weight
    tile's fills (:func:`tm_bwd_fill_cycles`); what the planner adds to the stage's backward time."""
    mem = bwd_memory(model, layers, board, folding, fmt, budget, samples, True)
    return (tm_bwd_spill_cycles(model, layers, board, folding, fmt, budget, samples, mem)
            + tm_bwd_fill_cycles(model, layers, board, folding, fmt, budget, samples, mem))


def tm_bwd_fill_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                       fmt: str, budget: int | None, samples: int, mem: BwdMemory | None = None) -> int:
    """Backward cycles per sample a time-multiplexed stage waits on its weight tile's fills
    (:func:`tile_stall_cycles`, the tiled turns' regions as :func:`turn_busy_cycles` gives them)."""
    if mem is None:
        mem = bwd_memory(model, layers, board, folding, fmt, budget, samples, True)
    if mem.tile is None:
        return 0
    busy = turn_busy_cycles(model, layers, board, folding, fmt, mem) if mem.tile.buffers > 1 else None
    return tile_stall_cycles(mem.tile, fmt, busy)


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


def turn_busy_cycles(model: Model, layers: Sequence[Layer], board: Board, folding: dict[str, tuple[int, int]],
                     fmt: str, mem: BwdMemory) -> dict[str, int]:
    """Per tiled layer, the cycles its turn's DATAFLOW region takes a sample besides a tile fill:
    its backward cycles (as the plan charges them), or its off-chip frames' words when longer."""
    if mem.tile is None:
        return {}
    io = _frame_io(mem, fmt)
    names = {l.name: l for l in layers}
    no_dx = no_input_gradient(model)
    return {n: max(io.get(n, 0), _own_cycles(n, names[n], board, folding, fmt, no_dx)) for n in mem.tile.layers}


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
