"""Off-chip weights of a stage kernel: 512-bit bursts into packed on-chip weight banks.

A stage whose weights live in off-chip memory (training, or an inference stage beyond on-chip
ROM: fpga_models.allocate.weights_offchip) reads each MVU's m_axi array as ``ap_uint<512>``
words in bursts (one word a cycle in one pipelined loop). On chip the weights are packed the
way the primitives want them (finn-hlslib's weights as SIMD-wide words per PE;
fpga_models.memory_blocks.WeightBanks): one PE x SIMD weight word a cycle is read from
``lanes / (2E)`` banks of E-element words (72 bits: a URAM288 word, a RAMB36E2's 512 x 72),
two bank words per bank on its two ports (one when a bank word holds the whole weight word),
``rom_t buf[H][B][D][E]`` with dims 1 (halves) and 2 (banks) partitioned and dim 4 reshaped
into one word (``bapipe::w_banks``). A time-multiplexed
kernel's shared array reads every MVU turn's word through the same lanes (lane p*SIMD + s),
so the banks are the kernel's, sized for its widest turn.

- when all the stage's matrices fit what two tiles may take (fpga_models.allocate
  .weights_all_resident), they stay on chip for the whole call: one buffer ``s<i>_wbuf``
  (H = 1, the matrices' words one after another) filled at the start of every call by ONE
  process (``s<i>_wload``, a turn of its own, ``once``), reading the ports one after another:
  one writer per buffer (UG1399, dataflow canonical form); no traffic per sample; otherwise:
- a matrix small enough to be a tile (fpga_models.allocate.weight_resident) is held on chip
  for its turn in one half of a ping-pong buffer ``s<i>_wbuf`` (H = 2, halves of the largest
  such matrix): ``bapipe::weight_fetch_banks`` fills the half the next MVU turn reads while
  this turn's MVU computes on the other (a process of the turn's DATAFLOW region); the first
  matrix is fetched by a turn of its own before the first MVU turn of every sample (the fill);
- a bigger matrix streams: ``bapipe::weight_stream`` reads it once per input vector into a
  two-deep FIFO of PE x SIMD words which ``bapipe::mvu_fifo`` consumes, one word a cycle.
- a trained bias (an m_axi array the update rewrites) is copied on chip once a call, beside
  the weights, into PE banks (``bapipe::bias_copy``): no m_axi read inside an II=1 loop.

A dataflow stage (every layer its own engine) gives each MVU its own packed buffer, all filled
by one load process at the start of every call (:func:`load_weights_once`).

Cycles: fpga_models.engines.weight_tiles_cycles / weight_stream_beats, priced by the planner
through fpga_models.allocate.tm_spill_cycles (tm_weight_turns); the banks and their blocks
are fpga_models.memory_blocks.weight_banks, which the planner prices too
(fpga_models.allocate.tm_weight_blocks). Nothing here decides hardware beyond that rule:
shapes, folding and the budget come from the Design and fpga_models.allocate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from bapipe.fpga_models.allocate import weight_resident, weights_all_resident
from bapipe.fpga_models.engines import DDR_WORD_BITS, weight_words
from bapipe.fpga_models.memory_blocks import storage_impl, weight_banks

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


#: bytes up to which an on-chip weight copy of the backward kernel is BRAM rather than URAM (one
#: URAM288 holds 36,864 bytes; a smaller matrix would waste most of one) [design choice]
BRAM_COPY_BYTES = 36_864


def _usable(board) -> dict:
    """The board's usable BRAM36 and URAM (storage_impl's comparison), a U250's without one."""
    return {} if board is None else {"usable_bram36": board.usable_bram36, "usable_uram": board.usable_uram}


