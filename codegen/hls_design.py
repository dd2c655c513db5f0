"""A dataflow stage's HLS kernel read off its Design nodes (codegen.rtl_model lowering).

Every engine node (window generator, MVU, pool, batchnorm, ReLU, add, fork, width converter)
becomes one call of the streaming engine library (hls_templates/hls/bapipe_engines.h.j2) with
the node's lanes, folding and shapes; every wire becomes an ``hls::stream<vec<L>, DEPTH>``.
FIFO nodes are not processes: their depth goes onto the wire they sit on (skip FIFOs, MVU
input buffers). Link nodes are the kernel's ports. Nothing here decides hardware: lanes,
folding, depths and line buffers are the Design's (fpga_models.engines through the lowering).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Vitis HLS's default hls::stream depth (a wire with no FIFO node on it)
DEFAULT_DEPTH = 2
#: ROM words per bank up to which a weight bank is LUTRAM rather than BRAM (a BRAM18 holds
#: 1024 x 18 bit; a bank this shallow would waste most of one) [design choice]
LUTRAM_WORDS = 64
#: nodes that are wiring, not processes
_ALIASES = ("fifo", "link_rx", "link_tx", "gate")


@dataclass
class Rom:
    """One constant array of the kernel: C name, shape, raw values, storage."""

    name: str
    shape: tuple[int, ...]
    values: np.ndarray
    partition_dims: tuple[int, ...] = ()   # 1-based dims split completely into registers/banks
    impl: str = "bram"                     # BIND_STORAGE impl of each bank

    @property
    def dims(self) -> str:
        """C array dimensions, e.g. ``[64][8][9]``."""
        return "".join(f"[{d}]" for d in self.shape)

    def text(self) -> str:
        """The C initializer of the raw integers, nested by dims."""

        def walk(a: np.ndarray, indent: str) -> str:
            if a.ndim == 1:
                return "{" + ", ".join(str(int(v)) for v in a) + "}"
            inner = indent + " "
            return "{" + f",\n{inner}".join(walk(x, inner) for x in a) + "}"

        return walk(np.asarray(self.values).reshape(self.shape), "    ")


@dataclass
class VStream:
    """A packed stream between two engines."""

    name: str
    lanes: int
    depth: int


@dataclass
class EngineStage:
    """The body of a dataflow stage kernel: port lanes, streams, engine calls, ROMs."""

    in_lanes: int
    out_lanes: int
    streams: list[VStream]
    calls: list[str]
    roms: list[Rom] = field(default_factory=list)
    line_buffer_elems: int = 0      # window generators' line buffers (elements)


def _rom_impl(words: int) -> str:
    return "lutram" if words <= LUTRAM_WORDS else "bram"


def engine_stage(st, layers, params: dict) -> EngineStage:
    """Lower one Design stage (a codegen.rtl_model.StageRtl of style dataflow) to engine calls.

    ``layers``: the stage's model layers (batchnorm nodes are matched to them by name);
    ``params``: the project weights (codegen.context.make_weights), for batchnorm scale/shift.
    """
    from .rtl_model import legal

    by_inst = {f"s{st.index}_{legal(l.name)}": l for l in layers}
    blocks = st.blocks
    # wires: the chain's names (c<j>) where a node lists none
    ins_of, outs_of = [], []
    prev = "c0"
    for j, b in enumerate(blocks):
        ins = list(b.ins) if b.ins is not None else [prev]
        outs = list(b.outs) if b.outs is not None else [f"c{j + 1}"]
        ins_of.append(ins)
        outs_of.append(outs)
        prev = outs[0]
    stage_in, stage_out = ins_of[0][0], outs_of[-1][0]
    alias: dict[str, str] = {}
    depth: dict[str, int] = {}

    def root(w: str) -> str:
        while w in alias:
            w = alias[w]
        return w

    for b, ins, outs in zip(blocks, ins_of, outs_of):
        if b.kind in _ALIASES:
            alias[outs[0]] = ins[0]
            if b.kind == "fifo":
                r = root(ins[0])
                depth[r] = max(depth.get(r, DEFAULT_DEPTH), int(b.params["DEPTH"]))
    lanes: dict[str, int] = {root(stage_in): blocks[0].in_lanes}
    names = {root(stage_in): "in0"}
    for b, outs in zip(blocks, outs_of):
        if b.kind in _ALIASES:
            continue
        for k, w in enumerate(outs):
            names.setdefault(root(w), f"{b.inst}_out{k}" if len(outs) > 1 else f"{b.inst}_out")
            lanes[root(w)] = b.out_lanes
    calls: list[str] = []
    roms: list[Rom] = []
    lb = 0
    if root(stage_out) == root(stage_in):   # nothing but wiring (a flatten alone): one copy
        calls.append(f"bapipe::width_conv<{st.in_lanes}, {st.in_lanes}>(in0, out0, (long)n * {st.in_elems})")
    else:
        names[root(stage_out)] = "out0"

    def s(w: str) -> str:
        return names[root(w)]

    for b, ins, outs in zip(blocks, ins_of, outs_of):
        k = b.kind
        if k in _ALIASES:
            continue
        p = b.params
        i, o = s(ins[0]), s(outs[0])
        per = f"(long)n * {b.beats_in}"
        if k == "swg":
            g = b.swg
            # K rows (fpga_models.engines.line_buffer_bytes) plus STRIDE - 1: with a stride the
            # next output row's first new rows arrive while the current row still reads its K
            rows = g.k + g.stride - 1
            lb += rows * g.w * g.c
            calls.append(f"bapipe::swg<{g.c}, {g.h}, {g.w}, {g.k}, {g.pad}, {g.stride}, {g.simd}, {g.taps}, {rows}, "
                         f"{'true' if p.get('PAD_MIN') else 'false'}>({i}, {o}, n)")
        elif k == "mvu":
            m = b.mvu
            nf, sf = m.nf, m.sf
            w = np.asarray(m.weights, dtype=np.int64).reshape(nf, m.pe, sf, m.simd).transpose(0, 2, 1, 3)
            wn, bn = f"{b.inst}_w", f"{b.inst}_b"
            roms.append(Rom(wn, (nf * sf, m.pe, m.simd), w.reshape(nf * sf, m.pe, m.simd), (2, 3),
                            _rom_impl(nf * sf)))
            roms.append(Rom(bn, (nf, m.pe), np.asarray(m.bias, dtype=np.int64).reshape(nf, m.pe), (2,),
                            _rom_impl(nf)))
            vectors = b.beats_in // sf
            calls.append(f"bapipe::mvu<{m.mh}, {m.mw}, {m.pe}, {m.simd}, {'true' if m.relu else 'false'}>"
                         f"({i}, {o}, {wn}, {bn}, (long)n * {vectors})")
        elif k == "pool":
            c, simd, taps = p["C"], p["SIMD"], p["TAPS"]
            pixels = b.beats_in // (taps * (c // simd))
            calls.append(f"bapipe::pool<{c}, {simd}, {taps}, {'true' if p['MODE'] == 0 else 'false'}, {p['AVG_R']}>"
                         f"({i}, {o}, (long)n * {pixels})")
        elif k == "bn":
            layer = by_inst[b.inst]
            c, ln = p["C"], p["LANES"]
            q = params[layer.name]
            for key in ("scale", "shift"):
                roms.append(Rom(f"{b.inst}_{key}", (c // ln, ln), np.asarray(q[key], dtype=np.int64).reshape(c // ln, ln),
                                (2,), "lutram"))
            calls.append(f"bapipe::batchnorm_ew<{c}, {ln}>({i}, {o}, {b.inst}_scale, {b.inst}_shift, {per})")
        elif k == "relu":
            calls.append(f"bapipe::relu_ew<{b.in_lanes}>({i}, {o}, {per})")
        elif k == "add":
            calls.append(f"bapipe::add_ew<{b.in_lanes}>({i}, {s(ins[1])}, {o}, {per})")
        elif k == "fork":
            calls.append(f"bapipe::fork_ew<{b.in_lanes}>({i}, {o}, {s(outs[1])}, {per})")
        elif k == "width_conv":
            calls.append(f"bapipe::width_conv<{b.in_lanes}, {b.out_lanes}>({i}, {o}, (long)n * "
                         f"{b.beats_in * b.in_lanes})")
        else:
            raise ValueError(f"Design node {b.inst}: kind '{k}' has no HLS engine")
    streams = sorted((VStream(nm, lanes[w], depth.get(w, DEFAULT_DEPTH)) for w, nm in names.items()
                      if nm not in ("in0", "out0")), key=lambda v: v.name)
    return EngineStage(st.in_lanes, st.out_lanes, streams, calls, roms, lb)
