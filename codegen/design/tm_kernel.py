"""A stage's HLS kernel read off its Design nodes (codegen.design.dataflow lowering).

Every engine node (window generator, MVU, pool, batchnorm, ReLU, add, fork, width converter)
becomes one call of the streaming engine library (hls_templates/hls/bapipe_engines.h.j2) with
the node's lanes, folding and shapes; every wire becomes an ``hls::stream<vec<L>, DEPTH>``.
FIFO nodes are not processes: their depth goes onto the wire they sit on (skip FIFOs, MVU
input buffers, frame buffers). Link nodes are the kernel's ports; gate nodes mark the turns
of a time-multiplexed stage (one DATAFLOW function per turn, called in order per sample).
Nothing here decides hardware: lanes, folding, depths and line buffers are the Design's
(fpga_models.engines through the lowering); the window generator's ring adds STRIDE - 1 rows.
"""
from __future__ import annotations


import numpy as np

from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models.allocate import frames_offchip, ring_banks, stage_onchip_budget
from bapipe.fpga_models.engines import DDR_WORD_BITS, ddr_words_per_beat, swg_rows

from bapipe.codegen.design.weight_layout import Banked, MvuMatrix
from bapipe.codegen.design.weight_memory import MvuCall, copy_params, load_weights_once, stream_weights

from bapipe.codegen.design.kernel_types import (_ALIASES, DEFAULT_DEPTH, LUTRAM_WORDS, DdrFrame, EngineStage, Rom,
                                                UnitFn, VStream)


def _rom_impl(words: int) -> str:
    return "lutram" if words <= LUTRAM_WORDS else "bram"


def onchip_budget(plan, stage, cluster) -> int | None:
    """On-chip bytes a stage's kernel may keep on its board (fpga_models.allocate.stage_onchip_budget);
    None without a cluster."""
    if cluster is None or not stage.boards:
        return None
    board = next((cb.board for cb in cluster.boards if cb.name == stage.boards[0]), None)
    return stage_onchip_budget(plan, stage, board)


