"""Everything the HLS templates print, decided here: one plain dataclass tree per project.

The lowering (codegen.design.lower) builds these per stage: it checks every stage can be
generated (layer types, folding divisibility) before anything is written, draws the
weights deterministically from the plan fingerprint, and wires each stage's layers into
a dataflow graph of streams (fan-out through ``dup2``, pass-through through ``copy``).
The templates then only loop over the fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bapipe.errors import SpecError
from bapipe.layers import Layer, prod
from bapipe.names import legal, shown
from bapipe.plan import Folding, Plan, Stage
from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models.allocate import WEIGHT_ROM_LIMIT
from bapipe.fpga_models.weights import model_draws, model_rounded

from bapipe.codegen.design.weight_layout import MvuMatrix

GENERATOR = "bapipe gen"
VERSION = "0.1.0"

#: layer types the generator can turn into HLS (the same set the numpy reference has)
SUPPORTED = fx.SUPPORTED
#: supported types with a forward kernel only (the imported CNNs' layers, issue #20)
INFERENCE_ONLY = frozenset({"concat", "mul", "sigmoid", "silu", "clip", "reshape"})
#: The weight rule (docs/codegen.md, "Where the weights live"): a stage whose weight arrays hold
#: at most this many elements in all keeps them on chip as ROM, written into <stage>_weights.h
#: as C initialisers (128 KB at 16 bits: what a small stage would really keep in BRAM, and what
#: g++ compiles in seconds). A bigger stage takes every weight array as an m_axi kernel argument
#: (off-chip memory, as a Vitis kernel for VGG-sized layers would), and its testbench fills those
#: arrays from weights.bin at run time: a 16 MB initialiser made g++ run for over 15 minutes at 12 GB.
#: The number is fpga_models.allocate's (WEIGHT_ROM_LIMIT), which the planner prices the
#: off-chip weights' fetches by (codegen.design.weight_memory).
EMBED_LIMIT = WEIGHT_ROM_LIMIT

#: Vitis platform per board type (the shell a v++ link targets); boards without one get no link cfg
PLATFORMS = {
    "U250": "xilinx_u250_gen3x16_xdma_4_1_202210_1",
    "U280": "xilinx_u280_gen3x16_xdma_1_202211_1",
    "U55C": "xilinx_u55c_gen3x16_xdma_3_202210_1",
    "U200": "xilinx_u200_gen3x16_xdma_2_202110_1",
}
#: memory bank the data movers use per board type (sp=)
#: the FPGA part of each board type's Vitis platform (the boards' data sheets; hls_config.cfg, package_xo.tcl)
PARTS = {
    "U250": "xcu250-figd2104-2L-e",
    "U280": "xcu280-fsvh2892-2L-e",
    "U55C": "xcu55c-fsvh2892-2L-e",
    "U200": "xcu200-fsgd2104-2-e",
    "VCU118": "xcvu9p-flga2104-2L-e",
    "ZCU102": "xczu9eg-ffvb1156-2-e",
}
MEMORY = {"U250": "DDR[0]", "U200": "DDR[0]", "U280": "HBM[0]", "U55C": "HBM[0]"}


@dataclass
class WeightArray:
    """One constant array of a layer: C name, shape as the kernel indexes it, raw values."""

    name: str
    shape: tuple[int, ...]          # kernel layout (conv weights: the MVU matrix (O, kh*kw*C))
    model_shape: tuple[int, ...]    # model layout in weights.bin (conv: OIHW)
    kernel_q: np.ndarray            # raw ints in kernel layout
    model_q: np.ndarray             # raw ints in model layout
    partitions: list[tuple[int, int]] = field(default_factory=list)   # (factor, dim) cyclic
    offset: int = 0                 # element offset in the stage's weight image (codegen.design.weight_image)
    slot: "object | None" = None    # ... and how it lies there (weight_image.Slot; set by lower.weight_images)

    @property
    def dims(self) -> str:
        """C array dimensions, e.g. ``[8][9]``."""
        return "".join(f"[{d}]" for d in self.shape)

    def text(self, frac: int) -> str:
        """The C initializer: every raw value q written as the exact decimal q / 2^frac."""
        scale = float(1 << frac)

        def row(vals) -> str:
            items = [repr(float(v) / scale) for v in vals]
            lines = [", ".join(items[i:i + 8]) for i in range(0, len(items), 8)]
            return "{" + ",\n     ".join(lines) + "}"

        q = np.asarray(self.kernel_q).reshape(self.shape[0], -1) if len(self.shape) > 1 else None
        if q is None:
            return row(self.kernel_q.reshape(-1))
        return "{\n    " + ",\n    ".join(row(r) for r in q) + "}"


@dataclass
class LayerCtx:
    """One layer of a stage: its wrapper function, call and weights."""

    name: str                       # model name
    ident: str                      # C identifier
    type: str
    comment: str
    func: str                       # library template, e.g. bapipe::conv2d
    tparams: list[int]
    n_in: int                       # stream inputs
    weights: list[WeightArray]
    layer: Layer | None = None
    external: bool = False          # weights arrive as kernel arguments (m_axi), not as on-chip ROM

    @property
    def wargs(self) -> list[str]:
        """Weight arrays passed to the layer wrapper (external weights only)."""
        return [w.name for w in self.weights] if self.external else []

    @property
    def wparams(self) -> str:
        """The wrapper's weight parameters, each with a leading comma (external weights only)."""
        return "".join(f", const data_t {w.name}{w.dims}" for w in self.weights) if self.external else ""


