"""Float32 forward and backward of each trainable layer type, in numpy, on a batch.

Every function works on arrays with a leading batch axis: images (N, C, H, W),
vectors (N, F), sequences (N, S, F). A layer is described by ``bapipe.layers.Layer``
(type, attributes, shapes); its weights are a dict of named arrays.

``forward(layer, params, xs, train, state) -> (y, cache)`` and
``backward(layer, params, cache, dy) -> (dxs, grads)`` are the only entry points;
``dxs`` has one gradient per input and ``grads`` one per weight. ``state`` holds
non-trained buffers (batch-norm running statistics) and is updated in place.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable

import numpy as np

from bapipe.errors import SpecError
from bapipe.layers import Layer
from bapipe.fpga_models.weights import draw
from bapipe.fpga_models.weights import norm_channels as _norm_channels

#: the layers' float type: float32, what the pipeline computes in; float64 only while
#: :func:`float_type` says so (the single-device gradient reference of host.driver)
F32 = np.float32
BN_EPS = 1e-5
BN_MOMENTUM = 0.1
LN_EPS = 1e-5


@contextmanager
def float_type(t):
    """Compute every layer in ``t`` (np.float64 for a reference) inside the ``with`` block."""
    global F32
    old, F32 = F32, t
    try:
        yield
    finally:
        F32 = old


def init_params(layer: Layer, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Initial weights of ``layer`` in this module's layout and float type: the project's one
    generator's draws (``fpga_models.weights.draw``), dense ``W`` transposed to (in, units),
    norm ``gamma``/``beta``."""
    t = layer.type
    d = draw(layer, rng)
    if t == "dense":
        return {"W": d["w"].T.astype(F32), **({"b": d["b"].astype(F32)} if "b" in d else {})}
    if t == "conv2d":
        return {"W": d["w"].astype(F32), **({"b": d["b"].astype(F32)} if "b" in d else {})}
    if t in ("batchnorm", "layernorm"):
        return {"gamma": d["gamma"].astype(F32), "beta": d["beta"].astype(F32)}
    if t in _FUNCS:
        return {}
    raise unsupported(layer)


