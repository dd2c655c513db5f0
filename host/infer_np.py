"""Float inference over a model's layer list in numpy: the whole model, one batch.

The trainable layer types run ``host.layers_np``'s own forwards (the numpy backend's); the
types imported models add (matmul with its scale, views with an element order, slices,
mul, clip, silu, learned tensors, embeddings, LSTMs) are inference-only here. Together
they compute what an imported ONNX file computes, with the file's weights
(``bapipe.onnx_weights``): tests/test_onnx_outputs.py holds it to torch's output.
"""
from __future__ import annotations

import numpy as np

from bapipe.errors import SpecError
from bapipe.layers import Layer
from bapipe.spec import Model

from . import layers_np as L


def forward_model(model: Model, params: dict, state: dict, inputs: dict[str, np.ndarray],
                  notes: list[str] = ()) -> np.ndarray:
    """The last layer's output for ``inputs`` (name -> array with a leading batch axis, each
    sample in the model input's per-sample shape). ``notes`` (bapipe.onnx_weights) say where
    the layers do not compute the source's function: then nothing is computed."""
    if notes:
        raise SpecError(model.name, None, "forward", f"the layers do not compute the file's function: {notes[0]}"
                        + (f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""))
    env = {k: np.asarray(v, dtype=L.F32) if model_input_float(model, k) else np.asarray(v)
           for k, v in inputs.items()}
    for layer in model.layers:
        xs = [env[n] for n in layer.inputs]
        env[layer.name] = layer_forward(layer, params.get(layer.name, {}), state.get(layer.name, {}), xs)
    return env[model.layers[-1].name]


def model_input_float(model: Model, name: str) -> bool:
    return next((i.dtype != "int" for i in model.inputs if i.name == name), True)


def layer_forward(layer: Layer, p: dict, s: dict, xs: list[np.ndarray]) -> np.ndarray:
    """One layer's inference output."""
    if layer.type in _INFER:
        return _INFER[layer.type](layer, p, s, xs)
    if layer.type in L.SUPPORTED:
        return L.forward(layer, p, xs, False, dict(s))[0]
    raise SpecError(None, None, f"layers.{layer.name}.type", f"no float forward for a '{layer.type}' layer")


def _matmul(layer, p, s, xs):
    a, b = xs[:2]
    if layer.attr["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    y = (a @ b) * L.F32(layer.attr.get("scale", 1.0))
    if layer.attr.get("causal"):   # key j > query i (+ the extra keys) is masked out
        sq, sk = y.shape[-2:]
        y = np.where(np.tril(np.ones((sq, sk), bool), sk - sq), y, L.F32(-np.inf))
    if "key_mask" in layer.attr:   # one value per key: masked columns are -inf
        m = xs[2].reshape(len(y), *([1] * (y.ndim - 2)), y.shape[-1]) != 0
        y = np.where(~m if layer.attr["key_mask"] == "zero" else m, L.F32(-np.inf), y)
    return y.astype(L.F32)


def _reshape(layer, p, s, xs):
    x = xs[0]
    n = x.shape[0]
    if "perm" in layer.attr:   # an imported Transpose: per sample, view as pre, permute, read as shape
        x = x.reshape((n,) + tuple(layer.attr["pre"])).transpose((0,) + tuple(q + 1 for q in layer.attr["perm"]))
    return np.ascontiguousarray(x).reshape((n,) + tuple(layer.out_shape))


def _slice(layer, p, s, xs):
    a = layer.attr
    idx = [slice(None)] * xs[0].ndim
    idx[a["axis"] + 1] = slice(a["start"], a["end"])
    return np.ascontiguousarray(xs[0][tuple(idx)])


def _mul(layer, p, s, xs):
    n = xs[0].shape[0]
    out = tuple(layer.out_shape)
    y = np.ones((n,) + out, L.F32)
    for x, shape in zip(xs, layer.in_shapes):   # per-sample shapes broadcast right-aligned (layers.py)
        y = y * x.reshape((n,) + (1,) * (len(out) - len(shape)) + tuple(shape))
    return y.astype(L.F32)


def _clip(layer, p, s, xs):
    a = layer.attr
    return np.clip(xs[0], a.get("min", -np.inf), a.get("max", np.inf)).astype(L.F32)


def _silu(layer, p, s, xs):
    x = xs[0]
    if layer.attr.get("hard"):   # HardSwish: x * clip(x/6 + 1/2, 0, 1)
        return (x * np.clip(x / L.F32(6) + L.F32(0.5), L.F32(0), L.F32(1))).astype(L.F32)
    return (x / (L.F32(1) + np.exp(-x))).astype(L.F32)


def _add_param(layer, p, s, xs):
    x = xs[0]
    core = p["p"]
    while core.ndim > x.ndim - 1 and core.shape[0] == 1:   # leading unit axes (the file's batch) broadcast away
        core = core[0]
    return (x + core).astype(L.F32)


def _concat_param(layer, p, s, xs):
    x = xs[0]
    rows = np.broadcast_to(p["p"], (x.shape[0],) + p["p"].shape)
    return np.concatenate([rows, x], axis=1).astype(L.F32)


def _embedding(layer, p, s, xs):
    ids = np.asarray(xs[0]).astype(np.int64)
    y = p["table"][ids]
    if "extra" in s:   # position / token-type rows the graph adds
        y = y + s["extra"][: ids.shape[1]]
    return y.astype(L.F32)


def _sigmoid(x):
    return L.F32(1) / (L.F32(1) + np.exp(-x))


def _lstm(layer, p, s, xs):
    """ONNX's LSTM (gates i, o, f, c; sigmoid and tanh), forward then reverse, outputs side by side."""
    x = xs[0]                                   # (N, S, F)
    n, steps, _ = x.shape
    h = layer.attr["hidden"]
    dirs = 2 if layer.attr["bidirectional"] else 1
    W, R, B = p["W"], p["R"], p["B"].reshape(dirs, 8 * h)
    h0 = s.get("h0", np.zeros((dirs, n, h), L.F32)).reshape(dirs, n, h)
    c0 = s.get("c0", np.zeros((dirs, n, h), L.F32)).reshape(dirs, n, h)
    ys = []
    for d in range(dirs):
        ht, ct = h0[d], c0[d]
        out = np.zeros((n, steps, h), L.F32)
        order = range(steps) if d == 0 else range(steps - 1, -1, -1)
        for t in order:
            g = x[:, t] @ W[d].T + ht @ R[d].T + B[d, :4 * h] + B[d, 4 * h:]
            i, o, f, c = (g[:, k * h:(k + 1) * h] for k in range(4))
            ct = _sigmoid(f) * ct + _sigmoid(i) * np.tanh(c)
            ht = _sigmoid(o) * np.tanh(ct)
            out[:, t] = ht
        ys.append(out)
    return np.concatenate(ys, axis=-1).astype(L.F32)


_INFER = {
    "matmul": _matmul,
    "reshape": _reshape,
    "slice": _slice,
    "mul": _mul,
    "clip": _clip,
    "silu": _silu,
    "add_param": _add_param,
    "concat_param": _concat_param,
    "embedding": _embedding,
    "lstm": _lstm,
    "dropout": lambda layer, p, s, xs: xs[0],   # the identity at inference
}
