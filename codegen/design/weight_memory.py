"""Off-chip weights of a time-multiplexed stage kernel: 512-bit bursts into on-chip tiles.

A time-multiplexed stage whose weights live in off-chip memory (training, or an inference
stage beyond on-chip ROM: fpga_models.allocate.weights_offchip) reads each MVU's m_axi array
as ``ap_uint<512>`` words, its own bundle, in bursts (one word a cycle in one pipelined loop):

- when all the stage's matrices fit what two tiles may take (fpga_models.allocate
  .weights_all_resident), they stay on chip for the whole call: one buffer
  ``s<i>_wbuf[1][sum]`` filled at the start of every call by a turn of its own (``once``)
  that reads all the ports at once; no traffic per sample (what the RTL's on-chip weights
  cost too); otherwise:
- a matrix small enough to be a tile (fpga_models.allocate.weight_resident) is held on chip
  for its turn in one half of a ping-pong buffer ``s<i>_wbuf[2][N]`` (N: the largest such
  matrix of the stage, one buffer for all the turns): ``bapipe::weight_fetch`` fills the half
  the next MVU turn reads while this turn's MVU computes on the other (a process of the turn's
  DATAFLOW region); the first matrix is fetched by a turn of its own before the first MVU
  turn of every sample (the fill); ``bapipe::mvu_tile`` reads its half;
- a bigger matrix streams: ``bapipe::weight_stream`` reads it once per input vector into a
  two-deep FIFO of PE x SIMD words which ``bapipe::mvu_fifo`` consumes, one word a cycle.

Cycles: fpga_models.engines.weight_tiles_cycles / weight_stream_beats, priced by the planner
through fpga_models.allocate.tm_spill_cycles (tm_weight_turns); the buffer's bytes are the
Design's (codegen.design.onchip counts the buffer as an on-chip array). Nothing here decides
hardware beyond that rule: shapes, folding and the budget come from the Design and
fpga_models.allocate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bapipe.fpga_models.allocate import weight_resident, weights_all_resident
from bapipe.fpga_models.engines import DDR_WORD_BITS, weight_words

#: bursts of the weight ports: 64 beats of 512 bits (4 KiB, the AXI4 burst boundary; AMD UG1399,
#: "Optimizing Burst Transfers": max_read_burst_length up to 256, 4 KiB per burst)
WEIGHT_BURST = 64


@dataclass
class MvuCall:
    """One MVU engine call of the lowering (codegen.design.tm_kernel), as its weight source needs it."""

    call: str        # the call string the lowering wrote
    mh: int
    mw: int
    pe: int
    simd: int
    relu: bool
    vectors: int     # input vectors per sample
    src: str         # input stream
    dst: str         # output stream
    bias: str        # bias array
    inst: str        # Design node

    @property
    def elems(self) -> int:
        """Elements of the weight matrix."""
        return self.mh * self.mw


def stream_weights(es, mvus: dict, budget: int | None, elem_bits: int, index: int) -> dict[str, str]:
    """Rewrite a time-multiplexed EngineStage ``es`` (codegen.design.tm_kernel) whose MVU weights are
    m_axi arrays (``mvus``: weight array name -> MvuCall) to fetch them in 512-bit bursts: the
    arrays become packed words (``Rom.word_bits``), each MVU turn reads its tile or FIFO, the
    ping-pong buffer is a Rom of the kernel (``buffer``) and the fill a turn of its own.
    Returns the MVU calls it replaced (old call -> new call)."""
    from bapipe.codegen.design.kernel_types import Rom, UnitFn, VStream

    eb = -(-elem_bits // 8)
    epw = DDR_WORD_BITS // elem_bits
    roms = {r.name: r for r in es.roms}
    order = []   # (unit, weight array, MvuCall) in turn order
    for u in es.units:
        for c in u.calls:
            for wn, m in mvus.items():
                if c == m.call and roms[wn].external:
                    order.append((u, wn, m))
    if not order:
        return {}
    renamed: dict[str, str] = {}
    for _u, wn, _m in order:
        roms[wn].word_bits, roms[wn].words = DDR_WORD_BITS, weight_words(roms[wn].size, elem_bits)
    if weights_all_resident([m.elems for _u, _w, m in order], eb, budget):
        return _all_resident(es, order, roms, index, renamed)
    res = [(u, wn, m) for u, wn, m in order if weight_resident(m.elems, eb, budget, m.vectors)]
    n_max = max((m.elems for _u, _w, m in res), default=0)
    buf = None
    if res:
        buf = Rom(f"s{index}_wbuf", (2, n_max), np.zeros(0, dtype=np.int64), (), "uram", buffer=True)
        es.roms.append(buf)
    for j, (u, wn, m) in enumerate(res):
        _replace(u, m.call, _tile_call(m, buf, j % 2, 0), renamed)
        if j + 1 < len(res):   # fetch the next MVU turn's matrix into the other half meanwhile
            _nu, nwn, nm = res[j + 1]
            u.calls.append(_fetch(nwn, buf, (j + 1) % 2, 0, nm.elems))
    if res:   # the fill: the first matrix, fetched by a turn of its own before the first MVU turn
        _u0, wn0, m0 = res[0]
        fill = UnitFn(f"s{index}_wfill", [], [], [_fetch(wn0, buf, 0, 0, m0.elems)], [roms[wn0], buf])
        first = next(k for k, u in enumerate(es.units) if u is res[0][0])
        es.units.insert(first, fill)
    for u, wn, m in order:
        if weight_resident(m.elems, eb, budget, m.vectors):
            continue
        ps = m.pe * m.simd
        if ps % epw and epw % ps:
            raise ValueError(f"stage {index}: {m.inst} streams its {m.elems} weights in PE x SIMD = {ps} words, "
                             f"which neither divide nor are multiples of a {DDR_WORD_BITS}-bit word's {epw}")
        ws = f"{m.inst}_ws"
        call = (f"bapipe::mvu_fifo<{m.mh}, {m.mw}, {m.pe}, {m.simd}, {_b(m.relu)}>"
                f"({m.src}, {m.dst}, {ws}, {m.bias}, (long)n * {m.vectors})")
        _replace(u, m.call, call, renamed)
        u.calls.insert(u.calls.index(call),
                       f"bapipe::weight_stream<{ps}, {DDR_WORD_BITS}>({wn}, {ws}, {m.elems}L, (long)n * {m.vectors})")
        u.streams = sorted(u.streams + [VStream(ws, ps, 2)], key=lambda v: v.name)
    for u in es.units:   # each turn takes the arrays its calls name (m_axi arrays, the buffer)
        u.roms = [r for r in es.roms if (r.external or r.buffer) and any(_names(c, r.name) for c in u.calls)]
    return renamed


#: bytes up to which a dataflow MVU's on-chip weight copy is BRAM rather than URAM (one URAM288
#: holds 36,864 bytes; a smaller matrix would waste most of one) [design choice]
BRAM_COPY_BYTES = 36_864


def load_weights_once(es, mvus: dict, elem_bits: int, index: int) -> dict[str, str]:
    """A dataflow EngineStage ``es`` whose MVU weights are m_axi arrays (``mvus``: weight array
    -> MvuCall): every MVU reads an on-chip copy of its matrix (its own buffer: all the layers
    compute at once), which the kernel fills at the start of every call from its m_axi array,
    read as 512-bit words in bursts (``es.loads``: ``bapipe::weight_fetch`` calls, one DATAFLOW
    region before the engines'); the MVU reads it as a tile (``bapipe::mvu_tile``), PE x SIMD
    elements a cycle, instead of scalar m_axi reads inside its II=1 loop. Per call, not per
    sample: the training update kernel rewrites the arrays between calls. Returns the MVU calls
    it replaced (old call -> new call)."""
    from bapipe.codegen.design.kernel_types import LUTRAM_WORDS, Rom

    eb = -(-elem_bits // 8)
    roms = {r.name: r for r in es.roms}
    renamed: dict[str, str] = {}
    for wn, m in mvus.items():
        if not roms[wn].external or m.call not in es.calls:
            continue
        roms[wn].word_bits, roms[wn].words = DDR_WORD_BITS, weight_words(roms[wn].size, elem_bits)
        # banks of a few words each are LUTRAM (as the ROMs: kernel_types.LUTRAM_WORDS): a BRAM18
        # a bank would hold 1,024 words
        impl = "lutram" if -(-m.elems // (m.pe * m.simd)) <= LUTRAM_WORDS else \
            "bram" if m.elems * eb <= BRAM_COPY_BYTES else "uram"
        # read PE x SIMD elements a cycle: that many banks (cyclic)
        buf = Rom(f"{m.inst}_wt", (1, m.elems), np.zeros(0, dtype=np.int64), (), impl, buffer=True, banks=m.pe * m.simd)
        es.roms.append(buf)
        new = _tile_call(m, buf, 0, 0)
        es.calls[es.calls.index(m.call)] = new
        renamed[m.call] = new
        es.loads.append(_fetch(wn, buf, 0, 0, m.elems).replace("(long)n)", "1L)"))
        es.load_roms.append(roms[wn])
        if roms[m.bias].external:   # a trained bias (the update rewrites it): on chip too
            new = _bias_copy(es, roms[m.bias], m, new)
            es.calls[es.calls.index(renamed[m.call])] = new
            renamed[m.call] = new
    return renamed


def _bias_copy(es, bias, m: MvuCall, call: str) -> str:
    """The MVU reads its bias from an on-chip copy (PE banks: one row of PE a cycle), filled
    beside the weights at the start of every call from the m_axi array, BIAS_WORD_BITS a beat
    (``bapipe::bias_copy``): no m_axi read inside the MVU's II=1 loop (UG1399: one read a cycle
    per m_axi port). Returns the MVU call reading the copy."""
    from bapipe.codegen.design.kernel_types import LUTRAM_WORDS, Rom

    nf, pe = bias.shape
    impl = "lutram" if nf <= LUTRAM_WORDS else "bram"
    copy = Rom(f"{m.inst}_bt", (nf, pe), np.zeros(0, dtype=np.int64), (), impl, buffer=True, banks=pe,
               copy_of=f"{m.inst}'s bias")
    es.roms.append(copy)
    es.loads.append(f"bapipe::bias_copy<{nf}, {pe}, {DDR_WORD_BITS}>({bias.name}, {copy.name})")
    es.load_roms.append(bias)
    bias.copied = True
    head, _, tail = call.rpartition(f", {bias.name}, ")
    return f"{head}, {copy.name}, {tail}"


def _all_resident(es, order, roms, index: int, renamed: dict[str, str]) -> dict[str, str]:
    """Every matrix stays on chip for the call: one buffer holding them one after another,
    filled at the start of the call by a turn of its own (``once``) whose DATAFLOW region reads
    all the ports at once; each MVU reads its part."""
    from bapipe.codegen.design.kernel_types import Rom, UnitFn

    total = sum(m.elems for _u, _w, m in order)
    buf = Rom(f"s{index}_wbuf", (1, total), np.zeros(0, dtype=np.int64), (), "uram", buffer=True)
    es.roms.append(buf)
    off, loads = 0, []
    for u, wn, m in order:
        _replace(u, m.call, _tile_call(m, buf, 0, off), renamed)
        loads.append(_fetch(wn, buf, 0, off, m.elems))
        off += m.elems
    es.units.insert(0, UnitFn(f"s{index}_wload", [], [], loads, [roms[wn] for _u, wn, _m in order] + [buf],
                              once=True))
    for u in es.units:
        u.roms = [r for r in es.roms if (r.external or r.buffer) and any(_names(c, r.name) for c in u.calls)]
    return renamed


def _b(x: bool) -> str:
    return "true" if x else "false"


def _tile_call(m: MvuCall, buf, half: int, off: int) -> str:
    h, n = buf.shape
    return (f"bapipe::mvu_tile<{m.mh}, {m.mw}, {m.pe}, {m.simd}, {_b(m.relu)}, {h}, {n}>"
            f"({m.src}, {m.dst}, {buf.name}, {half}, {off}L, {m.bias}, (long)n * {m.vectors})")


def _fetch(wn: str, buf, half: int, off: int, elems: int) -> str:
    h, n = buf.shape
    return f"bapipe::weight_fetch<{h}, {n}, {DDR_WORD_BITS}>({wn}, {buf.name}, {half}, {off}L, {elems}L, (long)n)"


def _replace(u, old: str, new: str, renamed: dict[str, str]) -> None:
    u.calls[u.calls.index(old)] = new
    renamed[old] = new


def _names(call: str, name: str) -> bool:
    """The call passes array ``name`` as an argument."""
    return f"({name}, " in call or f", {name}, " in call