def init_state(layer: Layer, draws: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Non-trained buffers: batch-norm running mean and variance, from the generator's
    ``draws`` of the layer (``mean``, ``var``: the statistics the hardware folds in) when
    given, else 0 and 1."""
    if layer.type == "batchnorm":
        ch = _norm_channels(layer)
        if draws is not None:
            return {"running_mean": draws["mean"].astype(F32), "running_var": draws["var"].astype(F32)}
        return {"running_mean": np.zeros(ch, F32), "running_var": np.ones(ch, F32)}
    return {}


def unsupported(layer: Layer) -> SpecError:
    """The error for a layer type the numpy host backend cannot train."""
    return SpecError(None, None, f"layers.{layer.name}.type",
                     f"the numpy host backend trains {', '.join(sorted(SUPPORTED))}; "
                     f"'{layer.type}' is not supported")


def forward(layer: Layer, params: dict, xs: list[np.ndarray], train: bool, state: dict) -> tuple[np.ndarray, object]:
    """Output of ``layer`` on the batch ``xs`` and what backward needs."""
    if layer.type not in _FUNCS:
        raise unsupported(layer)
    return _FUNCS[layer.type][0](layer, params, xs, train, state)


def backward(layer: Layer, params: dict, cache, dy: np.ndarray) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Gradients w.r.t. each input and each weight, given the output gradient ``dy``."""
    return _FUNCS[layer.type][1](layer, params, cache, dy)


# ---------------------------------------------------------------- dense


def _colsum(a: np.ndarray) -> np.ndarray:
    """Column sums accumulated in float64: numpy adds rows one by one along axis 0, and the
    float32 error of that grows with the row count (batch x pixels)."""
    return a.sum(axis=0, dtype=np.float64).astype(F32)


def _dense_f(layer, p, xs, train, state):
    x = xs[0]
    x2 = x.reshape(-1, x.shape[-1])
    y = x2 @ p["W"]
    if "b" in p:
        y = y + p["b"]
    return y.reshape(x.shape[:-1] + (p["W"].shape[1],)).astype(F32, copy=False), (x.shape, x2)


def _dense_b(layer, p, cache, dy):
    shape, x2 = cache
    d2 = dy.reshape(-1, dy.shape[-1])
    g = {"W": x2.T @ d2}
    if "b" in p:
        g["b"] = _colsum(d2)
    return [(d2 @ p["W"].T).reshape(shape)], g


# ---------------------------------------------------------------- conv2d (im2col)


def _windows(xp: np.ndarray, kh: int, kw: int, sh: int, sw: int) -> np.ndarray:
    """(N, C, Ho, Wo, kh, kw) view of every kernel window of a padded batch."""
    v = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return v[:, :, ::sh, ::sw]


def _pad(x: np.ndarray, ph: int, pw: int, value: float = 0.0, eh: int = 0, ew: int = 0) -> np.ndarray:
    """Pad H by ph (and eh more at the end) and W by pw (and ew more)."""
    if not ph and not pw and not eh and not ew:
        return x
    return np.pad(x, ((0, 0), (0, 0), (ph, ph + eh), (pw, pw + ew)), constant_values=value)


def _ceil_extra(layer, x: np.ndarray) -> tuple[int, int]:
    """Rows and columns past the padded input that ceil_mode's last, partial window reaches."""
    (kh, kw), (sh, sw), (ph, pw) = layer.attr["kernel"], layer.attr["stride"], layer.attr["padding"]
    ho, wo = layer.out_shape[1:]
    return (max(0, (ho - 1) * sh + kh - x.shape[2] - 2 * ph), max(0, (wo - 1) * sw + kw - x.shape[3] - 2 * pw))


def _conv_f(layer, p, xs, train, state):
    a = layer.attr
    (kh, kw), (sh, sw), (ph, pw), g = a["kernel"], a["stride"], a["padding"], a["groups"]
    x = xs[0]
    n, c = x.shape[:2]
    xp = _pad(x, ph, pw)
    win = _windows(xp, kh, kw, sh, sw)                       # N, C, Ho, Wo, kh, kw
    ho, wo = win.shape[2:4]
    co = p["W"].shape[0]
    cg, og = c // g, co // g
    outs, cols_all = [], []
    for gi in range(g):
        cols = win[:, gi * cg:(gi + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, cg * kh * kw)
        wmat = p["W"][gi * og:(gi + 1) * og].reshape(og, -1)
        outs.append(cols @ wmat.T)
        cols_all.append(cols)
    y = np.concatenate(outs, axis=1) if g > 1 else outs[0]
    if "b" in p:
        y = y + p["b"]
    y = y.reshape(n, ho, wo, co).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(y, dtype=F32), (x.shape, xp.shape, cols_all, ho, wo)


def _conv_b(layer, p, cache, dy):
    a = layer.attr
    (kh, kw), (sh, sw), (ph, pw), g = a["kernel"], a["stride"], a["padding"], a["groups"]
    xshape, xpshape, cols_all, ho, wo = cache
    n, c = xshape[:2]
    co = p["W"].shape[0]
    cg, og = c // g, co // g
    d2 = dy.transpose(0, 2, 3, 1).reshape(n * ho * wo, co)
    dW = np.empty_like(p["W"])
    dxp = np.zeros(xpshape, F32)
    for gi in range(g):
        dg = d2[:, gi * og:(gi + 1) * og]
        wmat = p["W"][gi * og:(gi + 1) * og].reshape(og, -1)
        dW[gi * og:(gi + 1) * og] = (dg.T @ cols_all[gi]).reshape(og, cg, kh, kw)
        dcols = (dg @ wmat).reshape(n, ho, wo, cg, kh, kw)
        for i in range(kh):      # col2im: scatter each kernel tap back to its input pixels
            for j in range(kw):
                dxp[:, gi * cg:(gi + 1) * cg, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] += \
                    dcols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    grads = {"W": dW}
    if "b" in p:
        grads["b"] = _colsum(d2)
    dx = dxp[:, :, ph:ph + xshape[2], pw:pw + xshape[3]]
    return [np.ascontiguousarray(dx)], grads


# ---------------------------------------------------------------- pooling


def _maxpool_f(layer, p, xs, train, state):
    a = layer.attr
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    x = xs[0]
    xp = _pad(x, ph, pw, -np.inf, *_ceil_extra(layer, x))   # ceil_mode: the partial window's cells never win
    win = _windows(xp, kh, kw, sh, sw)
    n, c, ho, wo = win.shape[:4]
    flat = win.reshape(n, c, ho, wo, kh * kw)
    arg = flat.argmax(axis=-1)
    y = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    return y.astype(F32), (x.shape, xp.shape, arg)


def _maxpool_b(layer, p, cache, dy):
    a = layer.attr
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    xshape, xpshape, arg = cache
    ho, wo = arg.shape[2:]
    dxp = np.zeros(xpshape, F32)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] += np.where(arg == i * kw + j, dy, 0)
    return [np.ascontiguousarray(dxp[:, :, ph:ph + xshape[2], pw:pw + xshape[3]])], {}


def _avgpool_f(layer, p, xs, train, state):
    a = layer.attr
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    x = xs[0]
    eh, ew = _ceil_extra(layer, x)
    xp = _pad(x, ph, pw, 0.0, eh, ew)  # zero padding counts in the mean (count_include_pad)
    y = _windows(xp, kh, kw, sh, sw).sum(axis=(-2, -1), dtype=F32) / _avg_count(layer, x, eh, ew)
    return y.astype(F32), (x.shape, xp.shape, y.shape[2:])


def _avg_count(layer, x, eh: int, ew: int) -> np.ndarray:
    """Cells each window divides by: the whole window, less what a ceil_mode window hangs past
    the padded input (PyTorch's count_include_pad counts the padding, not beyond it)."""
    (kh, kw), (sh, sw), (ph, pw) = layer.attr["kernel"], layer.attr["stride"], layer.attr["padding"]
    ho, wo = layer.out_shape[1:]
    rows = np.minimum(np.arange(ho) * sh + kh, x.shape[2] + 2 * ph) - np.arange(ho) * sh
    cols = np.minimum(np.arange(wo) * sw + kw, x.shape[3] + 2 * pw) - np.arange(wo) * sw
    return np.outer(rows, cols).astype(F32)


def _avgpool_b(layer, p, cache, dy):
    a = layer.attr
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    xshape, xpshape, (ho, wo) = cache
    dxp = np.zeros(xpshape, F32)
    eh, ew = xpshape[2] - xshape[2] - 2 * ph, xpshape[3] - xshape[3] - 2 * pw
    share = dy / _avg_count(layer, np.empty(xshape, F32), eh, ew)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] += share
    return [np.ascontiguousarray(dxp[:, :, ph:ph + xshape[2], pw:pw + xshape[3]])], {}


