"""The backward (training) kernel of a stage, decided here and printed by stage_bwd.cpp.j2.

One DATAFLOW region of streaming engines (hls_templates/hls/bapipe_layers_bwd.h.j2), each a
process with one flattened II=1 loop over the micro-batch:

- a matrix layer (dense, conv2d) is a tiled engine (fpga_models.bwd_tiles decides it,
  codegen.design.bwd_engines builds it: a chunk engine of output-stationary weight-gradient
  lanes and weight-reusing input-gradient lanes, or a row engine for few vectors a call); the
  walk below first writes a ``bapipe::mvu_bwd<...>(...)`` placeholder call naming its streams and
  arrays, which that pass replaces; a conv's dx goes through col2im, a row buffer that emits
  each finished input row;
- activation stashes (the inputs the forward saw) are read from memory by their own reader
  processes (``stash_read``: L elements a beat; ``window_read``: a conv's window columns),
  never held whole on chip;
- weight-gradient sums are exact, in accumulators of ``acc_width(T)`` bits for T terms (the
  iteration's vectors: micro-batches x samples x pixels), on chip or in their dW arrays off chip
  (off-chip passes, fpga_models.bwd_tiles); the flush writes them exact (64-bit ``wsum_t``,
  22 fraction bits, fpga_models.train_fixed) for the update kernel (codegen.design.train_kernels);
- element-wise engines (relu, batchnorm, pools, flatten, add, width converters) at the plan's
  lanes; gradients of a tensor read by several layers meet in a saturating add, in the order
  of fpga_models.fixedpoint.stage_bwd.

Every stream depth, lane count, accumulator width and storage place is computed here or in
fpga_models.bwd_tiles; the template prints them. The kernel's MB is the samples one replica
computes per micro-batch.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from math import prod

from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models.memory_blocks import storage_impl
from bapipe.fpga_models.bwd_memory import ACC_ONCHIP_SHARE, PORTS_TURN, STREAM_DEPTH, acc_width
from bapipe.fpga_models.engines import MVU_FILL, conv_window_lanes, ddr_words_per_beat

from bapipe.codegen.design.kernel_types import BArray, BStream, DdrFrame

#: the width of an m_axi burst beat (bits): dW/db leave one beat a cycle
AXI_BITS = 512
#: default depth of a stream between two engines (the Vitis HLS default handshake FIFO)
#: widest accumulator the C-simulation's 64-bit integer path holds exactly
MAX_ACC_BITS = 64
#: bits of one weight-gradient sum in memory (bapipe::wsum_t): the exact accumulator, widened
WSUM_BITS = 64


@dataclass
class StashPort:
    """An m_axi input: one layer's stashed input activation, MB samples in stream order."""

    name: str
    tensor: str
    layer: str
    elements: int           # per sample


@dataclass
class BPort:
    """An AXI4-Stream port of the backward kernel: LANES elements a beat."""

    name: str
    tensor: str
    shape: tuple[int, ...]
    elements: int
    lanes: int


@dataclass
class GradArray:
    """A weight-gradient output (m_axi): dW in kernel layout or db."""

    name: str
    count: int
    dims: str
    layer: str
    key: str


@dataclass
class BwdTurn:
    """One backward turn of a time-multiplexed stage: a DATAFLOW function over one layer's
    engines, called once per sample (and once more, with no samples, to flush the weight
    gradients); what other turns share with it are parameters."""

    name: str
    layer: str
    params: list[str]                 # C declarations
    args: list[str]                   # the call's arguments (the sample index ``i`` in scope)
    streams: list[BStream]            # declared inside the turn
    processes: list[str]


@dataclass
class BwdCtx:
    """A stage's backward kernel: ports, memories, streams and the dataflow processes."""

    name: str
    mb: int
    in_ports: list[BPort]             # dy_out*: gradients of the stage's outputs
    out_ports: list[BPort]            # dx_in*: gradients of its inputs (none for model inputs)
    stashes: list[StashPort]
    grad_arrays: list[GradArray]
    acc_ports: list[BArray]           # off-chip accumulators (m_axi scratch)
    arrays: list[BArray]              # static on-chip arrays of the kernel + engines' local buffers
    streams: list[BStream]
    processes: list[str]              # one C call each, in the DATAFLOW region
    weights: list = field(default_factory=list)   # m_axi weight inputs (external weights only)
    engines: list[dict] = field(default_factory=list)   # per engine: layer, what, cycles per sample
    turns: list[BwdTurn] = field(default_factory=list)   # time-multiplexed: the layers' turns in order
    frames: list[DdrFrame] = field(default_factory=list)   # time-multiplexed: gradient frames off chip
    top_streams: list[BStream] = field(default_factory=list)   # time-multiplexed: the frames on chip
    # time-multiplexed: every frame between turns as built, (writer, reader, lanes, bytes, off chip)
    frame_turns: list[tuple] = field(default_factory=list)
    # matrix layers whose backward computes dx (an input-gradient array: fpga_models.gradients)
    dx_layers: frozenset = frozenset()
    mac: object = None   # time-multiplexed: the MVU turns' shared arrays (codegen.design.mac_share.BwdMacShare)
    copies: list[dict] = field(default_factory=list)   # on-chip copies of the m_axi weights, filled once a call
    tile_macs: list = field(default_factory=list)   # dataflow: each matrix layer's MAC function (codegen.design.bwd_engines)
    stash_bundles: dict = field(default_factory=dict)   # stash port -> m_axi bundle (codegen.design.bundles.mirror_bundles)
    ew_dsp: int = 0                   # DSP of its element-wise engines (the matrix engines': tiles)
    tile_mac: object = None   # time-multiplexed: the shared MAC function's tiled engines (codegen.design.bwd_engines)
    wfill: dict = field(default_factory=dict)   # time-multiplexed, weights not all held: a turn's weight-store fill
    wfill_all: dict = field(default_factory=dict)   # time-multiplexed, weights held: the store's fill, once an iteration
    tiles: dict = field(default_factory=dict)   # layer -> fpga_models.bwd_tiles.BwdTiles (the decision it builds)

    @property
    def declared_streams(self) -> list[BStream]:
        """The streams the top function declares (the others are the turns' own)."""
        return self.top_streams if self.turns else self.streams

    @property
    def stream_ports(self) -> list[str]:
        return [p.name for p in self.in_ports + self.out_ports]

    @property
    def params(self) -> list[str]:
        """The C parameter list of the top function."""
        return ([f"hls::stream<bapipe::bvec<{p.lanes}> > &{p.name}" for p in self.in_ports + self.out_ports]
                + [f"const data_t {s.name}[MB * {s.elements}]" for s in self.stashes]
                + [f"bapipe::wsum_t {a.name}{a.dims}" for a in self.grad_arrays]
                + [f"{a.ctype} {a.name}{a.cdims}" for a in self.acc_ports]
                + [f"const data_t {w.name}{w.dims}" for w in self.weights]
                + [f"ap_uint<{f.bits}> {f.name}[{f.words}]" for f in self.frames] + ["int n", "int flush"])

    @property
    def args(self) -> list[str]:
        return (self.stream_ports + [s.name for s in self.stashes] + [a.name for a in self.grad_arrays]
                + [a.name for a in self.acc_ports] + [w.name for w in self.weights] + [f.name for f in self.frames]
                + ["n", "flush"])

    @property
    def onchip_bytes(self) -> int:
        """Bytes of on-chip memory the kernel declares: static arrays, engines' buffers, FIFOs."""
        return sum(a.bytes for a in self.arrays) + sum(s.bytes for s in self.streams)

    @property
    def static_arrays(self) -> list[BArray]:
        return [a for a in self.arrays if not a.local]

    def host_config(self) -> dict:
        """The kernel's entry in host_config.json."""
        return {
            "kernel": self.name, "microbatch": self.mb,
            "inputs": [{"port": q.name, "tensor": q.tensor, "shape": list(q.shape), "elements": q.elements,
                        "lanes": q.lanes} for q in self.in_ports],
            "outputs": [{"port": q.name, "tensor": q.tensor, "shape": list(q.shape), "elements": q.elements,
                         "lanes": q.lanes} for q in self.out_ports],
            "stashes": [{"arg": s.name, "tensor": s.tensor, "layer": s.layer, "elements": s.elements}
                        for s in self.stashes],
            "weight_grads": [{"name": a.name, "layer": a.layer, "kind": a.key, "elements": a.count,
                              "layout": "kernel (conv: MVU matrix O x kh*kw*C)",
                              "format": f"int{WSUM_BITS} exact sum, 22 fraction bits (A x G)"} for a in self.grad_arrays],
            "accumulators": [{"arg": a.name, "elements": prod(a.dims), "bits": a.bits} for a in self.acc_ports],
            **({"frames": [{"arg": f.name, "stream": f.stream, "words": f.words, "bits": f.bits}
                           for f in self.frames]} if self.frames else {}),
            "onchip_bytes": self.onchip_bytes,
            "engines": self.engines,
        }


