"""From a plan to the RTL pipeline's structure, and the cycle model that predicts its timing.

Every hardware decision the Verilog templates need is made here, in Python: which blocks a
board chains (FIFOs, width converters, sliding-window generators, matrix-vector units,
pool units, ReLUs, link transmitter/receiver), their parameters (folding, widths, FIFO depths, credit
counts sized from link bandwidth x latency), the weights they bake in, and the predicted
cycles per sample. ``codegen/rtl/pipeline.py`` only turns these dataclasses into text.

Cycle model (docs/rtl.md):
- a matrix-vector unit takes exactly NF*SF cycles per vector, NF = MH/PE, SF = MW/SIMD
  (conv: one vector per output pixel), plus ``MVU_FILL`` cycles of pipeline fill;
- a window generator takes max(image beats, window beats) cycles per image, a pool unit
  (also the global average pool, TAPS = H*W) one cycle per window beat; batchnorm, fork
  and add one cycle per beat;
- every stream moves at most one beat per cycle;
- a link carries a stage's words packed into 512-bit network beats (codegen.design.links: a
  sample costs max(words, beats x max(1, 64/bw)) cycles); the receiving stage's input FIFO
  holds ``credits`` beats, rate x (2*latency + ``LINK_LOOP``) as the old credit link's;
- the pipeline's interval (cycles per sample in steady state) is the slowest of all these.

Residual stages (a DAG of layers, ``stage_graph``): a tensor with several consumers goes
through ``axis_fork``; ``axis_add`` joins the main path and the skip path, which waits in a
FIFO (dataflow: as many frames as the main path holds back; time-multiplexed: the add's
frame buffer). Blocks then name their wires (``Block.ins``/``outs``, ``rtl.stage_wiring``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from bapipe.errors import SpecError
from bapipe.names import legal  # layer names -> Verilog identifiers (imported models: "/features/features.0/Conv")
from bapipe.plan import Folding, Plan
from bapipe.fpga_models.engines import (BN_FILL, DDR_WORD_BITS, MVU_FILL, POOL_FILL, TM_SWITCH, WEIGHT_FILL_LAG,
                                        WEIGHT_TURN_LAG, fetch_turn_cycles, mvu_fill,  # noqa: F401
                                 conv_window_lanes, ddr_words_per_beat, frame_io_cycles, link_beat_cycles,
                                 mvu_vector_cycles, swg_beats, width_conv_cycles, window_stream_fill)
from bapipe.fpga_models.engines import concat_cycles

from bapipe.codegen.design.unsupported import Unsupported
from bapipe.codegen.design.weight_layout import MvuMatrix, flatten_perm  # noqa: F401 (flatten_perm: importers of it here)

#: cycles a credit spends outside the link's two latencies (rx FIFO, credit register, tx)
LINK_LOOP = 3
#: slack credits beyond the round trip, so a one-cycle hiccup never starves the link
CREDIT_SLACK = 1
#: (width, fraction bits) per plan number format, as in docs/codegen.md
FORMATS = {"fixed16": (16, 10), "int8": (8, 4)}


def clog2(n: int) -> int:
    """Address bits for ``n`` entries (at least 1)."""
    return max(1, (n - 1).bit_length())


def count_bits(n: int) -> int:
    """Bits to hold every value 0..n (at least 1)."""
    return max(1, int(n).bit_length())


def elem_format(number_format: str, plan_file: str = "plan.yaml") -> tuple[int, int]:
    """(width, fraction bits) of a plan number format; SpecError for formats RTL lacks."""
    try:
        return FORMATS[number_format]
    except KeyError:
        raise SpecError(plan_file, None, "number_format",
                        f"expected one of {', '.join(FORMATS)} for RTL generation, got '{number_format}'") from None


# ------------------------------------------------------------------ blocks

@dataclass(eq=False)
class MvuSpec:
    """One matrix-vector unit: W (MH x MW) raw ints, bias (MH) raw ints, PE x SIMD folding."""

    module: str
    layer: str
    mw: int
    mh: int
    pe: int
    simd: int
    relu: bool
    elem_w: int
    frac: int
    weights: MvuMatrix              # W, computed from the layer's model-layout weights when read (np.asarray)
    bias: np.ndarray

    @property
    def sf(self) -> int:
        """Column folds: input beats per vector."""
        return self.mw // self.simd

    @property
    def nf(self) -> int:
        """Row folds: output beats per vector."""
        return self.mh // self.pe

    @property
    def cycles_per_vector(self) -> int:
        """Exactly (MH/PE)*(MW/SIMD) (fpga_models.engines)."""
        return mvu_vector_cycles(self.mh, self.mw, self.pe, self.simd)

    @property
    def acc_w(self) -> int:
        """Exact accumulator width 2W+16 (docs/codegen.md)."""
        return 2 * self.elem_w + 16

    def weight_word(self, addr: int) -> list[int]:
        """Lanes of weight ROM word ``addr`` = nf*SF + sf: W[nf*PE+p][sf*SIMD+i] at lane p*SIMD+i."""
        nf, sf = divmod(addr, self.sf)
        rows = self.weights[nf * self.pe:(nf + 1) * self.pe, sf * self.simd:(sf + 1) * self.simd]
        return [int(v) for v in rows.reshape(-1)]

    def bias_word(self, nf: int) -> list[int]:
        """Lanes of bias ROM word ``nf``: b[nf*PE+p] at lane p."""
        return [int(v) for v in self.bias[nf * self.pe:(nf + 1) * self.pe]]


@dataclass(frozen=True)
class SwgSpec:
    """Sliding-window generator (square kernel, same stride/pad both axes).

    ``simd`` channels per input beat and per tap; ``taps`` kernel taps per output beat (> 1
    only when ``simd == c``), so an output beat holds simd*taps column elements.
    """

    c: int
    h: int
    w: int
    k: int
    pad: int
    stride: int
    simd: int
    taps: int = 1

    @property
    def out_lanes(self) -> int:
        """Elements per output beat."""
        return self.simd * self.taps

    @property
    def out_hw(self) -> tuple[int, int]:
        """Output height and width."""
        return ((self.h + 2 * self.pad - self.k) // self.stride + 1,
                (self.w + 2 * self.pad - self.k) // self.stride + 1)

    @property
    def frame_beats(self) -> int:
        """Input beats per image (fpga_models.engines.swg_beats)."""
        return swg_beats(self.c, self.h, self.w, self.k, self.pad, self.stride, self.simd, self.taps)[0]

    @property
    def out_beats(self) -> int:
        """Output beats per image: one im2col column per output pixel (fpga_models.engines.swg_beats)."""
        return swg_beats(self.c, self.h, self.w, self.k, self.pad, self.stride, self.simd, self.taps)[1]

    def params(self, elem_w: int) -> dict[str, int]:
        """Verilog parameters."""
        oh, ow = self.out_hw
        cnt_w = count_bits(max(self.h, self.w, oh, ow, self.k * self.k, self.frame_beats) + self.pad) + 1
        return {"C": self.c, "IMG_H": self.h, "IMG_W": self.w, "K": self.k, "PAD": self.pad,
                "STRIDE": self.stride, "OUT_H": oh, "OUT_W": ow, "SIMD": self.simd, "TPB": self.taps, "ELEM_W": elem_w,
                "CNT_W": cnt_w, "ADDR_W": clog2(2 * self.frame_beats)}


@dataclass(frozen=True)
class LinkSpec:
    """One emulated inter-board link as the hardware sees it (all in cycles of the sim clock)."""

    src: str
    dst: str
    beat_bytes: int
    bw_num: int            # bandwidth = bw_num / bw_den bytes per cycle
    bw_den: int
    latency: int           # cycles from acceptance to delivery, each direction
    credits: int           # receiver FIFO depth = transmitter's initial credits

    @property
    def bytes_per_cycle(self) -> Fraction:
        """Configured bandwidth in bytes per cycle."""
        return Fraction(self.bw_num, self.bw_den)

    @property
    def beats_per_cycle(self) -> Fraction:
        """Sustained beat rate: the bandwidth, but never above one beat per cycle."""
        return min(Fraction(1), self.bytes_per_cycle / self.beat_bytes)

    def emulator_params(self, lanes: int, elem_w: int) -> dict[str, int]:
        """Verilog parameters of link_emulator."""
        cost = self.beat_bytes * self.bw_den
        return {"DATA_W": lanes * elem_w, "BEAT_BYTES": self.beat_bytes, "BW_NUM": self.bw_num,
                "BW_DEN": self.bw_den, "LATENCY": self.latency, "PTR_W": clog2(self.latency),
                "TOKEN_W": count_bits(cost + 2 * self.bw_num)}


def credit_depth(beats_per_cycle: Fraction, latency: int) -> int:
    """Receiver FIFO depth (= credits) that keeps a link busy: rate x round trip, plus slack.

    A credit spent in cycle t comes back usable in cycle t + 2*latency + LINK_LOOP.
    """
    return max(2, math.ceil(beats_per_cycle * (2 * latency + LINK_LOOP)) + CREDIT_SLACK)


def make_link(src: str, dst: str, bandwidth_Bps: float, latency_s: float, clock_hz: float,
              beat_bytes: int) -> LinkSpec:
    """Turn a cluster link (bytes/s, seconds) into cycles at ``clock_hz``.

    The bandwidth is kept as a fraction with denominator at most 64 (within 1/64 byte/cycle).
    """
    bpc = Fraction(bandwidth_Bps / clock_hz).limit_denominator(64)
    if bpc <= 0:
        bpc = Fraction(1, 64)
    latency = max(1, round(latency_s * clock_hz))
    rate = min(Fraction(1), bpc / beat_bytes)
    return LinkSpec(src, dst, beat_bytes, bpc.numerator, bpc.denominator, latency, credit_depth(rate, latency))


@dataclass(eq=False)
class Block:
    """One instance in a stage's chain: s_axis in, m_axis out."""

    kind: str                       # fifo | width_conv | relu | mvu | swg | pool | bn | fork | add | gate | link_rx | link_tx
    inst: str
    module: str
    params: dict[str, int]
    in_lanes: int
    out_lanes: int
    mvu: MvuSpec | None = None
    swg: SwgSpec | None = None
    beats_in: int = 0               # beats per sample on its input
    cycles: int = 0                 # cycles per sample it needs at best
    unit: int | None = None         # gate: the board-level unit it opens for
    ins: list[str] | None = None    # input wires (None: the previous block's output; see rtl.stage_wiring)
    outs: list[str] | None = None   # output wires (None: wire <j+1>)