def _gap_f(layer, p, xs, train, state):
    x = xs[0]
    return x.mean(axis=(2, 3), dtype=F32), x.shape


def _gap_b(layer, p, shape, dy):
    hw = shape[2] * shape[3]
    return [np.broadcast_to((dy / F32(hw))[:, :, None, None], shape).astype(F32)], {}


# ---------------------------------------------------------------- elementwise


def _relu_f(layer, p, xs, train, state):
    x = xs[0]
    mask = x > 0
    slope = F32(layer.attr.get("negative_slope", 0.0))   # a leaky ReLU's
    return np.where(mask, x, x * slope if slope else F32(0)).astype(F32), mask


def _relu_b(layer, p, mask, dy):
    slope = F32(layer.attr.get("negative_slope", 0.0))
    return [np.where(mask, dy, dy * slope if slope else F32(0)).astype(F32)], {}


def _tanh_f(layer, p, xs, train, state):
    y = np.tanh(xs[0])
    return y, y


def _tanh_b(layer, p, y, dy):
    return [dy * (F32(1) - y * y)], {}


def _sigmoid_f(layer, p, xs, train, state):
    if "alpha" in layer.attr:   # hard sigmoid: clip(alpha x + beta, 0, 1)
        u = F32(layer.attr["alpha"]) * xs[0] + F32(layer.attr["beta"])
        return np.clip(u, F32(0), F32(1)).astype(F32), (u > 0) & (u < 1)
    y = (F32(1) / (F32(1) + np.exp(-xs[0]))).astype(F32)
    return y, y


def _sigmoid_b(layer, p, y, dy):
    if "alpha" in layer.attr:   # y holds where the hard sigmoid is not clipped
        return [np.where(y, dy * F32(layer.attr["alpha"]), F32(0)).astype(F32)], {}
    return [dy * y * (F32(1) - y)], {}