@dataclass
class StreamCtx:
    """An hls::stream inside a stage's top function."""

    name: str
    elements: int
    depth: int                      # FIFO depth pragma (2 = default handshake)


@dataclass
class PortCtx:
    """An AXI4-Stream port of a stage kernel: one tensor crossing the stage boundary."""

    name: str
    tensor: str
    shape: tuple[int, ...]
    elements: int


@dataclass
class StageCtx:
    """One stage kernel."""

    index: int
    name: str                       # kernel name: stage<i>
    boards: list[str]
    board_type: str
    style: str
    dataflow: bool
    layers: list[LayerCtx]
    inputs: list[PortCtx]
    outputs: list[PortCtx]
    streams: list[StreamCtx]
    statements: list[str]           # the calls of the top function, in order (no trailing semicolon)
    embed_weights: bool
    weight_elements: int
    bwd: "BwdCtx | None" = None     # the backward kernel (training plans)
    engine: "EngineStage | None" = None   # stages read off the Design (codegen.design.tm_kernel)
    update: "UpdateCtx | None" = None     # the SGD update kernel (training; codegen.design.train_kernels)
    update_note: str | None = None        # why a training stage has no update kernel
    stash_note: str | None = None         # why the forward kernel writes no stashes (codegen.design.stash)
    loss: "LossCtx | None" = None         # the loss-gradient kernel behind the last training stage
    image: list = field(default_factory=list)   # the weight image's arrays (codegen.design.weight_image.Slot)

    @property
    def weights(self) -> list[WeightArray]:
        """All weight arrays of the stage in layer order."""
        return [w for l in self.layers for w in l.weights]

    @property
    def weight_params(self) -> list[str]:
        """The top function's weight parameters (m_axi arrays; empty when the weights are on-chip ROM)."""
        return [] if self.embed_weights else [f"const data_t {w.name}{w.dims}" for w in self.weights]

    @property
    def params(self) -> list[str]:
        """The forward top function's C parameter list (engine kernels: packed ports and ``n``,
        the samples of one call)."""
        if self.engine is not None:
            return [f"hls::stream<bapipe::vec<{self.port_lanes(p)}> > &{p.name}" for p in self.inputs + self.outputs] \
                + [r.param for r in self.engine.external] \
                + [f"ap_uint<{f.bits}> {f.name}[{f.words}]" for f in self.engine.frames] \
                + [f"data_t {b.name}[{b.mb} * {b.elements}]" for b in self.engine.stashes] + ["int n"]
        return [f"hls::stream<data_t> &{p.name}" for p in self.inputs + self.outputs] + self.weight_params

    @property
    def args(self) -> list[str]:
        """The forward call's argument list (testbench)."""
        if self.engine is not None:
            return [p.name for p in self.inputs + self.outputs] + [r.name for r in self.engine.external] \
                + [f.name for f in self.engine.frames] + [b.name for b in self.engine.stashes] + ["n"]
        return [p.name for p in self.inputs + self.outputs] + ([] if self.embed_weights else
                                                                [w.name for w in self.weights])

    def port_lanes(self, p: "PortCtx") -> int:
        """Elements per beat on a port: the Design's lanes for engine kernels, else 1."""
        if self.engine is None:
            return 1
        return self.engine.in_lanes if p in self.inputs else self.engine.out_lanes


@dataclass
class FormatCtx:
    """The number format as the C++ types need it."""

    name: str
    width: int
    frac: int
    data_t: str
    acc_t: str
    recip_t: str
    avg_bits: int
    port_bits: int                  # AXIS TDATA width (byte multiple)
    raw_t: str                      # C integer type of one raw value in weights.bin


@dataclass
class BoardCtx:
    """One board's v++ link configuration."""

    name: str
    board_type: str
    platform: str | None
    stages: list[str]               # stage kernel names placed on this board (forward, then backward)
    movers: list[str]               # host data-mover kernels linked in (mm2s, s2mm)
    connects: list[str]             # stream_connect lines
    nk: list[str]                   # nk lines
    sp: list[str]
    slr: list[str]

    @property
    def xclbin(self) -> str:
        """The board's link product (Makefile target)."""
        return f"link/{self.name}.xclbin"

    @property
    def deps(self) -> str:
        """The .xo files linked into the board's xclbin."""
        return " ".join([f"{k.split('_', 1)[0]}/{k}.xo" for k in self.stages]   # stage<i>[_bwd|_update|...]
                        + [f"common/{m}.xo" for m in self.movers])


