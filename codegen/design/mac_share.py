"""One MAC array per time-multiplexed kernel (the DSP rule): the MVU turns take it in turn.

The planner prices a time-multiplexed stage with ONE PE x SIMD array that its matrix layers
take turns on (fpga_models.allocate.engines_dsp: the largest layer's array; codegen.design.placement
states it as the kernel's DSP need). The lowering (codegen.design.tm_kernel) writes one MVU call per
layer turn, each with its own folding; read as Vitis would build it, that is one array per
layer (VGG-16's forward kernel: 45,248 MAC lanes against 3,072 planned). This pass, run on the
finished EngineStage when the kernel is rendered, takes the MVU calls out of the turns:

- the kernel gets one MAC function ``s<i>_mac`` with LANES multipliers (LANES: the largest
  PE x SIMD of its MVU turns); each MVU turn is a job of it, its folding (PE, SIMD, NF, SF),
  its input, output, weight source and bias chosen at run time by the turn index (a switch);
  one flattened II=1 loop of NF*SF cycles a vector, the same trip count as the MVU it
  replaces (the csim cycle counter sees the same loop);
- every MVU turn runs as ``s<i>_mvu_turn(t, ...)``: one DATAFLOW region of the turn's other
  engines (``s<i>_mvu_rest``: a switch calling the turn's function) beside the MAC function;
  the sequencer calls it from one call site (a loop over the turns, a switch for the others),
  so a Vitis build has one instance of it, and of the array.

Nothing here decides hardware: foldings, streams, depths and weight sources are the
lowering's; only where the MVU loop sits changes. ``mac_lanes`` reads the MAC lanes back from
generated C++ (one hardware instance per call site, as codegen.check.cxx_memory counts them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from bapipe.codegen.design.cxx_text import split_args

_MVU = re.compile(r"^bapipe::(mvu|mvu_tile|mvu_banks|mvu_fifo)<([^>]*)>\((.*)\)$")


class _Folding:
    """A matrix turn's folding (mh x mw on pe x simd lanes), shared by forward and backward jobs."""

    mh: int
    mw: int
    pe: int
    simd: int

    @property
    def nf(self) -> int:
        return self.mh // self.pe

    @property
    def sf(self) -> int:
        return self.mw // self.simd

    @property
    def lanes(self) -> int:
        return self.pe * self.simd


@dataclass
class MacJob(_Folding):
    """One MVU turn's use of the shared array."""

    turn: int            # the turn's index in the sequencer (t)
    kind: str            # "rom" (w[NF*SF][PE][SIMD]) | "tile" (a half of a flat buffer) | "banks" (a half of
                         # the packed weight buffer, fpga_models.memory_blocks.WeightBanks) | "fifo"
    mh: int
    mw: int
    pe: int
    simd: int
    relu: bool
    src: str             # input stream (SIMD lanes)
    dst: str             # output stream (PE lanes)
    weights: str         # the ROM / m_axi array, the buffer, or the weight FIFO
    bias: str
    vectors: str         # C expression: input vectors of the call
    half: int = 0        # tile: the buffer half
    off: str = "0L"      # tile: element offset
    buf_n: int = 0       # tile: elements of a half
    geom: tuple = ()     # banks: (banks, depth, elements a bank word, bank words a weight word)

    @property
    def source(self) -> str:
        """The C declaration of the weight source ``w`` (bapipe_engines.h: w_rom, w_tile, w_fifo)."""
        if self.kind == "rom":
            return f"bapipe::w_rom<{self.nf * self.sf}, {self.pe}, {self.simd}> w = {{{self.weights}, 0}}"
        if self.kind == "banks":
            b, d, e, ports = self.geom
            return (f"bapipe::w_banks<{b}, {d}, {e}, {ports}, {self.pe}, {self.simd}> w = "
                    f"{{{self.weights}[{self.half}], {self.off}, 0}}")
        if self.kind == "tile":
            return (f"bapipe::w_tile<{self.buf_n}, {self.pe}, {self.simd}> w = "
                    f"{{{self.weights}[{self.half}] + {self.off}, 0}}")
        return f"bapipe::w_fifo<{self.pe}, {self.simd}> w; w.ws = &{self.weights}"


