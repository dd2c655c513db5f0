"""The backward kernel's matrix engines as a board builds them, decided once: lanes, chunks,
weight-gradient tiles, weight stores, their banks and blocks, cycles and off-chip bytes.

Read by the planner (the backward's cycles and blocks it prices: planner.search, planner.planning)
and by codegen.design.backward / the HLS renderer (what stage_bwd.cpp.j2 lays out), so the plan,
the Design and ``bapipe check`` count the same hardware (docs/backward_tiles.md).

Why: a PE x SIMD array that adds every product straight into a banked accumulator needs a bank
(two ports: UG573) per lane -- 3,072 URAM banks an array -- and one that reads its weights per
vector needs PE x SIMD weights a cycle. The engines here reuse what they hold:

- **Weight gradient, output-stationary.** A matrix layer with many vectors a call (conv pixels,
  dense rows) is a *chunk* engine: the vectors come in chunks of ``P`` (the loader fills one half
  of two chunk buffers while the lanes work on the other); per block (nf, sf) of the PE x SIMD
  grid the lanes sum the chunk's P products in registers and hand the block to a drain shift
  register, which adds it into the accumulator store ``K = ceil(lanes / P)`` sums a cycle over
  ``J = ceil(lanes / K) <= P`` cycles: K banks of two ports each (one read, one write) instead of
  one per lane. The store holds the layer's whole dW on chip when it fits (written once an
  iteration by the flush), else one *pass* of rows at a time: the pass's tile is read from the
  layer's dW array in off-chip memory (not on the iteration's first call), the call's vectors
  stream through, and the tile is written back: once per tile per micro-batch.
- **Input gradient with weight reuse.** dx = W^T dy runs per group of ``PX`` vectors of the
  chunk: each weight block (PE x SIMD, registers) serves PX vectors, so the weight store gives
  ``KW = ceil(lanes / PX)`` weights a cycle (a shift register fills the next block); a group's
  dx sums wait in a two-group reorder buffer and leave in vector order, one beat every NF cycles.
- **Static lanes.** A time-multiplexed kernel's matrix turns share one grid (:func:`choose_grid`):
  every turn's lane (p, s) reads the same bank of the same buffers; a turn changes addresses and
  loop bounds only, never which bank feeds a lane (no run-time crossbar).
- **Few-vector layers** (a dense layer of one row a sample: VGG-16's classifier) have nothing to
  reuse within a call: a *row* engine of ``LR`` lanes walks the matrix once a call in row order,
  its weights read at the rate their 512-bit port gives (32 16-bit weights a beat). A small
  layer's dW is read-modify-written on chip (LR banks); a big one's (``keep``) is not touched
  during the iteration: the engine keeps its vectors (x and dy, on chip) and the flush computes
  dW output-stationary over them, eight 64-bit sums (a 512-bit beat) a cycle -- the flush's
  write, once an iteration, instead of a read-modify-write of the whole dW every vector.

Hardware rules cited in docs/backward_tiles.md: UG573 (RAMB36E2 / URAM288 widths, depths, two
ports), UG1399 (ARRAY_PARTITION / ARRAY_RESHAPE banks, PIPELINE II, m_axi widening), DS962 (U250).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import prod
from typing import Sequence

from bapipe.layers import Layer
from bapipe.spec import Model

from .cost import matrix_shape
from .gradients import gradient_tensors
from .memory_blocks import Blocks, array_blocks

#: bits of one 512-bit m_axi beat (UG1399 "Automatic Port Widening": max_widen_bitwidth=512)
AXI_BITS = 512
#: bits of one weight-gradient sum in off-chip memory (bapipe::wsum_t): the exact sum widened
WSUM_BITS = 64
#: sums one 512-bit beat carries
SUMS_PER_BEAT = AXI_BITS // WSUM_BITS
#: chunk sizes the search tries (vectors a chunk) [design choice: the drain needs J <= P, the
#: registers grow with neither; 16..64 keeps the loader's first chunk short]
CHUNK_RANGE = (16, 64)
#: chunks are multiples of it, so a dx group of up to 4 vectors divides them [design choice]
CHUNK_STEP = 4
#: input-gradient reuse factors tried: vectors one weight block serves [design choice]
REUSE_CHOICES = (1, 2, 4, 8)
#: fewest vectors a call for a chunk engine: below it a matrix layer takes the row engine
#: (a chunk of P vectors would be mostly padding) [design choice]
MIN_CHUNK_VECTORS = 16
#: elements of a kept vector a word of its store (a row engine's x beat of 32 written in one cycle
#: through a bank's two ports, UG573)
KEEP_X_PER_WORD = 16
#: weights one 512-bit beat carries (16-bit formats)
WEIGHTS_PER_BEAT = 32
#: words of a weight store: four 16-bit weights a 64-bit word (ARRAY_RESHAPE factor 4), a
#: URAM288 word being 72 bits (UG573)
WEIGHTS_PER_WORD = 4
#: pipeline depth charged once per loop (the loop's fill) [as the MVU's MVU_FILL]
LOOP_DEPTH = 4
#: share of the board's usable URAM a time-multiplexed kernel's weight store may take holding all its
#: matrices (else it holds one turn's: a tile filled before the turn) [design choice]
WEIGHT_URAM_SHARE = 0.15
#: elements up to which a row job keeps its dW on chip [design choice: 64 K sums, a few URAMs]
ROW_CHIP_ELEMS = 65536
#: share of the board's usable URAM the weight-gradient stores of one backward kernel may take
#: before layers go to off-chip passes [design choice: the forward kernel, the weight store and
#: the frames share the rest]
ACC_URAM_SHARE = 0.3


def acc_width(terms: int, a_width: int = 16, b_width: int = 16) -> int:
    """Bits of a signed accumulator that sums ``terms`` products exactly (fpga_models.train_fixed)."""
    return a_width + b_width - 1 + math.ceil(math.log2(max(1, terms) + 1))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- what the kernel computes


@dataclass(frozen=True)
class MatrixLayer:
    """One matrix layer of a backward kernel: MH x MW, ``vec`` vectors a sample, whether it
    computes an input gradient, its plan folding (PE, SIMD)."""

    name: str
    kind: str            # conv2d | dense
    mh: int
    mw: int
    vec: int
    dx: bool
    pe: int
    simd: int
    win: tuple = ()      # conv: (C, H, W, KH, KW, SH, SW, PH, PW) of its window generator

    @property
    def elems(self) -> int:
        return self.mh * self.mw


def matrix_layers(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]]) -> list[MatrixLayer]:
    """The matrix layers whose backward the kernel runs, in layer order (every dense / conv2d
    layer of the stage learns its matrix; dx when its input carries a gradient:
    fpga_models.gradients, codegen.design.backward's rule)."""
    grads = gradient_tensors(model)
    inside = {l.name for l in layers}
    needed = {i for l in layers for i in l.inputs if i not in inside and i in grads}
    out = []
    for l in layers:
        if l.type in ("dense", "conv2d") or any(i in needed for i in l.inputs):
            needed.add(l.name)
        if l.type not in ("dense", "conv2d"):
            continue
        mh, mw, pix = matrix_shape(l)
        vec = int(round(pix)) if l.type == "conv2d" else int(prod(l.in_shapes[0][:-1]))
        pe, simd = folding.get(l.name, (1, 1))
        win = ()
        if l.type == "conv2d":
            c, h, w = l.in_shapes[0]
            a = l.attr
            pair = lambda v: (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))   # noqa: E731
            win = (int(c), int(h), int(w), *pair(a["kernel"]), *pair(a["stride"]), *pair(a.get("padding", 0) or 0))
        out.append(MatrixLayer(l.name, l.type, int(mh), int(mw), vec, l.inputs[0] in needed, int(pe), int(simd), win))
    return out