def _banked(name: str, calls: list[MvuCall], words: int, halves: int, elem_bits: int, board):
    """The packed buffer ``name`` for the matrices of ``calls`` (fpga_models.memory_blocks.weight_banks):
    ``words`` weight words a half, as many lanes as the widest PE x SIMD."""
    from bapipe.codegen.design.kernel_types import Rom

    wb = weight_banks(max(m.pe * m.simd for m in calls), elem_bits, words, halves,
                      sorted({m.pe * m.simd for m in calls}), DDR_WORD_BITS // elem_bits, **_usable(board))
    return Rom(name, (halves, wb.banks, wb.depth, wb.elems), np.zeros(0, dtype=np.int64), (), wb.impl,
               buffer=True, banks=wb.banks, bank=wb)


def _words(m: MvuCall) -> int:
    """Weight words of a matrix (NF * SF PE x SIMD words)."""
    return m.elems // (m.pe * m.simd)


def stream_weights(es, mvus: dict, budget: int | None, elem_bits: int, index: int, board=None) -> dict[str, str]:
    """Rewrite a time-multiplexed EngineStage ``es`` (codegen.design.tm_kernel) whose MVU weights are
    m_axi arrays (``mvus``: weight array name -> MvuCall) to fetch them in 512-bit bursts: the
    arrays become packed words (``Rom.word_bits``), each MVU turn reads its tile or FIFO, the
    ping-pong buffer is a Rom of the kernel (``buffer``) and the fill a turn of its own; trained
    biases are copied on chip once a call. Returns the MVU calls it replaced (old call -> new call)."""
    from bapipe.codegen.design.kernel_types import UnitFn, VStream

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
        return _all_resident(es, order, roms, index, renamed, elem_bits, board)
    res = [(u, wn, m) for u, wn, m in order if weight_resident(m.elems, eb, budget, m.vectors)]
    buf = None
    if res:
        buf = _banked(f"s{index}_wbuf", [m for _u, _w, m in res], max(_words(m) for _u, _w, m in res), 2,
                      elem_bits, board)
        es.roms.append(buf)
    for j, (u, wn, m) in enumerate(res):
        _replace(u, m.call, _tile_call(m, buf, j % 2, 0), renamed)
        if j + 1 < len(res):   # fetch the next MVU turn's matrix into the other half meanwhile
            _nu, nwn, nm = res[j + 1]
            u.calls.append(_fetch(nwn, buf, (j + 1) % 2, 0, nm))
    if res:   # the fill: the first matrix, fetched by a turn of its own before the first MVU turn
        _u0, wn0, m0 = res[0]
        fill = UnitFn(f"s{index}_wfill", [], [], [_fetch(wn0, buf, 0, 0, m0)], [roms[wn0], buf])
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
    loads = _bias_copies(es, order, roms, renamed, elem_bits, board)
    if loads:   # the biases: one process of their own, once a call, before the turns
        es.units.insert(0, UnitFn(f"s{index}_bload", [], [], loads, [], once=True, sequential=True))
    _unit_roms(es)
    return renamed


def _unit_roms(es) -> None:
    """Each turn takes the arrays its calls name (m_axi arrays, the buffers)."""
    for u in es.units:
        u.roms = [r for r in es.roms if (r.external or r.buffer) and any(_names(c, r.name) for c in u.calls)]


def load_weights_once(es, mvus: dict, elem_bits: int, index: int, board=None) -> dict[str, str]:
    """A dataflow EngineStage ``es`` whose MVU weights are m_axi arrays (``mvus``: weight array
    -> MvuCall): every MVU reads a packed on-chip copy of its matrix (its own buffer: all the
    layers compute at once; fpga_models.memory_blocks.weight_banks, as many lanes as its PE x
    SIMD), which the kernel fills at the start of every call from its m_axi array, read as
    512-bit words in bursts (``es.loads``: ``bapipe::weight_fetch_banks`` calls, run one after
    another by one process before the engines' DATAFLOW region); the MVU reads it one PE x
    SIMD word a cycle (``bapipe::mvu_banks``) instead of scalar m_axi reads inside its II=1
    loop. Per call, not per sample: the training update kernel rewrites the arrays between
    calls. Returns the MVU calls it replaced (old call -> new call)."""
    roms = {r.name: r for r in es.roms}
    renamed: dict[str, str] = {}
    for wn, m in mvus.items():
        if not roms[wn].external or m.call not in es.calls:
            continue
        roms[wn].word_bits, roms[wn].words = DDR_WORD_BITS, weight_words(roms[wn].size, elem_bits)
        buf = _banked(f"{m.inst}_wt", [m], _words(m), 1, elem_bits, board)
        buf.copy_of = ""
        es.roms.append(buf)
        new = _tile_call(m, buf, 0, 0)
        es.calls[es.calls.index(m.call)] = new
        renamed[m.call] = new
        es.loads.append(_fetch(wn, buf, 0, 0, m).replace("(long)n)", "1L)"))
        es.load_roms.append(roms[wn])
        if roms[m.bias].external:   # a trained bias (the update rewrites it): on chip too
            copy, load = _bias_copy(roms[m.bias], m, elem_bits, board)
            es.roms.append(copy)
            es.loads.append(load)
            es.load_roms.append(roms[m.bias])
            new = _bias_call(new, roms[m.bias].name, copy.name)
            es.calls[es.calls.index(renamed[m.call])] = new
            renamed[m.call] = new
    return renamed


def _bias_copy(bias, m: MvuCall, elem_bits: int, board):
    """The on-chip copy of MVU ``m``'s trained bias (PE banks: one row of PE a cycle) and the
    call filling it from the m_axi array, BIAS_WORD_BITS a beat (``bapipe::bias_copy``): no m_axi
    read inside the MVU's II=1 loop (UG1399: one read a cycle per m_axi port)."""
    from bapipe.codegen.design.kernel_types import Rom

    nf, pe = bias.shape
    impl = storage_impl(elem_bits, nf, pe, **_usable(board))
    copy = Rom(f"{m.inst}_bt", (nf, pe), np.zeros(0, dtype=np.int64), (2,), impl, buffer=True, banks=pe,
               copy_of=f"{m.inst}'s bias")
    bias.copied = True
    return copy, f"bapipe::bias_copy<{nf}, {pe}, {DDR_WORD_BITS}>({bias.name}, {copy.name})"


def _bias_call(call: str, bias: str, copy: str) -> str:
    """``call`` reading ``copy`` where it read ``bias``."""
    head, _, tail = call.rpartition(f", {bias}, ")
    return f"{head}, {copy}, {tail}"


def _bias_copies(es, order, roms, renamed: dict[str, str], elem_bits: int, board) -> list[str]:
    """The trained biases of a time-multiplexed kernel's MVU turns (tiles and streams) on chip:
    each turn's MVU call reads its copy; returns the copy calls."""
    loads = []
    for u, _wn, m in order:
        bias = roms.get(m.bias)
        if bias is None or not bias.external:
            continue
        copy, load = _bias_copy(bias, m, elem_bits, board)
        es.roms.append(copy)
        loads.append(load)
        call = renamed.get(m.call, m.call)
        new = _bias_call(call, bias.name, copy.name)
        u.calls[u.calls.index(call)] = new
        renamed[m.call] = new
    return loads


def copy_params(es, elem_bits: int, index: int, board=None) -> dict[str, str]:
    """Every other m_axi array an engine reads inside its II=1 loop (a training kernel's
    batchnorm scale and shift, ``[C/L][L]``) copied on chip once a call beside the weights, into
    L banks (``<name>_c``, ``bapipe::bias_copy``; UG1399: an m_axi port gives one beat a cycle,
    a bank two words): the engines read the copies. Time-multiplexed kernels copy in their
    once-a-call load process (``s<i>_wload``, else ``s<i>_bload``), dataflow kernels in their
    ``<stage>_wload``. Returns the calls it changed (old -> new)."""
    from bapipe.codegen.design.kernel_types import Rom, UnitFn

    todo = [r for r in es.roms if r.external and not r.word_bits and not r.copied and len(r.shape) == 2]
    renamed: dict[str, str] = {}
    if not todo:
        return renamed
    loads = []
    for r in todo:
        rows, lanes = r.shape
        copy = Rom(f"{r.name}_c", (rows, lanes), np.zeros(0, dtype=np.int64), (2,),
                   storage_impl(elem_bits, rows, lanes, **_usable(board)), buffer=True, banks=lanes, copy_of=r.name)
        r.copied = True
        es.roms.append(copy)
        loads.append(f"bapipe::bias_copy<{rows}, {lanes}, {DDR_WORD_BITS}>({r.name}, {copy.name})")
        pat = re.compile(rf"(?<=[(,] ){re.escape(r.name)}(?=[,)])|(?<=[(,]){re.escape(r.name)}(?=[,)])")
        calls = [es.calls] + [u.calls for u in es.units] + ([es.feed.calls] if es.feed is not None else [])
        for cs in calls:
            for k, c in enumerate(cs):
                if c.startswith(("bapipe::bias_copy", "bapipe::weight_fetch")):
                    continue
                new = pat.sub(copy.name, c)
                if new != c:
                    renamed[c] = new
                    cs[k] = new
    for old in list(renamed):   # a call that named two arrays changed twice: old -> its last form
        while renamed[old] in renamed:
            renamed[old] = renamed[renamed[old]]
    if not es.units:   # a dataflow kernel: its one load process
        es.loads += loads
        es.load_roms += todo
        return renamed
    load = next((u for u in es.units if u.once and u.sequential), None)
    if load is None:
        load = UnitFn(f"s{index}_bload", [], [], [], [], once=True, sequential=True)
        es.units.insert(0, load)
    load.calls += loads
    _unit_roms(es)
    return renamed


def _all_resident(es, order, roms, index: int, renamed: dict[str, str], elem_bits: int, board) -> dict[str, str]:
    """Every matrix stays on chip for the call: one packed buffer holding their weight words one
    after another, filled at the start of the call by one process (a turn of its own,
    ``once``) reading the ports one after another, then copying the trained biases; each MVU
    reads its part."""
    from bapipe.codegen.design.kernel_types import UnitFn

    buf = _banked(f"s{index}_wbuf", [m for _u, _w, m in order], sum(_words(m) for _u, _w, m in order), 1,
                  elem_bits, board)
    es.roms.append(buf)
    off, loads = 0, []
    for u, wn, m in order:
        _replace(u, m.call, _tile_call(m, buf, 0, off), renamed)
        loads.append(_fetch(wn, buf, 0, off, m))
        off += _words(m)
    loads += _bias_copies(es, order, roms, renamed, elem_bits, board)
    es.units.insert(0, UnitFn(f"s{index}_wload", [], [], loads, [roms[wn] for _u, wn, _m in order] + [buf],
                              once=True, sequential=True))
    _unit_roms(es)
    return renamed


def _b(x: bool) -> str:
    return "true" if x else "false"


def _tile_call(m: MvuCall, buf, half: int, woff: int) -> str:
    h, b, d, e = buf.shape
    return (f"bapipe::mvu_banks<{m.mh}, {m.mw}, {m.pe}, {m.simd}, {_b(m.relu)}, {h}, {b}, {d}, {e}, {buf.bank.ports}>"
            f"({m.src}, {m.dst}, {buf.name}, {half}, {woff}L, {m.bias}, (long)n * {m.vectors})")


def _fetch(wn: str, buf, half: int, woff: int, m: MvuCall) -> str:
    h, b, d, e = buf.shape
    return (f"bapipe::weight_fetch_banks<{h}, {b}, {d}, {e}, {buf.bank.ports}, {m.pe * m.simd}, {DDR_WORD_BITS}>"
            f"({wn}, {buf.name}, {half}, {woff}L, {m.elems}L, (long)n)")


def _replace(u, old: str, new: str, renamed: dict[str, str]) -> None:
    u.calls[u.calls.index(old)] = new
    renamed[old] = new


def _names(call: str, name: str) -> bool:
    """The call passes array ``name`` as an argument (any position, the last too)."""
    return re.search(rf"[(,]\s*{re.escape(name)}\s*[,)]", call) is not None