_GELU_C = F32(math.sqrt(2.0 / math.pi))
_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    """The error function elementwise (math.erf, double precision), in the input's shape."""
    return _erf(x)


def _gelu_f(layer, p, xs, train, state):
    x = xs[0]
    if layer.attr.get("approximate") == "none":   # x * Phi(x), PyTorch's nn.GELU() default
        phi = F32(0.5) * (F32(1) + _erf(x / F32(math.sqrt(2.0))))
        return (x * phi).astype(F32), (x, phi)
    u = _GELU_C * (x + F32(0.044715) * x ** 3)
    t = np.tanh(u)
    return (F32(0.5) * x * (F32(1) + t)).astype(F32), (x, t)


def _gelu_b(layer, p, cache, dy):
    if layer.attr.get("approximate") == "none":   # Phi(x) + x * phi(x)
        x, phi = cache
        pdf = np.exp(F32(-0.5) * x * x) / F32(math.sqrt(2.0 * math.pi))
        return [(dy * (phi + x * pdf)).astype(F32)], {}
    x, t = cache
    du = _GELU_C * (F32(1) + F32(3 * 0.044715) * x * x)
    d = F32(0.5) * (F32(1) + t) + F32(0.5) * x * (F32(1) - t * t) * du
    return [(dy * d).astype(F32)], {}


def _softmax_f(layer, p, xs, train, state):
    y = softmax(xs[0])
    return y, y


def _softmax_b(layer, p, y, dy):
    return [(y * (dy - (dy * y).sum(axis=-1, keepdims=True))).astype(F32)], {}


# ---------------------------------------------------------------- normalisation


