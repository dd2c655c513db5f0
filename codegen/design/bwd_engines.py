"""The backward kernel's tiled matrix engines in the Design: fpga_models.bwd_tiles' decision turned
into the arrays, weight fills and MAC functions stage_bwd.cpp.j2 prints (hls_templates/hls/kernel/
bwd_mac.j2 lays the loops out).

codegen.design.backward builds the kernel's streams and engines with one ``bapipe::mvu_bwd`` call
per matrix layer (the folding it prints is the engines': fpga_models.bwd_tiles.engine_folding);
this pass replaces those calls and the per-layer accumulators and weight copies they used:

- a dataflow kernel: one MAC function a matrix layer (``s<i>_bwd_mac_<layer>``, its own grid);
- a time-multiplexed kernel: the shared MAC function (codegen.design.mac_share, one call site)
  runs every matrix turn's job on one grid, its stores shared by base rows.

Arrays it declares (sizes from bwd_tiles): the accumulator store ``aw`` (K banks) and bias sums
``ab`` (PE banks) of the chunk jobs, the weight store ``wst`` (KW/4 words a row) that the kernel's
first call of an iteration fills (resident) or a turn's fill before it (tile), a row job's on-chip
dW (``aw_<layer>``, LR banks) and bias sums, and the off-chip dy copy a multi-pass job keeps.
Nothing here decides a size.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from bapipe.fpga_models.bwd_tiles import SUMS_PER_BEAT, WEIGHTS_PER_WORD, BwdTiles, Job
from bapipe.names import shown

from bapipe.codegen.design.cxx_text import split_args

_MVU_BWD = re.compile(r"^bapipe::mvu_bwd<(.*)>\((.*)\)$")


@dataclass
class EngineJob:
    """One matrix layer's job in a MAC function (the template's fields)."""

    turn: int
    key: int
    layer: str
    mh: int
    mw: int
    nf: int
    sf: int
    vec: int
    dx: bool
    dy: str
    x: str
    dxs: str
    dw: str
    db: str
    lpe: int
    lsimd: int
    out: str = ""
    exact: bool = False
    passes: int = 1
    pnf: int = 1
    sbase: int = 0
    wbase: int = 0
    abase: int = 0
    ddr: bool = False
    w: str = ""          # row job: its weights (m_axi array or on-chip copy)
    aw: str = ""         # row job: its on-chip dW sums
    ab: str = ""         # row job: its bias sums
    lr: int = 0
    gb: int = 0
    xr: int = 1          # cycles between two x beats (the window's pace)
    keep: int = 0        # row job: vectors kept for its dW at the flush (0: dW on chip)
    xk: str = ""         # ... their x and dy stores
    dyk: str = ""


@dataclass
class TileMac:
    """A MAC function's render context (bwd_mac.j2)."""

    name: str
    summary: str
    c: dict
    chunk_jobs: list
    row_jobs: list
    params: list
    aw: str = ""
    ab: str = ""
    wst: str = ""
    dyf: str = ""
    dx: bool = False

    @property
    def njobs(self) -> int:
        return max(1, len(self.chunk_jobs))

    @property
    def nrows(self) -> int:
        return max(1, len(self.row_jobs))


def parse_mvu_bwd(call: str) -> dict | None:
    """The fields of a ``bapipe::mvu_bwd<...>(...)`` process call (codegen.design.backward prints it)."""
    m = _MVU_BWD.match(call.strip())
    if m is None:
        return None
    t, a = split_args(m.group(1)), split_args(m.group(2))
    vec = int(re.match(r"^\(long\)n \* (\d+)$", a[8]).group(1))
    return {"mh": int(t[0]), "mw": int(t[1]), "pe": int(t[2]), "simd": int(t[3]), "dx": t[4] == "1",
            "gb": int(t[5]), "xb": int(t[6]), "out": t[9], "dy": a[0], "x": a[1], "dxs": a[2], "w": a[3],
            "aw": a[4], "ab": a[5], "dw": a[6], "db": a[7], "vec": vec}


def _stream_decl(beat: str, name: str) -> str:
    return f"hls::stream<{beat} > &{name}"