@dataclass
class MacShare:
    """The render context of a kernel's shared array: its functions, their parameters, the jobs."""

    name: str                      # the MAC function
    turn_fn: str                   # the MVU turns' function
    rest_fn: str                   # the MVU turns' other engines
    lanes: int
    xw: int                        # the widest input beat (the largest SIMD)
    xb: int                        # elements of the kept input vector (the largest MW)
    yw: int                        # accumulators (the largest PE)
    jobs: list[MacJob]
    units: list                    # every turn function (UnitFn) in order, MVU turns without their MVU
    mvu_turns: list[int]           # sequencer indexes of the MVU turns
    streams: list                  # streams the MVU turns' function declares
    turn_params: list              # its stream parameters
    rest_params: list              # the rest function's stream parameters
    mac_params: list               # the MAC function's stream parameters
    roms: list = field(default_factory=list)       # m_axi arrays / buffers the MVU turns take
    mac_roms: list = field(default_factory=list)   # ... the MAC function reads
    frames: list = field(default_factory=list)
    stashes: list = field(default_factory=list)


def _uses(calls: list[str], name: str) -> bool:
    pat = re.compile(rf"\b{re.escape(name)}\b")
    return any(pat.search(c) for c in calls)


def _job(turn: int, call: str) -> MacJob | None:
    m = _MVU.match(call)
    if m is None:
        return None
    kind = {"mvu": "rom", "mvu_tile": "tile", "mvu_banks": "banks", "mvu_fifo": "fifo"}[m.group(1)]
    t = [a.strip() for a in m.group(2).split(",")]
    a = [x.strip() for x in m.group(3).split(",")]
    mh, mw, pe, simd, relu = int(t[0]), int(t[1]), int(t[2]), int(t[3]), t[4] == "true"
    if kind == "banks":
        return MacJob(turn, kind, mh, mw, pe, simd, relu, a[0], a[1], a[2], a[5], a[6], int(a[3]), a[4],
                      geom=(int(t[6]), int(t[7]), int(t[8]), int(t[9])))
    if kind == "tile":
        return MacJob(turn, kind, mh, mw, pe, simd, relu, a[0], a[1], a[2], a[5], a[6], int(a[3]), a[4], int(t[6]))
    return MacJob(turn, kind, mh, mw, pe, simd, relu, a[0], a[1], a[2], a[3], a[4])


def share_mac(es, index: int) -> MacShare | None:
    """The shared array of time-multiplexed EngineStage ``es`` (stage ``index``), or None when
    the kernel has no turns or no MVU turn (nothing to share)."""
    if es is None or not es.units:
        return None
    seq = [u for u in es.units if not u.once]
    jobs, units = [], []
    for t, u in enumerate(seq):
        found = [(c, j) for c in u.calls for j in [_job(t, c)] if j is not None]
        if len(found) != 1:   # no MVU (or, never lowered so, two): the turn stays as it is
            units.append(u)
            continue
        call, job = found[0]
        jobs.append(job)
        calls = [c for c in u.calls if c is not call]
        mine = {job.src, job.dst, job.weights}
        moved = [v for v in u.streams if v.name in mine]
        params = [v for v in u.params if _uses(calls, v.name)]
        params += [v for v in moved if _uses(calls, v.name)]
        local = [v for v in u.streams if v.name not in mine]
        roms = [r for r in u.roms if _uses(calls, r.name)]
        units.append(replace(u, params=sorted(params, key=lambda v: v.name), streams=local, calls=calls, roms=roms))
        units[-1].mac_moved = moved          # streams the MVU turns' function declares
        units[-1].mac_params = [v for v in u.params if v.name in mine]   # ... or takes from the turns
    if not jobs:
        return None
    mvu_turns = [j.turn for j in jobs]
    by_name = {u.name: u for u in units}
    every = [by_name.get(u.name, u) for u in es.units]   # the once-a-call turns too, in their order
    declared = {v.name: v for u in units for v in getattr(u, "mac_moved", [])}
    outer = {v.name: v for u in units for v in getattr(u, "mac_params", [])}
    mvu_units = [units[t] for t in mvu_turns]
    rest = {v.name: v for u in mvu_units for v in u.params}
    mac_names = {n for j in jobs for n in (j.src, j.dst, j.weights)}
    mac_params = [v for k, v in sorted({**declared, **outer}.items()) if k in mac_names]
    turn_params = {k: v for k, v in rest.items() if k not in declared}
    turn_params.update(outer)
    ext = [r for r in es.roms if r.external or r.buffer]
    mac_roms = [r for r in ext if any(r.name in (j.weights, j.bias) for j in jobs)]
    roms = [r for r in ext if r in mac_roms or any(r in u.roms for u in mvu_units)]
    frames = [f for f in es.frames if any(f in u.frames for u in mvu_units)]
    stashes = [b for b in es.stashes if any(b in u.stashes for u in mvu_units)]
    s = f"s{index}"
    return MacShare(f"{s}_mac", f"{s}_mvu_turn", f"{s}_mvu_rest", max(j.lanes for j in jobs),
                    max(j.simd for j in jobs), max(j.mw for j in jobs), max(j.pe for j in jobs), jobs, every, mvu_turns,
                    sorted(declared.values(), key=lambda v: v.name), [turn_params[k] for k in sorted(turn_params)],
                    [rest[k] for k in sorted(rest)], mac_params, roms, mac_roms, frames, stashes)


