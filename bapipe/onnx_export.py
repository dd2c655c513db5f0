"""Write a model (zoo or YAML) as an ONNX graph: structure, shapes and weights.

Layers with a standard ONNX counterpart are written the way PyTorch's exporter writes
them (Conv, Gemm, MatMul + Add for a bias, LSTM between Transposes, Gather for a token
embedding), so the importer reads them back through its ordinary op mapping. Layers
that are several ONNX nodes with no single-op form (multi-head attention, Bahdanau
attention, embeddings with positions, an LSTM over several concatenated inputs) are
written as plain ONNX subgraphs whose nodes carry a ``doc_string`` tag
``bapipe:{"layer": ..., "type": ..., "attrs": {...}}``; the importer regroups a tagged
subgraph into that one layer. Tied weights share one initializer. Trainable weights are
initializers (so their element count equals ``Model.params``); everything else (running
statistics, shapes, masks, indices) is a Constant node. The batch dimension is symbolic
(``N``). See docs/onnx.md.
"""
from __future__ import annotations

import json
import math

import numpy as np

from .errors import SpecError
from .layers import Layer
from .spec import Model

OPSET = 20             # Gelu is a standard op from opset 20
TAG = "bapipe:"        # doc_string prefix of nodes that belong to a composite layer
PROTO_LIMIT = 2 ** 31 - 2 ** 24   # protobuf's 2 GB limit, with room for the graph itself
MAX_EXPORT_BYTES = 16 * 2 ** 30   # refuse models whose weights do not fit comfortably in memory


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise SpecError("<export>", None, None, "the 'onnx' package is not installed") from None
    return onnx


class _Graph:
    """Accumulates nodes, initializers and constants of one ONNX graph."""

    def __init__(self, weights: str, seed: int = 0):
        self.onnx = _onnx()
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.init_names: set[str] = set()
        self.tag: str = ""
        self._consts: dict[str, str] = {}

    # -- tensors -------------------------------------------------------------------------
    def weight(self, name: str, shape: tuple[int, ...], fan_in: int | None = None) -> str:
        """A trainable initializer (random: uniform +-1/sqrt(fan_in) like PyTorch's default)."""
        if name in self.init_names:
            return name
        oh = self.onnx
        if self.weights == "none":  # dims only, no bytes: a test/inspection form, never saved
            t = oh.TensorProto(name=name, data_type=oh.TensorProto.FLOAT, dims=list(shape))
            t.data_location = oh.TensorProto.EXTERNAL
            e = t.external_data.add()
            e.key, e.value = "location", "none"
        else:
            if self.weights == "zero":
                arr = np.zeros(shape, np.float32)
            else:
                bound = 1.0 / math.sqrt(fan_in or shape[-1])
                arr = self.rng.uniform(-bound, bound, size=shape).astype(np.float32)
            t = oh.numpy_helper.from_array(arr, name)
        self.inits.append(t)
        self.init_names.add(name)
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        """A Constant node (not a trainable weight); identical names are emitted once."""
        if name in self._consts:
            return self._consts[name]
        out = name
        self.nodes.append(self.onnx.helper.make_node(
            "Constant", [], [out], name=name, value=self.onnx.numpy_helper.from_array(value, name)))
        self._consts[name] = out
        return out

    def ints(self, name: str, values) -> str:
        """An int64 1-D constant (shapes, axes)."""
        return self.const(name, np.asarray(values, dtype=np.int64))

    def node(self, op: str, inputs: list[str], output: str, name: str | None = None, **attrs) -> str:
        """Append one node (tagged when inside a composite layer)."""
        n = self.onnx.helper.make_node(op, inputs, [output], name=name or output, **attrs)
        if self.tag:
            n.doc_string = self.tag
        self.nodes.append(n)
        return output


def _tag(layer: Layer) -> str:
    attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in layer.attrs}
    d = {"layer": layer.name, "type": layer.type, "attrs": attrs}
    if layer.tied_to:
        d["tied_to"] = layer.tied_to
    return TAG + json.dumps(d, sort_keys=True)