def consts(bt: BwdTiles, chunk: list[Job], rows: list[Job], bits: int) -> dict:
    """The compile-time sizes a MAC function prints (bwd_tiles' decision)."""
    from bapipe.fpga_models.bwd_tiles import _cdiv

    c = {"PE": bt.pe, "SIMD": bt.simd, "LANES": bt.lanes, "P": bt.chunk, "K": bt.drain, "J": bt.drain_steps,
         "PX": bt.reuse, "KW": bt.wlanes, "KWW": _cdiv(bt.wlanes, WEIGHTS_PER_WORD), "WJ": bt.wsteps,
         "WL": SUMS_PER_BEAT, "G": _cdiv(bt.drain, SUMS_PER_BEAT), "GB": _cdiv(bt.pe, SUMS_PER_BEAT), "DEPTH": 4,
         "NFX": max((j.nf for j in chunk), default=1), "SFX": max((j.sf for j in chunk), default=1),
         "GBX": max((j.gb for j in chunk), default=1), "XBX": max((j.xb for j in chunk if j.layer.dx), default=1),
         "LR": bt.row_lanes or 1, "RSFX": max((j.sf for j in rows), default=1),
         "RMHX": max((j.layer.mh for j in rows), default=1), "RXB": max((j.xb for j in rows), default=1),
         "RLY": max((min(j.layer.pe, j.layer.mh) for j in rows), default=1),
         "DYC_IMPL": "", "XC_IMPL": "", "DXO_IMPL": "", "RX_IMPL": "", "RDX_IMPL": ""}
    for a in bt.arrays:
        if a.name in ("dyc", "xc", "dxo", "rx", "rdx"):
            c[f"{a.name.upper()}_IMPL"] = a.impl if a.impl in ("bram", "uram", "lutram") else ""
    return c


@dataclass
class EngineArrays:
    """What the pass adds to the kernel: static arrays (codegen.design.backward.BArray) and the
    weight fills (the copies' entries: once an iteration, or a turn's)."""

    arrays: list = field(default_factory=list)
    fills: list = field(default_factory=list)


