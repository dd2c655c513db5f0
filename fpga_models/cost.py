"""Per-layer cost and resource model on one board (FPGA: FINN-style folding; GPU: roofline).

FPGA compute (Umuroglu et al. FPGA'17; Blott et al. FINN-R TRETS'18): a matrix-vector unit
(MVU) with ``PE`` output rows and ``SIMD`` input lanes over an ``MH x MW`` weight matrix takes

    cycles = (MH / PE) * (MW / SIMD) * output_pixels      with PE | MH, SIMD | MW,

per sample, i.e. ``fwd_macs / (PE * SIMD)``. Backward runs on the same PE x SIMD array:
input-grad ``bwd_in_macs / (PE*SIMD)`` cycles (the transposed matrix) and weight-grad
``bwd_w_macs / (PE*SIMD)`` cycles (outer products). It costs ``PE*SIMD*dsp_per_mac[fmt]``
DSPs (1 per MAC for fixed16, 0.5 for int8, AMD WP486). Layers without MACs (activations,
pooling, norms, adds) stream ``simd`` elements per cycle on LUTs.

Memory: weights, gradient accumulators and optimizer state, stashed activations and line
buffers live on chip (URAM first, then BRAM36, each up to the utilisation cap) and spill to
off-chip DDR/HBM; spilled bytes cost ``bytes / offchip_bw`` (a roofline: time is the max of
compute and traffic). GPUs: per layer ``max(2*MACs / peak_flops, bytes / mem_bw)``.

Every formula is documented in docs/planner.md with its source.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from bapipe.errors import SpecError
from bapipe.layers import Layer

from .boards import BRAM36_BYTES, URAM_BYTES, Board, bytes_per_element
from .engines import (LUT_PER_LANE_OP, LUT_PER_LAYER, LUT_PER_MAC, MAX_LANES, MVU_TYPES,  # noqa: F401 (re-exported)
                      conv_window_cycles,
                      elementwise_dsp, elementwise_lut, line_buffer_bytes, mvu_cycles, mvu_dsp, mvu_lut, stream_cycles,
                      stream_elements)

#: elementwise work per output element in backward relative to forward (norms recompute statistics;
#: batchnorm is not here: BaPipe trains it affine, fpga_models.train_fixed, one pass each way as the
#: RTL and HLS engines run it, fpga_models.engines.batchnorm_train_cycles)
_BWD_WORK = {"layernorm": 2.0, "softmax": 2.0, "gelu": 2.0, "tanh": 1.0, "sigmoid": 1.0}
#: GPU formats: fixed16 has no GPU datapath, run it as fp16; bf16 falls back to fp32 where absent
_GPU_FMT = {"fixed16": "fp16"}


#: trial division stops here: no board has this many MAC lanes, so for n > DIVISOR_SEARCH_LIMIT**2
#: the divisors strictly between the limit and n / limit (all unusable as PE or SIMD) are not
#: listed, and a dimension like out_channels 1e20 costs 2**20 steps instead of 1e10 (a hang)
DIVISOR_SEARCH_LIMIT = 1 << 20


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n`` in increasing order: all of them when n <= 2**40, else the
    ones up to DIVISOR_SEARCH_LIMIT and their cofactors n // d (bounded work)."""
    return _divisors(int(n))


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small, large = [], []
    i = 1
    while i * i <= n and i <= DIVISOR_SEARCH_LIMIT:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return tuple(small + large[::-1])