def _dense(g: _Graph, l: Layer, x: str, weight_of: dict[str, str]) -> None:
    (s,) = l.in_shapes
    units, bias = l.attr["units"], l.attr["bias"]
    k = s[-1]
    tied = weight_of.get(l.tied_to) if l.tied_to else None
    if len(s) == 1:  # torch.nn.Linear on a vector: Gemm(x, W[units, in]^T) + b
        w = tied or g.weight(f"{l.name}.weight", (units, k), k)
        ins = [x, w] + ([g.weight(f"{l.name}.bias", (units,), k)] if bias else [])
        g.node("Gemm", ins, l.name, transB=1)
        weight_of[l.name] = w
        return
    if tied:  # tied to an embedding table [vocab, dim]: multiply by its transpose
        w = g.node("Transpose", [tied], f"{l.name}/weight_t", perm=[1, 0])
    else:
        w = g.weight(f"{l.name}.weight", (k, units), k)
    weight_of[l.name] = tied or w
    if bias:
        g.node("MatMul", [x, w], f"{l.name}/matmul", name=l.name)
        g.node("Add", [f"{l.name}/matmul", g.weight(f"{l.name}.bias", (units,), k)], l.name, name=f"{l.name}/bias")
    else:
        g.node("MatMul", [x, w], l.name)


def _lstm(g: _Graph, l: Layer, xs: list[str]) -> None:
    h, bidir = l.attr["hidden"], l.attr["bidirectional"]
    dirs = 2 if bidir else 1
    f_in = sum(s[1] for s in l.in_shapes)
    x = xs[0]
    if len(xs) > 1:
        x = g.node("Concat", xs, f"{l.name}/concat", axis=2)
    xt = g.node("Transpose", [x], f"{l.name}/x_t", perm=[1, 0, 2])          # [S, N, F]
    w = g.weight(f"{l.name}.W", (dirs, 4 * h, f_in), h)
    r = g.weight(f"{l.name}.R", (dirs, 4 * h, h), h)
    b = g.weight(f"{l.name}.B", (dirs, 8 * h), h)
    g.node("LSTM", [xt, w, r, b], f"{l.name}/y", name=l.name, hidden_size=h,
           direction="bidirectional" if bidir else "forward")             # [S, dirs, N, h]
    yt = g.node("Transpose", [f"{l.name}/y"], f"{l.name}/y_t", perm=[0, 2, 1, 3])  # [S, N, dirs, h]
    yr = g.node("Reshape", [yt, g.ints("shape_0_0_m1", [0, 0, -1])], f"{l.name}/y_r")
    g.node("Transpose", [yr], l.name, name=f"{l.name}/out", perm=[1, 0, 2])  # [N, S, dirs*h]


def _attention(g: _Graph, l: Layer, xs: list[str]) -> None:
    q_in, kv_in = xs[0], xs[-1]
    sq, d = l.in_shapes[0]
    sk = l.in_shapes[-1][0]
    heads, bias, causal = l.attr["heads"], l.attr["bias"], l.attr["causal"]
    dh = d // heads
    n = l.name

    def proj(tag: str, src: str, out: str | None = None) -> str:
        """x W (+ b), PyTorch's MatMul + Add form of a Linear."""
        w = g.weight(f"{n}.{tag}.weight", (d, d), d)
        y = g.node("MatMul", [src, w], out if out and not bias else f"{n}/{tag}" + ("/matmul" if bias else ""),
                   name=f"{n}/{tag}")
        if bias:
            y = g.node("Add", [y, g.weight(f"{n}.{tag}.bias", (d,), d)], out or f"{n}/{tag}/add",
                       name=f"{n}/{tag}/bias")
        return y

    split = g.ints(f"shape_0_0_{heads}_{dh}", [0, 0, heads, dh])
    q = g.node("Transpose", [g.node("Reshape", [proj("q", q_in), split], f"{n}/q_r")], f"{n}/q_t",
               perm=[0, 2, 1, 3])                                          # [N, h, Sq, dh]
    k = g.node("Transpose", [g.node("Reshape", [proj("k", kv_in), split], f"{n}/k_r")], f"{n}/k_t",
               perm=[0, 2, 3, 1])                                          # [N, h, dh, Sk]
    v = g.node("Transpose", [g.node("Reshape", [proj("v", kv_in), split], f"{n}/v_r")], f"{n}/v_t",
               perm=[0, 2, 1, 3])                                          # [N, h, Sk, dh]
    s = g.node("MatMul", [q, k], f"{n}/scores")
    s = g.node("Mul", [s, g.const("attn_scale_%d" % dh, np.array(1.0 / math.sqrt(dh), np.float32))], f"{n}/scaled")
    if causal:
        mask = np.triu(np.full((sq, sk), -1e4, np.float32), 1)
        s = g.node("Add", [s, g.const(f"causal_mask_{sq}x{sk}", mask)], f"{n}/masked")
    p = g.node("Softmax", [s], f"{n}/probs", axis=-1)
    c = g.node("MatMul", [p, v], f"{n}/context")                           # [N, h, Sq, dh]
    c = g.node("Transpose", [c], f"{n}/context_t", perm=[0, 2, 1, 3])
    c = g.node("Reshape", [c, g.ints(f"shape_0_0_{d}", [0, 0, d])], f"{n}/context_r")
    proj("o", c, n)