_ENGINE = re.compile(r"\bbapipe::(?:mvu|mvu_tile|mvu_banks|mvu_fifo)<\s*\d+\s*,\s*\d+\s*,\s*(\d+)\s*,\s*(\d+)\s*,")
_ARRAY = re.compile(r"\bbapipe::(?:mac_products|gmac_products|lane_products)<\s*(\d+)\s*>\s*\(")
_BWD_ENGINE = re.compile(r"\bbapipe::mvu_bwd<\s*\d+\s*,\s*\d+\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*([01])\s*,")


def mac_lanes(cpp: str) -> int:
    """MAC lanes a Vitis build of one generated kernel instantiates, read from its C++: each
    forward MVU call site is a PE x SIMD array (its template arguments), each backward
    ``mvu_bwd`` call site one for dW and, when it computes dx (DX = 1), one more; each shared
    array's ``mac_products`` / ``gmac_products`` call LANES multipliers (the kernel's MAC
    function, called from one site)."""
    body = re.sub(r"//[^\n]*", "", cpp)
    return (sum(int(p) * int(s) for p, s in _ENGINE.findall(body))
            + sum(int(p) * int(s) * (1 + int(d)) for p, s, d in _BWD_ENGINE.findall(body))
            + sum(int(k) for k in _ARRAY.findall(body)))


# ---------------------------------------------------------------- backward kernels

#: the two MAC arrays of a backward kernel's shared engine (fpga_models.allocate.BWD_ARRAYS):
#: the weight-gradient products dy x^T and the input-gradient products W^T dy
_MVU_BWD = re.compile(r"^bapipe::mvu_bwd<(.*)>\((.*)\)$")


def _decl_name(decl: str) -> str:
    """The parameter a C declaration names (``const data_t *st_fc``, ``bapipe::gacc<37> aw[10][64]``)."""
    return re.match(r"^.*?(\w+)\s*(\[[^&*]*\])*$", decl.strip()).group(1)


@dataclass
class BwdJob(_Folding):
    """One backward MVU turn's use of the shared weight-gradient and input-gradient arrays
    (what its ``bapipe::mvu_bwd`` call did on arrays of its own)."""

    turn: int
    mh: int
    mw: int
    pe: int
    simd: int
    dx: bool           # computes the input gradient (NF*SF more steps a vector)
    gb: int            # weight-gradient accumulator bits
    xb: int            # input-gradient accumulator bits
    wl: int            # sums a 512-bit beat when flushing
    depth: int         # the loop's pipeline depth (MVU_FILL)
    out: str           # the dx beat type
    dy: str
    x: str
    dxs: str
    w: str
    aw: str
    ab: str
    dw: str
    db: str
    vec: int           # vectors a sample

    @property
    def steps(self) -> int:
        return self.nf * self.sf * (2 if self.dx else 1)


def _bwd_job(turn: int, call: str) -> BwdJob | None:
    m = _MVU_BWD.match(call.strip())
    if m is None:
        return None
    t, a = split_args(m.group(1)), split_args(m.group(2))
    vec = int(re.match(r"^\(long\)n \* (\d+)$", a[8]).group(1))
    return BwdJob(turn, int(t[0]), int(t[1]), int(t[2]), int(t[3]), t[4] == "1", int(t[5]), int(t[6]), int(t[7]),
                  int(t[8]), t[9], *a[:8], vec)