def _dims(decl_dims: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\[(\d+)\]", decl_dims))


def _engine_job(turn: int, key: int, f: dict, j: Job, names: dict) -> EngineJob:
    """A template job from the parsed mvu_bwd call ``f`` and bwd_tiles' job ``j``."""
    m = j.layer
    out = f["out"].strip()
    e = EngineJob(turn, key, m.name, m.mh, m.mw, j.nf, j.sf, m.vec, m.dx, f["dy"], f["x"], f["dxs"], f["dw"], f["db"],
                  j.lpe, j.lsimd, out, out.startswith("bapipe::rvec"), j.passes, max(1, j.pass_nf or j.nf),
                  j.store_base, j.wbase, j.abase, j.home == "ddr", gb=j.gb, xr=j.xr)
    if j.engine == "row":
        e.lr, e.w = j.lsimd, names.get("w", f["w"])
        e.aw, e.ab = names.get("aw", ""), names.get("ab", "")
        e.keep, e.xk, e.dyk = j.keep, names.get("xk", ""), names.get("dyk", "")
    return e


def build(ctx, tiles: dict, index: int, width: int, layer_of: dict[str, str]) -> None:
    """Replace ``ctx``'s mvu_bwd engines (dataflow: its processes; time-multiplexed: the shared MAC
    of codegen.design.mac_share) by the tiled engines of ``tiles`` (layer -> BwdTiles);
    ``layer_of``: an mvu_bwd call's accumulator name -> its layer."""
    if ctx.mac is not None:
        _build_tm(ctx, tiles, index, width, layer_of)
    else:
        _build_dataflow(ctx, tiles, index, width, layer_of)
    _engine_cycles(ctx, tiles)


def _engine_cycles(ctx, tiles: dict) -> None:
    """The kernel's engine records (host_config ``engines``) of the matrix layers: the tiled
    engine's cycles a sample (fpga_models.bwd_tiles: a time-multiplexed turn as it runs, with its
    window generator and weight fill; a dataflow engine in steady state, its per-call fills aside)
    and its kind."""
    from bapipe.fpga_models.bwd_tiles import turn_cycles

    for e in ctx.engines:
        bt = tiles.get(e["layer"])
        if e.get("engine") != "mvu_bwd" or bt is None:
            continue
        j = bt.job(e["layer"])
        m = j.layer
        if bt.style == "tm":
            cyc = turn_cycles(bt, j, 1)
        elif j.engine == "chunk":
            cyc = j.blocks * m.vec * (2 if m.dx else 1)
        else:
            cyc = m.vec * m.mh * j.sf
        e.update({"engine": f"tiled_{j.engine}", "cycles_per_sample": int(cyc)})


def _weights_decl(ctx) -> dict[str, str]:
    return {w.name: f"const data_t {w.name}{w.dims}" for w in ctx.weights}


def _store_arrays(bt: BwdTiles, prefix: str, width: int) -> tuple[list, dict]:
    """The chunk engine's static arrays (BArray) named with ``prefix``: the accumulator store, the
    bias sums and the weight store; name -> BArray."""
    from bapipe.codegen.design.kernel_types import BArray

    by = {a.name: a for a in bt.arrays}
    out = {}
    if "aw" in by:
        a = by["aw"]
        out["aw"] = BArray(f"{prefix}aw", f"bapipe::gacc<{a.width}>", (max(1, a.depth), a.banks), a.width, a.impl,
                           partitions=[(a.banks, 2)])
        b = by["ab"]
        out["ab"] = BArray(f"{prefix}ab", f"bapipe::gacc<{b.width}>", (max(1, b.depth), b.banks), b.width, b.impl,
                           partitions=[(b.banks, 2)])
    if "wst" in by:
        w = by["wst"]
        out["wst"] = BArray(f"{prefix}wst", "bapipe::wsword_t", (w.depth, w.banks), w.width, w.impl,
                            partitions=[(w.banks, 2)])
    return list(out.values()), out


def _fill(bt: BwdTiles, j: Job, src: str, src_dims: tuple, dst) -> dict:
    """A weight-store fill of job ``j``'s matrix from ``src`` (wst_fill)."""
    from bapipe.fpga_models.bwd_tiles import _cdiv

    m = j.layer
    call = (f"bapipe::wst_fill<{m.mh}, {m.mw}, {bt.pe}, {bt.simd}, {bt.wlanes}, {_cdiv(bt.wlanes, WEIGHTS_PER_WORD)}, "
            f"{bt.wsteps}, {dst.dims[0]}>({src}, {dst.name}, {j.wbase})")
    return {"src": src, "dst": dst.name, "words": _cdiv(m.elems * 16, 512),
            "params": f"const data_t {src}{''.join(f'[{d}]' for d in src_dims)}, {dst.decl}",
            "args": f"{src}, {dst.name}", "call": call}


def _row_arrays(j: Job, tag: str, bt: BwdTiles | None = None):
    """A row job's on-chip dW sums (when they live on chip) or kept vectors (x and dy, a bank a
    vector: fpga_models.bwd_tiles' ``xk_`` / ``dyk_`` arrays), and its bias sums (BArray)."""
    from bapipe.codegen.design.kernel_types import BArray
    from bapipe.fpga_models.bwd_tiles import KEEP_X_PER_WORD

    m = j.layer
    arrs = []
    if j.home == "chip":
        arrs.append(BArray(f"aw_{tag}", f"bapipe::gacc<{j.gb}>", (m.mh * j.sf, j.lsimd), j.gb,
                           "lutram" if m.mh * j.sf <= 64 else "bram", partitions=[(j.lsimd, 2)]))
    elif j.home == "keep":
        impl = {a.name: a.impl for a in (bt.arrays if bt is not None else ())}
        arrs.append(BArray(f"xk_{tag}", "data_t", (j.keep, m.mw), 16, impl.get(f"xk_{m.name}", "bram"),
                           partitions=[(j.keep, 1)], reshape=(KEEP_X_PER_WORD, 2)))
        arrs.append(BArray(f"dyk_{tag}", "data_t", (j.keep, m.mh), 16, impl.get(f"dyk_{m.name}", "bram"),
                           partitions=[(j.keep, 1)]))
    # bias sums: the loader adds a dy beat (PE) a cycle, the flush reads one 512-bit beat (8) a cycle
    banks = min(m.mh, max(min(m.pe, m.mh), SUMS_PER_BEAT))
    arrs.append(BArray(f"ab_{tag}", f"bapipe::gacc<{j.gb}>", (m.mh,), j.gb,
                       "registers" if m.mh <= 64 else ("lutram" if m.mh // banks <= 64 else "bram"),
                       partitions=[(banks, 1)]))
    return arrs


def _summary(bt: BwdTiles, jobs: list[EngineJob]) -> str:
    parts = [f"{shown(j.layer)} {j.mh}x{j.mw}" for j in jobs]   # a comment: the layer's name as text
    return (f"{len(jobs)} matrix job(s) ({', '.join(parts)}); grid {bt.pe} x {bt.simd}, chunks of {bt.chunk}, "
            f"dx groups of {bt.reuse}, row engine {bt.row_lanes or 0} lanes (fpga_models.bwd_tiles)")


def _mac_params(ctx, jobs_f: list[tuple[dict, EngineJob]], store: dict, extra: list[str]) -> list[str]:
    """The MAC function's C parameters: its jobs' streams, dW/db arrays, row weights and sums, the
    stores, and ``extra`` declarations; sorted by name."""
    from bapipe.codegen.design.mac_share import _decl_name

    streams = {s.name: s for s in ctx.streams}
    ports = {q.name: q for q in ctx.in_ports + ctx.out_ports}
    grads = {g.name: g for g in ctx.grad_arrays}
    wdecl = _weights_decl(ctx)
    arrays = {a.name: a for a in ctx.arrays}
    decls = {}

    def stream(n: str):
        if n in streams:
            decls[n] = _stream_decl(streams[n].beat, n)
        elif n in ports:
            decls[n] = _stream_decl(f"bapipe::bvec<{ports[n].lanes}>", n)

    for f, e in jobs_f:
        for n in (e.dy, e.x) + ((e.dxs,) if e.dx else ()):
            stream(n)
        for n in (e.dw, e.db):
            decls[n] = f"bapipe::wsum_t {n}{grads[n].dims}"
        for n in (e.w, e.aw, e.ab, e.xk, e.dyk):
            if not n:
                continue
            if n in wdecl:
                decls[n] = wdecl[n]
            elif n in arrays:
                decls[n] = arrays[n].decl
    for a in store.values():
        decls[a.name] = a.decl
    for d in extra:
        decls[_decl_name(d)] = d
    return [decls[k] for k in sorted(decls)]


def _build_dataflow(ctx, tiles: dict, index: int, width: int, layer_of: dict[str, str]) -> None:
    """A dataflow kernel: each mvu_bwd process becomes a call of its layer's own MAC function."""
    from bapipe.codegen.design.context import ident

    macs, fills, new_arrays, drop = [], [], [], set()
    procs = []
    for p in ctx.processes:
        f = parse_mvu_bwd(p)
        if f is None:
            procs.append(p)
            continue
        layer = layer_of[f["aw"]]
        bt = tiles[layer]
        j = bt.job(layer)
        tag = ident(layer)
        drop |= {f["aw"], f["ab"], f"wc_{f['w']}", f["w"] if f["w"].startswith("wc_") else ""}
        arrs, store = _store_arrays(bt, f"s{index}_{tag}_", width) if j.engine == "chunk" else ([], {})
        names = {}
        if j.engine == "row":
            arrs = _row_arrays(j, tag, bt)
            names = {"aw": f"aw_{tag}" if j.home == "chip" else "", "ab": f"ab_{tag}", "w": _src(f["w"]),
                     "xk": f"xk_{tag}" if j.keep else "", "dyk": f"dyk_{tag}" if j.keep else ""}
        new_arrays += arrs + _locals(bt, tag)
        drop |= {f"{tag}.dyb", f"{tag}.xs"}
        e = _engine_job(0, 0, f, j, names)
        name = f"s{index}_bwd_mac_{tag}"
        mac = _tile_mac(name, bt, [e] if j.engine == "chunk" else [], [e] if j.engine == "row" else [], store, width)
        extra = [a.decl for a in arrs] if j.engine == "row" else []
        mac.params = _mac_params_from(ctx, [(f, e)], store, extra, arrs)
        macs.append(mac)
        if j.engine == "chunk" and j.layer.dx:
            src = _src(f["w"])
            fills.append(_fill(bt, j, src, _dims(next(w.dims for w in ctx.weights if w.name == src)), store["wst"]))
        procs.append(f"{name}(0, {', '.join(_names(mac.params))}, n, flush)")
    ctx.processes = procs
    _finish(ctx, macs, fills, new_arrays, drop)


def _src(w: str) -> str:
    """The m_axi weight array an engine read (its on-chip copy ``wc_<w>`` named it)."""
    return w[3:] if w.startswith("wc_") else w


def _names(decls: list[str]) -> list[str]:
    from bapipe.codegen.design.mac_share import _decl_name

    return [_decl_name(d) for d in decls]


def _mac_params_from(ctx, jobs_f, store, extra, arrs) -> list[str]:
    arrays = {a.name: a for a in ctx.arrays}
    for a in arrs:
        arrays[a.name] = a
    saved = ctx.arrays
    ctx.arrays = list(arrays.values())
    try:
        return _mac_params(ctx, jobs_f, store, extra)
    finally:
        ctx.arrays = saved


def _tile_mac(name: str, bt: BwdTiles, chunk: list[EngineJob], rows: list[EngineJob], store: dict,
              width: int) -> TileMac:
    cj = [j for j in bt.jobs if j.engine == "chunk" and j.layer.name in {e.layer for e in chunk}]
    rj = [j for j in bt.jobs if j.engine == "row" and j.layer.name in {e.layer for e in rows}]
    return TileMac(name, _summary(bt, chunk + rows), consts(bt, cj, rj, width), chunk, rows, [],
                   store["aw"].name if "aw" in store else "", store["ab"].name if "ab" in store else "",
                   store["wst"].name if "wst" in store else "", "", any(e.dx for e in chunk))


def _finish(ctx, macs, fills, new_arrays, drop) -> None:
    """Drop the per-layer accumulators and weight copies the engines replaced, add their arrays,
    and turn the weight copies into the weight-store fills (plus the copies still read)."""
    ctx.arrays = [a for a in ctx.arrays if a.name not in drop] + new_arrays
    ctx.acc_ports = [a for a in ctx.acc_ports if a.name not in drop]
    kept = [c for c in ctx.copies if c["dst"] not in drop]
    ctx.copies = kept + fills
    ctx.tile_macs = macs


def _locals(bt: BwdTiles, prefix: str) -> list:
    """The engines' own buffers (counted, declared inside the MAC function): chunk buffers, dx
    reorder buffer, the row engine's vectors."""
    from bapipe.codegen.design.kernel_types import BArray

    out = []
    for a in bt.arrays:
        if a.name in ("dyc", "xc", "dxo", "rx", "rdx"):
            out.append(BArray(f"{prefix}.{a.name}", "data_t", (a.depth, a.banks), a.width,
                              a.impl if a.impl in ("bram", "uram", "lutram") else "registers", local=True,
                              partitions=[(a.banks, 2)]))
    return out


_CHAIN = re.compile(r"^bapipe::(stash_read|swg|resize|window_read)<(.*)>\((.*)\)$")


def _replay_x(procs: list[str], x: str, passes: int) -> list[str]:
    """The processes that make stream ``x`` (a chain back to its stash: stash_read, swg, resize)
    run ``passes`` times a call: the stash read again each time (stash_read_rep), the rest
    on ``n * passes`` beats' worth."""
    out = list(procs)
    want = x
    while want:
        k = next((i for i, p in enumerate(out) if (m := _CHAIN.match(p)) and split_args(m.group(3))[1].strip() == want),
                 None)
        if k is None:
            raise ValueError(f"backward: the stream {x} of an off-chip pass has no stash chain to replay")
        m = _CHAIN.match(out[k])
        kind, targs, args = m.group(1), m.group(2), split_args(m.group(3))
        if kind == "window_read":
            raise ValueError(f"backward: an off-chip pass over window_read ({x}) is not supported")
        if kind == "stash_read":
            out[k] = f"bapipe::stash_read_rep<{targs}, {passes}>({', '.join(a.strip() for a in args)})"
            want = ""
        else:
            out[k] = f"bapipe::{kind}<{targs}>({', '.join(a.strip() for a in args[:-1])}, n * {passes})"
            want = args[0].strip()
    return out


def _build_tm(ctx, tiles: dict, index: int, width: int, layer_of: dict[str, str]) -> None:
    """A time-multiplexed kernel: the shared MAC function runs every matrix turn on one grid."""
    from bapipe.fpga_models.engines import DDR_WORD_BITS

    from bapipe.codegen.design.context import ident
    from bapipe.codegen.design.kernel_types import DdrFrame
    from bapipe.codegen.design.mac_share import _decl_name

    mac = ctx.mac
    bt = next(iter(tiles.values()))
    arrs, store = _store_arrays(bt, f"s{index}_bwd_", width)
    chunk, rows, fills, drop, jobs_f = [], [], [], set(), []
    wdims = {w.name: _dims(w.dims) for w in ctx.weights}
    wfill = []
    for bj in mac.jobs:
        layer = layer_of[bj.aw]
        tj = bt.job(layer)
        tag = ident(layer)
        f = {"dy": bj.dy, "x": bj.x, "dxs": bj.dxs, "dw": bj.dw, "db": bj.db, "out": bj.out, "w": bj.w,
             "aw": bj.aw, "ab": bj.ab}
        drop |= {bj.aw, bj.ab, bj.w if bj.w.startswith("wc_") else ""}
        if tj.engine == "row":
            ra = _row_arrays(tj, tag, bt)
            arrs += ra
            names = {"aw": f"aw_{tag}" if tj.home == "chip" else "", "ab": f"ab_{tag}", "w": _src(bj.w),
                     "xk": f"xk_{tag}" if tj.keep else "", "dyk": f"dyk_{tag}" if tj.keep else ""}
            e = _engine_job(bj.turn, len(rows), f, tj, names)
            rows.append(e)
        else:
            e = _engine_job(bj.turn, len(chunk), f, tj, {})
            chunk.append(e)
            if tj.layer.dx:
                src = _src(bj.w)
                fl = _fill(bt, tj, src, wdims[src], store["wst"])
                (fills if bt.weights == "resident" else wfill).append((bj.turn, fl))
            if tj.passes > 1:
                u = mac.turns[bj.turn]
                mac.turns[bj.turn] = type(u)(**{**u.__dict__, "processes": _replay_x(u.processes, bj.x, tj.passes)})
        jobs_f.append((f, e))
    extra = [a.decl for a in arrs if a.name not in {s.name for s in store.values()}]
    dyf = None
    pj = [(e, tj) for e in chunk for tj in [bt.job(e.layer)] if tj.passes > 1]
    if pj:
        words = max(tj.layer.vec * tj.nf for _e, tj in pj)
        dyf = DdrFrame(f"s{index}_bwd_dyf", "dy kept for off-chip passes", bt.pe, words, words, DDR_WORD_BITS, words)
        ctx.frames = ctx.frames + [dyf]
        extra.append(f"ap_uint<{DDR_WORD_BITS}> {dyf.name}[{words}]")
    tm = _tile_mac(mac.name, bt, chunk, rows, store, width)
    tm.dyf = dyf.name if dyf else ""
    saved = ctx.arrays
    ctx.arrays = [a for a in ctx.arrays] + arrs
    tm.params = _mac_params(ctx, jobs_f, store, extra)
    ctx.arrays = saved
    # the MVU turns' function passes the MAC what the top holds
    rest = {_decl_name(d): d for d in mac.rest_params}
    moved = {s.name for s in mac.streams}
    outer = {_decl_name(d): d for d in tm.params if _decl_name(d) not in moved}
    outer.update({k: v for k, v in rest.items() if k not in moved})
    mac.mac_params = tm.params
    mac.turn_params = [outer[k] for k in sorted(outer)]
    ctx.tile_mac = tm
    local_drop = {f"{mac.name}.dyb", f"{mac.name}.xs"} | {f"{ident(layer_of[j.aw])}.{k}" for j in mac.jobs
                                                          for k in ("dyb", "xs")}
    one = []
    if fills:   # every matrix at its base: one process fills the store, the matrices one after another
        srcs = [fl["src"] for _t, fl in fills]
        params = [f"const data_t {n}{''.join(f'[{d}]' for d in wdims[n])}" for n in srcs] + [store["wst"].decl]
        args = srcs + [store["wst"].name]
        ctx.wfill_all = {"name": f"s{index}_bwd_wst_load", "params": params, "calls": [fl["call"] for _t, fl in fills]}
        one = [{"src": ",".join(srcs), "dst": store["wst"].name, "words": sum(fl["words"] for _t, fl in fills),
                "params": ", ".join(params), "args": ", ".join(args),
                "call": f"{ctx.wfill_all['name']}({', '.join(args)})"}]
    _finish(ctx, [], one, arrs + _locals(bt, mac.name), drop | local_drop)
    ctx.tile_macs = []
    if wfill:   # one turn's matrix in the store, filled before its turn
        srcs = sorted({fl["src"] for _t, fl in wfill})
        ctx.wfill = {"name": f"s{index}_bwd_wfill", "cases": [(t, fl["call"]) for t, fl in wfill],
                     "params": [f"const data_t {n}{''.join(f'[{d}]' for d in wdims[n])}" for n in srcs]
                     + [store["wst"].decl], "args": srcs + [store["wst"].name]}


def array_blocks_of(a) -> "Blocks":
    """Blocks of one of the Design's backward arrays (BArray): its banks (cyclic partitions,
    complete when a factor covers a dimension) of ``bits`` x depth in its storage (memory_blocks,
    UG573); registers and off-chip arrays take none."""
    from math import ceil, prod

    from bapipe.fpga_models.memory_blocks import Blocks, array_blocks

    if a.storage in ("off-chip",):
        return Blocks()
    dims = list(a.dims)
    banks, full = 1, set()
    for f, d in a.partitions:
        if 1 <= d <= len(dims):
            k = max(1, min(f, dims[d - 1]))
            banks *= k
            if k == dims[d - 1]:
                full.add(d - 1)
    if a.storage == "registers" or len(full) == len(dims):
        return Blocks(ff=prod(dims) * a.bits)
    impl = a.storage if a.storage in ("bram", "uram", "lutram") else "auto"
    per = a.reshape[0] if a.reshape else 1   # ARRAY_RESHAPE: a word holds ``per`` elements
    return array_blocks(impl, a.bits * per, banks * ceil(prod(dims) / banks / per), banks)


def stream_blocks_of(s) -> "Blocks":
    """Blocks of one of the Design's backward FIFOs (BStream): UG1399's binding (SRL when short,
    else its BIND_STORAGE, else BRAM: memory_blocks.fifo_impl)."""
    from bapipe.fpga_models.memory_blocks import bank_blocks, fifo_impl

    return bank_blocks(fifo_impl(s.beat_bits, s.depth, s.storage or None), s.beat_bits, s.depth)


def design_blocks(ctx) -> dict:
    """The Design's figure of a backward kernel: BRAM36, URAM and LUTs of every array and FIFO it
    declares (memory_blocks' rules, the ones `bapipe check` applies to the C++), and the DSP of its
    matrix engines (fpga_models.bwd_tiles.kernel_dsp) and element-wise engines (``ew_dsp``)."""
    from bapipe.fpga_models.bwd_tiles import kernel_dsp
    from bapipe.fpga_models.memory_blocks import Blocks

    total = Blocks()
    for a in ctx.arrays:
        total = total + array_blocks_of(a)
    seen = set()
    for s in ctx.streams + list(getattr(ctx, "top_streams", [])):
        if s.name in seen:
            continue
        seen.add(s.name)
        total = total + stream_blocks_of(s)
    return {"bram36": total.bram36, "uram": total.uram, "lut": total.lut,
            "dsp": kernel_dsp(ctx.tiles) + getattr(ctx, "ew_dsp", 0)}