@dataclass
class ProjectCtx:
    """The whole generated project."""

    plan: Plan
    fingerprint: str
    header: list[str]               # comment lines (without comment markers)
    fmt: FormatCtx
    stages: list[StageCtx]
    boards: list[BoardCtx]
    seed: int
    skipped: list[str]              # stages not generated (GPU boards), with the reason


def ident(name: str) -> str:
    """A C identifier for a layer or tensor name: itself when legal, else a unique sanitised form
    (``bapipe.names.legal``: imported names such as ``/features/features.0/Conv``)."""
    return legal(name)


def header_lines(plan: Plan) -> list[str]:
    """The provenance header every generated file carries (as comment lines: the model's and
    cluster's names or paths come from the user, so they are ``shown``)."""
    return [f"Generated by {GENERATOR} {VERSION} - do not edit by hand, regenerate instead.",
            f"plan fingerprint: {plan.fingerprint()}",
            f"model: {shown(plan.model)}   cluster: {shown(plan.cluster)}   format: {shown(plan.number_format)}"]


def weight_seed(plan: Plan) -> int:
    """The weights' RNG seed: the first 64 bits of the plan fingerprint."""
    return int(plan.fingerprint()[:16], 16)


def _err(plan_file: str, stage: Stage, fld: str, msg: str) -> SpecError:
    return SpecError(plan_file, None, f"stages[{stage.index}].{fld}", msg)


def check_plan(plan: Plan, model, plan_file: str = "plan.yaml") -> None:
    """Refuse, with one line, anything the generator cannot build (before anything is written)."""
    if plan.number_format not in fx.FORMATS:
        raise SpecError(plan_file, None, "number_format",
                        f"codegen supports {', '.join(fx.FORMATS)}; got '{plan.number_format}'")
    for st in plan.stages:
        if st.style == "gpu":
            continue
        for name in st.layers:
            if name not in model.index:
                raise _err(plan_file, st, "layers", f"layer '{name}' is not in model '{model.name}'")
            l = model.layers[model.index[name]]
            if l.type not in SUPPORTED:
                raise _err(plan_file, st, "layers",
                           f"layer '{name}' has type '{l.type}', which codegen cannot generate "
                           f"(supported: {', '.join(SUPPORTED)})")
            why = library_refusal(l)
            if why:
                raise _err(plan_file, st, "layers", f"layer '{name}': {why}")
            if plan.mode == "train" and (l.type in INFERENCE_ONLY or l.attr.get("groups", 1) != 1):
                what = "grouped conv2d" if l.type == "conv2d" else f"type '{l.type}'"
                raise _err(plan_file, st, "layers", f"layer '{name}': {what} has no backward kernel in codegen "
                           "(plan it with --mode inference)")
            fo = st.folding.get(name, Folding())
            if fo.pe < 1 or fo.simd < 1:
                raise _err(plan_file, st, f"folding.{name}", f"expected pe >= 1 and simd >= 1, got pe={fo.pe} simd={fo.simd}")
            mh, mw = mvu_dims(l)
            if mh:
                if mh % fo.pe or mw % fo.simd:
                    raise _err(plan_file, st, f"folding.{name}",
                               f"expected PE | MH and SIMD | MW for {l.type} '{name}' (MH={mh}, MW={mw}); "
                               f"got pe={fo.pe} simd={fo.simd}")
            elif l.type in ("maxpool", "avgpool", "globalavgpool") and l.in_shapes[0][0] % fo.ew_lanes:
                raise _err(plan_file, st, f"folding.{name}",
                           f"expected lanes to divide the {l.in_shapes[0][0]} channels of {l.type} '{name}'; "
                           f"got lanes={fo.ew_lanes}")


def mvu_dims(l: Layer) -> tuple[int, int]:
    """(MH, MW) of the layer's matrix-vector unit, (0, 0) for layers without one: the
    planner's ``fpga_models.cost.matrix_shape`` (a grouped conv's MW is one group's window,
    C / groups * kh * kw), for the two types the HLS library builds on an MVU."""
    if l.type in ("dense", "conv2d"):
        from bapipe.fpga_models.cost import matrix_shape
        mh, mw, _ = matrix_shape(l)
        return mh, mw
    return 0, 0


def stream_order(shape) -> np.ndarray:
    """The model-layout (row-major) index of each element in the order a stream carries the
    tensor: images (C, H, W) in HWC order, anything else row-major."""
    idx = np.arange(prod(shape)).reshape(shape)
    return (idx.transpose(1, 2, 0) if len(shape) == 3 else idx).reshape(-1)