@lru_cache(maxsize=1 << 16)   # pure (MatrixLayer is frozen): choose_grid asks it for every grid it tries
def window_cycles(m: MatrixLayer, simd: int) -> int:
    """Cycles a sample the backward's window columns of conv ``m`` take at ``simd`` lanes a beat
    (codegen.design.backward's window: the square windows through the line-buffer generator,
    fpga_models.engines.swg_cycles; the others gathered from memory, a beat a cycle); 0 for dense."""
    if not m.win:
        return 0
    from .engines import conv_window_lanes, swg_cycles

    c, h, w, kh, kw, sh, sw, ph, pw = m.win
    lanes, taps = conv_window_lanes(c, kh, simd)
    if kh == kw and sh == sw and ph == pw and simd % (lanes * taps) == 0 and c % lanes == 0:
        return swg_cycles(c, h, w, kh, ph, sh, lanes, taps)
    return m.vec * m.mw // simd


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Job:
    """One matrix layer's engine as built (a chunk engine's job, or a row engine's)."""

    layer: MatrixLayer
    engine: str          # "chunk" | "row"
    nf: int              # row blocks of the grid (chunk) / rows (row engine)
    sf: int              # column blocks
    lpe: int             # dy beat lanes (min(PE, MH))
    lsimd: int           # x and dx beat lanes (min(SIMD, MW))
    gb: int              # weight-gradient accumulator bits
    xb: int              # input-gradient accumulator bits
    home: str            # "chip": dW lives on chip between calls | "ddr": in its dW array | "keep": made at the flush
    passes: int = 1      # chunk engine, home ddr: row-block passes a call
    pass_nf: int = 0     # row blocks a pass (the last may have fewer)
    store_base: int = 0  # first row of the job in the accumulator store (chip) / 0 (ddr: the tile)
    wbase: int = 0       # first row of its weights in the weight store (resident), else 0 (tile)
    abase: int = 0       # first row of its bias sums (PE a row)
    wsimd: int = 0       # conv: the SIMD its window generator is built for (conv_window_lanes)
    xr: int = 1          # cycles between two x beats the loader takes (the window's pace)
    keep: int = 0        # row job, home "keep": the iteration's vectors it keeps for its dW at the flush

    @property
    def blocks(self) -> int:
        return self.nf * self.sf

    def pass_blocks(self, k: int) -> int:
        """Grid blocks of pass ``k`` (its row blocks x SF)."""
        nf = min(self.pass_nf, self.nf - k * self.pass_nf) if self.passes > 1 else self.nf
        return nf * self.sf


@dataclass(frozen=True)
class Array:
    """A memory the engines declare: ``banks`` banks of ``width`` bits x ``depth`` words bound to
    ``impl`` (memory_blocks), ``per`` elements a word (ARRAY_RESHAPE)."""

    name: str
    width: int
    depth: int
    banks: int
    impl: str
    per: int = 1

    @property
    def blocks(self) -> Blocks:
        return array_blocks(self.impl, self.width, self.banks * self.depth, self.banks)