def _additive_attention(g: _Graph, l: Layer, xs: list[str]) -> None:
    q_in, mem = xs
    (sq, dq), (sk, dk) = l.in_shapes
    u = l.attr["units"]
    n = l.name
    pq = g.node("MatMul", [q_in, g.weight(f"{n}.query.weight", (dq, u), dq)], f"{n}/pq")       # [N, Sq, u]
    pk = g.node("MatMul", [mem, g.weight(f"{n}.memory.weight", (dk, u), dk)], f"{n}/pk")       # [N, Sk, u]
    pq = g.node("Unsqueeze", [pq, g.ints("axes_2", [2])], f"{n}/pq_u")                        # [N, Sq, 1, u]
    pk = g.node("Unsqueeze", [pk, g.ints("axes_1", [1])], f"{n}/pk_u")                        # [N, 1, Sk, u]
    e = g.node("Add", [pq, pk], f"{n}/sum")
    e = g.node("Add", [e, g.weight(f"{n}.norm_bias", (u,), u)], f"{n}/biased")
    e = g.node("Tanh", [e], f"{n}/tanh")
    v = g.node("Mul", [g.weight(f"{n}.v", (u, 1), u), g.weight(f"{n}.norm_scalar", (1,), 1)], f"{n}/v_scaled")
    e = g.node("MatMul", [e, v], f"{n}/energy")                                               # [N, Sq, Sk, 1]
    e = g.node("Squeeze", [e, g.ints("axes_3", [3])], f"{n}/energy_s")
    p = g.node("Softmax", [e], f"{n}/probs", axis=-1)
    g.node("MatMul", [p, mem], n, name=f"{n}/context")                                      # [N, Sq, dk]


def _embedding(g: _Graph, l: Layer, x: str, weight_of: dict[str, str]) -> None:
    (s,) = l.in_shapes[0]
    vocab, dim, pos, tt = (l.attr[k] for k in ("vocab", "dim", "positions", "token_types"))
    n = l.name
    w = weight_of.get(l.tied_to) if l.tied_to else None
    w = w or g.weight(f"{n}.weight", (vocab, dim), dim)
    weight_of[n] = w
    if not pos and not tt:
        g.node("Gather", [w, x], n)
        return
    y = g.node("Gather", [w, x], f"{n}/tokens")
    if pos:
        pe = g.node("Gather", [g.weight(f"{n}.position.weight", (pos, dim), dim),
                               g.const(f"range_{s}", np.arange(s, dtype=np.int64))], f"{n}/pos")
        y = g.node("Add", [y, pe], n if not tt else f"{n}/with_pos")
    if tt:
        te = g.node("Gather", [g.weight(f"{n}.token_type.weight", (tt, dim), dim),
                               g.const(f"zeros_{s}", np.zeros(s, dtype=np.int64))], f"{n}/type")
        g.node("Add", [y, te], n)


def _matmul(g: _Graph, l: Layer, xs: list[str]) -> None:
    """MatMul, then the imported extras: the scale (Mul), the causal triangle and the key mask
    (Where of -inf), in the order the importer reads them back."""
    n, a = l.name, l.attr
    b = xs[1]
    if a["transpose_b"]:
        r = len(l.in_shapes[1]) + 1
        b = g.node("Transpose", [b], f"{n}/b_t", perm=list(range(r - 2)) + [r - 1, r - 2])
    steps = [k for k in ("scale", "causal", "key_mask") if k in a]
    y = g.node("MatMul", [xs[0], b], n if not steps else f"{n}/matmul", name=n if not steps else f"{n}/matmul")
    sq, sk = l.out_shape[-2:]
    ninf = g.const("neg_inf", np.array(-np.inf, np.float32))
    for i, k in enumerate(steps):
        out = n if i == len(steps) - 1 else f"{n}/{k}"
        if k == "scale":
            y = g.node("Mul", [y, g.const(f"{n}/scale_value", np.array(a["scale"], np.float32))], out)
        elif k == "causal":
            keep = np.tril(np.ones((sq, sk), bool), sk - sq)
            y = g.node("Where", [g.const(f"causal_{sq}x{sk}", keep), y, ninf], out)
        else:   # key_mask: one value per key, broadcast over the rows (and heads)
            r = len(l.out_shape) + 1
            m = g.node("Reshape", [xs[2], g.ints(f"mask_shape_{r}_{sk}", [0] + [1] * (r - 2) + [sk])], f"{n}/mask")
            hit = g.node("Equal", [g.node("Cast", [m], f"{n}/mask_f", to=1), g.const("zero_f", np.array(0, np.float32))],
                         f"{n}/mask_zero")
            if a["key_mask"] == "nonzero":
                hit = g.node("Not", [hit], f"{n}/mask_set")
            y = g.node("Where", [hit, ninf, y], out)