def concat_chunks(l: Layer) -> tuple[int, list[int]]:
    """(OUTER, chunk per input) of a concat on the stream: OUTER times, each input's next chunk
    of elements in turn (channels of one pixel for an image's channel concat)."""
    axis, shapes = l.attr["axis"], l.in_shapes
    if len(shapes[0]) == 3:   # HWC: C innermost, then W, then H
        c, h, w = shapes[0]
        outer = {0: h * w, 1: 1, 2: h}[axis]
    else:
        outer = prod(shapes[0][:axis])
    return outer, [prod(s) // outer for s in shapes]


def mul_broadcast(l: Layer) -> int | None:
    """The input index of a mul whose other input it scales per channel ((C,), (C, 1, 1) against
    an image (C, H, W)), or None when both inputs have the output's shape."""
    out = tuple(l.out_shape)
    small = [k for k, s in enumerate(l.in_shapes) if tuple(s) != out]
    return small[0] if small else None


def library_refusal(l: Layer) -> str | None:
    """Why the per-layer HLS library cannot build a layer of a supported type, or None."""
    t, shapes = l.type, l.in_shapes
    if t == "mul":
        out = tuple(l.out_shape)
        odd = [s for s in shapes if tuple(s) != out]
        if len(shapes) != 2 or len(odd) > 1 or (odd and not (len(out) == 3 and prod(odd[0]) == out[0]
                                                             and tuple(odd[0]) in ((out[0],), (out[0], 1, 1)))):
            return (f"mul of {[list(s) for s in shapes]} is not supported by codegen (expected two equal shapes, "
                    "or a (C,) / (C, 1, 1) scale of a (C, H, W) image)")
    if t == "concat" and len(shapes) != 2:
        return f"concat of {len(shapes)} inputs is not supported by codegen (expected 2)"
    if t in ("maxpool", "avgpool") and l.attr.get("ceil_mode"):
        return ("ceil_mode pooling (a partial last window) is not built by codegen (export with input sizes "
                "whose windows fit, or ceil_mode=False)")
    if t == "reshape" and "perm" in l.attr:
        return f"reshape with a permutation {list(l.attr['perm'])} (an imported Transpose) is not built by codegen"
    if t == "reshape" and not np.array_equal(stream_order(shapes[0]), stream_order(l.out_shape)):
        return (f"reshape {list(shapes[0])} -> {list(l.out_shape)} reorders the stream (HWC images), "
                "which codegen does not build (expected a view that keeps the element order)")
    return None


def make_weights(plan: Plan, model) -> dict[str, dict[str, np.ndarray]]:
    """Fixed-point weights (model layout) of every weighted layer of the plan's FPGA stages:
    ``fpga_models.weights`` draws under ``weight_seed(plan)`` (an ONNX model: its file's weights,
    ``fpga_models.weights.model_draws``), quantized to the plan's format
    (dense/conv2d ``w``, ``b``: zeros for a layer without bias; batchnorm folded to ``scale``,
    ``shift``). The one generator's draws, so the host starting from the same seed holds the
    float weights these round."""
    fmt = fx.get_fmt(plan.number_format)
    seed = weight_seed(plan)
    out: dict[str, dict[str, np.ndarray]] = {}
    for st in plan.stages:
        if st.style == "gpu":
            continue
        for name in st.layers:
            pos = model.index[name]
            l = model.layers[pos]
            if l.type in ("dense", "conv2d"):
                d = model_rounded(model, pos, seed, fmt)   # = fx.quantize(model_draws(...)), kept narrow
                mh = d["w"].shape[0]
                out[name] = {"w": d["w"], "b": d["b"] if "b" in d else np.zeros(mh, dtype=d["w"].dtype)}
            elif l.type == "batchnorm":
                d = model_draws(model, pos, seed)
                scale, shift = fx.fold_batchnorm(d["gamma"], d["beta"], d["mean"], d["var"], fmt, d.get("eps", 1e-5))
                out[name] = {"scale": scale, "shift": shift}
    return out


def format_ctx(name: str) -> FormatCtx:
    """The C++ type names of a plan number format."""
    f = fx.get_fmt(name)
    return FormatCtx(name=name, width=f.width, frac=f.frac, data_t=f.hls_type, acc_t=f.hls_acc_type,
                     recip_t=f"ap_ufixed<{fx.AVG_BITS + 1},1>", avg_bits=fx.AVG_BITS,
                     port_bits=(f.width + 7) // 8 * 8, raw_t="short" if f.width > 8 else "signed char")


def _window_params(l: Layer) -> list[int]:
    c, h, w = l.in_shapes[0]
    (kh, kw), (sh, sw), (ph, pw) = l.attr["kernel"], l.attr["stride"], l.attr["padding"]
    return [c, h, w, kh, kw, sh, sw, ph, pw]


def _shape_str(s) -> str:
    return "x".join(map(str, s))


def layer_ctx(l: Layer, fo: Folding, params: dict[str, np.ndarray], fmt: str = "fixed16") -> LayerCtx:
    """The call of one layer: library template, its parameters, weights and pragmas."""
    cid = ident(l.name)
    t = l.type
    ins = " + ".join(_shape_str(s) for s in l.in_shapes)
    desc = f"{shown(l.name)}: {t} {ins} -> {_shape_str(l.out_shape)}"
    weights: list[WeightArray] = []
    n_in = 1
    if t in ("dense", "conv2d"):
        mh, mw = mvu_dims(l)
        wq = params["w"]
        km = wq if t == "dense" else MvuMatrix(wq)   # conv: fx.conv_weight_matrix's (O, kh*kw*C), built when read
        weights = [WeightArray(f"{cid}_w", (mh, mw), tuple(wq.shape), km, wq, [(fo.pe, 1), (fo.simd, 2)]),
                   WeightArray(f"{cid}_b", (mh,), (mh,), params["b"], params["b"], [(fo.pe, 1)])]
        folds = (mh // fo.pe) * (mw // fo.simd)
        groups = l.attr.get("groups", 1)
        if t == "dense":
            rows = prod(l.in_shapes[0][:-1])
            func, tp = "bapipe::dense", [mh, mw, fo.pe, fo.simd]
            desc += f"; MVU MH={mh} MW={mw} PE={fo.pe} SIMD={fo.simd}: {folds} cycles per vector"
            if rows > 1:
                desc += f" x {rows} rows"
                func = "bapipe::dense_rows"
                tp = [rows] + tp
        else:
            c, h, w = l.in_shapes[0]
            (kh, kw), (sh, sw), (ph, pw) = l.attr["kernel"], l.attr["stride"], l.attr["padding"]
            func, tp = "bapipe::conv2d", [c, h, w, mh, kh, kw, sh, sw, ph, pw, fo.pe, fo.simd]
            if groups != 1:   # each output channel's window columns are its group's channels
                func, tp = "bapipe::conv2d_grouped", tp[:10] + [groups] + tp[10:]
                desc += f"; {groups} groups"
            desc += f"; MVU MH={mh} MW={mw} PE={fo.pe} SIMD={fo.simd}: {folds} cycles per pixel"
    elif t == "relu":
        func, tp = "bapipe::relu", [l.out_elems, fo.ew_lanes]
    elif t == "maxpool":
        func, tp = "bapipe::maxpool", _window_params(l) + [fo.ew_lanes]
    elif t == "avgpool":
        kk = prod(l.attr["kernel"])
        func, tp = "bapipe::avgpool", _window_params(l) + [fo.ew_lanes, fx.avg_recip(kk)]
        desc += f"; 1/{kk} as {fx.avg_recip(kk)}/2^{fx.AVG_BITS}"
    elif t == "globalavgpool":
        c, h, w = l.in_shapes[0]
        func, tp = "bapipe::globalavgpool", [c, h, w, fo.ew_lanes, fx.avg_recip(h * w)]
    elif t == "batchnorm":
        s = l.in_shapes[0]
        ch = s[0] if len(s) == 3 else s[-1]
        func, tp = "bapipe::batchnorm", [l.out_elems, ch, fo.ew_lanes]
        weights = [WeightArray(f"{cid}_scale", (ch,), (ch,), params["scale"], params["scale"], [(fo.ew_lanes, 1)]),
                   WeightArray(f"{cid}_shift", (ch,), (ch,), params["shift"], params["shift"], [(fo.ew_lanes, 1)])]
    elif t == "add":
        func, tp = "bapipe::add", [l.out_elems, fo.ew_lanes]
        n_in = 2  # the library add is binary; the stage builder chains it for more inputs
    elif t == "flatten":
        s = l.in_shapes[0]
        if len(s) == 3:
            func, tp = "bapipe::flatten", list(s)
        else:
            func, tp = "bapipe::copy", [l.out_elems]
    elif t == "reshape":   # a view keeping the stream order (library_refusal): a copy
        func, tp = "bapipe::copy", [l.out_elems]
    elif t == "sigmoid":
        func, tp = "bapipe::sigmoid", [l.out_elems, fo.ew_lanes, *fx.sigmoid_consts(fx.get_fmt(fmt))]
        desc += "; PLAN piecewise-linear (shifts and adds)"
    elif t == "silu":
        func, tp = "bapipe::silu", [l.out_elems, fo.ew_lanes, *fx.sigmoid_consts(fx.get_fmt(fmt))]
        desc += "; x * PLAN sigmoid(x), one rounding"
    elif t == "clip":
        lo, hi = fx.clip_bounds(fmt, l.attr.get("min"), l.attr.get("max"))
        func, tp = "bapipe::clip", [l.out_elems, fo.ew_lanes, lo, hi]
        desc += f"; raw bounds [{lo}, {hi}]"
    elif t == "mul":
        k = mul_broadcast(l)
        n_in = 2
        if k is None:
            func, tp = "bapipe::mul", [l.out_elems, fo.ew_lanes]
        else:
            c = l.out_shape[0]
            func, tp = "bapipe::mul_channel", [c, l.out_elems // c, fo.ew_lanes, "true" if k == 0 else "false"]
            desc += f"; input {k} scales each channel"
    elif t == "concat":
        outer, (ca, cb) = concat_chunks(l)
        func, tp = "bapipe::concat", [outer, ca, cb]
        n_in = 2
    else:  # guarded by check_plan
        raise ValueError(f"unsupported layer type {t}")
    return LayerCtx(name=l.name, ident=f"layer_{cid}", type=t, comment=desc, func=func, tparams=tp, n_in=n_in,
                    weights=weights, layer=l)


def _tensor_shape(model, name: str) -> tuple[int, ...]:
    if name in model.index:
        return tuple(model.layers[model.index[name]].out_shape)
    return tuple(next(i.shape for i in model.inputs if i.name == name))


def stage_ports(model, st: Stage) -> tuple[list[str], list[str]]:
    """(input tensors, output tensors) of a stage, in the model's cut order."""
    n = len(model.layers)
    if st.first == 0:
        used = {i for l in model.layers[st.first:st.last + 1] for i in l.inputs}
        later = {i for l in model.layers[st.last + 1:] for i in l.inputs}
        ins = [i.name for i in model.inputs if i.name in used or i.name in later]
    else:
        ins = [t.producer for t in model.cut_tensors(st.first - 1)]
    outs = [t.producer for t in model.cut_tensors(st.last)] if st.last < n - 1 else [model.layers[-1].name]
    return ins, outs


def build_stage(plan: Plan, model, st: Stage, weights: dict[str, dict[str, np.ndarray]]) -> StageCtx:
    """Wire one stage: ports, layer calls, fan-out duplication and pass-through copies."""
    layers = [model.layers[model.index[n]] for n in st.layers]
    lctx = [layer_ctx(l, st.folding.get(l.name, Folding()), weights.get(l.name, {}), plan.number_format)
            for l in layers]
    welems = sum(int(w.kernel_q.size) for lc in lctx for w in lc.weights)
    # training: the SGD update kernel (codegen.design.train_kernels) rewrites the weights every iteration,
    # so they live in writable m_axi memory, not in ROM
    embed = welems <= EMBED_LIMIT and plan.mode != "train"
    for lc in lctx:
        lc.external = not embed
    ins, outs = stage_ports(model, st)
    inputs = [PortCtx(f"in{k}", t, _tensor_shape(model, t), prod(_tensor_shape(model, t))) for k, t in enumerate(ins)]
    outputs = [PortCtx(f"out{k}", t, _tensor_shape(model, t), prod(_tensor_shape(model, t)))
               for k, t in enumerate(outs)]
    out_port = {p.tensor: p.name for p in outputs}
    in_port = {p.tensor: p.name for p in inputs}
    elems = {t: prod(_tensor_shape(model, t)) for t in ins + [l.name for l in layers]}

    # consumers of every tensor: ("slot", layer, k) for a layer input, ("port", name) for an output port
    consumers: dict[str, list[tuple]] = {}
    for l in layers:
        for k, src in enumerate(l.inputs):
            consumers.setdefault(src, []).append(("slot", l.name, k))
    for t in outs:
        consumers.setdefault(t, []).append(("port", out_port[t]))

    def hop(n: int) -> int:
        """Depth of a stream from one layer to the next: the handshake depth in a dataflow
        stage (both run at once); a whole tensor in a time-multiplexed one (the producer
        finishes before the consumer starts, as the Design's frame buffers between units)."""
        return 2 if st.style == "dataflow" else n

    streams: list[StreamCtx] = []
    slot_stream: dict[tuple[str, int], str] = {}
    source: dict[str, str] = {}        # the stream a tensor is first written to
    fans: dict[str, list[str]] = {}    # tensor -> streams its source must be duplicated into
    for t, cons in consumers.items():
        n = elems[t]
        if len(cons) == 1:
            c = cons[0]
            if c[0] == "port":
                source[t] = in_port.get(t, c[1])
                if t in in_port:           # pass-through: a tensor this stage only forwards
                    fans[t] = [c[1]]
            else:
                src = in_port.get(t) or f"s_{ident(t)}"
                if t not in in_port:
                    streams.append(StreamCtx(src, n, hop(n)))
                source[t] = src
                slot_stream[(c[1], c[2])] = src
            continue
        src = in_port.get(t) or f"s_{ident(t)}"
        if t not in in_port:
            streams.append(StreamCtx(src, n, hop(n)))
        source[t] = src
        targets = []
        for c in cons:
            if c[0] == "port":
                targets.append(c[1])
            else:
                nm = f"s_{ident(t)}_to_{ident(c[1])}" + (f"_{c[2]}" if c[2] else "")
                # deep FIFO: the other branch of a fork may hold a whole tensor before this one is read
                streams.append(StreamCtx(nm, n, n))
                slot_stream[(c[1], c[2])] = nm
                targets.append(nm)
        fans[t] = targets

    statements: list[str] = []

    def fan_out(t: str) -> None:
        """Copy or duplicate tensor ``t`` from its source stream into its consumers' streams."""
        targets, n, cur = fans.get(t, []), elems[t], source.get(t)
        if len(targets) == 1:
            statements.append(f"bapipe::copy<{n}>({cur}, {targets[0]})")
            return
        for i, tgt in enumerate(targets[:-1]):
            nxt = targets[-1] if i == len(targets) - 2 else f"s_{ident(t)}_fan{i}"
            if nxt.startswith("s_") and nxt.endswith(f"_fan{i}"):
                streams.append(StreamCtx(nxt, n, n))
            statements.append(f"bapipe::dup2<{n}>({cur}, {tgt}, {nxt})")
            cur = nxt

    for p in inputs:
        fan_out(p.tensor)
    for l, lc in zip(layers, lctx):
        srcs = [slot_stream[(l.name, k)] for k in range(len(l.inputs))]
        if l.name not in source:
            raise ValueError(f"layer '{l.name}' output is never used")
        dst = source[l.name]
        if l.type == "add" and len(srcs) > 2:
            acc = srcs[0]
            for j, s2 in enumerate(srcs[1:]):
                o = dst if j == len(srcs) - 2 else f"s_{ident(l.name)}_part{j}"
                if o != dst:
                    streams.append(StreamCtx(o, l.out_elems, hop(l.out_elems)))
                statements.append(f"{lc.ident}({acc}, {s2}, {o})")
                acc = o
        else:
            statements.append(f"{lc.ident}({', '.join(srcs + [dst] + lc.wargs)})")
        fan_out(l.name)
    # sort stream declarations by name for a stable, readable order
    streams = sorted({s.name: s for s in streams}.values(), key=lambda s: s.name)
    return StageCtx(index=st.index, name=f"stage{st.index}", boards=list(st.boards), board_type=st.board_type,
                    style=st.style, dataflow=st.style == "dataflow", layers=lctx, inputs=inputs, outputs=outputs,
                    streams=streams, statements=statements, embed_weights=embed,
                    weight_elements=welems)


def _board_type_key(board_type: str) -> str:
    return board_type.upper().replace("ALVEO", "").replace("-", "").strip()


def _loss_kernel(s: StageCtx, last: int):
    """The loss kernel fed by stage ``s`` (the last stage of a training build that has one)."""
    return s.loss if s.index == last and s.bwd is not None else None


def _train_kernel_names(s: StageCtx, last: int) -> list[str]:
    """The training kernels besides forward and backward a stage's boards link (hls_train)."""
    u, loss = s.update, _loss_kernel(s, last)
    return ([u.name] if u else []) + ([u.allreduce_name] if u and u.replicas > 1 else []) \
        + ([loss.name] if loss else [])


def _train_kernels(s: StageCtx, loss, mem: str, kernels: dict, connects: list, sp: list, slr: list) -> None:
    """nk, sp, slr and stream_connect lines of a training stage's update, all-reduce and loss
    kernels (codegen.design.train_kernels): the update kernel's gradient, master, velocity and weight
    arrays, and the forward's arrays it rewrites, in the bank the other kernels use (the host
    passes them the same buffers); the all-reduce's sums and its ring to the next replica (over
    the network kernels); the loss kernel's labels."""
    u = s.update
    if u is not None:
        kernels.setdefault(u.name, []).append(f"{u.name}_1")
        slr.append(f"{u.name}_1:SLR0")
        for a in u.arrays:
            sp.extend(f"{u.name}_1.{x}{a.name}:{mem}" for x in ("g_", "m_", "v_", ""))
        sp.extend(f"{u.name}_1.{r}:{mem}" for r, _ in u.roms)
        if u.replicas > 1:
            ak = u.allreduce_name
            kernels.setdefault(ak, []).append(f"{ak}_1")
            slr.append(f"{ak}_1:SLR0")
            sp.extend(f"{ak}_1.{x}{g}:{mem}" for g, _ in u.grads for x in ("snd_", ""))
            connects.append(f"{ak}_1.ring_out:net_tx_1.{ak}_ring_out")
            connects.append(f"net_rx_1.{ak}_ring_in:{ak}_1.ring_in")
    if loss is not None:
        kernels.setdefault(loss.name, []).append(f"{loss.name}_1")
        slr.append(f"{loss.name}_1:SLR0")
        sp.append(f"{loss.name}_1.labels:{mem}")


def build_boards(plan: Plan, cluster, stages: list[StageCtx]) -> list[BoardCtx]:
    """Per board: the stage kernels placed on it and its v++ link lines.

    Each stage kernel streams to/from the board's network kernel (``net_tx``/``net_rx``,
    one AXIS channel per tensor) or, at the pipeline ends, to the host data movers
    (``mm2s``/``s2mm``) whose memory port goes to the board's first memory bank.
    """
    by_board: dict[str, list[StageCtx]] = {}
    for s in stages:
        for b in s.boards:
            by_board.setdefault(b, []).append(s)
    producer: dict[str, StageCtx] = {}
    for s in stages:
        for p in s.outputs:
            producer[p.tensor] = s
    out = []
    order = [cb.name for cb in cluster.boards] if cluster is not None else sorted(by_board)
    last = max((s.index for s in stages), default=0)
    for bname in order:
        if bname not in by_board:
            continue
        sts = by_board[bname]
        bt = sts[0].board_type
        key = _board_type_key(bt)
        kernels: dict[str, list[str]] = {}   # kernel -> instance names (one nk line each)
        connects, sp, slr = [], [], []
        mem = MEMORY.get(key, "DDR[0]")
        for s in sts:
            kernels.setdefault(s.name, []).append(f"{s.name}_1")
            slr.append(f"{s.name}_1:SLR0")
            if s.engine is not None:   # engine kernels: the banked MVU weight arrays beyond on-chip ROM
                sp.extend(f"{s.name}_1.{r.name}:{mem}" for r in s.engine.external)
                sp.extend(f"{s.name}_1.{f.name}:{mem}" for f in s.engine.frames)   # off-chip frame buffers
                sp.extend(f"{s.name}_1.{b.name}:{mem}" for b in s.engine.stashes)   # training: stash slots
            elif not s.embed_weights:   # m_axi weight ports (stages too big for on-chip ROM)
                sp.extend(f"{s.name}_1.{w.name}:{mem}" for w in s.weights)
            for p in s.inputs:
                src = producer.get(p.tensor) if s.index > 0 else None
                # the previous stage's copy of this tensor (its producer, or a stage passing it on)
                src = next((x for x in reversed(stages) if x.index < s.index
                            and any(q.tensor == p.tensor for q in x.outputs)), src)
                if src is None:
                    inst = f"mm2s_{s.name}_{p.name}"
                    kernels.setdefault("mm2s", []).append(inst)
                    connects.append(f"{inst}.out:{s.name}_1.{p.name}")
                    sp.append(f"{inst}.mem:{mem}")
                elif src.boards == s.boards:
                    q = next(q for q in src.outputs if q.tensor == p.tensor)
                    connects.append(f"{src.name}_1.{q.name}:{s.name}_1.{p.name}")
                else:
                    connects.append(f"net_rx_1.{s.name}_{p.name}:{s.name}_1.{p.name}")
            for p in s.outputs:
                dst = next((x for x in stages if x.index > s.index and any(q.tensor == p.tensor for q in x.inputs)),
                           None)
                if _loss_kernel(s, last) is not None:   # training: the logits stream into the loss kernel
                    connects.append(f"{s.name}_1.{p.name}:{_loss_kernel(s, last).name}_1.z_in")
                elif dst is None or s.index == last:
                    inst = f"s2mm_{s.name}_{p.name}"
                    kernels.setdefault("s2mm", []).append(inst)
                    connects.append(f"{s.name}_1.{p.name}:{inst}.in")
                    sp.append(f"{inst}.mem:{mem}")
                elif dst.boards != s.boards:
                    connects.append(f"{s.name}_1.{p.name}:net_tx_1.{s.name}_{p.name}")
            if s.bwd is not None:
                bk = s.bwd.name
                kernels.setdefault(bk, []).append(f"{bk}_1")
                slr.append(f"{bk}_1:SLR0")
                for a in s.bwd.grad_arrays + s.bwd.stashes + s.bwd.acc_ports + s.bwd.frames:   # m_axi
                    sp.append(f"{bk}_1.{a.name}:{mem}")
                sp.extend(f"{bk}_1.{w.name}:{mem}" for w in s.bwd.weights)
                loss = _loss_kernel(s, last)
                for p in s.bwd.in_ports:
                    if loss is not None:   # the loss kernel turns the logits into their gradient on the board
                        connects.append(f"{loss.name}_1.dz_out:{bk}_1.{p.name}")
                    elif p.name.startswith("x_") or s.index == last:
                        # stashed activations are replayed from memory; the loss gradient comes from the host
                        inst = f"mm2s_{bk}_{p.name}"
                        kernels.setdefault("mm2s", []).append(inst)
                        connects.append(f"{inst}.out:{bk}_1.{p.name}")
                        sp.append(f"{inst}.mem:{mem}")
                    else:
                        connects.append(f"net_rx_1.{bk}_{p.name}:{bk}_1.{p.name}")
                for p in s.bwd.out_ports:
                    connects.append(f"{bk}_1.{p.name}:net_tx_1.{bk}_{p.name}")
                _train_kernels(s, loss, mem, kernels, connects, sp, slr)   # codegen.design.train_kernels: update, all-reduce, loss
        nk = [f"{k}:{len(v)}:{'.'.join(v)}" for k, v in kernels.items()]
        movers = sorted(k for k in kernels if k in ("mm2s", "s2mm"))
        names = [s.name for s in sts] + [s.bwd.name for s in sts if s.bwd is not None] \
            + [k for s in sts for k in _train_kernel_names(s, last)]
        out.append(BoardCtx(name=bname, board_type=bt, platform=PLATFORMS.get(key), stages=names,
                            movers=movers, connects=connects, nk=nk, sp=sp, slr=slr))
    return out