@dataclass(frozen=True)
class BwdTiles:
    """A backward kernel's matrix engines (see the module docstring)."""

    style: str                    # "tm" (one shared grid) | "dataflow" (an engine per layer)
    pe: int                       # tm: the grid
    simd: int
    chunk: int                    # P
    drain: int                    # K
    drain_steps: int              # J
    reuse: int                    # PX
    wlanes: int                   # KW: weights a cycle into the reuse shift register
    wsteps: int                   # ceil(lanes / KW) <= PX
    row_lanes: int                # LR of the row engine (0: none)
    jobs: tuple                   # Job, layer order
    weights: str                  # "resident" (held all iteration) | "tile" (per turn) | "none"
    arrays: tuple = ()            # Array
    samples: int = 1              # vectors of a call are vec x samples (tm: one sample a turn)
    ddr_bytes: dict = field(default_factory=dict)   # per sample: "dw" (dW tiles / row sums), "w" (weights), "dy"

    @property
    def lanes(self) -> int:
        return self.pe * self.simd

    @property
    def blocks(self) -> Blocks:
        """The engines' memories in blocks (memory_blocks, UG573)."""
        total = Blocks()
        for a in self.arrays:
            total = total + a.blocks
        return total

    def job(self, layer: str) -> Job | None:
        return next((j for j in self.jobs if j.layer.name == layer), None)


def choose_grid(mats: Sequence[MatrixLayer], lanes: int, samples: int = 1) -> tuple[int, int]:
    """:func:`_choose_grid` (its docstring says how), once per (layers, lanes, samples): the
    planner prices the same stage at the same lanes many times."""
    return _choose_grid(tuple(mats), lanes, samples)


@lru_cache(maxsize=1 << 14)
def _choose_grid(mats: tuple[MatrixLayer, ...], lanes: int, samples: int = 1) -> tuple[int, int]:
    """The (PE, SIMD) grid of a time-multiplexed kernel's chunk engine: PE x SIMD = ``lanes``, every
    chunk layer's MH a multiple of PE or below it and MW a multiple of SIMD or below it (a beat is
    a whole block row or the whole vector, so a lane's bank is fixed), fewest cycles over the
    layers (NF x SF x vectors), then a PE whose dy row fits one 512-bit word (an off-chip pass keeps
    dy in such words), then the squarest (fewest chunk-buffer banks: PE + SIMD). None
    fits: the layers' largest folding, padded."""
    chunked = [m for m in mats if _is_chunk(m, samples)]
    best, key = None, None
    # the plan's lanes, and the largest power of two within them: with a factor 3 in the lanes
    # (3,072) and every MH a power of two (ResNet-50's stages) only PE = lanes fits, one lane of
    # SIMD; 2,048 lanes as 32 x 64 do the same work in a fraction of the cycles
    for n in sorted({lanes, 1 << (max(1, lanes).bit_length() - 1)}, reverse=True):
        for pe in range(1, n + 1):
            if n % pe:
                continue
            simd = n // pe
            if not all((m.mh % pe == 0 or m.mh < pe) and (m.mw % simd == 0 or m.mw < simd) for m in chunked):
                continue
            cyc = sum(max(_cdiv(m.mh, pe) * _cdiv(m.mw, simd) * m.vec * (2 if m.dx else 1),
                          window_cycles(m, min(simd, m.mw)) * samples) for m in chunked)
            k = (cyc, pe * 16 > AXI_BITS, pe + simd, pe)   # a dy row in one 512-bit word (off-chip passes)
            if key is None or k < key:
                best, key = (pe, simd), k
    if best is None:
        m = max(chunked or mats, key=lambda m: (m.pe * m.simd, m.pe))
        best = (m.pe, m.simd)
    return best


def _is_chunk(m: MatrixLayer, samples: int) -> bool:
    """A layer with enough vectors a call for the chunk engine (else the row engine)."""
    return m.vec * samples >= MIN_CHUNK_VECTORS


def choose_chunk(jobs: Sequence[tuple[int, int, int, bool]], lanes: int) -> int:
    """P: the chunk with the fewest cycles of one call of every chunk job (``jobs``: (vectors a
    call, NF, SF, dx)): its padded chunks, the first chunk's load (P x max(NF, SF)) and the last
    drain (J); among those within 0.5% of the fewest, the largest P (fewest drain banks K)."""
    lo, hi = CHUNK_RANGE
    cost = {}
    for p in range(lo, hi + 1, CHUNK_STEP):
        k = _cdiv(lanes, p)
        j = _cdiv(lanes, k)
        cost[p] = sum(_cdiv(v, p) * p * nf * sf * (2 if dx else 1) + p * max(nf, sf) + j for v, nf, sf, dx in jobs)
    best = min(cost.values())
    return max(p for p, c in cost.items() if c <= best * 1.005)


def choose_reuse(lanes: int, chunk: int, store_elems: int) -> int:
    """PX: the fewest vectors a weight block serves (a divisor of P among REUSE_CHOICES) such that
    the weight store's banks (KW / 4 weights a 64-bit word, one row read a cycle) are no more than
    the URAM288s its capacity takes (``store_elems`` 16-bit weights; UG573: 4K x 72); else the
    largest such divisor."""
    cap = max(1, _cdiv(store_elems * 16, 4096 * 72))
    ok = [px for px in REUSE_CHOICES if chunk % px == 0]
    for px in ok:
        if _cdiv(_cdiv(lanes, px), WEIGHTS_PER_WORD) <= cap:
            return px
    return ok[-1]