def _bn_axes(x: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Reduction axes and the broadcast shape of per-channel vectors."""
    if x.ndim == 4:  # (N, C, H, W): channels on axis 1
        return (0, 2, 3), (1, -1, 1, 1)
    return tuple(range(x.ndim - 1)), (-1,)


def _bn_f(layer, p, xs, train, state):
    x = xs[0]
    axes, bshape = _bn_axes(x)
    if train:
        mean = x.mean(axis=axes, dtype=F32)
        var = x.var(axis=axes, dtype=F32)
        cnt = x.size // mean.size
        # running statistics use the unbiased variance, as PyTorch does
        state["running_mean"] = ((1 - BN_MOMENTUM) * state["running_mean"] + BN_MOMENTUM * mean).astype(F32)
        state["running_var"] = ((1 - BN_MOMENTUM) * state["running_var"]
                                + BN_MOMENTUM * var * cnt / max(cnt - 1, 1)).astype(F32)
    else:
        mean, var = state["running_mean"], state["running_var"]
    eps = F32(state.get("eps", BN_EPS))   # an imported model's own epsilon (0 for a folded batchnorm)
    inv = (F32(1) / np.sqrt(var + eps)).astype(F32)
    xhat = (x - mean.reshape(bshape)) * inv.reshape(bshape)
    y = xhat * p["gamma"].reshape(bshape) + p["beta"].reshape(bshape)
    return y.astype(F32), (xhat, inv, axes, bshape, train)


def _bn_b(layer, p, cache, dy):
    xhat, inv, axes, bshape, train = cache
    g = {"gamma": (dy * xhat).sum(axis=axes), "beta": dy.sum(axis=axes)}
    dxhat = dy * p["gamma"].reshape(bshape)
    if not train:
        return [(dxhat * inv.reshape(bshape)).astype(F32)], g
    cnt = xhat.size // inv.size
    dx = (inv.reshape(bshape) / F32(cnt)) * (F32(cnt) * dxhat - dxhat.sum(axis=axes).reshape(bshape)
                                             - xhat * (dxhat * xhat).sum(axis=axes).reshape(bshape))
    return [dx.astype(F32)], g


def _ln_f(layer, p, xs, train, state):
    x = xs[0]
    mean = x.mean(axis=-1, keepdims=True, dtype=F32)
    var = x.var(axis=-1, keepdims=True, dtype=F32)
    inv = F32(1) / np.sqrt(var + F32(state.get("eps", LN_EPS)))
    xhat = (x - mean) * inv
    return (xhat * p["gamma"] + p["beta"]).astype(F32), (xhat, inv)


def _ln_b(layer, p, cache, dy):
    xhat, inv = cache
    red = tuple(range(dy.ndim - 1))
    g = {"gamma": (dy * xhat).sum(axis=red), "beta": dy.sum(axis=red)}
    dxhat = dy * p["gamma"]
    n = F32(xhat.shape[-1])
    dx = inv / n * (n * dxhat - dxhat.sum(-1, keepdims=True) - xhat * (dxhat * xhat).sum(-1, keepdims=True))
    return [dx.astype(F32)], g


# ---------------------------------------------------------------- structure


def _flatten_f(layer, p, xs, train, state):
    x = xs[0]
    return x.reshape(x.shape[0], -1), x.shape


def _flatten_b(layer, p, shape, dy):
    return [dy.reshape(shape)], {}


def _add_f(layer, p, xs, train, state):
    y = xs[0]
    for x in xs[1:]:
        y = y + x
    return y, len(xs)


def _add_b(layer, p, k, dy):
    return [dy] * k, {}


def _concat_f(layer, p, xs, train, state):
    ax = layer.attr["axis"] + 1  # attributes count axes per sample, without the batch
    return np.concatenate(xs, axis=ax), (ax, [x.shape[ax] for x in xs])


def _concat_b(layer, p, cache, dy):
    ax, sizes = cache
    return [np.ascontiguousarray(d) for d in np.split(dy, np.cumsum(sizes)[:-1], axis=ax)], {}


def _take_f(layer, p, xs, train, state):
    x = xs[0]
    return np.ascontiguousarray(x[:, layer.attr["index"]]), x.shape


def _take_b(layer, p, shape, dy):
    dx = np.zeros(shape, F32)
    dx[:, layer.attr["index"]] = dy
    return [dx], {}


_FUNCS: dict[str, tuple[Callable, Callable]] = {
    "dense": (_dense_f, _dense_b),
    "conv2d": (_conv_f, _conv_b),
    "maxpool": (_maxpool_f, _maxpool_b),
    "avgpool": (_avgpool_f, _avgpool_b),
    "globalavgpool": (_gap_f, _gap_b),
    "relu": (_relu_f, _relu_b),
    "tanh": (_tanh_f, _tanh_b),
    "sigmoid": (_sigmoid_f, _sigmoid_b),
    "gelu": (_gelu_f, _gelu_b),
    "softmax": (_softmax_f, _softmax_b),
    "batchnorm": (_bn_f, _bn_b),
    "layernorm": (_ln_f, _ln_b),
    "flatten": (_flatten_f, _flatten_b),
    "add": (_add_f, _add_b),
    "concat": (_concat_f, _concat_b),
    "take": (_take_f, _take_b),
}

#: layer types the numpy backend can train
SUPPORTED = frozenset(_FUNCS)


# ---------------------------------------------------------------- loss


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax along the last axis (shifted by the max for stability)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray, scale: float) -> tuple[float, np.ndarray]:
    """Summed cross-entropy times ``scale`` and its gradient w.r.t. the logits.

    The driver passes ``scale = 1 / global_batch`` so the micro-batch gradients add up to
    the gradient of the mean loss over the whole batch.

    Integer logits are raw fixed-point values (fixed-point training, docs/training.md): the
    gradient is then the raw per-sample ``p - onehot`` of fpga_models.train_fixed (the
    1 / batch lives in the learning-rate constant), the loss is still scaled.
    """
    if np.issubdtype(np.asarray(logits).dtype, np.integer):
        from bapipe.fpga_models import train_fixed as T

        from .fixed import int_formats

        tf = int_formats()
        z = np.asarray(logits, np.int64).reshape(len(labels), -1)
        return (T.softmax_xent_loss(z, labels, tf) * scale,
                T.softmax_xent_grad(z, labels, tf).reshape(np.shape(logits)))
    z = logits.reshape(len(labels), -1).astype(F32)
    shifted = z - z.max(axis=1, keepdims=True)
    logsum = np.log(np.exp(shifted).sum(axis=1))
    nll = logsum - shifted[np.arange(len(labels)), labels]
    prob = softmax(z)
    prob[np.arange(len(labels)), labels] -= F32(1)
    return float(nll.sum(dtype=np.float64) * scale), (prob * F32(scale)).reshape(logits.shape).astype(F32)