@dataclass(eq=False)
class Unit:
    """One layer engine of a time-multiplexed stage: it runs only while the sequencer grants it."""

    layer: str
    index: int                      # board-level unit number (sequencer port)
    out_wire: int                   # chain wire (c<j>) that carries the unit's output
    out_beats: int                  # beats per sample on that wire
    cycles: int                     # predicted cycles per sample, fill included


@dataclass(eq=False)
class StageRtl:
    """The RTL of one pipeline stage on one board: a linear chain of blocks, input to output.

    Wire ``c<j>`` is the input of block j; the last wire is the stage output. Time-multiplexed
    stages also list their units and the wire on which whole input frames are counted.
    """

    index: int
    board: str
    style: str                      # dataflow | time-multiplexed
    blocks: list[Block]
    in_lanes: int
    out_lanes: int
    has_rx: bool
    has_tx: bool
    in_elems: int = 0               # elements per sample entering the stage
    out_elems: int = 0              # elements per sample leaving the stage
    units: list[Unit] = field(default_factory=list)
    in_wire: int | None = None      # time-multiplexed: frame beats are counted on this wire
    in_beats: int = 0               # ... this many per sample
    weights: "WeightFetch | None" = None   # time-multiplexed with off-chip weights (ddr_weights)

    @property
    def job_cycles(self) -> float:
        """Cycles one sample keeps this stage busy (time-multiplexed: units in turn)."""
        if self.units:
            return sum(u.cycles for u in self.units) + TM_SWITCH
        return max((b.cycles for b in self.blocks), default=0)


@dataclass(eq=False)
class BoardRtl:
    """The RTL of one board: every stage it runs (several under interleaved schedules)."""

    name: str
    module: str
    stages: list[StageRtl]

    @property
    def units(self) -> list[Unit]:
        """The board's time-multiplexed units in sequencer order."""
        return [u for s in self.stages for u in s.units]


@dataclass(eq=False)
class Pipeline:
    """The whole generated pipeline: stages in order, the boards that hold them, links between."""

    boards: list[BoardRtl]
    stages: list[StageRtl]
    links: list[LinkSpec | None]    # links[i] joins stage i to stage i+1 (None: same board)
    elem_w: int
    frac: int
    fmt: str
    in_elems: int                   # elements per sample into stage 0
    out_elems: int                  # elements per sample out of the last stage
    ops: list[dict] = field(default_factory=list)   # numpy reference: dense/conv/relu in order
    breakdown: list[tuple[str, int]] = field(default_factory=list)
    interval: float = 0.0           # predicted cycles per sample (steady state)

    @property
    def in_lanes(self) -> int:
        """Elements per input beat."""
        return self.stages[0].in_lanes

    @property
    def out_lanes(self) -> int:
        """Elements per output beat."""
        return self.stages[-1].out_lanes

    @property
    def time_multiplexed(self) -> bool:
        """True when some stage runs its layers in turns (the replay model then applies)."""
        return any(s.units for s in self.stages)


# ------------------------------------------------------------------ weights

def plan_weights(plan: Plan, model) -> dict[str, dict[str, np.ndarray]]:
    """The weights of a plan's project: exactly those the HLS kernels bake in
    (``codegen.design.context.make_weights``, seeded by the plan fingerprint), so a stage's RTL twin,
    its HLS kernel and the host's reference compute the same numbers."""
    from bapipe.codegen.design.context import make_weights

    return make_weights(plan, model)


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


# ------------------------------------------------------------------ chains