def _impl(width: int, depth: int) -> str:
    """Where a bank of ``width`` x ``depth`` goes: LUTRAM when 64 deep or less (one LUT6 a bit,
    UG574), else the cheaper of BRAM and URAM in share of a U250's blocks (UG573 modes)."""
    if depth <= 64:
        return "lutram"
    from .memory_blocks import bram18_units, uram_blocks

    b = bram18_units(width, depth) / (2 * 2304)
    u = uram_blocks(width, depth) / 1280
    return "uram" if u < b else "bram"


def stage_tiles(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]], style: str,
                samples: int, iteration_vectors: int, board=None, fmt_bits: int = 16,
                uram: int | None = None) -> dict[str, "BwdTiles"]:
    """Every matrix layer's engines: ``style`` "tm" (a time-multiplexed kernel: one decision, its
    turns on one grid, one sample a turn) or "dataflow" (each layer its own engine at its
    folding, ``samples`` a call). layer name -> BwdTiles (the same object for all of a tm kernel).
    ``uram``: the URAMs the weight-gradient and weight stores' shares are of (None: the board's
    usable; fpga_models.bwd_memory.engine_uram: what the forward kernel leaves)."""
    if style == "tm":
        bt = decide(model, layers, folding, "tm", 1, iteration_vectors, board, fmt_bits, uram=uram)
        return {j.layer.name: bt for j in bt.jobs} if bt is not None else {}
    out = {}
    for l in layers:
        if l.type in ("dense", "conv2d"):
            bt = decide(model, [l], folding, "dataflow", samples, iteration_vectors, board, fmt_bits,
                        needed_from=layers)
            if bt is not None:
                out[l.name] = bt
    return out