def _window(l: Layer) -> dict:
    (ph, pw) = l.attr["padding"]
    return {"kernel_shape": list(l.attr["kernel"]), "strides": list(l.attr["stride"]), "pads": [ph, pw, ph, pw]}


def _layer(g: _Graph, l: Layer, weight_of: dict[str, str]) -> None:
    """Emit the ONNX nodes of one layer; its output tensor is named after the layer."""
    t, n, xs = l.type, l.name, list(l.inputs)
    composite = (t in ("attention", "additive_attention")
                 or (t == "embedding" and (l.attr["positions"] or l.attr["token_types"]))
                 or (t == "lstm" and len(xs) > 1))
    g.tag = _tag(l) if composite else ""
    if t == "conv2d":
        co, (kh, kw), groups = l.attr["out_channels"], l.attr["kernel"], l.attr["groups"]
        ci = l.in_shapes[0][0]
        fan = ci // groups * kh * kw
        ins = xs + [g.weight(f"{n}.weight", (co, ci // groups, kh, kw), fan)]
        if l.attr["bias"]:
            ins.append(g.weight(f"{n}.bias", (co,), fan))
        w = _window(l)
        g.node("Conv", ins, n, group=groups, kernel_shape=w["kernel_shape"], strides=w["strides"], pads=w["pads"])
    elif t == "dense":
        _dense(g, l, xs[0], weight_of)
    elif t == "matmul":
        _matmul(g, l, xs)
    elif t == "attention":
        _attention(g, l, xs)
    elif t == "additive_attention":
        _additive_attention(g, l, xs)
    elif t == "lstm":
        _lstm(g, l, xs)
    elif t == "embedding":
        _embedding(g, l, xs[0], weight_of)
    elif t in ("maxpool", "avgpool"):
        g.node("MaxPool" if t == "maxpool" else "AveragePool", xs, n, **_window(l),
               **({"ceil_mode": 1} if l.attr.get("ceil_mode") else {}),
               **({"count_include_pad": 1} if t == "avgpool" and any(l.attr["padding"]) else {}))
    elif t == "globalavgpool":
        g.node("GlobalAveragePool", xs, f"{n}/gap", name=n)
        g.node("Flatten", [f"{n}/gap"], n, name=f"{n}/flatten", axis=1)
    elif t == "gelu":   # the layer's default is the tanh form; ONNX Gelu's default is the exact one
        g.node("Gelu", xs, n, approximate=l.attr.get("approximate", "tanh"))
    elif t == "relu" and l.attr.get("negative_slope"):
        g.node("LeakyRelu", xs, n, alpha=l.attr["negative_slope"])
    elif t == "sigmoid" and "alpha" in l.attr:
        g.node("HardSigmoid", xs, n, alpha=l.attr["alpha"], beta=l.attr["beta"])
    elif t == "silu":   # x * sigmoid(x), the pattern the importer reads back; HardSwish is one op
        if l.attr.get("hard"):
            g.node("HardSwish", xs, n)
        else:
            g.node("Mul", [xs[0], g.node("Sigmoid", xs, f"{n}/sigmoid")], n)
    elif t in ("relu", "tanh", "sigmoid"):
        g.node(t.capitalize(), xs, n)
    elif t == "softmax":
        g.node("Softmax", xs, n, axis=-1)
    elif t == "batchnorm":
        (s,) = l.in_shapes
        if len(s) != 3:
            raise SpecError("<export>", None, n, f"ONNX BatchNormalization needs an image input (C,H,W), got {list(s)}")
        c = s[0]
        g.node("BatchNormalization", xs + [g.weight(f"{n}.weight", (c,), 1), g.weight(f"{n}.bias", (c,), 1),
                                           g.const(f"{n}.running_mean", np.zeros(c, np.float32)),
                                           g.const(f"{n}.running_var", np.ones(c, np.float32))], n)
    elif t == "layernorm":
        f = l.in_shapes[0][-1]
        g.node("LayerNormalization", xs + [g.weight(f"{n}.weight", (f,), 1), g.weight(f"{n}.bias", (f,), 1)], n,
               axis=-1)
    elif t == "add":
        g.node("Add" if len(xs) == 2 else "Sum", xs, n)
    elif t == "concat":
        g.node("Concat", xs, n, axis=l.attr["axis"] + 1)
    elif t == "flatten":
        g.node("Flatten", xs, n, axis=1)
    elif t == "take":
        g.node("Gather", [xs[0], g.const(f"index_{l.attr['index']}", np.array(l.attr["index"], np.int64))], n, axis=1)
    elif t == "slice":   # positions start..end of one axis (the batch axis first in ONNX)
        a = l.attr
        g.node("Slice", [xs[0], g.ints(f"starts_{a['start']}", [a["start"]]), g.ints(f"ends_{a['end']}", [a["end"]]),
                         g.ints(f"axes_{a['axis'] + 1}", [a["axis"] + 1])], n)
    elif t == "reshape":
        src = xs[0]
        if "perm" in l.attr:   # an imported Transpose: view as pre, permute, then reshape
            pre, perm = l.attr["pre"], l.attr["perm"]
            src = g.node("Reshape", [src, g.ints("shape_" + "_".join(map(str, (0,) + pre)), (0,) + pre)], f"{n}/pre")
            src = g.node("Transpose", [src], f"{n}/perm", perm=[0] + [p + 1 for p in perm])
        g.node("Reshape", [src, g.ints("shape_" + "_".join(map(str, (0,) + l.out_shape)), (0,) + l.out_shape)], n)
    else:
        raise SpecError("<export>", None, n, f"a '{t}' layer has no ONNX form (opaque layers cannot be exported)")
    g.tag = ""


def build_onnx(model: Model, weights: str = "random", seed: int = 0):
    """The ONNX ModelProto of ``model``; weights 'random' | 'zero' | 'none' (dims only, not savable)."""
    if weights not in ("random", "zero", "none"):
        raise SpecError("<export>", None, "weights", f"expected random, zero or none, got {weights!r}")
    onnx = _onnx()
    oh = onnx.helper
    g = _Graph(weights, seed)
    weight_of: dict[str, str] = {}
    for l in model.layers:
        _layer(g, l, weight_of)
    inputs = [oh.make_tensor_value_info(i.name, onnx.TensorProto.INT64 if i.dtype == "int" else onnx.TensorProto.FLOAT,
                                        ["N", *i.shape]) for i in model.inputs]
    last = model.layers[-1]
    outputs = [oh.make_tensor_value_info(last.name, onnx.TensorProto.FLOAT, ["N", *last.out_shape])]
    graph = oh.make_graph(g.nodes, model.name, inputs, outputs, initializer=g.inits)
    m = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)], producer_name="bapipe",
                      doc_string=model.description)
    m.ir_version = 9
    return m