def engine_stage(st, layers, params: dict, external: bool = False, writable: bool = False,
                 onchip_budget: int | None = None, number_format: str = "fixed16", board=None) -> EngineStage:
    """Lower one Design stage (a codegen.design.dataflow.StageRtl of style dataflow) to engine calls.

    ``layers``: the stage's model layers (batchnorm nodes are matched to them by name);
    ``params``: the project weights (codegen.design.context.make_weights), for batchnorm scale/shift.
    ``external``: the MVU weight matrices are m_axi arguments (stages beyond on-chip ROM).
    ``writable``: every weight array (biases, batchnorm scale/shift too) is an m_axi argument,
    the memory the training update kernel (codegen.design.train_kernels) rewrites every iteration.
    ``onchip_budget``: bytes the kernel may keep on chip; a time-multiplexed stage's frame
    buffers beyond it go off chip (fpga_models.allocate.frames_offchip), elements of
    ``number_format`` packed into 512-bit words (fpga_models.engines.ddr_words_per_beat).
    ``board``: the catalog board (its usable BRAM36 and URAM choose each buffer's and deep
    FIFO's storage, fpga_models.memory_blocks.storage_impl; a U250's without one).
    """
    from bapipe.codegen.design.dataflow import legal

    f = fx.get_fmt(number_format)
    elem_bits, acc_b = f.width, -(-f.acc_width // 8)

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
    ddr: set[str] = set()            # wires of the Design's off-chip frame buffers (ddr_frame nodes)

    def root(w: str) -> str:
        while w in alias:
            w = alias[w]
        return w

    gate_out: dict[str, int] = {}    # wire -> the time-multiplexed turn whose gate drives it
    gate_in: dict[str, int] = {}     # wire -> the turn whose gate it feeds
    for b, ins, outs in zip(blocks, ins_of, outs_of):
        if b.kind in _ALIASES:
            alias[outs[0]] = ins[0]
            if b.kind == "fifo":
                r = root(ins[0])
                depth[r] = max(depth.get(r, DEFAULT_DEPTH), int(b.params["DEPTH"]))
            if b.kind == "ddr_frame":   # a frame the Design put off chip: a frame's depth until spilled below
                r = root(ins[0])
                depth[r] = max(depth.get(r, DEFAULT_DEPTH), int(b.params["DEPTH_WORDS"]) // int(b.params["WORDS"]))
                ddr.add(r)
            if b.kind == "gate":
                gate_out[outs[0]], gate_in[ins[0]] = b.unit, b.unit
    lanes: dict[str, int] = {root(stage_in): blocks[0].in_lanes}
    names = {root(stage_in): "in0"}
    for b, outs in zip(blocks, outs_of):
        if b.kind in _ALIASES:
            continue
        for k, w in enumerate(outs):
            names.setdefault(root(w), f"{b.inst}_out{k}" if len(outs) > 1 else f"{b.inst}_out")
            lanes[root(w)] = b.out_lanes
    calls: list[str] = []
    call_block: list[int] = []       # the block index of each call
    roms: list[Rom] = []
    mvus: dict = {}                  # weight array -> its MVU call (codegen.design.weight_memory)
    lb = 0
    rings: list[tuple[int, int, int, str]] = []   # each window generator's ring (fpga_models.allocate.ring_banks)
    accs: list[tuple[int, int, int]] = []         # each pool's accumulators: (banks, width, depth)
    acc = 0
    if root(stage_out) == root(stage_in):   # nothing but wiring (a flatten alone): one copy
        calls.append(f"bapipe::width_conv<{st.in_lanes}, {st.in_lanes}>(in0, out0, (long)n * {st.in_elems})")
        call_block.append(-1)
    else:
        names[root(stage_out)] = "out0"

    def s(w: str) -> str:
        return names[root(w)]

    # elements per sample on every wire, followed from the stage input through the engines
    # (the shapes decide them; a node's beats_in is not always its first input's: an add's
    # converters count both inputs)
    elems: dict[str, int] = {root(stage_in): st.in_elems}
    writer: dict[str, str] = {}     # stream name -> the call that writes it
    node_out: dict[str, str] = {}   # Design node -> the stream it writes (codegen.design.stash tees them)

    for j, (b, ins, outs) in enumerate(zip(blocks, ins_of, outs_of)):
        k = b.kind
        if k in _ALIASES:
            continue
        call_block.append(j)
        p = b.params
        i, o = s(ins[0]), s(outs[0])
        e_in = elems[root(ins[0])]
        e_out = e_in
        per = f"(long)n * {e_in // b.in_lanes}"
        if k == "swg":
            g = b.swg
            rows = swg_rows(g.k, g.stride)   # fpga_models.engines (the planner's line buffer too)
            lb += rows * g.w * g.c
            ring = ring_banks(rows, g.k, g.w, g.c, g.simd, elem_bits, board)   # the ring's banks and storage
            rings.append(ring)
            calls.append(f"bapipe::swg_{ring[3]}<{g.c}, {g.h}, {g.w}, {g.k}, {g.pad}, {g.stride}, {g.simd}, {g.taps}, {rows}, "
                         f"{'true' if p.get('PAD_MIN') else 'false'}>({i}, {o}, n)")
            e_out = g.out_beats * g.out_lanes
        elif k == "mvu":
            m = b.mvu
            nf, sf = m.nf, m.sf
            # w[nf*SF + sf][p][s] = W[nf*PE + p][sf*SIMD + s], computed when read (codegen.design.weight_layout)
            mat = m.weights if isinstance(m.weights, MvuMatrix) else MvuMatrix(np.asarray(m.weights))
            wn, bn = f"{b.inst}_w", f"{b.inst}_b"
            roms.append(Rom(wn, (nf * sf, m.pe, m.simd), Banked(mat, m.pe, m.simd), (2, 3),
                            _rom_impl(nf * sf), external))
            roms.append(Rom(bn, (nf, m.pe), np.asarray(m.bias, dtype=np.int64).reshape(nf, m.pe), (2,),
                            _rom_impl(nf), writable))
            vectors = e_in // m.mw
            e_out = vectors * m.mh
            calls.append(f"bapipe::mvu<{m.mh}, {m.mw}, {m.pe}, {m.simd}, {'true' if m.relu else 'false'}>"
                         f"({i}, {o}, {wn}, {bn}, (long)n * {vectors})")
            mvus[wn] = MvuCall(calls[-1], m.mh, m.mw, m.pe, m.simd, bool(m.relu), vectors, i, o, bn, b.inst)
        elif k == "pool":
            c, simd, taps = p["C"], p["SIMD"], p["TAPS"]
            pixels = e_in // (taps * c)
            acc += c * acc_b   # bapipe::pool keeps one exact accumulator (acc_t) per channel
            accs.append((simd, f.acc_width, c // simd))   # acc[C / SIMD][SIMD]: SIMD banks (the Design's blocks)
            e_out = pixels * c
            calls.append(f"bapipe::pool<{c}, {simd}, {taps}, {'true' if p['MODE'] == 0 else 'false'}, {p['AVG_R']}>"
                         f"({i}, {o}, (long)n * {pixels})")
        elif k == "bn":
            layer = by_inst[b.inst]
            c, ln = p["C"], p["LANES"]
            q = params[layer.name]
            for key in ("scale", "shift"):
                roms.append(Rom(f"{b.inst}_{key}", (c // ln, ln), np.asarray(q[key], dtype=np.int64).reshape(c // ln, ln),
                                (2,), "lutram", writable))
            calls.append(f"bapipe::batchnorm_ew<{c}, {ln}>({i}, {o}, {b.inst}_scale, {b.inst}_shift, {per})")
        elif k == "relu":
            calls.append(f"bapipe::relu_ew<{b.in_lanes}>({i}, {o}, {per})")
        elif k == "add":
            calls.append(f"bapipe::add_ew<{b.in_lanes}>({i}, {s(ins[1])}, {o}, {per})")
        elif k == "fork":
            calls.append(f"bapipe::fork_ew<{b.in_lanes}>({i}, {o}, {s(outs[1])}, {per})")
        elif k == "concat":   # BEATS_A of the first input, then BEATS_B of the second, per group
            ba, bb = p["BEATS_A"], p["BEATS_B"]
            e_out = e_in + elems[root(ins[1])]
            calls.append(f"bapipe::concat_ew<{b.in_lanes}, {ba}, {bb}>({i}, {s(ins[1])}, {o}, "
                         f"(long)n * {e_out // (b.in_lanes * (ba + bb))})")
        elif k == "width_conv":
            calls.append(f"bapipe::width_conv<{b.in_lanes}, {b.out_lanes}>({i}, {o}, (long)n * {e_in})")
        else:
            raise ValueError(f"Design node {b.inst}: kind '{k}' has no HLS engine")
        for w in outs:
            elems[root(w)] = e_out
            writer[s(w)] = calls[-1]
        node_out[b.inst] = s(outs[0])
    units: list[UnitFn] = []
    if st.style == "time-multiplexed":
        units = _turns(st, blocks, ins_of, outs_of, calls, call_block, root, alias, gate_out, gate_in, depth)
        for u in units:   # the m_axi arrays each turn's engines read are its arguments too
            u.roms = [r for r in roms if r.external and any(f", {r.name}, " in c for c in u.calls)]
    streams = {w: VStream(nm, lanes[w], depth.get(w, DEFAULT_DEPTH)) for w, nm in names.items()}
    if not units:
        es = EngineStage(st.in_lanes, st.out_lanes, _decl(streams.values()), calls, roms, lb, acc_bytes=acc,
                         node_out=node_out, writers=writer)
        if external:   # off-chip weights: copied on chip per call in 512-bit bursts (codegen.design.weight_memory)
            renamed = load_weights_once(es, mvus, elem_bits, st.index, board)
            more = copy_params(es, elem_bits, st.index, board)   # batchnorm scale/shift on chip too
            es.writers = {k: more.get(renamed.get(c, c), renamed.get(c, c)) for k, c in writer.items()}
        bind_fifos(es, elem_bits, board)
        es.rings, es.pool_accs = rings, accs
        return es
    fns = [UnitFn(u.name, sorted((streams[w] for w in u.params), key=lambda v: v.name),
                  _decl(streams[w] for w in u.streams), u.calls, u.roms) for u in units]
    feed = next((f for f in fns if f.name.endswith("_feed")), None)
    turns = [f for f in fns if f is not feed]
    # the top function declares the feed's streams (a DATAFLOW region of the feed and the
    # turns' sequencer); the frame buffers between turns live in the sequencer
    top = {v.name: v for v in (feed.params + feed.streams if feed else [])}
    between = {v.name: v for u in turns for v in u.params if v.name not in top}
    es = EngineStage(st.in_lanes, st.out_lanes, _decl(top.values()), [], roms, lb, turns, feed,
                     _decl(between.values()), [], onchip_budget, acc)
    if external:   # off-chip weights: 512-bit bursts into on-chip tiles (codegen.design.weight_memory)
        renamed = stream_weights(es, mvus, onchip_budget, elem_bits, st.index, board)
        more = copy_params(es, elem_bits, st.index, board)   # batchnorm scale/shift on chip too
        writer = {k: more.get(renamed.get(c, c), renamed.get(c, c)) for k, c in writer.items()}
    if onchip_budget is not None and es.turn_streams:
        # the frame buffers that do not fit go off chip: the planner's rule (fpga_models.allocate)
        # on the figures codegen.design.onchip states (fixed bytes; each frame's, in turn order)
        from bapipe.codegen.design.onchip import engine_fixed_bytes, frame_bytes, frame_order
        eb = -(-elem_bits // 8)
        off = frames_offchip(frame_bytes(es, eb), engine_fixed_bytes(es, eb), onchip_budget)
        beats_of = {names[w]: e // lanes[w] for w, e in elems.items() if w in names}
        spill = {k for k, o in zip(frame_order(es), off) if o}
        if ddr:   # the Design placed them (codegen.design.dataflow.offchip_frames): build those
            spill = {names[w] for w in ddr}
        es.frames = [_spill(v, beats_of[v.name], elem_bits, turns, writer) for v in es.turn_streams if v.name in spill]
        es.turn_streams = [v for v in es.turn_streams if v.name not in spill]
    es.node_out, es.writers = node_out, writer   # codegen.design.stash tees the turns' streams
    bind_fifos(es, elem_bits, board)
    es.rings, es.pool_accs = rings, accs
    return es


def bind_fifos(es: EngineStage, elem_bits: int, board=None) -> None:
    """The storage of every FIFO deeper than Vitis's default (frame buffers between turns, skip
    and input FIFOs): fpga_models.memory_blocks.storage_impl, so the blocks it takes are the
    Design's decision (BIND_STORAGE), not the tool's."""
    from bapipe.fpga_models.memory_blocks import storage_impl

    usable = {} if board is None else {"usable_bram36": board.usable_bram36, "usable_uram": board.usable_uram}
    units = list(es.units) + ([es.feed] if es.feed is not None else [])
    for v in list(es.streams) + list(es.turn_streams) + [v for u in units for v in u.streams]:
        if v.depth > DEFAULT_DEPTH:
            v.impl = storage_impl(v.lanes * elem_bits, v.depth, fifo=True, **usable)


def _spill(v: VStream, beats: int, elem_bits: int, turns: list[UnitFn], writer: dict[str, str]) -> DdrFrame:
    """Move frame buffer ``v`` off chip: the turn writing it ends in a ``frame_write`` to the new
    m_axi argument, the turn reading it starts with a ``frame_read``; in both the stream becomes
    a two-deep one of the turn's own."""
    f = DdrFrame(f"{v.name}_ddr", v.name, v.lanes, v.depth, beats, DDR_WORD_BITS,
                 beats * ddr_words_per_beat(v.lanes, elem_bits))
    for u in turns:
        if not any(p.name == v.name for p in u.params):
            continue
        u.params = [p for p in u.params if p.name != v.name]
        u.streams = _decl(u.streams + [VStream(v.name, v.lanes, DEFAULT_DEPTH)])
        u.frames.append(f)
        if writer.get(v.name) in u.calls:
            u.calls.append(f"bapipe::frame_write<{v.lanes}, {f.bits}>({v.name}, {f.name}, (long)n * {beats})")
        else:
            u.calls.insert(0, f"bapipe::frame_read<{v.lanes}, {f.bits}>({f.name}, {v.name}, (long)n * {beats})")
    return f


def _decl(streams) -> list[VStream]:
    """The streams a function declares (not its ports), in name order."""
    return sorted((v for v in streams if v.name not in ("in0", "out0")), key=lambda v: v.name)


def _turns(st, blocks, ins_of, outs_of, calls, call_block, root, alias, gate_out, gate_in, depth) -> list[UnitFn]:
    """Group a time-multiplexed stage's engines into its turns (one per gate of the Design).

    An engine runs in the turn of the gate in front of it; a window generator in the turn of
    the gate behind it (its input then holds a whole frame: the turn before has finished);
    anything else (forks, converters) in its producer's turn, or, straight behind the stage
    input, in the turn of its consumer. Streams used by one turn are its own; the others
    (frame buffers, ports) are declared in the top function and passed in."""
    producer = {root(w): j for j, outs in enumerate(outs_of) if blocks[j].kind not in _ALIASES for w in outs}
    turn: dict[int, int | None] = {}

    def of_wire(w: str) -> int | None:
        while True:
            if w in gate_out:
                return gate_out[w]
            if w not in alias:
                break
            w = alias[w]
        j = producer.get(w)
        return None if j is None else of_block(j)

    def of_block(j: int) -> int | None:
        if j not in turn:
            b = blocks[j]
            if b.kind == "swg" and outs_of[j][0] in gate_in:
                turn[j] = gate_in[outs_of[j][0]]
                r = root(ins_of[j][0])   # a whole frame waits for this turn
                depth[r] = max(depth.get(r, DEFAULT_DEPTH), b.swg.frame_beats)
            else:
                turn[j] = of_wire(ins_of[j][0])
        return turn[j]

    for j in call_block:
        of_block(j)
    # straight behind the stage input (widening converters into the first frame buffer):
    # not a turn; they run as the input arrives, beside the turns (FEED), as in the Design,
    # where they work in the producer's (the link's) time
    for j in call_block:
        if turn[j] is None:
            turn[j] = FEED
    order = sorted({turn[j] for j in call_block} - {FEED})
    uses: dict[str, set[int]] = {}
    for j in call_block:
        for w in ins_of[j] + outs_of[j]:
            uses.setdefault(root(w), set()).add(turn[j])
    ports = {root(ins_of[0][0]), root(outs_of[-1][0])}
    out = []
    for t in order + ([FEED] if FEED in turn.values() else []):
        mine = [c for c, j in zip(calls, call_block) if turn[j] == t]
        ws = {w for w, ts in uses.items() if t in ts}
        shared = {w for w in ws if len(uses[w]) > 1 or w in ports}
        name = f"s{st.index}_feed" if t == FEED else f"s{st.index}_turn{t - order[0]}"
        out.append(UnitFn(name, sorted(shared), sorted(ws - shared), mine))
    return out


#: the group of a time-multiplexed stage's engines that runs beside its turns (see _turns)
FEED = -1