def engine_folding(tiles: dict[str, "BwdTiles"], folding: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The (PE, SIMD) the backward kernel's streams use: a chunk job's beats (dy min(PE, MH), x and
    dx min(SIMD, MW) of its grid), a row job's (dy at the plan's PE, x and dx LR lanes); other
    layers as planned."""
    out = dict(folding)
    for name, bt in tiles.items():
        j = bt.job(name)
        if j is None:
            continue
        out[name] = (j.lpe, j.lsimd) if j.engine == "chunk" else (min(j.layer.pe, j.layer.mh), j.lsimd)
    return out


def decide(model: Model, layers: Sequence[Layer], folding: dict[str, tuple[int, int]], style: str,
           samples: int, iteration_vectors: int, board=None, fmt_bits: int = 16,
           needed_from: Sequence[Layer] | None = None, uram: int | None = None) -> BwdTiles | None:
    """The backward kernel's matrix engines (see :func:`stage_tiles`). ``iteration_vectors``:
    samples an accumulator sums in an iteration (micro-batches x the replica's micro-batch).
    ``needed_from``: the stage's layers when deciding one layer of it (dx as the stage has it);
    ``uram``: the URAMs WEIGHT_URAM_SHARE and ACC_URAM_SHARE are of (None: the board's usable).
    None when there is no matrix layer."""
    mats = matrix_layers(model, needed_from or layers, folding)
    names = {l.name for l in layers}
    mats = [m for m in mats if m.name in names]
    if not mats:
        return None
    tm = style == "tm"
    n = 1 if tm else max(1, samples)
    chunked = [m for m in mats if _is_chunk(m, n)]
    if tm:
        lanes = max(m.pe * m.simd for m in mats)
        pe, simd = choose_grid(mats, lanes, n)
    else:
        big = max(mats, key=lambda m: m.pe * m.simd)
        pe, simd = big.pe, big.simd
    lanes = pe * simd
    chunk = choose_chunk([(m.vec * n, _cdiv(m.mh, pe), _cdiv(m.mw, simd), m.dx) for m in chunked], lanes) \
        if chunked else CHUNK_RANGE[0]
    drain = _cdiv(lanes, chunk)
    dsteps = _cdiv(lanes, drain)
    dxw = [m for m in chunked if m.dx]
    if uram is None:
        uram = board.usable_uram if board is not None else 1280
    all_elems = sum(_cdiv(m.mh, pe) * _cdiv(m.mw, simd) * lanes for m in dxw)
    reuse = choose_reuse(lanes, chunk, all_elems) if dxw else 1
    words = _cdiv(_cdiv(lanes, reuse), WEIGHTS_PER_WORD)
    resident = not tm or words * _cdiv(all_elems // words // WEIGHTS_PER_WORD, 4096) <= WEIGHT_URAM_SHARE * uram
    if dxw and not resident:   # the store holds one turn's matrix: its reuse for that capacity
        reuse = choose_reuse(lanes, chunk, max(_cdiv(m.mh, pe) * _cdiv(m.mw, simd) * lanes for m in dxw))
    wl = _cdiv(lanes, reuse)
    wsteps = _cdiv(lanes, wl)
    # homes: the chunk layers' dW on chip, smallest first, while the store's banks (K of them, each
    # whole URAM288s of 4K rows: UG573) fit the share
    rows_cap = int(ACC_URAM_SHARE * uram) // drain * 4096
    used, home = 0, {}
    for m in sorted(chunked, key=lambda m: m.elems):
        rows = _cdiv(m.mh, pe) * _cdiv(m.mw, simd) * dsteps
        home[m.name] = not tm or used + rows <= rows_cap
        if home[m.name]:
            used += rows
    out = []
    store_row = abase = wbase = 0
    for m in mats:
        xb = acc_width(m.mh * (_kk(model, m) if m.kind == "conv2d" else 1))
        gb = acc_width(iteration_vectors * m.vec)
        if m in chunked:
            nf, sf = _cdiv(m.mh, pe), _cdiv(m.mw, simd)
            wsimd, xr = window_pace(m, min(simd, m.mw), nf)
            j = Job(m, "chunk", nf, sf, min(pe, m.mh), min(simd, m.mw), gb, xb, "chip" if home[m.name] else "ddr",
                    store_base=store_row if home[m.name] else 0, wbase=wbase if (m.dx and resident) else 0,
                    abase=abase, wsimd=wsimd, xr=xr)
            if home[m.name]:
                store_row += nf * sf * dsteps
            abase += nf
            if m.dx and resident:
                wbase += nf * sf * wsteps
        else:
            lr = _row_lanes(m)
            big = m.elems > ROW_CHIP_ELEMS
            j = Job(m, "row", m.mh, _cdiv(m.mw, lr), min(m.pe, m.mh), lr, gb, xb, "keep" if big else "chip",
                    keep=iteration_vectors * m.vec if big else 0)
        out.append(j)
    tile_rows = _tile_rows(out, rows_cap - used, dsteps, pe)
    if not tile_rows:   # the grid cannot pass off chip: every dW stays on chip (its blocks say what it costs)
        out = [replace(j, home="chip", store_base=_rebase(out, j, dsteps)) if j.engine == "chunk" else j for j in out]
    out = [_with_passes(j, tile_rows, chunk, reuse, dsteps) if j.engine == "chunk" and j.home == "ddr" else j
           for j in out]
    lr = max((j.lsimd for j in out if j.engine == "row"), default=0)
    bt = BwdTiles(style, pe, simd, chunk, drain, dsteps, reuse, wl, wsteps, lr, tuple(out),
                  ("resident" if resident else "tile") if dxw else "none", samples=n)
    return _with_arrays(bt, model, fmt_bits)


def _kk(model: Model, m: MatrixLayer) -> int:
    l = model.layers[model.index[m.name]]
    k = l.attr.get("kernel", 1)
    return int(prod(k)) if not isinstance(k, int) else k * k


def _row_lanes(m: MatrixLayer) -> int:
    """LR of a row job: one 512-bit beat of weights a cycle (WEIGHTS_PER_BEAT: the weights read
    where they live); a divisor of MW."""
    lr = min(WEIGHTS_PER_BEAT, m.mw)
    while m.mw % lr:
        lr -= 1
    return lr


def _tile_rows(jobs, free_rows: int, dsteps: int, pe: int) -> int:
    """Store rows the off-chip homes' pass tile may take: what the share leaves, whole row blocks
    of the widest job, at least one."""
    need = [j for j in jobs if j.engine == "chunk" and j.home == "ddr"]
    if not need:
        return 0
    if pe * 16 > AXI_BITS:   # a dy row of the grid is wider than one 512-bit word: no off-chip passes
        return 0
    one = max(j.sf for j in need) * dsteps
    return max(one, free_rows // one * one)


def window_pace(m: MatrixLayer, lsimd: int, nf: int, pass_nf: int = 0) -> tuple[int, int]:
    """(the SIMD a conv's backward window generator is built for, the cycles between two x beats
    the loader takes): the narrowest generator (fewest line-buffer banks: ROWS x K x lanes) whose
    beats, widened to ``lsimd``, come at least every NF x (1 + dx) cycles (the chunk engine's x
    rate; an off-chip home's later passes, dW of ``pass_nf`` row blocks only, every ``pass_nf``)
    and whose image and window cycles fit the engine's; dense: (``lsimd``, 1)."""
    if not m.win:
        return lsimd, 1
    from .engines import conv_window_lanes

    c, _h, _w, kh, _kw, _sh, _sw, _ph, _pw = m.win
    own = nf * _cdiv(m.mw, lsimd) * m.vec * (2 if m.dx else 1)
    limit = nf * (2 if m.dx else 1) if not pass_nf else min(nf * (2 if m.dx else 1), pass_nf)
    for d in _divisors(lsimd):
        lanes, taps = conv_window_lanes(c, kh, d)
        if lsimd % (lanes * taps):
            continue
        xr = lsimd // (lanes * taps)
        if xr <= limit and window_cycles(m, d) <= own:
            return d, xr
    return lsimd, 1


def _rebase(jobs, j: Job, dsteps: int) -> int:
    """The store row where chunk job ``j`` starts when every chunk job's dW is on chip: the rows of
    the chunk jobs before it (layer order)."""
    base = 0
    for x in jobs:
        if x is j:
            return base
        if x.engine == "chunk":
            base += x.nf * x.sf * dsteps
    return base


def _with_passes(j: Job, tile_rows: int, chunk: int, reuse: int, dsteps: int) -> Job:
    """An off-chip home's passes: as many row blocks a pass as the tile holds, and enough that the
    first pass's dW steps outlast a dx group's beats (P x pass row blocks >= PX x NF)."""
    per_nf = j.sf * dsteps
    pass_nf = max(1, min(j.nf, tile_rows // per_nf), _cdiv(reuse * j.nf, chunk))
    passes = _cdiv(j.nf, pass_nf)
    wsimd, xr = window_pace(j.layer, j.lsimd, j.nf, pass_nf if passes > 1 else 0)
    return Job(j.layer, j.engine, j.nf, j.sf, j.lpe, j.lsimd, j.gb, j.xb, "ddr", passes, pass_nf,
               0, j.wbase, j.abase, wsimd, xr)


def _with_arrays(bt: BwdTiles, model: Model, bits: int) -> BwdTiles:
    """The memories the engines declare (what stage_bwd.cpp.j2 lays out and `bapipe check` reads)."""
    from dataclasses import replace

    chunk = [j for j in bt.jobs if j.engine == "chunk"]
    arrays: list[Array] = []
    if chunk:
        p, pe, simd = bt.chunk, bt.pe, bt.simd
        nfx = max(j.nf for j in chunk)
        sfx = max(j.sf for j in chunk)
        arrays.append(Array("dyc", bits, 2 * p * nfx, pe, _impl(bits, 2 * p * nfx)))
        arrays.append(Array("xc", bits, 2 * p * sfx, simd, _impl(bits, 2 * p * sfx)))
        gbx = max(j.gb for j in chunk)
        rows = sum(j.blocks * bt.drain_steps for j in chunk if j.home == "chip")
        tile = max((j.pass_nf * j.sf * bt.drain_steps for j in chunk if j.home == "ddr"), default=0)
        arrays.append(Array("aw", gbx, rows + tile, bt.drain, _impl(gbx, rows + tile)))
        arrays.append(Array("ab", gbx, sum(j.nf for j in chunk), pe, _impl(gbx, sum(j.nf for j in chunk))))
        dxj = [j for j in chunk if j.layer.dx]
        if dxj:
            xbx = max(j.xb for j in dxj)
            d = 2 * bt.reuse * max(j.sf for j in dxj)
            arrays.append(Array("dxo", xbx, d, simd, _impl(xbx, d)))
            # resident: every dx matrix at its base; tile: the largest, filled before each turn
            wrows = (sum(j.blocks for j in dxj) if bt.weights == "resident" else max(j.blocks for j in dxj)) * bt.wsteps
            words = _cdiv(bt.wlanes, WEIGHTS_PER_WORD)
            arrays.append(Array("wst", WEIGHTS_PER_WORD * bits, wrows, words, _impl(64, wrows), WEIGHTS_PER_WORD))
    rows = [j for j in bt.jobs if j.engine == "row"]
    if rows:
        lr = bt.row_lanes
        for j in rows:   # a row job's own dW sums: MH x SF rows of its LR lanes; or its kept vectors
            m = j.layer
            if j.home == "chip":
                d = m.mh * j.sf
                arrays.append(Array(f"aw_{m.name}", j.gb, d, j.lsimd, "lutram" if d <= 64 else "bram"))
            elif j.home == "keep":   # x: KEEP_X_PER_WORD elements a word, a bank a vector; dy: a bank a vector
                dx_ = _cdiv(m.mw, KEEP_X_PER_WORD)
                arrays.append(Array(f"xk_{m.name}", bits * KEEP_X_PER_WORD, dx_, j.keep,
                                    _impl(bits * KEEP_X_PER_WORD, dx_), KEEP_X_PER_WORD))
                arrays.append(Array(f"dyk_{m.name}", bits, m.mh, j.keep, _impl(bits, m.mh)))
        sfx = max(j.sf for j in rows)
        xbx = max(j.xb for j in rows)
        # two vectors' x and dx sums, a column group a row (the row loop's xr, dxr)
        arrays.append(Array("rx", bits, 2 * sfx, lr, _impl(bits, 2 * sfx)))
        arrays.append(Array("rdx", xbx, 2 * sfx, lr, _impl(xbx, 2 * sfx)))
    return replace(bt, arrays=tuple(arrays))


# ---------------------------------------------------------------- cycles and bytes


def chunk_cycles(bt: BwdTiles, j: Job, vectors: int, fresh: bool = False) -> int:
    """Cycles of one call of chunk job ``j`` over ``vectors`` vectors (the MAC loop's trips as
    codegen lays them out): per pass, the first chunk's load (P x max(NF, SF x XR) cycles: x beats
    come every XR cycles, the window's pace), every chunk's
    dW steps (the pass's blocks x P) and, in the first pass, its dx steps (all blocks x P), then the
    tail (the last drain and the last group's dx beats); an off-chip home's pass reads its tile
    (not on ``fresh``, the iteration's first call) and writes it back, ceil(K / 8) beats a row."""
    if vectors <= 0:
        return 0
    p = bt.chunk
    chunks = _cdiv(vectors, p)
    load = p * max(j.nf, j.sf * j.xr)
    tail = max(bt.drain_steps, bt.reuse * j.sf if j.layer.dx else 0)
    beats = _cdiv(bt.drain, SUMS_PER_BEAT)
    total = 0
    for k in range(j.passes):
        blk = j.pass_blocks(k)
        steps = blk * p + (j.blocks * p if (k == 0 and j.layer.dx) else 0)
        total += load + chunks * max(steps, load) + tail + LOOP_DEPTH
        if j.home == "ddr":   # the tile's read (not on the iteration's first call) and write loops, depth 2 each
            rows = blk * bt.drain_steps
            total += rows * beats * (1 if fresh else 2) + (2 if fresh else 4)
    return total


def row_cycles(bt: BwdTiles, j: Job, vectors: int) -> int:
    """Cycles of one call of row job ``j`` over ``vectors`` vectors (the row loop's trips): the first
    vector's load (its SF x beats, its MH / PE dy beats), per vector MH x SF steps (a row, LR
    columns a step: dW and dx lanes side by side), the last vector's SF dx beats, the loop's depth."""
    if vectors <= 0:
        return 0
    m = j.layer
    load = max(j.sf, _cdiv(m.mh, j.lpe))
    return load + vectors * m.mh * j.sf + j.sf + LOOP_DEPTH


def flush_cycles(bt: BwdTiles, j: Job) -> int:
    """Cycles the flush call spends writing job ``j``'s sums: the on-chip store, ceil(K/8) beats a
    row (chunk) or MH x MW / 8 beats (row engine on chip); the bias sums MH / 8; none for a dW
    already in its array."""
    db = _cdiv(j.layer.mh, SUMS_PER_BEAT) + LOOP_DEPTH
    if j.home == "keep":   # dW from the kept vectors, a 512-bit beat of sums a cycle (row_keep_dw)
        return j.layer.mh * _cdiv(j.layer.mw, SUMS_PER_BEAT) + LOOP_DEPTH + db
    if j.home == "ddr":
        return db
    if j.engine == "chunk":
        return j.blocks * bt.drain_steps * _cdiv(bt.drain, SUMS_PER_BEAT) + LOOP_DEPTH + db
    return _cdiv(j.layer.elems, SUMS_PER_BEAT) + LOOP_DEPTH + db


def job_cycles(bt: BwdTiles, j: Job, samples: int = 1) -> int:
    """A job's cycles for a call of ``samples`` samples."""
    v = j.layer.vec * samples
    return chunk_cycles(bt, j, v) if j.engine == "chunk" else row_cycles(bt, j, v)


def job_ddr_bytes(bt: BwdTiles, j: Job, samples: int = 1) -> dict[str, int]:
    """Off-chip bytes of a call: "dw" the dW tiles read and written (off-chip homes; the row
    engine's sums), "w" the weights a row engine streams, "dy" an off-chip pass's dy copy."""
    out = {"dw": 0, "w": 0, "dy": 0}
    m = j.layer
    if j.home == "ddr":
        out["dw"] = 2 * m.elems * WSUM_BITS // 8
    if j.engine == "row" and m.dx:
        out["w"] = m.vec * samples * m.elems * 2
    if j.engine == "chunk" and j.passes > 1:
        out["dy"] = j.passes * m.vec * samples * m.mh * 2
    return out


def fill_cycles(bt: BwdTiles, j: Job) -> int:
    """Cycles of job ``j``'s weight-store fill (wst_fill: one 512-bit beat a cycle, a row when its KW
    weights are in): a tile kernel pays it before every turn of the job, a resident one once an
    iteration (its first call), 0 for a job without dx."""
    if j.engine != "chunk" or not j.layer.dx:
        return 0
    return j.blocks * bt.wsteps * _cdiv(bt.wlanes, WEIGHTS_PER_BEAT) + LOOP_DEPTH


def turn_cycles(bt: BwdTiles, j: Job, samples: int = 1) -> int:
    """Cycles a call of job ``j`` takes in its kernel: its engine's loops (or its window generator
    beside it, when slower), plus its weight fill when the store holds one turn's matrix at a time
    (the fill runs before the turn)."""
    own = job_cycles(bt, j, samples)
    if j.engine == "chunk":   # its window generator runs beside it (the turn's other engines), once a pass
        own = max(own, window_cycles(j.layer, j.wsimd or j.lsimd) * samples * j.passes)
    return own + (fill_cycles(bt, j) if bt.weights == "tile" else 0)


def engine_extra_cycles(tiles: dict[str, BwdTiles], plan_cycles: dict[str, int], samples: int = 1) -> int:
    """Backward cycles a call of ``samples`` samples takes in the tiled engines beyond the plan's
    per-layer figure (``plan_cycles``: layer -> its backward cycles at the plan's folding, a call):
    what the planner adds to a time-multiplexed stage's backward (its turns run one after another)."""
    seen, extra = set(), 0
    for name, bt in tiles.items():
        j = bt.job(name)
        if j is None or name in seen:
            continue
        seen.add(name)
        extra += turn_cycles(bt, j, samples) - int(plan_cycles.get(name, 0))
    return extra


def kernel_dsp(tiles: dict[str, BwdTiles], dsp_per_mac: float = 1.0) -> int:
    """DSP48E2 slices of a backward kernel's matrix engines: per chunk grid its two arrays (dW and
    dx; one without any dx job), per row engine its two arrays of LR lanes (UG579: a 16 x 16
    product in one DSP48E2; ``dsp_per_mac`` the board's figure)."""
    total, seen = 0, set()
    for bt in tiles.values():
        if id(bt) in seen:
            continue
        seen.add(id(bt))
        chunk = [j for j in bt.jobs if j.engine == "chunk"]
        if chunk:
            total += bt.lanes * (2 if any(j.layer.dx for j in chunk) else 1)
        if any(j.engine == "row" for j in bt.jobs):
            total += 2 * bt.row_lanes
        # a kept job's flush: SUMS_PER_BEAT sums a cycle, each over its kept vectors
        total += sum(SUMS_PER_BEAT * j.keep for j in bt.jobs if j.home == "keep")
    return int(math.ceil(total * dsp_per_mac))


def kernel_blocks(tiles: dict[str, BwdTiles]) -> Blocks:
    """The matrix engines' memories of a backward kernel in blocks (memory_blocks, UG573)."""
    total, seen = Blocks(), set()
    for bt in tiles.values():
        if id(bt) not in seen:
            seen.add(id(bt))
            total = total + bt.blocks
    return total


# ---------------------------------------------------------------- col2im and frames

#: lanes a time-multiplexed kernel's col2im emits at most: a conv's input gradient leaves a few
#: elements a cycle (its turn is long), the reading turn widens it [design choice; priced:
#: :func:`col2im_reader_extra`]
COL2IM_OUT_LANES = 32


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    """Divisors of ``n`` in increasing order (asked for the same channel counts thousands of
    times a search: resnet50's col2im plans)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


@dataclass(frozen=True)
class Col2im:
    """A conv's input-gradient col2im as built: input beats of ``lin`` exact sums (resized down from
    the engine's ``lsimd`` when a beat may take NF cycles), ``lout`` emitted a beat, over a row
    buffer of ``rows`` x ``wc`` sums banked ``rows`` x ``chans`` (a beat's elements are
    consecutive in a row: UG573 two ports a bank, one add and one emit a cycle)."""

    layer: str
    lsimd: int
    lin: int
    lout: int
    rows: int
    wc: int
    xb: int

    @property
    def chans(self) -> int:
        return max(self.lin, self.lout)


def col2im_plan(layer: Layer, job: Job, want: int, tm: bool) -> Col2im:
    """The col2im of conv ``layer`` (its chunk ``job``; ``want``: the lanes its gradient's reader
    takes). LIN: the fewest lanes a beat can be cut into while the MAC's dx beats (one every NF
    cycles) keep flowing, dividing C when one does (a beat then stays in one tap); LOUT: the reader's
    lanes, at most COL2IM_OUT_LANES in a time-multiplexed kernel, dividing W x C."""
    c, _h, w = layer.in_shapes[0]
    k = layer.attr["kernel"]
    s = layer.attr["stride"]
    kh = k[0] if not isinstance(k, int) else k
    sh = s[0] if not isinstance(s, int) else s
    ls = job.lsimd
    cands = [d for d in _divisors(ls) if ls // d <= max(1, job.nf)]
    fit = [d for d in cands if c % d == 0]
    lin = min(fit) if fit else min(cands)
    cap = min(want, COL2IM_OUT_LANES) if tm else want
    lout = max(d for d in _divisors(w * c) if d <= max(1, cap))
    return Col2im(layer.name, ls, lin, lout, kh + sh, w * c, job.xb)


def col2im_buffer(plans: Sequence[Col2im], tm: bool) -> list[Array]:
    """The col2im row buffers: one shared by a time-multiplexed kernel's turns (they never run at
    once: the largest rows x W*C, the widest sums, the most banks), else one a layer."""
    if not plans:
        return []
    if tm:
        rows, wc = max(p.rows for p in plans), max(p.wc for p in plans)
        xb, chans = max(p.xb for p in plans), max(p.chans for p in plans)
        depth = _cdiv(wc, chans)
        return [Array("lb", xb, depth, rows * chans, _impl(xb, depth))]
    return [Array(f"lb_{p.layer}", p.xb, _cdiv(p.wc, p.chans), p.rows * p.chans, _impl(p.xb, _cdiv(p.wc, p.chans)))
            for p in plans]


def col2im_reader_extra(plans: Sequence[Col2im], elems: dict[str, int], reader_lanes: dict[str, int]) -> int:
    """Cycles a sample a time-multiplexed kernel's turns reading a col2im's gradient spend beyond
    their planned lanes: the frame arrives LOUT lanes a beat, N / LOUT beats (``elems``: the
    conv's input elements; ``reader_lanes``: the reading layer's planned lanes, per conv)."""
    extra = 0
    for p in plans:
        n = elems.get(p.layer, 0)
        lanes = reader_lanes.get(p.layer, p.lout)
        if lanes > p.lout:
            extra += _cdiv(n, p.lout) - _cdiv(n, lanes)
    return extra


def fifo_storage(width: int, depth: int) -> str:
    """Where a whole-frame FIFO between a time-multiplexed kernel's turns goes: the cheaper of BRAM
    and URAM in share of the board's blocks (UG573 modes; an hls::stream takes BIND_STORAGE,
    UG1399), LUTs for a short one."""
    from .memory_blocks import AUTO_SRL_MAX_BITS, AUTO_SRL_MAX_DEPTH

    if depth <= AUTO_SRL_MAX_DEPTH or width * depth <= AUTO_SRL_MAX_BITS:
        return "srl"
    return _impl(width, depth) if depth > 64 else "lutram"


def kernel_flush_cycles(tiles: dict[str, BwdTiles]) -> int:
    """Cycles of a backward kernel's flush call (the iteration's end: every on-chip dW and the bias
    sums written out, :func:`flush_cycles`): a time-multiplexed kernel's turns flush one after
    another, a dataflow kernel's engines side by side."""
    seen, per = set(), []
    style = "tm"
    for name, bt in tiles.items():
        j = bt.job(name)
        if j is None or name in seen:
            continue
        seen.add(name)
        style = bt.style
        per.append(flush_cycles(bt, j))
    if not per:
        return 0
    return sum(per) if style == "tm" else max(per)


def steady_cycles(bt: BwdTiles, j: Job) -> int:
    """A dataflow engine's cycles a sample once running (its per-call load and tail aside): a chunk
    engine's NF x SF steps a vector, twice with dx (or its window generator's, when slower); a row
    engine's MH x SF steps a vector."""
    m = j.layer
    if j.engine == "chunk":
        return max(j.blocks * m.vec * (2 if m.dx else 1), window_cycles(m, j.wsimd or j.lsimd))
    return m.vec * m.mh * j.sf