def _converters(prefix: str, lanes_in: int, lanes_out: int, elem_w: int, beats: int) -> list[Block]:
    """Width converters from lanes_in to lanes_out (through their gcd when neither divides)."""
    if lanes_in == lanes_out:
        return []
    steps = [lanes_in, lanes_out]
    if lanes_in % lanes_out and lanes_out % lanes_in:
        steps = [lanes_in, math.gcd(lanes_in, lanes_out), lanes_out]
    out = []
    for i, (a, b) in enumerate(zip(steps, steps[1:])):
        ratio = max(a, b) // min(a, b)
        elems = beats * lanes_in
        out.append(Block("width_conv", f"{prefix}_wc{i}", "axis_width_conv",
                         {"IN_W": a * elem_w, "OUT_W": b * elem_w, "COUNT_W": count_bits(ratio)},
                         a, b, beats_in=elems // a, cycles=width_conv_cycles(elems, a, b)))
    return out


def _fifo(inst: str, lanes: int, depth: int, elem_w: int, beats: int) -> Block:
    return Block("fifo", inst, "axis_fifo",
                 {"DATA_W": lanes * elem_w, "DEPTH": depth, "ADDR_W": clog2(depth), "COUNT_W": count_bits(depth)},
                 lanes, lanes, beats_in=beats, cycles=beats)


def _ddr(inst: str, lanes: int, beats: int, elem_w: int) -> Block:
    """An off-chip frame buffer (ddr_frame): one sample's frame of ``beats`` beats through a DDR
    memory model in 512-bit words, one a cycle each way (fpga_models.engines.frame_io_cycles)."""
    words = ddr_words_per_beat(lanes, elem_w)
    depth = beats * words
    return Block("ddr_frame", inst, "ddr_frame",
                 {"LANES": lanes, "ELEM_W": elem_w, "WORD_W": DDR_WORD_BITS, "WORDS": words, "DEPTH_WORDS": depth,
                  "ADDR_W": clog2(depth), "COUNT_W": count_bits(depth)},
                 lanes, lanes, beats_in=beats, cycles=frame_io_cycles(beats, lanes, elem_w))


def _stream_swg(sblk: Block) -> Block:
    """A window generator fed by an off-chip frame in its layer's turn: its output rows start as
    their input rows arrive (swg STREAM = 1), so the turn takes the longer of the two, after
    the rows under the first window (:func:`_stream_fill`)."""
    sblk.params = {**sblk.params, "STREAM": 1}
    return sblk


def _stream_fill(sblk: Block | None, lanes: int, elem_w: int) -> int:
    """Cycles before a streaming window generator's first window (fpga_models.engines
    .window_stream_fill) when its image arrives at ``lanes`` a beat from a ddr_frame; 0 without one."""
    if sblk is None:
        return 0
    g = sblk.swg
    return window_stream_fill(g.k, g.pad, g.h, g.w, g.c, lanes, elem_w)


def offchip_frames(plan: Plan, stage, model, cluster) -> frozenset[str]:
    """The layers of a time-multiplexed stage whose output frame the plan places off chip:
    fpga_models.allocate.tm_offchip, the rule the planner priced (tm_spill_cycles), on the
    stage's board, folding, cap and kernels per board; empty for other stages."""
    from bapipe.fpga_models.allocate import plan_port_lanes, tm_frames, tm_offchip
    if stage.style != "time-multiplexed" or cluster is None or not stage.boards:
        return frozenset()
    board = next((cb.board for cb in cluster.boards if cb.name == stage.boards[0]), None)
    if board is None or board.kind != "fpga":
        return frozenset()
    layers = [model.layers[model.index[n]] for n in stage.layers]
    fold = {l.name: (1, 1) for l in layers}
    fold.update({n: (f.pe, f.simd) if f.lanes is None else (1, f.lanes) for n, f in stage.folding.items()})
    off = tm_offchip(layers, board, fold, plan.number_format, plan.utilisation_cap, plan.chunks, plan.mode == "train",
                     plan_port_lanes(plan, model, stage))
    turns = [l for l in layers if l.type != "flatten"]
    assert len(off) == len(tm_frames(layers, fold, plan.number_format))
    return frozenset(t.name for t, o in zip(turns, off) if o)




@dataclass(frozen=True)
class WeightFetch:
    """A time-multiplexed stage's off-chip weights as the plan prices them
    (fpga_models.allocate: weights_offchip, tm_weight_tiles, tm_weight_turns, tm_weight_cycles),
    read from there, never re-derived: each matrix resident in the ping-pong tile buffer or
    streamed through a FIFO, the fill (512-bit words fetched before the first turn of a
    sample) and the words each turn fetches."""

    budget: int                                   # the kernel's on-chip bytes (kernel_onchip_budget)
    tiles: tuple[tuple[str, int, bool], ...]      # (layer, matrix elements, resident) in turn order
    fill: int                                     # words before the first turn, per sample
    fetch: dict                                   # layer -> words its turn fetches
    plan_cycles: int                              # tm_weight_cycles: what the plan adds per sample

    def as_dict(self) -> dict:
        """The Design's record (design.json ``weights``)."""
        return {"offchip": True, "budget_bytes": self.budget,
                "tiles": [{"layer": n, "elems": e, "resident": r} for n, e, r in self.tiles],
                "fill_words": self.fill, "fetch_words": dict(self.fetch), "plan_cycles": self.plan_cycles}


def offchip_weights(plan: Plan, stage, model, cluster) -> WeightFetch | None:
    """The off-chip weight decision of a time-multiplexed stage (:class:`WeightFetch`), None when
    its weights are on-chip ROMs or all stay on chip for the call (fetched once per call, no
    traffic per sample), or for other stages."""
    from bapipe.fpga_models.allocate import (kernel_onchip_budget, tm_weight_cycles, tm_weight_tiles, tm_weight_turns,
                                      weights_offchip)
    if stage.style != "time-multiplexed" or cluster is None or not stage.boards:
        return None
    board = next((cb.board for cb in cluster.boards if cb.name == stage.boards[0]), None)
    if board is None or board.kind != "fpga":
        return None
    layers = [model.layers[model.index[n]] for n in stage.layers]
    train = plan.mode == "train"
    if not weights_offchip(layers, train):
        return None
    fold = {l.name: (1, 1) for l in layers}
    fold.update({n: (f.pe, f.simd) if f.lanes is None else (1, f.lanes) for n, f in stage.folding.items()})
    budget = kernel_onchip_budget(board, plan.utilisation_cap, plan.chunks, train)
    fill, fetch = tm_weight_turns(layers, fold, plan.number_format, budget)
    if not fill and not fetch:
        return None
    tiles = tuple((l.name, int(e), bool(r)) for l, e, r in tm_weight_tiles(layers, fold, plan.number_format, budget))
    return WeightFetch(budget, tiles, int(fill), {k: int(v) for k, v in fetch.items()},
                       int(tm_weight_cycles(layers, board, fold, plan.number_format, plan.utilisation_cap,
                                            plan.chunks, train)))


def _wait_weights(units: list[Unit], wf: WeightFetch | None) -> None:
    """Each turn lasts at least its fetch (tm_sequencer waits on ddr_weights) and the first
    turn of a job starts after the fill: the plan's fill + max(own, fetch) per turn."""
    if wf is None:
        return
    for u in units:
        if wf.fetch.get(u.layer):
            u.cycles = fetch_turn_cycles(u.cycles, 0, wf.fetch[u.layer])
    if wf.fill:
        units[0].cycles += wf.fill + WEIGHT_FILL_LAG


def _pool(layer, stage, pre: str, lanes: int | None, elem_w: int, blocks: list, ops: list,
          lp: int | None = None) -> tuple[int, int]:
    """Window generator + pool_unit for a max/avg pool; returns (lanes, elements) after it.

    ``lp`` forces the channels per beat (time-multiplexed stages take the plan's PE*SIMD)."""
    from bapipe.fpga_models.fixedpoint import AVG_BITS, avg_recip
    if len(layer.in_shapes[0]) != 3:
        raise Unsupported(f"layer '{layer.name}': pooling needs a (C, H, W) input")
    c, h, w = layer.in_shapes[0]
    a = layer.attr
    k = _pair(a["kernel"])
    s = _pair(a.get("stride") or a["kernel"])
    pd = _pair(a.get("padding", 0) or 0)
    if k[0] != k[1] or s[0] != s[1] or pd[0] != pd[1]:
        raise Unsupported(f"layer '{layer.name}': only square pooling windows")
    if layer.type == "maxpool" and pd[0] >= k[0]:
        raise Unsupported(f"layer '{layer.name}': maxpool padding {pd[0]} >= kernel {k[0]} (a window of padding only)")
    f = stage.folding.get(layer.name)
    # Channels per beat: the plan's lanes when they divide C, else what already arrives.
    if lp is None:
        lp = _planned_lanes(f, c) or math.gcd(lanes or 1, c)
    if lanes is None:
        lanes = lp
    swg = SwgSpec(c, h, w, k[0], pd[0], s[0], lp)
    blocks += _converters(f"{pre}_{legal(layer.name)}", lanes, lp, elem_w, layer.in_elems // lanes)
    # A padded max pool pads with the most negative value, so padding never wins the max
    # (fixedpoint.maxpool_fwd pads with -inf: equal, as every window holds a real pixel).
    sp = {**swg.params(elem_w), **({"PAD_MIN": 1} if layer.type == "maxpool" and pd[0] else {})}
    blocks.append(Block("swg", f"{pre}_{legal(layer.name)}_swg", "swg", sp, lp, lp, swg=swg,
                        beats_in=swg.frame_beats, cycles=max(swg.frame_beats, swg.out_beats)))
    taps = k[0] * k[0]
    params = {"C": c, "SIMD": lp, "TAPS": taps, "MODE": 0 if layer.type == "maxpool" else 1, "ELEM_W": elem_w,
              "ACC_W": elem_w + clog2(taps) + 1, "AVG_R": avg_recip(taps), "AVG_BITS": AVG_BITS,
              "TAP_W": clog2(taps), "CF_W": clog2(c // lp)}
    blocks.append(Block("pool", f"{pre}_{legal(layer.name)}", "pool_unit", params, lp, lp,
                        beats_in=swg.out_beats, cycles=swg.out_beats))
    ops.append({"layer": layer.name, "type": layer.type})
    return lp, layer.out_elems


def _fold(stage, name: str) -> Folding:
    return stage.folding.get(name) or Folding(1, 1)


def _matrix_layer(stage, layer, p: dict, f: Folding, state: dict):
    """A dense/conv2d layer as an MVU job: (window generator or None, MW, MH, weight matrix in
    the stream's column order, vectors per sample). Checks that the folding divides."""
    if layer.type == "dense":
        if len(layer.in_shapes[0]) != 1:
            raise Unsupported(f"layer '{layer.name}': dense on a {len(layer.in_shapes[0])}-D input")
        mw, mh = layer.in_shapes[0][0], layer.attr["units"]
        # the vector arrives in HWC order after a flatten: W's columns follow it
        wmat = MvuMatrix(p["w"], tuple(state.pop("hwc")) if state.get("hwc") else None)
        vectors = 1
        swg = None
    else:
        c, h, w = layer.in_shapes[0]
        k, s, pd = _pair(layer.attr["kernel"]), _pair(layer.attr.get("stride", 1)), _pair(layer.attr.get("padding", 0))
        if k[0] != k[1] or s[0] != s[1] or pd[0] != pd[1] or layer.attr.get("groups", 1) != 1:
            raise Unsupported(f"layer '{layer.name}': only square, ungrouped convolutions")
        # The window generator emits whole pixels of several taps per beat when SIMD is a
        # multiple of C, else gcd(C, SIMD) channels of one tap; a width converter then
        # packs its column stream (contiguous in the MVU's column order) to SIMD.
        swg = SwgSpec(c, h, w, k[0], pd[0], s[0], *conv_window_lanes(c, k[0], f.simd))
        mw, mh = k[0] * k[0] * c, layer.attr["out_channels"]
        wmat = MvuMatrix(p["w"])   # conv: columns (ky*KW + kx)*C + c, as fixedpoint.conv_weight_matrix
        vectors = swg.out_hw[0] * swg.out_hw[1]
    if mh % f.pe or mw % f.simd:
        raise SpecError("plan.yaml", None, f"stages[{stage.index}].folding.{layer.name}",
                        f"expected PE dividing {mh} and SIMD dividing {mw}, got pe={f.pe} simd={f.simd}")
    return swg, mw, mh, wmat, vectors


def dataflow_chain(plan: Plan, stage, model, params, board_name: str, in_lanes: int | None,
                   link_in: LinkSpec | None, elem_w: int, frac: int, ops: list[dict],
                   state: dict | None = None) -> StageRtl:
    """The block chain of a dataflow stage (every layer its own engine, all running at once);
    appends the stage's layers to ``ops``.

    ``in_lanes`` None means the board's input is the host: it takes the first layer's SIMD.
    ``state`` carries across boards the image shape a flatten left on the (HWC) stream: the
    next dense layer's weight columns are permuted to match, so no reorder buffer is needed.
    Raises Unsupported for layer types or shapes the RTL pipeline does not build.
    """
    state = {} if state is None else state
    pre = f"s{stage.index}"
    layers = [model.layers[model.index[n]] for n in stage.layers]
    tin, cons = stage_graph(stage, model, layers)
    if is_dag(layers, cons):
        return _dag_dataflow(stage, layers, tin, cons, params, state, pre, board_name, in_lanes, link_in, elem_w,
                             frac, ops)
    blocks: list[Block] = []
    lanes = in_lanes
    skip = set()
    for li, layer in enumerate(layers):
        if layer.name in skip:
            continue
        nxt = layers[li + 1] if li + 1 < len(layers) else None
        fuse_relu = nxt is not None and nxt.type == "relu" and layer.type in ("dense", "conv2d")
        new, lanes = _df_engine(stage, layer, fuse_relu, params, state, pre, lanes, elem_w, frac, ops)
        blocks += new
        if fuse_relu:
            skip.add(nxt.name)
    if lanes is None:
        raise Unsupported(f"stage {stage.index} has no layers the RTL can build")
    in_l = blocks[0].in_lanes if blocks else lanes
    has_rx = link_in is not None
    if has_rx:
        blocks.insert(0, _rx(pre, link_in, in_l, elem_w, layers[0].in_elems // in_l))
    return StageRtl(stage.index, board_name, "dataflow", blocks, in_l, lanes, has_rx, False,
                    layers[0].in_elems, layers[-1].out_elems)


def _df_engine(stage, layer, fuse_relu: bool, params, state: dict, pre: str, lanes: int | None, elem_w: int,
               frac: int, ops: list[dict]) -> tuple[list[Block], int | None]:
    """One layer's engine in a dataflow stage: (its blocks in stream order, lanes after it).

    ``fuse_relu``: a dense/conv2d layer applies the next layer's ReLU in its MVU. Appends the
    layer to ``ops``. No blocks for a flatten (the stream is unchanged).
    """
    blocks: list[Block] = []
    elems = None
    if layer.type in ("dense", "conv2d"):
        f = _fold(stage, layer.name)
        p = params[layer.name]
        swg, mw, mh, wmat, vectors = _matrix_layer(stage, layer, p, f, state)
        if lanes is None:
            lanes = swg.simd if swg else f.simd
        in_elems = layer.in_elems
        if swg:
            blocks += _converters(f"{pre}_{legal(layer.name)}", lanes, swg.simd, elem_w, in_elems // lanes)
            blocks.append(Block("swg", f"{pre}_{legal(layer.name)}_swg", "swg", swg.params(elem_w), swg.simd,
                                swg.out_lanes, swg=swg, beats_in=swg.frame_beats,
                                cycles=max(swg.frame_beats, swg.out_beats)))
            blocks += _converters(f"{pre}_{legal(layer.name)}_col", swg.out_lanes, f.simd, elem_w, swg.out_beats)
        else:
            blocks += _converters(f"{pre}_{legal(layer.name)}", lanes, f.simd, elem_w, in_elems // lanes)
            # Holds a whole input vector so the producer runs ahead while this MVU replays
            # its buffer for the later row folds: the interval is then the slower of the two.
            blocks.append(_fifo(f"{pre}_{legal(layer.name)}_fifo", f.simd, mw // f.simd + 2, elem_w, mw // f.simd))
        bias = np.asarray(p["b"], dtype=np.int64) if p.get("b") is not None else np.zeros(mh, dtype=np.int64)
        mvu = MvuSpec(f"{pre}_{legal(layer.name)}_mvu", layer.name, mw, mh, f.pe, f.simd, fuse_relu, elem_w, frac,
                      wmat, bias)
        blocks.append(Block("mvu", f"{pre}_{legal(layer.name)}_mvu", mvu.module, {}, f.simd, f.pe, mvu=mvu,
                            beats_in=vectors * mvu.sf, cycles=vectors * mvu.cycles_per_vector))
        ops.append({"layer": layer.name, "type": layer.type, "relu": fuse_relu,
                    "w": p["w"], "b": bias,
                    **({"stride": swg.stride, "padding": swg.pad, "in_shape": [swg.c, swg.h, swg.w]} if swg else {})})
        lanes = f.pe
        elems = layer.out_elems
    elif layer.type in ("maxpool", "avgpool"):
        lanes, elems = _pool(layer, stage, pre, lanes, elem_w, blocks, ops)
    elif layer.type == "relu":
        planned = _planned_lanes(stage.folding.get(layer.name), layer.out_elems)
        if lanes is None:
            lanes = planned or 1
        elif planned and planned != lanes:   # run at the plan's lanes, not at what arrives
            blocks += _converters(f"{pre}_{legal(layer.name)}", lanes, planned, elem_w, layer.in_elems // lanes)
            lanes = planned
        beats = layer.out_elems // lanes
        blocks.append(Block("relu", f"{pre}_{legal(layer.name)}", "axis_relu", {"LANES": lanes, "ELEM_W": elem_w},
                            lanes, lanes, beats_in=beats, cycles=beats))
        ops.append({"layer": layer.name, "type": "relu", "relu": True})
        elems = layer.out_elems
    elif layer.type == "batchnorm":
        new, lanes = _bn(layer, pre, lanes, elem_w, frac, params, ops,
                         lb=_planned_lanes(stage.folding.get(layer.name), _channels(layer)))
        blocks += new
        elems = layer.out_elems
    elif layer.type == "globalavgpool":
        new, lanes = _gap(layer, stage, pre, lanes, elem_w, ops)
        blocks += new
        elems = layer.out_elems
    elif layer.type == "flatten":
        if len(layer.in_shapes[0]) == 3 and layer.in_shapes[0][1:] != (1, 1):
            state["hwc"] = tuple(layer.in_shapes[0])
        return [], lanes  # the stream itself is unchanged
    else:
        raise Unsupported(f"layer '{layer.name}': type '{layer.type}' has no RTL engine yet "
                          f"(RTL builds dense, conv2d, maxpool, avgpool, globalavgpool, batchnorm, add, relu, flatten)")
    if lanes and elems and elems % lanes:
        raise Unsupported(f"layer '{layer.name}': {elems} elements do not fill {lanes}-lane beats")
    return blocks, lanes


# ------------------------------------------------------------------ residual CNN engines and stage graphs

def verilog_hex(values, elem_w: int) -> str:
    """Sized Verilog literal packing ``values`` (two's complement) as elem_w-bit lanes, values[0] lowest."""
    mask = (1 << elem_w) - 1
    v = 0
    for i, x in enumerate(values):
        v |= (int(x) & mask) << (i * elem_w)
    width = len(values) * elem_w
    return f"{width}'h{v:0{(width + 3) // 4}x}"


def _channels(layer) -> int:
    """Channels of a batchnorm's input: axis 0 of images (C, H, W), the last axis otherwise."""
    s = layer.in_shapes[0]
    return s[0] if len(s) == 3 else s[-1]


def _bn(layer, pre: str, lanes: int | None, elem_w: int, frac: int, params, ops: list,
        lb: int | None = None) -> tuple[list[Block], int]:
    """Folded batchnorm: width converters to ``lb`` lanes (default gcd(lanes, C)) + axis_batchnorm
    with the per-channel scale/shift baked in as ROM parameters."""
    c = _channels(layer)
    p = params.get(layer.name) or {}
    if "scale" not in p or "shift" not in p:
        raise Unsupported(f"layer '{layer.name}': batchnorm without scale/shift parameters")
    scale, shift = np.asarray(p["scale"], dtype=np.int64), np.asarray(p["shift"], dtype=np.int64)
    if lanes is None:
        lanes = lb or 1
    lb = lb or math.gcd(lanes, c)
    if c % lb:
        raise Unsupported(f"layer '{layer.name}': {lb} lanes do not divide {c} channels")
    blocks = _converters(f"{pre}_{legal(layer.name)}", lanes, lb, elem_w, layer.in_elems // lanes)
    beats = layer.out_elems // lb
    blocks.append(Block("bn", f"{pre}_{legal(layer.name)}", "axis_batchnorm",
                        {"LANES": lb, "ELEM_W": elem_w, "FRAC": frac, "C": c, "CF_W": clog2(c // lb),
                         "SCALE": verilog_hex(scale, elem_w), "SHIFT": verilog_hex(shift, elem_w)},
                        lb, lb, beats_in=beats, cycles=beats))
    ops.append({"layer": layer.name, "type": "batchnorm", "scale": scale, "shift": shift})
    return blocks, lb


def _gap(layer, stage, pre: str, lanes: int | None, elem_w: int, ops: list,
         lg: int | None = None) -> tuple[list[Block], int]:
    """Global average pool = pool_unit with TAPS = H*W on the bare HWC stream (no window
    generator: the whole image is one window, tap-major, channel folds inner)."""
    from bapipe.fpga_models.fixedpoint import AVG_BITS, avg_recip
    if len(layer.in_shapes[0]) != 3:
        raise Unsupported(f"layer '{layer.name}': globalavgpool needs a (C, H, W) input")
    c, h, w = layer.in_shapes[0]
    f = stage.folding.get(layer.name)
    lg = lg or _planned_lanes(f, c)
    if lanes is None:
        lanes = lg or 1
    lg = lg or math.gcd(lanes, c)
    taps = h * w
    blocks = _converters(f"{pre}_{legal(layer.name)}", lanes, lg, elem_w, layer.in_elems // lanes)
    beats = layer.in_elems // lg
    blocks.append(Block("pool", f"{pre}_{legal(layer.name)}", "pool_unit",
                        {"C": c, "SIMD": lg, "TAPS": taps, "MODE": 1, "ELEM_W": elem_w,
                         "ACC_W": elem_w + clog2(taps) + 1, "AVG_R": avg_recip(taps), "AVG_BITS": AVG_BITS,
                         "TAP_W": clog2(taps), "CF_W": clog2(c // lg)}, lg, lg, beats_in=beats, cycles=beats))
    ops.append({"layer": layer.name, "type": "globalavgpool"})
    return blocks, lg


def stage_graph(stage, model, layers) -> tuple[str, dict[str, list[str]]]:
    """(the stage's input tensor, consumers inside the stage of every tensor it sees).

    A stage streams one tensor in and one out; a skip connection left open across a cut
    (a layer reading an earlier stage's tensor other than the input, or a tensor leaving
    the stage besides its output) raises Unsupported naming the tensor.
    """
    names = set(stage.layers)
    tin = layers[0].inputs[0]
    cons: dict[str, list[str]] = {tin: []}
    for l in layers:
        cons.setdefault(l.name, [])
        for t in l.inputs:
            if t not in names and t != tin:
                raise Unsupported(f"stage {stage.index}: layer '{l.name}' reads tensor '{t}' from before the stage "
                                  f"(a skip connection open across the cut; RTL stages stream one tensor in)")
            cons[t].append(l.name)
    last = layers[-1].name
    for l in model.layers:
        if l.name in names:
            continue
        for t in l.inputs:
            if t in names and t != last:
                raise Unsupported(f"stage {stage.index}: tensor '{t}' leaves the stage for layer '{l.name}' besides "
                                  f"the stage output '{last}' (a skip connection open across the cut)")
    return tin, cons


def is_dag(layers, cons: dict[str, list[str]]) -> bool:
    """True when the stage is not a plain chain (a tensor with several consumers, an add)."""
    return any(len(l.inputs) != 1 for l in layers) or any(len(v) > 1 for v in cons.values())


def _wire_chain(blocks: list[Block], new: list[Block], win: str, fresh) -> str:
    """Append ``new`` (a linear chain) reading wire ``win``; returns its output wire."""
    for b in new:
        b.ins, b.outs = [win], [fresh()]
        win = b.outs[0]
        blocks.append(b)
    return win


def _fork_to(blocks: list[Block], pre: str, t: str, w: str, lanes: int, beats: int, k: int, elem_w: int,
             fresh) -> list[str]:
    """``k`` branches of wire ``w`` (a chain of k-1 two-way forks); branch i feeds consumer i."""
    ends = [w]
    while len(ends) < k:
        src = ends.pop()
        a, b = fresh(), fresh()
        blocks.append(Block("fork", f"{pre}_{legal(t)}_fork{len(ends)}", "axis_fork", {"DATA_W": lanes * elem_w},
                            lanes, lanes, beats_in=beats, cycles=beats, ins=[src], outs=[a, b]))
        ends += [a, b]
    return ends


def _dag_dataflow(stage, layers, tin, cons, params, state, pre, board_name, in_lanes, link_in, elem_w, frac,
                  ops) -> StageRtl:
    """A dataflow stage whose layers form a DAG (residual blocks): every layer its own engine,
    an ``axis_fork`` where a tensor has several consumers, an ``axis_add`` joining two streams.

    The skip input of an add (the one behind fewer frame-buffering engines: window generators)
    gets a FIFO of (difference + 1) whole frames: each window generator on the main path
    holds back about one frame while the fork keeps feeding both branches, so the skip
    branch never stalls the fork and the stage runs at its slowest engine.
    """
    blocks: list[Block] = []
    count = [0]

    def fresh() -> str:
        count[0] += 1
        return f"k{count[0]}"

    w, lanes = "0", in_lanes
    if link_in is not None:
        w = _wire_chain(blocks, [_rx(pre, link_in, lanes, elem_w, layers[0].in_elems // lanes)], w, fresh)
    avail: dict[str, list[tuple[str, int | None, int]]] = {}

    def emit(t: str, w: str, ln: int | None, depth: int, elems: int) -> None:
        k = max(1, len(cons.get(t, [])))
        if k > 1 and ln is None:
            raise Unsupported(f"stage {stage.index}: tensor '{t}' forks straight from the host input")
        ends = _fork_to(blocks, pre, t, w, ln, elems // ln, k, elem_w, fresh) if k > 1 else [w]
        avail[t] = [(e, ln, depth) for e in ends]

    emit(tin, w, lanes, 0, layers[0].in_elems)
    fused: set[str] = set()
    for li, layer in enumerate(layers):
        if layer.name in fused:
            continue
        ins = [avail[t].pop(0) for t in layer.inputs]
        if layer.type == "add":
            if len(ins) != 2:
                raise Unsupported(f"layer '{layer.name}': add of {len(ins)} tensors (RTL adds two)")
            (wm, lm0, dm), (wk, lk, dk) = sorted(ins, key=lambda e: -e[2])    # main first, skip second
            lm = _planned_lanes(stage.folding.get(layer.name), _channels(layer)) or lm0
            if lm != lm0:   # the add runs at the plan's lanes
                wm = _wire_chain(blocks, _converters(f"{pre}_{legal(layer.name)}_main", lm0, lm, elem_w,
                                                     layer.out_elems // lm0), wm, fresh)
            beats = layer.out_elems // lm
            new = _converters(f"{pre}_{legal(layer.name)}_skip", lk, lm, elem_w, layer.out_elems // lk)
            frames = dm - dk + 1
            new.append(_fifo(f"{pre}_{legal(layer.name)}_skip_fifo", lm, frames * beats + 2, elem_w, beats))
            wk = _wire_chain(blocks, new, wk, fresh)
            add = Block("add", f"{pre}_{legal(layer.name)}", "axis_add", {"LANES": lm, "ELEM_W": elem_w}, lm, lm,
                        beats_in=beats, cycles=beats, ins=[wm, wk], outs=[fresh()])
            blocks.append(add)
            ops.append({"layer": layer.name, "type": "add"})
            emit(layer.name, add.outs[0], lm, dm, layer.out_elems)
            continue
        if layer.type == "concat" and len(ins) == 2:
            emit(layer.name, *_df_concat(blocks, stage, layer, ins, pre, elem_w, fresh), layer.out_elems)
            ops.append({"layer": layer.name, "type": "concat"})
            continue
        if len(ins) != 1:
            raise Unsupported(f"layer '{layer.name}': type '{layer.type}' with {len(ins)} inputs has no RTL engine yet")
        (wi, li_lanes, d), = ins
        nxt = layers[li + 1] if li + 1 < len(layers) else None
        fuse = (layer.type in ("dense", "conv2d") and nxt is not None and nxt.type == "relu"
                and cons[layer.name] == [nxt.name])
        new, lo = _df_engine(stage, layer, fuse, params, state, pre, li_lanes, elem_w, frac, ops)
        d += sum(1 for b in new if b.kind == "swg")
        wo = _wire_chain(blocks, new, wi, fresh) if new else wi
        if fuse:
            fused.add(nxt.name)
            emit(nxt.name, wo, lo, d, nxt.out_elems)
        else:
            emit(layer.name, wo, lo, d, layer.out_elems)
    (wout, lanes, _), = avail[layers[-1].name]
    if not blocks or blocks[-1].outs[0] != wout:
        raise Unsupported(f"stage {stage.index}: its output is not produced by its last engine")
    return StageRtl(stage.index, board_name, "dataflow", blocks, blocks[0].in_lanes, lanes, link_in is not None,
                    False, layers[0].in_elems, layers[-1].out_elems)


def _df_concat(blocks: list[Block], stage, layer, ins, pre: str, elem_w: int, fresh) -> tuple[str, int, int]:
    """A two-input concat in a dataflow stage: both inputs converted to L lanes (the plan's,
    cut down to divide both inputs' chunks: codegen.design.context.concat_chunks, an image's channels
    per pixel), each input behind a FIFO of whole frames (one, plus one per window generator
    fewer than the other input's), then ``axis_concat`` passes a chunk of each in turn, one beat a cycle
    (fpga_models.engines: a concat streams its output elements). Returns (wire, lanes, depth)."""
    from bapipe.codegen.design.context import concat_chunks

    _outer, (ca, cb) = concat_chunks(layer)
    lanes = _ew_lanes(stage.folding.get(layer.name), math.gcd(ca, cb))
    dmax = max(d for _, _, d in ins)
    wires = []
    for k, ((w, ln, d), shape) in enumerate(zip(ins, layer.in_shapes)):
        elems = math.prod(shape)
        if ln is None:
            raise Unsupported(f"layer '{layer.name}': concat of the host input")
        new = _converters(f"{pre}_{legal(layer.name)}_in{k}", ln, lanes, elem_w, elems // ln)
        # each input can wait a whole frame (more behind fewer window generators): the two
        # branches from one fork reach the concat at different times (a 1x1 and a 3x3 conv's
        # window generators both count one, but the 3x3 holds back rows), and the fork feeds
        # both in lockstep
        new.append(_fifo(f"{pre}_{legal(layer.name)}_fifo{k}", lanes, (dmax - d + 1) * (elems // lanes) + 2,
                         elem_w, elems // lanes))
        wires.append(_wire_chain(blocks, new, w, fresh))
    beats = layer.out_elems // lanes
    ba, bb = ca // lanes, cb // lanes
    blk = Block("concat", f"{pre}_{legal(layer.name)}", "axis_concat",
                {"LANES": lanes, "ELEM_W": elem_w, "BEATS_A": ba, "BEATS_B": bb, "COUNT_W": count_bits(max(ba, bb))},
                lanes, lanes, beats_in=beats, cycles=concat_cycles(layer.out_elems, lanes), ins=wires, outs=[fresh()])
    blocks.append(blk)
    return blk.outs[0], lanes, dmax


def _ew_lanes(f: Folding | None, dim: int) -> int:
    """Lanes of an element-wise engine: the plan's lanes, cut down to divide ``dim``."""
    return math.gcd(f.ew_lanes if f is not None else 1, dim)


def _planned_lanes(f: Folding | None, dim: int) -> int | None:
    """The plan's lanes of an element-wise engine when they divide ``dim``, else None."""
    if f is None or dim % f.ew_lanes:
        return None
    return f.ew_lanes


def _tm_engine(stage, layer, params, state: dict, pre: str, elem_w: int, frac: int, ops: list):
    """One layer's engine in a time-multiplexed stage.

    Returns (window generator block or None, the blocks after it, input lanes, output lanes,
    output beats per sample, cycles of its turn excluding fill, fill cycles), or None for
    layers that leave the stream as it is (flatten). ReLU is not fused: the plan gives it its
    own turn, and so does the RTL.
    """
    f = stage.folding.get(layer.name)
    if layer.type in ("dense", "conv2d"):
        f = f or Folding(1, 1)
        p = params[layer.name]
        swg, mw, mh, wmat, vectors = _matrix_layer(stage, layer, p, f, state)
        blocks: list[Block] = []
        sblk = None
        fill = mvu_fill(f.simd)
        lin = f.simd
        if swg:
            sblk = Block("swg", f"{pre}_{legal(layer.name)}_swg", "swg", swg.params(elem_w), swg.simd, swg.out_lanes,
                         swg=swg, beats_in=swg.frame_beats, cycles=swg.out_beats)
            col = _converters(f"{pre}_{legal(layer.name)}_col", swg.out_lanes, f.simd, elem_w, swg.out_beats)
            blocks += col
            lin = swg.simd
            fill += len(col)
        bias = np.asarray(p["b"], dtype=np.int64) if p.get("b") is not None else np.zeros(mh, dtype=np.int64)
        mvu = MvuSpec(f"{pre}_{legal(layer.name)}_mvu", layer.name, mw, mh, f.pe, f.simd, False, elem_w, frac, wmat, bias)
        blocks.append(Block("mvu", f"{pre}_{legal(layer.name)}_mvu", mvu.module, {}, f.simd, f.pe, mvu=mvu,
                            beats_in=vectors * mvu.sf, cycles=vectors * mvu.cycles_per_vector))
        ops.append({"layer": layer.name, "type": layer.type, "relu": False,
                    "w": p["w"], "b": bias,
                    **({"stride": swg.stride, "padding": swg.pad, "in_shape": [swg.c, swg.h, swg.w]} if swg else {})})
        busy = max([b.cycles for b in blocks] + ([sblk.cycles] if sblk else []))
        return sblk, blocks, lin, f.pe, vectors * mvu.nf, busy, fill
    if layer.type in ("maxpool", "avgpool"):
        if len(layer.in_shapes[0]) != 3:
            raise Unsupported(f"layer '{layer.name}': pooling needs a (C, H, W) input")
        lp = _ew_lanes(f, layer.in_shapes[0][0])
        blocks = []
        _pool(layer, stage, pre, lp, elem_w, blocks, ops, lp=lp)
        sblk = blocks.pop(0)
        sblk.cycles = sblk.swg.out_beats
        return sblk, blocks, lp, lp, layer.out_elems // lp, max(b.cycles for b in blocks + [sblk]), POOL_FILL
    if layer.type == "relu":
        lanes = _ew_lanes(f, layer.out_elems)
        beats = layer.out_elems // lanes
        ops.append({"layer": layer.name, "type": "relu", "relu": True})
        return (None, [Block("relu", f"{pre}_{legal(layer.name)}", "axis_relu", {"LANES": lanes, "ELEM_W": elem_w},
                             lanes, lanes, beats_in=beats, cycles=beats)], lanes, lanes, beats, beats, 0)
    if layer.type == "batchnorm":
        lb = _ew_lanes(f, _channels(layer))
        blocks, _ = _bn(layer, pre, lb, elem_w, frac, params, ops, lb=lb)
        beats = layer.out_elems // lb
        return None, blocks, lb, lb, beats, beats, BN_FILL
    if layer.type == "globalavgpool":
        if len(layer.in_shapes[0]) != 3:
            raise Unsupported(f"layer '{layer.name}': globalavgpool needs a (C, H, W) input")
        lg = _ew_lanes(f, layer.in_shapes[0][0])
        blocks, _ = _gap(layer, stage, pre, lg, elem_w, ops, lg=lg)
        return None, blocks, lg, lg, layer.out_elems // lg, layer.in_elems // lg, POOL_FILL
    if layer.type == "flatten":
        if len(layer.in_shapes[0]) == 3 and layer.in_shapes[0][1:] != (1, 1):
            state["hwc"] = tuple(layer.in_shapes[0])
        return None
    raise Unsupported(f"layer '{layer.name}': type '{layer.type}' has no RTL engine yet "
                      f"(RTL builds dense, conv2d, maxpool, avgpool, globalavgpool, batchnorm, add, relu, flatten)")


def _rx(pre: str, link: LinkSpec, lanes: int, elem_w: int, beats: int) -> Block:
    """The receiving stage's input FIFO behind the board-to-board transport (net_link in the
    cluster top, docs/network.md), ``link.credits`` stage beats deep as the old link receiver."""
    return Block("link_rx", f"{pre}_rx", "axis_fifo",
                 {"DATA_W": lanes * elem_w, "DEPTH": link.credits, "ADDR_W": clog2(link.credits),
                  "COUNT_W": count_bits(link.credits)}, lanes, lanes, beats_in=beats, cycles=beats)


def _gate(inst: str, lanes: int, beats: int, elem_w: int, unit: int) -> Block:
    return Block("gate", inst, "axis_gate", {"DATA_W": lanes * elem_w, "BEATS": beats, "CNT_W": count_bits(beats)},
                 lanes, lanes, beats_in=beats, unit=unit)


def tm_chain(plan: Plan, stage, model, params, board_name: str, in_lanes: int | None,
             link_in: LinkSpec | None, elem_w: int, frac: int, ops: list[dict], state: dict,
             unit0: int, offchip: frozenset[str] = frozenset(), weights: WeightFetch | None = None) -> StageRtl:
    """The block chain of a time-multiplexed stage: its layers take turns, one sample at a time.

    Each layer's engine sits behind a frame buffer and a gate that the board's
    ``tm_sequencer`` opens for one frame when the layer's turn comes, so a sample's stage
    time is the sum of its layers' times, as the planner costs it. Conv and pool layers use
    their window generator's two image banks as the frame buffer (the gate sits on its
    output, so a turn costs only the replay); others get a FIFO. The stage's input buffer
    holds two frames (the previous board sends the next sample while this one is worked
    on), as does the output buffer (the link drains while the next job runs). Width
    converters run in the producer's turn when they widen or feed a window generator, else
    after the gate in the consumer's. ``unit0`` numbers the units on the board.

    A frame of ``offchip`` (the layers whose output the plan puts off chip,
    :func:`offchip_frames`) goes through a ``ddr_frame`` instead, at the wider of the
    producer's and the consumer's beats: the producer's turn writes it and the consumer's
    reads it, one 512-bit word a cycle, behind the gate (a window generator then streams,
    :func:`_stream_swg`), so each of the two turns takes at least its transfer.
    """
    pre = f"s{stage.index}"
    layers = [model.layers[model.index[n]] for n in stage.layers]
    tin, cons = stage_graph(stage, model, layers)
    if is_dag(layers, cons):
        return _dag_tm(stage, layers, tin, cons, params, state, pre, board_name, in_lanes, link_in, elem_w, frac,
                       ops, unit0, offchip, weights)
    blocks: list[Block] = []
    lanes = in_lanes
    if link_in is not None:
        blocks.append(_rx(pre, link_in, lanes, elem_w, layers[0].in_elems // lanes))
    units: list[Unit] = []
    pending: list[list] = []        # [layer, out_wire, out_beats, busy, fill] of the unit being built
    in_wire, in_beats = None, 0

    def close(extra: list[Block]) -> None:
        # Converters placed in the producer's turn count towards that turn.
        if pending:
            name, wire, beats, busy, fill = pending.pop()
            busy = max([busy] + [b.cycles for b in extra])
            units.append(Unit(name, unit0 + len(units), wire, beats, busy + fill))

    for layer in layers:
        eng = _tm_engine(stage, layer, params, state, pre, elem_w, frac, ops)
        if eng is None:
            continue
        sblk, e_blocks, lin, lout, out_beats, busy, fill = eng
        if lanes is None:
            lanes = lin
        in_elems = layer.in_elems
        first = not units and not pending
        u = unit0 + len(units) + (1 if pending else 0)
        if pending and pending[-1][0] in offchip:
            # the frame from the previous turn is off chip: widen in the producer's turn, then
            # the DDR frame (written there), the gate, narrowing converters and the engine
            fl = max(lanes, lin)
            pre_conv = _converters(f"{pre}_{legal(layer.name)}", lanes, fl, elem_w, in_elems // lanes)
            ddr = _ddr(f"{pre}_{legal(layer.name)}_ddr", fl, in_elems // fl, elem_w)
            blocks += pre_conv
            close(pre_conv + [ddr])
            blocks += [ddr, _gate(f"{pre}_{legal(layer.name)}_gate", fl, in_elems // fl, elem_w, u)]
            post = _converters(f"{pre}_{legal(layer.name)}_in", fl, lin, elem_w, in_elems // fl)
            blocks += post + ([_stream_swg(sblk)] if sblk is not None else [])
            busy = max([busy, ddr.cycles] + [b.cycles for b in post])
            fill += len(post) + _stream_fill(sblk, fl, elem_w)
        elif sblk is not None:
            pre_conv = _converters(f"{pre}_{legal(layer.name)}", lanes, lin, elem_w, in_elems // lanes)
            blocks += pre_conv
            close(pre_conv)
            fill += len(pre_conv)   # the image is complete only once they have drained
            if first:
                in_wire, in_beats = len(blocks), sblk.swg.frame_beats
            blocks.append(sblk)
            blocks.append(_gate(f"{pre}_{legal(layer.name)}_gate", sblk.out_lanes, sblk.swg.out_beats, elem_w, u))
        else:
            if lin > lanes:
                pre_conv, post, fl = _converters(f"{pre}_{legal(layer.name)}", lanes, lin, elem_w, in_elems // lanes), [], lin
            else:
                pre_conv, post, fl = [], _converters(f"{pre}_{legal(layer.name)}", lanes, lin, elem_w, in_elems // lanes), lanes
            blocks += pre_conv
            close(pre_conv)
            frame = in_elems // fl
            if first:
                in_wire, in_beats = len(blocks), frame
            blocks.append(_fifo(f"{pre}_{legal(layer.name)}_buf", fl, frame * (2 if first else 1), elem_w, frame))
            blocks.append(_gate(f"{pre}_{legal(layer.name)}_gate", fl, frame, elem_w, u))
            blocks += post
            busy = max([busy] + [b.cycles for b in post])
            # a widening converter runs in the producer's turn, which ends on the producer's
            # last beat; its wide word reaches this buffer one cycle a converter later, inside
            # this turn (Verilator: relu3 after a 1-lane MVU fires one cycle after its grant)
            fill += len(post) + (0 if first else len(pre_conv))
        blocks += e_blocks
        pending.append([layer.name, len(blocks), out_beats, busy, fill])
        lanes = lout
    close([])
    if not units:
        raise Unsupported(f"stage {stage.index} has no layers the RTL can build")
    out_beats = layers[-1].out_elems // lanes
    blocks.append(_fifo(f"{pre}_out_buf", lanes, 2 * out_beats, elem_w, out_beats))
    _wait_weights(units, weights)
    return StageRtl(stage.index, board_name, "time-multiplexed", blocks, blocks[0].in_lanes, lanes,
                    link_in is not None, False, layers[0].in_elems, layers[-1].out_elems, units, in_wire, in_beats,
                    weights)


@dataclass
class _Turn:
    """One layer's unit while :class:`_DagTm` builds it: the wire and lanes it reads, the unit
    that produced them (None: the stage input), its engine's window generator (or None) and
    input lanes, and its turn's cycles (busy, fill)."""

    layer: Any
    unit: int
    wire: str
    lanes: int
    producer: int | None
    swg: Block | None
    lin: int
    busy: int
    fill: int


class _DagTm:
    """The blocks of a time-multiplexed DAG stage while :func:`_dag_tm` lays them out.

    ``recs``: per unit in turn order [layer, out_wire, out_beats, busy, fill]; ``avail``: per
    tensor the branches no consumer has taken yet, [(wire, lanes, producer unit)]; ``in_wire``
    / ``in_beats``: where whole input frames are counted (the stage's job start)."""

    def __init__(self, stage, cons, pre: str, elem_w: int, unit0: int, offchip: frozenset[str], ops: list):
        self.stage, self.cons, self.pre, self.elem_w = stage, cons, pre, elem_w
        self.unit0, self.offchip, self.ops = unit0, offchip, ops
        self.blocks: list[Block] = []
        self.count = 0
        self.recs: list[list] = []
        self.avail: dict[str, list[tuple[str, int | None, int | None]]] = {}
        self.in_wire: str | None = None
        self.in_beats = 0

    def fresh(self) -> str:
        self.count += 1
        return f"k{self.count}"

    def chain(self, new: list[Block], w: str) -> str:
        return _wire_chain(self.blocks, new, w, self.fresh)

    def inst(self, layer, suffix: str = "") -> str:
        return f"{self.pre}_{legal(layer.name)}{suffix}"

    def emit(self, t: str, w: str, ln: int | None, elems: int, producer: int | None) -> None:
        """Tensor t leaves on wire w: forked into one branch per consumer."""
        k = max(1, len(self.cons.get(t, [])))
        if k > 1 and ln is None:
            raise Unsupported(f"stage {self.stage.index}: tensor '{t}' forks straight from the host input")
        ends = _fork_to(self.blocks, self.pre, t, w, ln, elems // ln, k, self.elem_w, self.fresh) if k > 1 else [w]
        self.avail[t] = [(e, ln, producer) for e in ends]

    def off(self, producer: int | None) -> bool:
        return producer is not None and self.recs[producer][0] in self.offchip

    def bump(self, producer: int | None, extra: list[Block]) -> None:
        # Converters in front of a consumer's buffer run in the producer's turn.
        if producer is not None:
            self.recs[producer][3] = max([self.recs[producer][3]] + [b.cycles for b in extra])

    def add_unit(self, layer) -> None:
        """An add is a unit: both inputs wait in one-frame FIFOs (two frames when fed straight
        from the stage input; a ddr_frame when off chip) and its gate opens the first."""
        u = self.unit0 + len(self.recs)
        if len(layer.inputs) != 2:
            raise Unsupported(f"layer '{layer.name}': add of {len(layer.inputs)} tensors (RTL adds two)")
        elem_w = self.elem_w
        (wa, la, pa), (wb, lb, pb) = [self.avail[t].pop(0) for t in layer.inputs]
        beats = layer.out_elems // la
        conv = _converters(self.inst(layer, "_in1"), lb, la, elem_w, layer.in_elems // lb)
        self.bump(pb, conv)

        def frame(k: int, p: int | None) -> Block:
            if self.off(p):
                d = _ddr(self.inst(layer, f"_ddr{k}"), la, beats, elem_w)
                self.bump(p, [d])
                return d
            return _fifo(self.inst(layer, f"_buf{k}"), la, beats * (2 if p is None else 1), elem_w, beats)

        fa, fb = frame(0, pa), frame(1, pb)
        wa = self.chain([fa, _gate(self.inst(layer, "_gate"), la, beats, elem_w, u)], wa)
        wb = self.chain(conv + [fb], wb)
        add = Block("add", self.inst(layer), "axis_add", {"LANES": la, "ELEM_W": elem_w}, la, la,
                    beats_in=beats, cycles=beats, ins=[wa, wb], outs=[self.fresh()])
        self.blocks.append(add)
        self.ops.append({"layer": layer.name, "type": "add"})
        self.recs.append([layer.name, add.outs[0], beats,
                          max([beats] + [f.cycles for f in (fa, fb) if f.kind == "ddr_frame"]), 0])
        self.emit(layer.name, add.outs[0], la, layer.out_elems, len(self.recs) - 1)

    def engine_unit(self, layer, eng) -> None:
        """A layer's engine (``_tm_engine``'s tuple; None: flatten, the stream unchanged) behind
        its input: an off-chip frame, its window generator's banks, or a frame FIFO."""
        u = self.unit0 + len(self.recs)
        wi, ln, pi = self.avail[layer.inputs[0]].pop(0)
        if eng is None:
            self.emit(layer.name, wi, ln, layer.out_elems, pi)
            return
        sblk, e_blocks, lin, lout, out_beats, busy, fill = eng
        t = _Turn(layer, u, wi, lin if ln is None else ln, pi, sblk, lin, busy, fill)
        if self.off(pi):
            self.offchip_input(t)
        elif sblk is not None:
            self.swg_input(t)
        else:
            self.fifo_input(t)
        wo = self.chain(e_blocks, t.wire)
        self.recs.append([layer.name, wo, out_beats, t.busy, t.fill])
        self.emit(layer.name, wo, lout, layer.out_elems, len(self.recs) - 1)

    def offchip_input(self, t: _Turn) -> None:
        """An off-chip frame (as tm_chain): written in the producer's turn, read in this one,
        at the wider of the two widths, behind the gate."""
        layer, elem_w, n = t.layer, self.elem_w, t.layer.in_elems
        fl = max(t.lanes, t.lin)
        pre_conv = _converters(self.inst(layer), t.lanes, fl, elem_w, n // t.lanes)
        ddr = _ddr(self.inst(layer, "_ddr"), fl, n // fl, elem_w)
        self.bump(t.producer, pre_conv + [ddr])
        post = _converters(self.inst(layer, "_in"), fl, t.lin, elem_w, n // fl)
        t.wire = self.chain(pre_conv + [ddr, _gate(self.inst(layer, "_gate"), fl, n // fl, elem_w, t.unit)]
                            + post + ([_stream_swg(t.swg)] if t.swg is not None else []), t.wire)
        t.busy = max([t.busy, ddr.cycles] + [b.cycles for b in post])
        t.fill += len(post) + _stream_fill(t.swg, fl, elem_w)

    def swg_input(self, t: _Turn) -> None:
        """The window generator's two image banks are the frame buffer; the gate sits on its output."""
        layer, sblk = t.layer, t.swg
        pre_conv = _converters(self.inst(layer), t.lanes, t.lin, self.elem_w, layer.in_elems // t.lanes)
        self.bump(t.producer, pre_conv)
        t.fill += len(pre_conv)   # the image is complete only once they have drained
        t.wire = self.chain(pre_conv, t.wire)
        if t.producer is None and self.in_wire is None:
            self.in_wire, self.in_beats = t.wire, sblk.swg.frame_beats
        t.wire = self.chain([sblk, _gate(self.inst(layer, "_gate"), sblk.out_lanes, sblk.swg.out_beats, self.elem_w,
                                         t.unit)], t.wire)

    def fifo_input(self, t: _Turn) -> None:
        """A frame FIFO (two frames when it reads the stage input) and the gate; widening
        converters run in the producer's turn, narrowing ones after the gate."""
        layer, elem_w = t.layer, self.elem_w
        first = t.producer is None        # reads the stage input: its buffer holds two frames
        conv = _converters(self.inst(layer), t.lanes, t.lin, elem_w, layer.in_elems // t.lanes)
        pre_conv, post, fl = (conv, [], t.lin) if t.lin > t.lanes else ([], conv, t.lanes)
        self.bump(t.producer, pre_conv)
        t.wire = self.chain(pre_conv, t.wire)
        frame = layer.in_elems // fl
        if first and self.in_wire is None:
            self.in_wire, self.in_beats = t.wire, frame
        t.wire = self.chain([_fifo(self.inst(layer, "_buf"), fl, frame * (2 if first else 1), elem_w, frame),
                             _gate(self.inst(layer, "_gate"), fl, frame, elem_w, t.unit)] + post, t.wire)
        t.busy = max([t.busy] + [b.cycles for b in post])
        t.fill += len(post) + (0 if first else len(pre_conv))   # widening: as tm_chain


def _dag_tm(stage, layers, tin, cons, params, state, pre, board_name, in_lanes, link_in, elem_w, frac, ops,
            unit0: int, offchip: frozenset[str] = frozenset(), weights: WeightFetch | None = None) -> StageRtl:
    """A time-multiplexed stage whose layers form a DAG (residual blocks).

    Units take turns in the stage's topological order, each behind its frame buffer and
    gate as in :func:`tm_chain`. A tensor with several consumers goes through ``axis_fork``
    in its producer's turn into each consumer's frame buffer; the add is a unit too: both
    of its inputs wait in one-frame FIFOs (two frames when fed straight from the stage
    input, which the previous board refills during the job) and its gate opens the first, so
    the skip frame waits while the main path's units take turns. A tensor the plan puts off
    chip (``offchip``, :func:`tm_chain`) reaches each of its consumers through a ``ddr_frame``
    in place of the frame buffer, ahead of the gate.
    """
    g = _DagTm(stage, cons, pre, elem_w, unit0, offchip, ops)
    w, lanes = "0", in_lanes
    if link_in is not None:
        w = g.chain([_rx(pre, link_in, lanes, elem_w, layers[0].in_elems // lanes)], w)
    if len(cons[tin]) > 1 and lanes is not None:
        g.in_wire, g.in_beats = w, layers[0].in_elems // lanes      # whole frames counted before the fork
    g.emit(tin, w, lanes, layers[0].in_elems, None)
    for layer in layers:
        if layer.type == "add":
            g.add_unit(layer)
        else:
            g.engine_unit(layer, _tm_engine(stage, layer, params, state, pre, elem_w, frac, ops))
    if not g.recs or g.in_wire is None:
        raise Unsupported(f"stage {stage.index} has no layers the RTL can build")
    units = [Unit(name, unit0 + i, wire, beats, busy + fill)
             for i, (name, wire, beats, busy, fill) in enumerate(g.recs)]
    (wout, lanes, _), = g.avail[layers[-1].name]
    out_beats = layers[-1].out_elems // lanes
    g.chain([_fifo(f"{pre}_out_buf", lanes, 2 * out_beats, elem_w, out_beats)], wout)
    _wait_weights(units, weights)
    return StageRtl(stage.index, board_name, "time-multiplexed", g.blocks, g.blocks[0].in_lanes, lanes,
                    link_in is not None, False, layers[0].in_elems, layers[-1].out_elems, units, g.in_wire, g.in_beats,
                    weights)


def build_pipeline(plan: Plan, model, cluster, params=None, plan_file: str = "plan.yaml",
                   in_lanes: int | None = None, partial: bool = False) -> Pipeline:
    """The RTL pipeline of a plan: replica 0 of every stage, links between consecutive stages.

    A board that runs several stages (interleaved schedules) gets all of them; time-multiplexed
    stages on a board share its sequencer, so they take turns as the plan assumes. Raises
    Unsupported when the plan needs what the RTL cannot build (stages split over meshes,
    layer types without an engine).

    ``in_lanes`` sets the lanes of the first stage's input (None: its first engine's), and
    ``partial`` builds a slice of a plan (codegen.check.agreement runs one stage alone): a flatten
    left open at its end is then fine.
    """
    elem_w, frac = elem_format(plan.number_format, plan_file)
    params = plan_weights(plan, model) if params is None else params
    if not plan.stages:
        raise Unsupported("the plan has no stages")
    for s in plan.stages:
        # Data-parallel replicas are identical copies working on other samples: the RTL
        # pipeline is that of replica 0 (boards[0] of each stage).
        if math.prod(s.mesh) != 1 or len(s.boards) != s.replicas:
            raise Unsupported(f"stage {s.index} is split over a {'x'.join(map(str, s.mesh))} mesh "
                              f"(RTL builds one board per stage replica)")
    clock = min(cb.board.clock_hz for cb in cluster.boards)
    stages: list[StageRtl] = []
    links: list[LinkSpec | None] = []
    ops: list[dict] = []
    link_in = None
    lanes = in_lanes
    state: dict = {}
    units_on: dict[str, int] = {}
    for s in plan.stages:
        bname = s.boards[0]
        if s.style == "time-multiplexed":
            st = tm_chain(plan, s, model, params, bname, lanes, link_in, elem_w, frac, ops, state,
                          units_on.get(bname, 0), offchip_frames(plan, s, model, cluster),
                          offchip_weights(plan, s, model, cluster))
            units_on[bname] = units_on.get(bname, 0) + len(st.units)
        else:
            st = dataflow_chain(plan, s, model, params, bname, lanes, link_in, elem_w, frac, ops, state)
        stages.append(st)
        if s is not plan.stages[-1]:
            nxt = plan.stages[s.index + 1].boards[0]
            link_in = None
            if nxt != bname:
                beat_bytes = st.out_lanes * elem_w // 8
                link_in = make_link(bname, nxt, cluster.path_bandwidth(bname, nxt),
                                    cluster.path_latency(bname, nxt), clock, beat_bytes)
                st.has_tx = True    # its output goes to the transport (net_link; codegen.design.links)
            links.append(link_in)
            lanes = st.out_lanes
    if state.get("hwc") and not partial:
        raise Unsupported("the last flatten is not followed by a dense layer")
    boards: list[BoardRtl] = []
    for st in stages:
        b = next((b for b in boards if b.name == st.board), None)
        if b is None:
            boards.append(BoardRtl(st.board, f"{st.board}_top", [st]))
        else:
            b.stages.append(st)
    first = model.layers[model.index[plan.stages[0].layers[0]]]
    last = model.layers[model.index[plan.stages[-1].layers[-1]]]
    pipe = Pipeline(boards, stages, links, elem_w, frac, plan.number_format, first.in_elems, last.out_elems, ops)
    pipe.breakdown, pipe.interval = predict_interval(pipe)
    return pipe


def predict_interval(pipe: Pipeline) -> tuple[list[tuple[str, float]], float]:
    """Cycle model: (per-element cycles per sample, the slowest = predicted steady-state interval).

    Dataflow stages: every block of every stage works at once, so the slowest block sets the
    pace. Time-multiplexed stages: a board's stages take turns, so a board costs the sum of
    its stages' jobs (each the sum of its units).
    """
    parts: list[tuple[str, float]] = []
    for b in pipe.boards:
        tm = [st for st in b.stages if st.units]
        if tm:
            parts.append((f"{b.name}/jobs", float(sum(st.job_cycles for st in tm))))
        for st in b.stages:
            if st.units:
                continue
            for blk in st.blocks:
                if blk.cycles:
                    parts.append((f"{b.name}/{blk.inst}", blk.cycles))
    parts.append(("host in", pipe.in_elems // pipe.in_lanes))
    for i, link in enumerate(pipe.links):
        if link is not None:
            parts.append((f"link {link.src}->{link.dst}", float(link_transport(pipe, i).cycles_per_sample)))
    parts.append(("out", pipe.out_elems // pipe.out_lanes))
    parts = [(n, c) for n, c in parts if c]
    return parts, max(c for _, c in parts)


def _link_beats(pipe: Pipeline, i: int) -> int:
    """Beats per sample leaving stage i (its output elements over its output lanes)."""
    st = pipe.stages[i]
    return st.out_elems // st.out_lanes


def link_transport(pipe: Pipeline, i: int):
    """The board-to-board transport (codegen.design.links.TransportSpec) after stage i: its words
    are stage i's output beats; TDEST (the XUP VNx socket) is the link's position i."""
    from bapipe.codegen.design.links import transport
    return transport(pipe.links[i], pipe.stages[i].out_lanes, pipe.elem_w, _link_beats(pipe, i), dest=i)


# ------------------------------------------------------------------ replay of turn-taking boards

#: cycles from a stage's last beat entering the next stage's input buffer to that job's start
TM_START = 2
#: cycles from a link's last beat leaving the transmitter to entering the receiver's buffer
LINK_RX_DELAY = 2


def timing_model(pipe: Pipeline) -> dict:
    """What :func:`replay_outputs` needs, JSON-able (written into the manifest by ``bapipe gen``)."""
    out = []
    for i, st in enumerate(pipe.stages):
        link = pipe.links[i] if i < len(pipe.links) else None
        out.append({
            "stage": st.index, "board": st.board,
            "units": [u.cycles for u in st.units] if st.units else [st.job_cycles],
            "in_beats": st.in_beats or (st.in_elems // st.in_lanes),
            "out_beats": st.out_elems // st.out_lanes,
            "link": None if link is None else _link_timing(link_transport(pipe, i)),
        })
    return {"stages": out, "switch": TM_SWITCH, "start": TM_START, "rx_delay": LINK_RX_DELAY,
            "host_beats": pipe.in_elems // pipe.in_lanes}


def _link_timing(t) -> dict:
    """A transport as the replay sees it: stage beats per cycle and delivery latency."""
    return {"beats_per_cycle": float(t.sample_words // t.slices / t.cycles_per_sample), "latency": t.delivery_latency}


def replay_outputs(model: dict, n: int) -> list[float]:
    """Cycle of each sample's last output beat (from the first input beat) for n samples sent
    back to back, replaying the boards' turn-taking: a board runs one stage job at a time,
    the latest stage among those whose whole input frame has arrived first (as
    ``tm_sequencer`` does); a link forwards a job's output while its last layer produces it.
    """
    st = model["stages"]
    sw, start_d, rx_d = model["switch"], model["start"], model["rx_delay"]
    ns = len(st)
    ready = [[None] * n for _ in st]
    host = model["host_beats"]
    ready[0][0] = float(host)
    if n > 1:
        ready[0][1] = 2.0 * host
    nxt = [0] * ns                                  # next sample each stage will take
    free = {s["board"]: 0.0 for s in st}
    link_free = [0.0] * ns
    outs = [0.0] * n
    done = 0
    while done < ns * n:
        best = None
        for b in free:
            cands = [j for j in range(ns) if st[j]["board"] == b and nxt[j] < n and ready[j][nxt[j]] is not None]
            if not cands:
                continue
            t = max(free[b], min(ready[j][nxt[j]] + start_d for j in cands))
            if best is None or t < best[0]:
                j = max(j for j in cands if ready[j][nxt[j]] + start_d <= t)
                best = (t, j)
        if best is None:
            raise RuntimeError("replay stuck: a stage waits for input that never comes")
        t, j = best
        k = nxt[j]
        nxt[j] += 1
        units = st[j]["units"]
        end = t + sum(units) + sw
        free[st[j]["board"]] = end
        if j == 0 and k + 2 < n:
            # The host refills stage 0's two-frame buffer as this job's first layer drains it.
            ready[0][k + 2] = max(ready[0][k + 1] + host, t + units[0])
        last_start = end - units[-1]
        if j + 1 < ns:
            link = st[j]["link"]
            if link is None:
                ready[j + 1][k] = end
            else:
                send0 = max(last_start, link_free[j])
                send1 = max(end, send0 + st[j]["out_beats"] / link["beats_per_cycle"])
                link_free[j] = send1
                ready[j + 1][k] = send1 + link["latency"] + rx_d
        else:
            outs[k] = end
        done += 1
    return outs


def predicted_cycles_per_sample(model: dict, n: int) -> float:
    """What `bapipe rtlsim` measures, predicted: (last sample's output - first's) / (n - 1)."""
    outs = replay_outputs(model, n)
    return (outs[-1] - outs[0]) / (n - 1)