@dataclass
class BwdMacShare:
    """The render context of a time-multiplexed backward kernel's shared arrays."""

    name: str                  # the MAC function
    turn_fn: str               # the MVU turns' function (one call site)
    rest_fn: str               # the MVU turns' other engines
    lanes_w: int               # weight-gradient lanes (the largest PE x SIMD)
    lanes_x: int               # input-gradient lanes (the largest PE x SIMD of a turn with dx; 0: none)
    mh: int                    # the largest MH (dy kept for the input gradient)
    mw: int                    # the largest MW (the input vector kept for the row folds)
    pe: int
    simd: int
    xb: int                    # the widest input-gradient accumulator
    depth: int
    jobs: list[BwdJob]
    turns: list                # every turn (BwdTurn) in order, the MVU turns without their mvu_bwd
    mvu_turns: list[int]
    streams: list              # streams the MVU turns' function declares (BStream)
    rest_params: list[str]     # C declarations
    mac_params: list[str]
    turn_params: list[str]

    @staticmethod
    def names(decls: list[str]) -> list[str]:
        return [_decl_name(d) for d in decls]


def share_bwd_mac(ctx, index: int) -> BwdMacShare | None:
    """The shared arrays of a time-multiplexed backward kernel (BwdCtx ``ctx`` with turns,
    codegen.design.backward), or None when it has no turns or no MVU turn.

    Every MVU turn's ``mvu_bwd`` becomes a job of one MAC function (``s<i>_bwd_mac``): one
    array of ``lanes_w`` multipliers for dW += dy x^T and one of ``lanes_x`` for dx = W^T dy
    (the Design's two backward arrays, each the largest layer's PE x SIMD), the job's folding
    chosen at run time by the turn index; one flattened II=1 loop of the same trip count as the
    ``mvu_bwd`` it replaces (vectors x NF*SF, twice with dx). The turns' other engines stay in
    their turn functions, called by ``s<i>_bwd_rest`` (a switch) beside the MAC function in one
    DATAFLOW region, ``s<i>_bwd_mvu_turn``, which the sequencer calls from one site."""
    from dataclasses import replace as _replace

    if ctx is None or not ctx.turns:
        return None
    jobs, turns, moved = [], [], {}
    for k, u in enumerate(ctx.turns):
        found = [(p, j) for p in u.processes for j in [_bwd_job(k, p)] if j is not None]
        if len(found) != 1:
            turns.append(u)
            continue
        call, job = found[0]
        jobs.append(job)
        rest = [p for p in u.processes if p is not call]
        mine = {job.dy, job.x, job.dxs}
        mv = [s for s in u.streams if s.name in mine]
        for s in mv:
            moved[s.name] = s
        text = "\n".join(rest)
        used = lambda n: re.search(rf"\b{re.escape(n)}\b", text) is not None   # noqa: E731
        pairs = [(d, a) for d, a in zip(u.params[:-2], u.args) if used(_decl_name(d))]
        pairs += [(f"hls::stream<{s.beat} > &{s.name}", s.name) for s in mv if used(s.name)]
        pairs.sort(key=lambda da: _decl_name(da[0]))
        turns.append(_replace(u, params=[d for d, _a in pairs] + ["int n", "int flush"], args=[a for _d, a in pairs],
                              streams=[s for s in u.streams if s.name not in mine], processes=rest))
    if not jobs:
        return None
    mvu_turns = [j.turn for j in jobs]
    before = {_decl_name(d): d for k in mvu_turns for d in ctx.turns[k].params[:-2]}   # the turns' parameters

    def decl_of(name: str) -> str:
        if name in moved:
            return f"hls::stream<{moved[name].beat} > &{name}"
        return before[name]
    rest = sorted({_decl_name(d) for k in mvu_turns for d in turns[k].params[:-2]})
    mac = sorted({n for j in jobs for n in (j.dy, j.x, j.dxs, j.w, j.aw, j.ab, j.dw, j.db)})
    outer = sorted((set(rest) | set(mac)) - set(moved))
    dxj = [j for j in jobs if j.dx]
    s = f"s{index}"
    return BwdMacShare(f"{s}_bwd_mac", f"{s}_bwd_mvu_turn", f"{s}_bwd_rest", max(j.lanes for j in jobs),
                       max((j.lanes for j in dxj), default=0), max(j.mh for j in jobs), max(j.mw for j in jobs),
                       max(j.pe for j in jobs), max(j.simd for j in jobs), max(j.xb for j in jobs),
                       max(j.depth for j in jobs), jobs, turns, mvu_turns,
                       sorted(moved.values(), key=lambda v: v.name),
                       [decl_of(n) for n in rest], [decl_of(n) for n in mac], [decl_of(n) for n in outer])