def matrix_shape(layer: Layer) -> tuple[int, int, float] | None:
    """(MH, MW, pixels) of an MVU layer with MH*MW*pixels = fwd_macs; None for other layers.

    conv2d: MH = out_channels, MW = in_channels/groups * kh * kw, pixels = Ho*Wo (FINN's
    sliding-window MVU); dense: MH = units, MW = input features, pixels = rows; LSTM: the
    four gate matrices stacked, MH = 4h, MW = inputs + h, one pixel per step and direction;
    attention and matmul: the d x d projection shape, pixels = fwd_macs / (MH*MW).
    """
    a = layer.attr
    t = layer.type
    if t == "conv2d":
        c = layer.in_shapes[0][0]
        kh, kw = a["kernel"]
        mh, mw = a["out_channels"], (c // a["groups"]) * kh * kw
    elif t == "dense":
        mh, mw = a["units"], layer.in_shapes[0][-1]
    elif t == "lstm":
        mh = 4 * a["hidden"]
        mw = sum(s[1] for s in layer.in_shapes) + a["hidden"]
    elif t == "attention":
        mh = mw = layer.in_shapes[0][-1]
    elif t == "additive_attention":
        mh, mw = a["units"], layer.in_shapes[0][-1]
    elif t == "matmul":
        b = layer.in_shapes[1]
        mh = b[-2] if a.get("transpose_b") else b[-1]
        mw = layer.in_shapes[0][-1]
    else:
        return None
    return mh, mw, layer.fwd_macs / (mh * mw)


def lane_dim(layer: Layer) -> int:
    """The dimension an elementwise layer's lanes must divide (channels of images, else features)."""
    s = layer.out_shape
    if len(s) == 3:
        return s[0]
    return s[-1] if s else 1


def elementwise_work(layer: Layer) -> tuple[float, float]:
    """(forward, backward) elements a non-MVU layer's engine streams per sample, each lane
    taking one a cycle (fpga_models.engines.stream_elements; backward x _BWD_WORK)."""
    f = float(stream_elements(layer))
    return f, f * _BWD_WORK.get(layer.type, 1.0)


@dataclass(frozen=True)
class LayerCost:
    """Cycles and resources of one layer at one folding on one board, for ``batch`` samples."""

    name: str
    type: str
    pe: int
    simd: int
    fwd_cycles: int
    bwd_in_cycles: int
    bwd_w_cycles: int
    dsp: int
    lut: int
    weight_bytes: int
    in_bytes: int          # input activations of the whole batch (what backward needs stashed)
    out_bytes: int
    buffer_bytes: int      # line buffers / FIFOs of the engine
    clock_hz: float
    fwd_s_override: float | None = None   # GPU roofline or measured profile (seconds)
    bwd_s_override: float | None = None

    @property
    def bwd_cycles(self) -> int:
        """Input-grad plus weight-grad cycles."""
        return self.bwd_in_cycles + self.bwd_w_cycles

    @property
    def fwd_s(self) -> float:
        """Forward time in seconds (compute only; spill traffic is charged per stage)."""
        return self.fwd_s_override if self.fwd_s_override is not None else self.fwd_cycles / self.clock_hz

    @property
    def bwd_s(self) -> float:
        """Backward time in seconds."""
        return self.bwd_s_override if self.bwd_s_override is not None else self.bwd_cycles / self.clock_hz


def _first(v) -> int:
    return int(v) if isinstance(v, (int, float)) else int(v[0])


def _square_conv(layer: Layer) -> bool:
    """A conv the window generator builds: square kernel, stride and padding, no groups."""
    a = layer.attr
    pair = lambda v: (v, v) if isinstance(v, (int, float)) else tuple(v)  # noqa: E731
    return (len(layer.in_shapes[0]) == 3 and a.get("groups", 1) == 1 and len(set(pair(a["kernel"]))) == 1
            and len(set(pair(a.get("stride", 1)))) == 1 and len(set(pair(a.get("padding", 0)))) == 1)


def layer_cost(layer: Layer, board: Board, pe: int, simd: int, fmt: str = "fixed16", batch: int = 1) -> LayerCost:
    """Cost of ``layer`` on an FPGA ``board`` with folding (pe, simd) for ``batch`` samples."""
    bpe = bytes_per_element(fmt)
    ms = matrix_shape(layer)
    in_b = layer.in_elems * bpe * batch
    out_b = layer.out_elems * bpe * batch
    wbytes = layer.params * bpe
    if ms is not None:
        fc = mvu_cycles(layer.fwd_macs, pe, simd, batch)
        if layer.type == "conv2d" and _square_conv(layer):   # its window generator may be slower
            c, h, w = layer.in_shapes[0]
            a = layer.attr
            fc = max(fc, batch * conv_window_cycles(c, h, w, _first(a["kernel"]), _first(a.get("padding", 0)),
                                                    _first(a.get("stride", 1)), simd))
        bic = mvu_cycles(layer.bwd_in_macs, pe, simd, batch)
        bwc = mvu_cycles(layer.bwd_w_macs, pe, simd, batch)
        dsp = mvu_dsp(pe, simd, board.dsp_per_mac.get(fmt, 1.0))
        lut = mvu_lut(pe, simd)
        buf = 0
        if layer.type == "conv2d":  # sliding-window line buffer: kh rows of the input (FINN SWG)
            c, _h, w = layer.in_shapes[0]
            buf = line_buffer_bytes(layer.attr["kernel"][0], w, c, bpe)
    else:
        # element-wise engines: ``lanes`` elements a cycle (plans store it as simd with pe 1)
        fw, bw = elementwise_work(layer)
        lanes = pe * simd
        fc = stream_cycles(fw, lanes, batch)
        bic = stream_cycles(bw, lanes, batch)
        bwc = 0
        dsp = elementwise_dsp(layer.type, lanes, board.dsp_per_mac.get(fmt, 1.0))
        ops = max(1.0, layer.fwd_ops / max(1, layer.out_elems))
        lut = elementwise_lut(lanes, ops) if fw else 0
        buf = 0
        if layer.type in ("maxpool", "avgpool") and len(layer.in_shapes[0]) == 3:
            c, _h, w = layer.in_shapes[0]
            buf = line_buffer_bytes(layer.attr["kernel"][0], w, c, bpe)
    return LayerCost(layer.name, layer.type, pe, simd, fc, bic, bwc, dsp, lut, wbytes, in_b, out_b, buf,
                     board.clock_hz)


def folding_cost(layer: Layer, board: Board, folding, fmt: str = "fixed16", batch: int = 1) -> LayerCost:
    """:func:`layer_cost` at a plan's folding (bapipe.plan.Folding): PE x SIMD of a
    matrix-vector unit, ``lanes`` of an element-wise engine."""
    if folding.lanes is not None:
        return layer_cost(layer, board, 1, folding.lanes, fmt, batch)
    return layer_cost(layer, board, folding.pe, folding.simd, fmt, batch)


def folding_candidates(layer: Layer) -> list[tuple[int, int]]:
    """Legal (pe, simd) pairs: PE | MH and SIMD | MW for MVUs; (1, lanes | lane_dim) otherwise."""
    ms = matrix_shape(layer)
    if ms is not None:
        mh, mw, _ = ms
        return [(p, s) for p in divisors(mh) for s in divisors(mw)]
    return [(1, s) for s in divisors(lane_dim(layer)) if s <= MAX_LANES]


def best_folding(layer: Layer, board: Board, fmt: str = "fixed16", dsp_budget: float | None = None,
                 lut_budget: float | None = None) -> tuple[int, int]:
    """The fastest legal folding within the DSP and LUT budgets (ties: fewer lanes, then larger SIMD).

    Defaults are the board's usable DSP and LUT. Always returns at least (1, 1).
    """
    dsp_budget = board.usable_dsp if dsp_budget is None else dsp_budget
    lut_budget = board.usable_lut if lut_budget is None else lut_budget
    return _best_folding(layer, board.dsp_per_mac.get(fmt, 1.0), float(dsp_budget), float(lut_budget))


def _best_folding(layer: Layer, dpm: float, dsp_budget: float, lut_budget: float) -> tuple[int, int]:
    ms = matrix_shape(layer)
    if ms is not None:
        lanes = min(dsp_budget / dpm, (lut_budget - LUT_PER_LAYER) / LUT_PER_MAC)
        return _best_mvu_pair(ms[0], ms[1], int(max(1, math.floor(lanes + 1e-9))))
    ops = max(1.0, layer.fwd_ops / max(1, layer.out_elems))
    lanes = (lut_budget - LUT_PER_LAYER) / (LUT_PER_LANE_OP * min(ops, 8))
    best = 1
    for s in divisors(lane_dim(layer)):
        if s <= min(MAX_LANES, lanes):
            best = s
    return 1, best


@lru_cache(maxsize=65536)
def _best_mvu_pair(mh: int, mw: int, lanes: int) -> tuple[int, int]:
    """max PE*SIMD <= lanes over PE | mh, SIMD | mw; ties -> larger SIMD (wider input stream)."""
    best = (1, 1)
    dw = divisors(mw)
    for p in divisors(mh):
        if p > lanes:
            break
        cap = lanes // p
        # largest divisor of mw not above cap (divisors are sorted)
        lo, hi = 0, len(dw) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if dw[mid] <= cap:
                lo = mid
            else:
                hi = mid - 1
        s = dw[lo]
        if p * s > best[0] * best[1] or (p * s == best[0] * best[1] and s > best[1]):
            best = (p, s)
    return best


@dataclass(frozen=True)
class GpuLayerCost:
    """Roofline time of a layer on a GPU (no folding)."""

    fwd_s: float
    bwd_s: float
    fwd_bound: str   # "compute" | "memory"


def gpu_format(board: Board, fmt: str) -> str:
    """The GPU datapath a plan format runs on (fixed16 -> fp16; missing formats -> fp32)."""
    f = _GPU_FMT.get(fmt, fmt)
    if f not in board.peak_flops:
        f = "fp32"
    if f not in board.peak_flops:
        raise SpecError(None, None, "format", f"board {board.name} has no peak FLOP/s for {fmt} or fp32")
    return f


def gpu_layer_cost(layer: Layer, board: Board, fmt: str = "fixed16", batch: int = 1) -> GpuLayerCost:
    """Roofline (Williams et al. CACM'09): max(FLOPs / peak, bytes moved / memory bandwidth).

    FLOPs = 2 x MACs plus elementwise ops; bytes = weights + input and output activations
    (forward), twice the activations plus weights and weight gradients (backward).
    """
    f = gpu_format(board, fmt)
    peak = board.peak_flops[f]
    bpe = bytes_per_element(f)
    fw, bw = (0.0, 0.0) if matrix_shape(layer) is not None else elementwise_work(layer)
    flops_f = 2.0 * layer.fwd_macs * batch + fw * batch
    flops_b = 2.0 * layer.bwd_macs * batch + bw * batch
    act = (layer.in_elems + layer.out_elems) * bpe * batch
    wb = layer.params * bpe
    bytes_f = wb + act
    bytes_b = 2 * wb + 2 * act if layer.params else 2 * act
    tf_c, tf_m = flops_f / peak, bytes_f / board.offchip_bw_Bps
    tb = max(flops_b / peak, bytes_b / board.offchip_bw_Bps)
    return GpuLayerCost(max(tf_c, tf_m), tb, "compute" if tf_c >= tf_m else "memory")


def profile_layer(layer: Layer, board: Board, fmt: str = "fixed16", batch: int = 1, cap: float = 1.0) -> dict:
    """One layer's time using the whole usable board (times ``cap``) at its best folding.

    Returns ``{"fwd_s", "bwd_s", "fwd_cycles", "bwd_cycles", "pe", "simd", "dsp", "lut",
    "weight_bytes", "activation_bytes", "bound"}`` where ``bwd_s`` is input-grad plus
    weight-grad and ``bound`` is "compute" or "memory": when the weights do not fit on chip
    they stream from off-chip memory once per forward and twice per backward (weights read,
    gradients read-modify-write), and time is the roofline max of compute and traffic.
    GPUs use :func:`gpu_layer_cost` (cycles at the boost clock).
    """
    bpe = bytes_per_element(fmt)
    act = (layer.in_elems + layer.out_elems) * bpe * batch
    if board.kind == "gpu":
        g = gpu_layer_cost(layer, board, fmt, batch)
        return {"fwd_s": g.fwd_s, "bwd_s": g.bwd_s, "fwd_cycles": int(round(g.fwd_s * board.clock_hz)),
                "bwd_cycles": int(round(g.bwd_s * board.clock_hz)), "pe": 1, "simd": 1, "dsp": 0, "lut": 0,
                "weight_bytes": layer.params * bpe, "activation_bytes": act, "bound": g.fwd_bound}
    pe, simd = best_folding(layer, board, fmt, board.usable_dsp * cap, board.usable_lut * cap)
    c = layer_cost(layer, board, pe, simd, fmt, batch)
    onchip = onchip_capacity(board, cap)
    spill = max(0, c.weight_bytes - onchip)
    tf_c, tb_c = c.fwd_s, c.bwd_s
    tf_m = spill / board.offchip_bw_Bps
    tb_m = 3 * spill / board.offchip_bw_Bps
    return {"fwd_s": max(tf_c, tf_m), "bwd_s": max(tb_c, tb_m) if c.bwd_cycles or spill else 0.0,
            "fwd_cycles": c.fwd_cycles, "bwd_cycles": c.bwd_cycles, "pe": pe, "simd": simd, "dsp": c.dsp,
            "lut": c.lut, "weight_bytes": c.weight_bytes, "activation_bytes": act,
            "bound": "memory" if tf_m > tf_c else "compute"}


def onchip_capacity(board: Board, cap: float = 1.0) -> int:
    """Usable on-chip bytes (URAM + BRAM36) times the utilisation cap."""
    return int((board.usable_uram * URAM_BYTES + board.usable_bram36 * BRAM36_BYTES) * cap)


def onchip_blocks(board: Board, nbytes: int, cap: float = 1.0) -> dict[str, int]:
    """URAM and BRAM36 blocks holding ``nbytes`` on chip: URAM first (denser), then BRAM36."""
    u_cap = int(board.usable_uram * cap)
    uram = min(u_cap, int(math.ceil(nbytes / URAM_BYTES)))
    rest = max(0, nbytes - uram * URAM_BYTES)
    bram = int(math.ceil(rest / BRAM36_BYTES))
    return {"uram": uram, "bram36": bram}


@dataclass(frozen=True)
class Budget:
    """Per-board resource budget: usable figures times the utilisation cap."""

    dsp: float
    lut: float
    bram36: float
    uram: float
    onchip_bytes: int
    offchip_bytes: int

    @staticmethod
    def of(board: Board, cap: float = 0.8) -> "Budget":
        """The budget of ``board`` under utilisation ``cap`` (off-chip memory is not capped)."""
        return Budget(board.usable_dsp * cap, board.usable_lut * cap, board.usable_bram36 * cap,
                      board.usable_uram * cap, onchip_capacity(board, cap), board.offchip_bytes)


def weight_copies(optimizer: str, mode: str = "train", versions: int = 1) -> int:
    """Weight-sized buffers per parameter: weights (x versions) + gradient + optimizer state.

    Inference keeps the weights only. Training with plain SGD keeps a gradient accumulator
    (2 copies; momentum would add one, torchgpipe counts 2-3x); Adam adds two moments (4).
    PipeDream-2BW double-buffers the weights (versions=2, Narayanan et al. ICML'21).
    """
    if mode != "train":
        return 1
    return versions + (1 if optimizer == "sgd" else 3)