# ---------------------------------------------------------------- helpers

def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def replica_batch(plan, st) -> int:
    """Samples one replica of the stage computes per micro-batch (the planner's beta)."""
    return max(1, _ceil_div(max(1, plan.microbatch_size), max(1, st.replicas)))


class _Builder:
    """Collects streams, arrays and processes while the layers are walked in reverse."""

    def __init__(self, fmt_width: int, mb: int):
        self.w = fmt_width
        self.mb = mb
        self.streams: list[BStream] = []
        self.arrays: list[BArray] = []
        self.procs: list[str] = []
        self.engines: list[dict] = []
        self.turn: str = ""             # the layer whose backward turn the next processes belong to
        self.turn_of: list[str] = []    # per process, its turn (time-multiplexed stages)
        self.ew_dsp = 0                 # DSP of the element-wise engines it emits (a batchnorm: one a lane)
        self._n = 0

    def stream(self, base: str, lanes: int, depth: int = STREAM_DEPTH, raw_bits: int = 0) -> str:
        self._n += 1
        name = f"s{self._n}_{base}"
        if raw_bits:
            beat, bits = f"bapipe::rvec<{lanes}, {raw_bits}>", lanes * raw_bits   # ap_int<raw_bits> lanes
        else:
            beat, bits = f"bapipe::bvec<{lanes}>", lanes * self.w
        self.streams.append(BStream(name, beat, depth, bits))
        return name

    def stash_read(self, st_name: str, out: str, n: int, lanes: int, layer: str) -> None:
        """A stash reader: ``n`` elements a sample, ``lanes`` a vector, in as many 512-bit port
        beats as a vector takes (fpga_models.engines.ddr_words_per_beat), one a cycle."""
        beats = ddr_words_per_beat(lanes, self.w)
        self.proc(f"bapipe::stash_read<{n}, {lanes}, {beats}>({st_name}, {out})", layer, "stash_read",
                  n // lanes * beats)

    def proc(self, call: str, layer: str, what: str, cycles: int) -> None:
        """One DATAFLOW process; every engine takes the call's sample count ``n`` last."""
        call = call.rstrip(";")
        assert call.endswith(")"), call
        self.procs.append(call[:-1] + ", n)")
        self.turn_of.append(self.turn)
        self.engines.append({"layer": layer, "engine": what, "cycles_per_sample": cycles})


# ---------------------------------------------------------------- the kernel

def build_bwd(plan, model, st, sc, fmt, board=None) -> BwdCtx:
    """The backward kernel of stage ``st`` (StageCtx ``sc`` holds its ports and weight arrays)."""
    from bapipe.plan import Folding
    from bapipe.fpga_models.bwd_tiles import col2im_buffer, col2im_plan, engine_folding, stage_tiles
    from bapipe.fpga_models.gradients import gradient_tensors

    from bapipe.codegen.design.bwd_engines import build as build_engines
    from bapipe.codegen.design.context import ident, mvu_dims

    mb = replica_batch(plan, st)
    W = fmt.width
    layers = [model.layers[model.index[n]] for n in st.layers]
    lc_of = {lc.name: lc for lc in sc.layers}
    model_inputs = {i.name for i in model.inputs}
    in_tensors = [p.tensor for p in sc.inputs]
    elems = {p.tensor: p.elements for p in sc.inputs}
    for l in layers:
        elems[l.name] = l.out_elems
    fold = {n: st.folding.get(n, Folding()) for n in st.layers}
    # the matrix engines as fpga_models.bwd_tiles decides them: their streams' lanes
    from bapipe.fpga_models.allocate import plan_bwd_room
    from bapipe.fpga_models.bwd_memory import engine_uram

    tiles = stage_tiles(model, layers, _fold_of(st, layers), "tm" if st.style == "time-multiplexed" else "dataflow",
                        mb, max(1, plan.microbatches) * mb, board, W,
                        engine_uram(plan_bwd_room(plan, model, st, board), board))
    for n, (pe, simd) in engine_folding(tiles, _fold_of(st, layers)).items():
        if n in tiles:
            fold[n] = Folding(pe, simd)

    # which gradients are needed: a layer is active when it learns or passes a needed gradient;
    # a stage input carries one unless no parameter lies upstream of it (the model's input:
    # fpga_models.gradients, the rule the plan prices)
    needed: set[str] = {t for t in in_tensors if t in gradient_tensors(model)}
    active: set[str] = set()
    for l in layers:
        if l.type in ("dense", "conv2d") or any(i in needed for i in l.inputs):
            active.add(l.name)
            needed.add(l.name)

    # the width each gradient's reader wants (None: any)
    def dy_lanes(l) -> int | None:
        fo = fold[l.name]
        if l.type in ("dense", "conv2d"):
            return fo.pe
        if l.type in ("add",):
            return None
        if l.type == "flatten":
            return None
        return fo.ew_lanes

    b = _Builder(W, mb)
    # gradient contributions per tensor: (stream, lanes) in the reference's order
    contrib: dict[str, list[tuple[str, int]]] = {t: [] for t in list(elems)}
    in_ports: list[BPort] = []
    for p in sc.outputs:
        if p.tensor not in needed:
            continue
        prod_l = next((l for l in layers if l.name == p.tensor), None)
        want = dy_lanes(prod_l) if prod_l is not None else None
        lanes = want or _divisor_at_most(p.elements, 16)
        in_ports.append(BPort(f"dy_{p.name}", p.tensor, tuple(p.shape), p.elements, lanes))
        contrib[p.tensor].append((f"dy_{p.name}", lanes))

    def resize(src: str, n: int, a: int, bl: int, tag: str) -> str:
        """src (a lanes) as a stream of bl lanes (through gcd when neither divides the other)."""
        if a == bl:
            return src
        if a % bl and bl % a:
            g = math.gcd(a, bl)
            return resize(resize(src, n, a, g, tag), n, g, bl, tag)
        out = b.stream(f"{tag}_w{bl}", bl)
        b.proc(f"bapipe::resize<{n}, {a}, {bl}>({src}, {out});", tag, "resize", n // min(a, bl))
        return out

    def gradient(t: str, lanes: int | None) -> tuple[str, int]:
        """The stream carrying the gradient of tensor t (summed over its contributions) at ``lanes``."""
        n = elems[t]
        parts = contrib[t]
        tag = ident(t)
        if not parts:
            L = lanes or _divisor_at_most(n, 16)
            z = b.stream(f"g_{tag}_zero", L)
            b.proc(f"bapipe::zeros<{n}, {L}>({z});", t, "zeros", n // L)
            return z, L
        L = lanes or parts[0][1]
        cur = resize(parts[0][0], n, parts[0][1], L, f"g_{tag}")
        for s, a in parts[1:]:
            other = resize(s, n, a, L, f"g_{tag}")
            out = b.stream(f"g_{tag}_sum", L)
            b.proc(f"bapipe::grad_sum<{n}, {L}>({cur}, {other}, {out});", t, "grad_sum", n // L)
            cur = out
        return cur, L

    stashes: list[StashPort] = []
    reads: dict[str, list[tuple[int, int]]] = {}   # weight arrays the engines read -> their copy's partitions
    grads: list[GradArray] = []
    acc_arrays: list[BArray] = []      # weight-gradient accumulators (placed below)
    acc_users: list[tuple[BArray, BArray]] = []

    def stash(l, tensor: str) -> str:
        name = f"st_{ident(l.name)}"
        stashes.append(StashPort(name, tensor, l.name, elems[tensor]))
        return name

    def window(l, st_name: str, simd: int, tag: str) -> str:
        """The window columns of layer l's stashed input, SIMD elements a beat (k = tap*C + c):
        the stash streamed in order through the line-buffer generator swg (square windows; a
        matrix engine's at the width fpga_models.bwd_tiles.window_pace gives it), else gathered
        from memory by window_read."""
        c, h, w_ = l.in_shapes[0]
        (kh, kw), (sh, sw), (ph, pw) = l.attr["kernel"], l.attr["stride"], l.attr["padding"]
        ho, wo = l.out_shape[1], l.out_shape[2]
        cols = ho * wo * kh * kw * c
        job = tiles[l.name].job(l.name) if l.name in tiles else None
        wsimd = job.wsimd if job is not None and job.wsimd else simd
        lanes, taps = conv_window_lanes(c, kh, wsimd) if l.type == "conv2d" else (simd, 1)
        if kh == kw and sh == sw and ph == pw and simd % (lanes * taps) == 0 and c % lanes == 0:
            raw = b.stream(f"xs_{tag}", lanes)
            b.stash_read(st_name, raw, c * h * w_, lanes, l.name)
            rows = kh + sh - 1                  # as the forward's window generator (codegen.design.tm_kernel)
            col = b.stream(f"col_{tag}", lanes * taps)
            b.proc(f"bapipe::swg<{c}, {h}, {w_}, {kh}, {ph}, {sh}, {lanes}, {taps}, {rows}, false>({raw}, {col})",
                   l.name, "swg", max(c * h * w_ // lanes, cols // (lanes * taps)))
            # its line buffer as the template banks it (bapipe_engines.h swg: rows x K x lanes)
            b.arrays.append(BArray(f"{tag}.swg_rows", "data_t", (rows, w_, c), W, "auto", local=True,
                                   partitions=[(rows, 1), (kh, 2), (lanes, 3)]))
            return resize(col, cols, lanes * taps, simd, tag)
        x = b.stream(f"x_{tag}", simd)
        wp = f"{c}, {h}, {w_}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}"
        b.proc(f"bapipe::window_read<{wp}, {simd}>({st_name}, {x})", l.name, "window_read", cols // simd)
        return x

    def want_of(t: str) -> int | None:
        """Lanes the reader of gradient t wants (its producer layer, or the dx port)."""
        prod_l = next((l for l in layers if l.name == t), None)
        if prod_l is not None:
            return dy_lanes(prod_l)
        return None

    # the convs' col2im row buffers: one shared by a time-multiplexed kernel's turns, else one a layer
    tm = st.style == "time-multiplexed"
    c2i = {l.name: col2im_plan(l, tiles[l.name].job(l.name), want_of(l.inputs[0]) or l.in_shapes[0][0], tm)
           for l in layers if l.type == "conv2d" and l.name in tiles and l.inputs[0] in needed}
    lb_of = {}
    for a in col2im_buffer(list(c2i.values()), tm):
        mine = list(c2i) if tm else [a.name[3:]]
        rows = max(c2i[n].rows for n in mine)
        chans = a.banks // rows
        arr = BArray(f"lb_s{st.index}" if tm else f"lb_{ident(mine[0])}", f"bapipe::gacc<{a.width}>",
                     (rows, a.depth * chans), a.width, a.impl, partitions=[(rows, 1), (chans, 2)])
        b.arrays.append(arr)
        lb_of.update({n: arr for n in mine})

    for l in reversed(layers):
        if l.name not in active:
            continue
        b.turn = l.name
        fo = fold[l.name]
        tag = ident(l.name)
        src = l.inputs[0]
        n_in = elems[src]
        need_dx = [i in needed for i in l.inputs]
        if l.type in ("dense", "conv2d"):
            mh, mw = mvu_dims(l)
            pe, simd = fo.pe, fo.simd
            nf, sf = mh // pe, mw // simd
            dy, _ = gradient(l.name, pe)
            lc = lc_of[l.name]
            wname = lc.weights[0].name
            reads[wname] = [(pe, 1), (simd, 2)]
            st_name = stash(l, src)
            if l.type == "dense":
                x = b.stream(f"x_{tag}", simd)
                vec = prod(l.in_shapes[0][:-1])
                b.stash_read(st_name, x, vec * mw, simd, l.name)
                terms_dx = mh
            else:
                c, h, w_ = l.in_shapes[0]
                (kh, kw), (sh, sw), (ph, pw) = l.attr["kernel"], l.attr["stride"], l.attr["padding"]
                ho, wo = l.out_shape[1], l.out_shape[2]
                vec = ho * wo
                wp = f"{c}, {h}, {w_}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}"
                x = window(l, st_name, simd, tag)
                terms_dx = mh * kh * kw
            gb = acc_width(max(1, plan.microbatches) * mb * vec, W, W)   # summed over the iteration's calls
            xb = acc_width(terms_dx, W, W)
            if gb > MAX_ACC_BITS or xb > MAX_ACC_BITS:
                raise ValueError(f"layer '{l.name}': a {max(gb, xb)}-bit gradient accumulator exceeds "
                                 f"{MAX_ACC_BITS} bits ({plan.microbatches} micro-batches of {mb} x {vec} vectors)")
            aw = BArray(f"aw_{tag}", f"bapipe::gacc<{gb}>", (mh, mw), gb, "bram", partitions=[(pe, 1), (simd, 2)])
            ab = BArray(f"ab_{tag}", f"bapipe::gacc<{gb}>", (mh,), gb, "registers", partitions=[(pe, 1)])
            acc_arrays.append(aw)
            acc_users.append((aw, ab))
            b.arrays.append(ab)
            b.arrays.extend([BArray(f"{tag}.dyb", "data_t", (mh,), W, "registers", local=True),
                             BArray(f"{tag}.xs", "data_t", (mw,), W, "lutram", local=True)])
            dw = GradArray(f"dw_{tag}", mh * mw, f"[{mh}][{mw}]", l.name, "dw")
            db = GradArray(f"db_{tag}", mh, f"[{mh}]", l.name, "db")
            grads.extend([dw, db])
            steps = nf * sf * (2 if need_dx[0] else 1)
            wl = AXI_BITS // WSUM_BITS
            if need_dx[0] and l.type == "dense":
                dx = b.stream(f"dx_{tag}", simd)
                out_t = f"bapipe::bvec<{simd}>"
            elif need_dx[0]:
                dx = b.stream(f"dxc_{tag}", simd, raw_bits=xb)
                out_t = f"bapipe::rvec<{simd}, {xb}>"
            else:
                dx = b.stream(f"nodx_{tag}", simd)
                out_t = f"bapipe::bvec<{simd}>"
            b.turn_of.append(b.turn)
            b.procs.append(f"bapipe::mvu_bwd<{mh}, {mw}, {pe}, {simd}, {int(need_dx[0])}, {gb}, {xb}, {wl}, "
                           f"{MVU_FILL}, {out_t} >({dy}, {x}, {dx}, {wname}, {aw.name}, {ab.name}, {dw.name}, "
                           f"{db.name}, (long)n * {vec}, flush)")
            b.engines.append({"layer": l.name, "engine": "mvu_bwd", "cycles_per_sample": vec * steps,
                              "flush_cycles": _ceil_div(mh * mw, wl) + _ceil_div(mh, wl)})
            if not need_dx[0]:
                continue
            if l.type == "dense":
                contrib[src].append((dx, simd))
                continue
            # col2im over a row buffer (fpga_models.bwd_tiles.col2im_plan: its lanes, banks and storage)
            c2 = c2i[l.name]
            src_dx = dx
            if c2.lin < simd:   # narrower beats: one every NF cycles keeps pace with the engine
                src_dx = b.stream(f"dxn_{tag}", c2.lin, raw_bits=xb)
                b.proc(f"bapipe::resize_sums<{vec * mw}, {simd}, {c2.lin}, {xb}>({dx}, {src_dx})", l.name, "resize",
                       vec * mw // c2.lin)
            lout = c2.lout
            out = b.stream(f"dx_{tag}", lout)
            lb = lb_of[l.name]
            b.proc(f"bapipe::col2im_rows<{wp}, {c2.lin}, {lout}, {xb}, bapipe::FINISH_REQUANT, 0, {lb.dims[0]}, "
                   f"{lb.dims[1]}, {lb.bits}>({src_dx}, {out}, {lb.name});", l.name, "col2im",
                   _col2im_steps(h, w_, c, kh, sh, ph, vec * (kh * kw * c // c2.lin), lout))
            contrib[src].append((out, lout))
        elif l.type == "relu":
            L = fo.ew_lanes
            dy, _ = gradient(l.name, L)
            x = b.stream(f"x_{tag}", L)
            # the relu's output, not its input: relu(x) > 0 exactly when x > 0, and a relu fused
            # into the MVU before it has no forward stream of its input (codegen.design.stash)
            st_name = stash(l, l.name)
            b.stash_read(st_name, x, n_in, L, l.name)
            out = b.stream(f"dx_{tag}", L)
            b.proc(f"bapipe::relu_bwd<{n_in}, {L}>({x}, {dy}, {out});", l.name, "relu_bwd", n_in // L)
            contrib[src].append((out, L))
        elif l.type == "batchnorm":
            L = fo.ew_lanes
            s = l.in_shapes[0]
            ch = s[0] if len(s) == 3 else s[-1]
            dy, _ = gradient(l.name, L)
            # trained: the exact per-channel sums dscale = sum dy x, dshift = sum dy << 10 over the
            # iteration (fpga_models.train_fixed.batchnorm_bwd_weight), x from its stash
            x = b.stream(f"x_{tag}", L)
            st_name = stash(l, src)
            b.stash_read(st_name, x, n_in, L, l.name)
            gb = acc_width(max(1, plan.microbatches) * mb * (n_in // ch), W, W)
            if gb > MAX_ACC_BITS:
                raise ValueError(f"layer '{l.name}': a {gb}-bit gradient accumulator exceeds {MAX_ACC_BITS} bits")
            # the engine adds L channels a cycle, the flush writes a 512-bit beat (8 sums) a cycle
            banks = min(ch, max(L, AXI_BITS // WSUM_BITS))
            acc_s = BArray(f"as_{tag}", f"bapipe::gacc<{gb}>", (ch,), gb, "registers", partitions=[(banks, 1)])
            acc_h = BArray(f"ash_{tag}", f"bapipe::gacc<{gb}>", (ch,), gb, "registers", partitions=[(banks, 1)])
            b.arrays.extend([acc_s, acc_h])
            ds = GradArray(f"ds_{tag}", ch, f"[{ch}]", l.name, "scale")
            dsh = GradArray(f"dsh_{tag}", ch, f"[{ch}]", l.name, "shift")
            grads.extend([ds, dsh])
            out = b.stream(f"dx_{tag}", L)
            wl = AXI_BITS // WSUM_BITS
            b.ew_dsp += 2 * L   # dy x scale and dy x x a lane (fpga_models.bwd_memory.elementwise_dsp)
            b.turn_of.append(b.turn)
            # the engine reads L scales a cycle, the copy writes a 512-bit beat (32) a cycle
            reads[lc_of[l.name].weights[0].name] = [(min(ch, max(L, AXI_BITS // W)), 1)]
            b.procs.append(f"bapipe::batchnorm_bwd_train<{n_in}, {ch}, {L}, {gb}, {wl}>({dy}, {x}, {out}, "
                           f"{lc_of[l.name].weights[0].name}, {acc_s.name}, {acc_h.name}, {ds.name}, {dsh.name}, n, "
                           f"flush)")
            b.engines.append({"layer": l.name, "engine": "batchnorm_bwd", "cycles_per_sample": n_in // L,
                              "flush_cycles": _ceil_div(ch, wl)})
            contrib[src].append((out, L))
        elif l.type in ("maxpool", "avgpool"):
            L = fo.ew_lanes
            c, h, w_ = l.in_shapes[0]
            (kh, kw), (sh, sw), (ph, pw) = l.attr["kernel"], l.attr["stride"], l.attr["padding"]
            ho, wo = l.out_shape[1], l.out_shape[2]
            kk = kh * kw
            recip = fx.avg_recip(kk)
            dy, _ = gradient(l.name, L)
            disjoint = kh == kw == sh == sw and ph == pw == 0 and h % kh == 0 and w_ % kw == 0
            out = b.stream(f"dx_{tag}", L)
            if disjoint:
                if l.type == "maxpool":
                    x = b.stream(f"x_{tag}", L)
                    st_name = stash(l, src)
                    b.stash_read(st_name, x, n_in, L, l.name)
                    pv = b.stream(f"arg_{tag}", L)
                    b.streams[-1].beat, b.streams[-1].beat_bits = f"bapipe::pvec<{L}>", L * (W + 8)
                    b.proc(f"bapipe::maxpool_bwd_scan<{c}, {h}, {w_}, {kh}, {L}>({x}, {dy}, {pv});",
                           l.name, "maxpool_bwd_scan", n_in // L)
                    b.proc(f"bapipe::pool_bwd_emit<{c}, {h}, {w_}, {kh}, {L}, 1, {recip}, bapipe::pvec<{L}> >"
                           f"({pv}, {out});", l.name, "pool_bwd_emit", n_in // L)
                    b.arrays.append(BArray(f"{tag}.scan", "data_t", (wo, c), W + 8, "registers", local=True))
                else:
                    b.proc(f"bapipe::pool_bwd_emit<{c}, {h}, {w_}, {kh}, {L}, 0, {recip}, bapipe::bvec<{L}> >"
                           f"({dy}, {out});", l.name, "pool_bwd_emit", n_in // L)
                b.arrays.append(BArray(f"{tag}.emit", "data_t", (wo, c), W + 8, "registers", local=True))
            else:
                gb = W + math.ceil(math.log2(kk + 1)) + 1
                wp = f"{c}, {h}, {w_}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}"
                r = b.stream(f"contrib_{tag}", L, raw_bits=gb)
                if l.type == "maxpool":
                    st_name = stash(l, src)
                    x = window(l, st_name, L, tag)
                    b.proc(f"bapipe::maxpool_bwd_window<{wp}, {L}, {gb}>({x}, {dy}, {r});", l.name,
                           "maxpool_bwd_window", (ho * wo + 1) * kk * c // L)
                    mode = "bapipe::FINISH_SAT"
                else:
                    b.proc(f"bapipe::avgpool_bwd_spread<{c}, {ho}, {wo}, {kk}, {L}, {gb}>({dy}, {r});", l.name,
                           "avgpool_bwd_spread", ho * wo * kk * c // L)
                    mode = "bapipe::FINISH_AVG"
                parts = _lb_partitions(kh, kw, sh, w_, c, L, L)
                nb = prod(f for f, _d in parts)
                # its banks where the shared rule puts them (memory_blocks.storage_impl): resnet50's
                # pool1, 960 banks of 38 sums, one BRAM18 each as BRAM (480 BRAM36), LUTRAM
                impl = storage_impl(gb, _ceil_div((kh + sh) * w_ * c, nb), nb,
                                    *((board.usable_bram36, board.usable_uram) if board is not None else ()))
                b.arrays.append(BArray(f"lb_{tag}", f"bapipe::gacc<{gb}>", (kh + sh, w_, c), gb, impl,
                                       partitions=parts))
                b.proc(f"bapipe::col2im<{wp}, {L}, {L}, {gb}, {mode}, {recip}>({r}, {out}, lb_{tag});",
                       l.name, "col2im", _col2im_steps(h, w_, c, kh, sh, ph, ho * wo * kk * c // L, L))
            contrib[src].append((out, L))
        elif l.type == "globalavgpool":
            L = fo.ew_lanes
            c, h, w_ = l.in_shapes[0]
            dy, _ = gradient(l.name, L)
            out = b.stream(f"dx_{tag}", L)
            b.proc(f"bapipe::globalavgpool_bwd<{c}, {h}, {w_}, {L}, {fx.avg_recip(h * w_)}>({dy}, {out});",
                   l.name, "globalavgpool_bwd", n_in // L)
            contrib[src].append((out, L))
        elif l.type == "flatten":
            s = l.in_shapes[0]
            dy, lin = gradient(l.name, None)
            if len(s) == 3:
                want = want_of(src) or lin
                lout = want if n_in % want == 0 else math.gcd(n_in, want)
                out = b.stream(f"dx_{tag}", lout)
                b.proc(f"bapipe::unflatten<{s[0]}, {s[1]}, {s[2]}, {lin}, {lout}>({dy}, {out});", l.name,
                       "unflatten", max(n_in // lin, n_in // lout))
                b.arrays.append(BArray(f"{tag}.buf", "data_t", (2, n_in), W, "bram", local=True))
                contrib[src].append((out, lout))
            else:
                contrib[src].append((dy, lin))
        elif l.type == "add":
            dy, L = gradient(l.name, None)
            n = elems[l.name]
            outs = [k for k, i in enumerate(l.inputs) if need_dx[k]]
            depths = _skip_depths(l, layers, elems, L, tiles)
            cur = dy
            for j, k in enumerate(outs):
                if j == len(outs) - 1:
                    contrib[l.inputs[k]].append((cur, L))
                    break
                o0 = b.stream(f"dx_{tag}_{k}", L, depth=depths[k])
                o1 = b.stream(f"fan_{tag}_{k}", L, depth=max(depths[k + 1:]))
                b.proc(f"bapipe::dup2<{n}, {L}>({cur}, {o0}, {o1});", l.name, "dup2", n // L)
                contrib[l.inputs[k]].append((o0, L))
                cur = o1
        else:
            raise ValueError(f"layer '{l.name}': type '{l.type}' has no HLS backward engine")

    # gradients of the stage inputs leave through the dx ports
    out_ports: list[BPort] = []
    b.turn = PORTS_TURN
    for p in sc.inputs:
        if p.tensor in model_inputs:
            continue
        s, L = gradient(p.tensor, None)
        out_ports.append(BPort(f"dx_{p.name}", p.tensor, tuple(p.shape), p.elements, L))
        if any(q.name == s for q in in_ports):   # a tensor the stage passes on: dy goes straight back
            b.proc(f"bapipe::resize<{p.elements}, {L}, {L}>({s}, dx_{p.name})", p.tensor, "copy", p.elements // L)
        else:
            _rename_stream(b, s, f"dx_{p.name}")

    rom_bytes = sum(int(w.kernel_q.size) for w in sc.weights) * ((W + 7) // 8) if sc.embed_weights else 0
    budget = _bwd_budget(plan, st, board)
    copies = [] if sc.embed_weights else _copy_weights(sc, reads, W, budget, b)
    mem = None
    if st.style == "time-multiplexed":   # the plan's decision (fpga_models.bwd_memory), not re-derived
        mem = bwd_memory_of(plan, model, st, board, budget)
        layer_of = {f"aw_{ident(l.name)}": l.name for l in layers}
        for aw, _ab in acc_users:
            aw.storage = (("uram" if aw.bytes >= 64 * 1024 else "bram") if mem.acc_onchip[layer_of[aw.name]]
                          else "off-chip")
    else:
        _place_accumulators(acc_users, b, board, None if budget is None else budget - rom_bytes)
    acc_ports = [a for a, _ in acc_users if a.storage == "off-chip"]
    b.arrays = [a for a, _ in acc_users if a.storage != "off-chip"] + b.arrays
    pos = {l.name: i for i, l in enumerate(layers)}
    grads.sort(key=lambda a: (pos[a.layer], a.key != "dw"))
    stashes.sort(key=lambda s: pos[s.layer])
    ctx = BwdCtx(name=f"{sc.name}_bwd", mb=mb, in_ports=in_ports, out_ports=out_ports, stashes=stashes,
                 grad_arrays=grads, acc_ports=acc_ports, arrays=b.arrays, streams=b.streams, processes=b.procs,
                 weights=[] if sc.embed_weights else [w for w in sc.weights if w.name in reads], engines=b.engines,
                 copies=copies)
    ctx.dx_layers = frozenset(l.name for l in layers if l.type in ("dense", "conv2d") and l.inputs[0] in needed)
    layer_of = {f"aw_{ident(l.name)}": l.name for l in layers}
    if st.style == "time-multiplexed":
        frame_elems = {s: elems[t] for t, parts in contrib.items() for s, _l in parts}
        _sequence_turns(ctx, b.turn_of, frame_elems, W, mem)
        _share_arrays(ctx, st.index, W)
    ctx.tiles = tiles
    ctx.ew_dsp = b.ew_dsp
    if tiles:   # the tiled matrix engines replace the mvu_bwd calls (codegen.design.bwd_engines)
        build_engines(ctx, tiles, st.index, W, layer_of)
    return ctx


def _copy_weights(sc, reads: dict, width: int, budget: int | None, b: _Builder) -> list[dict]:
    """On-chip copies of the m_axi weight vectors the engines read (a trained batchnorm's scale;
    never the biases, which no backward engine reads; the matrices live in the tiled engines'
    weight store, codegen.design.bwd_engines), filled at the start of an iteration by one
    pipelined loop per array of 512-bit beats (AXI_BITS / width elements a cycle, the port widened
    to 512 bits), so no engine reads m_axi inside its II=1 loop: when the weights all fit what
    the forward's rule gives a kernel's weights (fpga_models.allocate.weights_all_resident, the
    kernel's on-chip budget), else none (the engines read the m_axi arrays in place). The copies
    are static arrays of the kernel, partitioned as the engine reads them; the processes read
    them instead of the ports."""
    from bapipe.fpga_models.allocate import weights_all_resident

    from bapipe.codegen.design.weight_memory import BRAM_COPY_BYTES

    # the vectors only: a matrix is the tiled engines' weight store's (codegen.design.bwd_engines),
    # so it neither gets a copy nor counts against the copies' budget (resnet50's res4e..res5c with
    # fc: the matrices over the budget left sixteen batchnorm scales read over m_axi, II 8)
    ws = [w for w in sc.weights if w.name in reads and len(re.findall(r"\[(\d+)\]", w.dims)) == 1]
    eb = (width + 7) // 8
    if not ws or not weights_all_resident([int(w.kernel_q.size) for w in ws], eb, budget):
        return []
    out = []
    for w in ws:
        dims = tuple(int(d) for d in re.findall(r"\[(\d+)\]", w.dims))
        dst = f"wc_{w.name}"
        n = prod(dims)
        parts = [(f, d) for f, d in reads[w.name] if d <= len(dims)]
        banks = prod(f for f, _d in parts) or 1
        # banked as the engine reads it, each bank where the shared rule puts it
        # (memory_blocks.storage_impl): resnet50's 512-channel scales in 256 banks of 2 are LUTRAM
        # (128 BRAM36 each as BRAM); a single bank as before (BRAM up to BRAM_COPY_BYTES, else URAM)
        impl = storage_impl(width, -(-n // banks), banks) if banks > 1 else \
            ("bram" if n * eb <= BRAM_COPY_BYTES else "uram")
        b.arrays.append(BArray(dst, "data_t", dims, width, impl, partitions=parts))
        b.procs = [re.sub(rf"\b{re.escape(w.name)}\b", dst, p) for p in b.procs]
        fn = f"weight_copy<{dims[0]}, {dims[1]}, {AXI_BITS // width}>" if len(dims) == 2 else \
            f"weight_copy1<{n}, {AXI_BITS // width}>"
        out.append({"src": w.name, "dst": dst, "words": -(-n * width // AXI_BITS),
                    "params": f"const data_t {w.name}{w.dims}, data_t {dst}{w.dims}", "args": f"{w.name}, {dst}",
                    "call": f"bapipe::{fn}({w.name}, {dst})"})
    return out


def _share_arrays(ctx: BwdCtx, index: int, width: int) -> None:
    """The MVU turns of a time-multiplexed backward kernel take turns on one weight-gradient and
    one input-gradient array (codegen.design.mac_share.share_bwd_mac, the DSP rule): their per-layer
    engine buffers (dy and x of a vector) become the shared MAC function's, sized by the
    largest layer."""
    from bapipe.codegen.design.mac_share import share_bwd_mac

    mac = share_bwd_mac(ctx, index)
    if mac is None:
        return
    ctx.mac = mac
    tags = {f"{j.aw[3:]}.{k}" for j in mac.jobs for k in ("dyb", "xs")}
    ctx.arrays = [a for a in ctx.arrays if a.name not in tags] + [
        BArray(f"{mac.name}.dyb", "data_t", (mac.mh,), width, "registers", local=True),
        BArray(f"{mac.name}.xs", "data_t", (mac.mw,), width, "lutram", local=True)]


def _lb_partitions(kh: int, kw: int, sh: int, w: int, c: int, lin: int, lout: int) -> list[tuple[int, int]]:
    """ARRAY_PARTITION of a col2im line buffer [KH+SH][W][C] so a step's LIN adds (taps of one
    pixel: several rows, columns and channels) and LOUT emits (consecutive HWC elements of a row)
    touch distinct banks: every row slot, KW (or the columns a beat spans) columns, the channels
    a beat spans."""
    cols = max(kw, _ceil_div(lout, c))
    chans = min(c, max(lin, lout))
    return [(kh + sh, 1), (min(w, cols), 2), (chans, 3)]


def _col2im_steps(h: int, w: int, c: int, kh: int, sh: int, ph: int, add_beats: int, lout: int) -> int:
    """col2im steps a sample when emission keeps up: every add beat, plus the rows still to
    leave after the last output row (those at or below (HO-1)*SH - PH), one emit beat each."""
    ho = (h + 2 * ph - kh) // sh + 1
    tail_rows = h - max(0, min(h, (ho - 1) * sh - ph))
    return add_beats + tail_rows * (w * c // lout)


def _rename_stream(b: _Builder, old: str, new: str) -> None:
    """The stream ``old`` is the kernel's port ``new``: drop its declaration, use the port."""
    b.streams = [s for s in b.streams if s.name != old]
    b.procs = [re.sub(rf"\b{re.escape(old)}\b", new, p) for p in b.procs]


def _ancestors(t: str, names: dict) -> set[str]:
    """t and every tensor of the stage it is computed from."""
    out, stack = set(), [t]
    while stack:
        x = stack.pop()
        if x in out:
            continue
        out.add(x)
        if x in names:
            stack.extend(names[x].inputs)
    return out


def _skip_depths(add_layer, layers, elems, lanes: int, tiles: dict | None = None) -> list[int]:
    """Per input of a residual add, the depth of the FIFO that carries dy to it in backward.

    The gradients of the add's inputs meet again where the branches fork (grad_sum reads them
    in lockstep), so a short path must hold the beats the longer one takes in before its first
    output beat: per matrix engine on that branch, a dense layer takes a whole sample; a conv
    takes KH+1 rows of its dy before col2im finishes an input row. Depth of path k = 2 + the
    largest such count over the other paths, minus its own (never below 2)."""
    names = {l.name: l for l in layers}
    anc = [_ancestors(i, names) for i in add_layer.inputs]
    common = set.intersection(*anc) if anc else set()
    n = elems[add_layer.name]
    out_shape = add_layer.out_shape
    row_beats = (n // out_shape[1] if len(out_shape) == 3 else n) // lanes
    lat = []
    for a in anc:
        beats = 0
        for t in a - common:
            l = names.get(t)
            if l is None:
                continue
            if l.type == "dense":
                beats += n // lanes
            elif l.type == "conv2d":
                beats += (l.attr["kernel"][0] + 1) * row_beats * max(1, l.attr["stride"][0])
            if l.type in ("conv2d", "dense") and tiles and l.name in tiles:
                # a chunk engine takes a chunk of P vectors before its first dx group and holds
                # one more while it computes (fpga_models.bwd_tiles): 2P vectors of the add's beats
                j = tiles[l.name].job(l.name)
                if j is not None and j.engine == "chunk":
                    vectors = max(1, j.layer.vec)          # the layer's vectors a sample
                    per_vec = -(-n // vectors)             # the add's elements a vector of it
                    beats += 2 * tiles[l.name].chunk * -(-per_vec // max(1, lanes))
        lat.append(beats)
    top = max(lat, default=0)
    return [max(STREAM_DEPTH, top - x + STREAM_DEPTH + (row_beats if top else 0)) for x in lat]


def _place_accumulators(users, b: _Builder, board, kernel_budget: int | None = None) -> None:
    """Weight-gradient accumulators on chip, smallest first, while they fit ACC_ONCHIP_SHARE of
    the board's usable BRAM+URAM and what the kernel's share (``kernel_budget``: the planner's
    rule, fpga_models.allocate.kernel_onchip_budget, less the on-chip weights) leaves beside the
    kernel's other arrays and streams, so a board the planner accepts is a board gen accepts;
    the rest go to off-chip memory (read-modify-write)."""
    from bapipe.fpga_models.boards import on_chip_bytes

    budget = ACC_ONCHIP_SHARE * on_chip_bytes(board) if board is not None else float("inf")
    if kernel_budget is not None:
        budget = min(budget, kernel_budget - sum(a.bytes for a in b.arrays) - sum(s.bytes for s in b.streams))
    used = 0
    for aw, ab in sorted(users, key=lambda u: u[0].bytes):
        need = aw.bytes + ab.bytes
        if used + need <= budget:
            used += need
            aw.storage = "uram" if aw.bytes >= 64 * 1024 else "bram"
        else:
            aw.storage = "off-chip"


def plan_bwd_cycles(plan, model, index: int, board) -> dict:
    """The plan's backward cycles of stage ``index``: per micro-batch (plan.yaml cycles.bwd) and
    per sample in steady state (dataflow: the slowest layer's fpga_models.cost backward cycles at
    the plan's folding, without the input gradient fpga_models.gradients says nothing reads;
    time-multiplexed: the micro-batch's cycles over its samples)."""
    from bapipe.plan import Folding
    from bapipe.fpga_models.cost import folding_cost
    from bapipe.fpga_models.gradients import backward_work, no_input_gradient

    from bapipe.fpga_models.bwd_tiles import stage_tiles, steady_cycles

    st = plan.stages[index]
    beta = replica_batch(plan, st)
    no_dx = no_input_gradient(model)
    layers = [model.layers[model.index[n]] for n in st.layers]
    tiles = stage_tiles(model, layers, _fold_of(st, layers), "dataflow", beta,
                        max(1, plan.microbatches) * beta, board) if st.style == "dataflow" else {}
    per_layer = {}
    for n in st.layers:
        l = model.layers[model.index[n]]
        if n in tiles:   # a dataflow stage's matrix engine as built (fpga_models.bwd_tiles)
            per_layer[n] = steady_cycles(tiles[n], tiles[n].job(n))
            continue
        c = folding_cost(l, board, st.folding.get(n, Folding()), plan.number_format, 1)
        per_layer[n] = backward_work(c.bwd_in_cycles, c.bwd_w_cycles, n not in no_dx)
    mbc = float(st.cycles.get("bwd", 0))
    if st.style == "dataflow":
        steady = float(max(per_layer.values(), default=0))
    else:
        steady = mbc / beta
    return {"microbatch": mbc, "per_sample": steady, "beta": beta, "layers": per_layer,
            "fill": float(sum(per_layer.values()) - max(per_layer.values(), default=0))}


# ---------------------------------------------------------------- time-multiplexed stages

def bwd_memory_of(plan, model, st, board, budget: int | None):
    """The plan's memory decision for stage ``st``'s backward kernel (fpga_models.bwd_memory:
    which accumulators and gradient frames stay on chip), at the plan's folding, on ``budget``
    (:func:`_bwd_budget`)."""
    from bapipe.fpga_models.allocate import plan_bwd_room
    from bapipe.fpga_models.bwd_memory import bwd_memory

    layers = [model.layers[model.index[n]] for n in st.layers]
    return bwd_memory(model, layers, board, _fold_of(st, layers), plan.number_format, budget,
                      max(1, plan.microbatches) * replica_batch(plan, st), st.style == "time-multiplexed",
                      plan_bwd_room(plan, model, st, board))


def _fold_of(st, layers) -> dict[str, tuple[int, int]]:
    """The plan's folding as fpga_models reads it: (PE, SIMD) of an MVU, (1, lanes) of the others."""
    fold = {l.name: (1, 1) for l in layers}
    fold.update({n: (f.pe, f.simd) if f.lanes is None else (1, f.lanes) for n, f in st.folding.items()})
    return fold


def design_backward_memory(plan, model, cluster) -> list[dict | None]:
    """Per stage, the Design's record of its backward kernel's memory (design.json
    ``backward_memory``: fpga_models.bwd_memory.BwdMemory.as_dict, with ``spill_cycles`` and
    ``engine_cycles``, the backward cycles a sample its off-chip frames add and its tiled engines
    take beyond the plan's per-layer figure, which the plan's cycles.bwd holds); None for a stage
    not on a catalog FPGA."""
    from bapipe.fpga_models.allocate import plan_bwd_room
    from bapipe.fpga_models.bwd_memory import tm_bwd_engine_cycles, tm_bwd_spill_cycles

    out: list[dict | None] = []
    for st in plan.stages:
        cb = next((c for c in cluster.boards if st.boards and c.name == st.boards[0]), None) if cluster else None
        board = cb.board if cb is not None else None
        if board is None or getattr(board, "kind", "fpga") != "fpga":
            out.append(None)
            continue
        budget = _bwd_budget(plan, st, board)
        mem = bwd_memory_of(plan, model, st, board, budget)
        rec = mem.as_dict()
        if st.style == "time-multiplexed":
            layers = [model.layers[model.index[n]] for n in st.layers]
            samples = max(1, plan.microbatches) * replica_batch(plan, st)
            args = (model, layers, board, _fold_of(st, layers), plan.number_format)
            rec["spill_cycles"] = tm_bwd_spill_cycles(*args, budget, samples, mem)
            rec["engine_cycles"] = tm_bwd_engine_cycles(*args, samples, plan_bwd_room(plan, model, st, board))
        out.append(rec)
    return out


def _bwd_budget(plan, st, board) -> int | None:
    """On-chip bytes the backward kernel may keep: the forward kernels' rule
    (fpga_models.allocate.stage_onchip_budget); None without a board."""
    from bapipe.fpga_models.allocate import stage_onchip_budget

    return stage_onchip_budget(plan, st, board)


def _uses(name: str, procs: list[str]) -> list[int]:
    pat = re.compile(rf"\b{re.escape(name)}\b")
    return [k for k, p in enumerate(procs) if pat.search(p)]


def _sequence_turns(ctx: BwdCtx, turn_of: list[str], frame_elems: dict[str, int], width: int, mem) -> None:
    """Sequence a time-multiplexed stage's backward as the plan prices it (fpga_models.allocate.
    time_multiplexed: the layers' backward cycles add up): one turn per layer, in the order the
    layers were walked (last layer first), each a DATAFLOW function of its layer's engines called
    once per sample. A stream two turns share is a whole frame (one sample's gradient): a FIFO of
    its beats in the top function, or, where the plan puts it off chip (``mem``,
    fpga_models.bwd_memory: the frame its writer's turn hands to its reader's), an m_axi
    buffer of 512-bit words written by ``frame_write`` and read back by ``frame_read``."""
    from bapipe.fpga_models.bwd_tiles import fifo_storage
    from bapipe.fpga_models.engines import DDR_WORD_BITS, ddr_words_per_beat

    order: list[str] = []
    for t in turn_of:
        if t not in order:
            order.append(t)
    procs = ctx.processes
    ports = set(ctx.stream_ports)
    streams = {s.name: s for s in ctx.streams}
    turns_using = {s: {turn_of[k] for k in _uses(s, procs)} for s in streams}
    frames = [s for s in ctx.streams if len(turns_using[s.name]) > 1]
    for s in frames:
        assert len(turns_using[s.name]) == 2 and s.beat.startswith("bapipe::bvec<"), (s.name, turns_using[s.name])
    lanes = {s.name: s.beat_bits // width for s in frames}
    for s in frames:   # a whole sample's frame waits between its writer's turn and its reader's
        s.depth = frame_elems[s.name] // lanes[s.name]
    writer = {s.name: min(turns_using[s.name], key=order.index) for s in frames}
    frames.sort(key=lambda s: (order.index(writer[s.name]), s.name))
    reader = {s.name: max(turns_using[s.name], key=order.index) for s in frames}
    off = [bool(mem.offchip(writer[s.name], reader[s.name])) for s in frames]
    ctx.frame_turns = [(writer[s.name], reader[s.name], lanes[s.name], s.bytes, o) for s, o in zip(frames, off)]
    ddr: dict[str, DdrFrame] = {}
    for s, o in zip(frames, off):
        if o:
            beats = s.depth
            # a gradient frame holds one sample: its on-chip depth was its beats
            ddr[s.name] = DdrFrame(f"{s.name}_ddr", s.name, lanes[s.name], beats, beats, DDR_WORD_BITS,
                                   beats * ddr_words_per_beat(lanes[s.name], width))
            s.depth = STREAM_DEPTH   # two deep in the writer's turn and in the reader's
    ctx.frames = list(ddr.values())
    ctx.top_streams = [s for s in frames if s.name not in ddr]
    for s in ctx.top_streams:   # a whole frame on chip: its FIFO in the cheaper blocks
        s.storage = fifo_storage(s.beat_bits, s.depth)
    extra = [BStream(s.name, s.beat, STREAM_DEPTH, s.beat_bits) for s in frames if s.name in ddr]
    ctx.streams = ctx.streams + extra   # the off-chip frame's stream in its reader's turn

    stash = {s.name: s for s in ctx.stashes}
    arrays = {a.name: f"{a.ctype} {a.name}{a.cdims}" for a in ctx.static_arrays + ctx.acc_ports}
    arrays.update({g.name: f"bapipe::wsum_t {g.name}{g.dims}" for g in ctx.grad_arrays})
    arrays.update({w.name: f"const data_t {w.name}{w.dims}" for w in ctx.weights})
    top_frames = {s.name: s for s in ctx.top_streams}
    turns: list[BwdTurn] = []
    for k, t in enumerate(order):
        mine = [p for p, tt in zip(procs, turn_of) if tt == t]
        text = "\n".join(mine)
        used = lambda n: re.search(rf"\b{re.escape(n)}\b", text) is not None   # noqa: E731
        params, args = [], []
        for n in sorted(ports):
            if used(n):
                q = next(q for q in ctx.in_ports + ctx.out_ports if q.name == n)
                params.append(f"hls::stream<bapipe::bvec<{q.lanes}> > &{n}")
                args.append(n)
        for n, s in top_frames.items():
            if used(n):
                params.append(f"hls::stream<{s.beat} > &{n}")
                args.append(n)
        for n, s in stash.items():
            if used(n):
                params.append(f"const data_t *{n}")
                args.append(f"{n} + (long)i * {s.elements}")
        for n, decl in arrays.items():
            if used(n):
                params.append(decl)
                args.append(n)
        local = [s for s in ctx.streams if s.name not in top_frames and s.name not in ports
                 and turns_using.get(s.name) == {t} and s.name not in ddr]
        for n, f in ddr.items():
            if t not in turns_using[n]:
                continue
            params.append(f"ap_uint<{f.bits}> {f.name}[{f.words}]")
            args.append(f.name)
            local.append(next(s for s in ctx.streams if s.name == n and s.depth == STREAM_DEPTH))
            if writer[n] == t:
                mine = mine + [f"bapipe::frame_write<{f.lanes}, {f.bits}>({n}, {f.name}, (long)n * {f.depth})"]
            else:
                mine = [f"bapipe::frame_read<{f.lanes}, {f.bits}>({f.name}, {n}, (long)n * {f.depth})"] + mine
        turns.append(BwdTurn(f"{ctx.name}_turn{k}", t, params + ["int n", "int flush"], args,
                             sorted(local, key=lambda s: s.name), mine))
    ctx.turns = turns