def weight_bytes(model: Model) -> int:
    """Bytes of float32 weights the export writes (tied weights once)."""
    return 4 * model.params


def export_onnx(model: Model, path: str, weights: str = "random", seed: int = 0) -> dict:
    """Write ``model`` to ``path`` as ONNX; weights above 2 GB go to ``<path>.data`` (external data).

    Refuses models whose weights exceed MAX_EXPORT_BYTES (e.g. gpt3-175b) with a SpecError.
    Returns a summary: path, nodes, initializers, weight bytes, external data file or None.
    """
    if weights not in ("random", "zero"):
        raise SpecError("<export>", None, "weights", f"expected random or zero, got {weights!r}")
    nbytes = weight_bytes(model)
    if nbytes > MAX_EXPORT_BYTES:
        raise SpecError(model.name, None, "MODEL",
                        f"{model.params / 1e9:.1f}B parameters ({nbytes / 2**30:.0f} GiB of fp32 weights) do not fit "
                        f"in memory for export; the limit is {MAX_EXPORT_BYTES // 2**30} GiB")
    onnx = _onnx()
    m = build_onnx(model, weights, seed)
    external = nbytes > PROTO_LIMIT
    data = None
    try:
        if external:
            from pathlib import Path
            data = Path(path).name + ".data"
            onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data,
                            size_threshold=1024)
        else:
            onnx.save_model(m, path)
    except OSError as e:
        raise SpecError(path, None, "output", f"cannot write ({e.strerror or type(e).__name__})") from None
    return {"model": model.name, "path": str(path), "nodes": len(m.graph.node),
            "initializers": len(m.graph.initializer), "weight_bytes": nbytes, "weights": weights,
            "external_data": data, "opset": OPSET}
