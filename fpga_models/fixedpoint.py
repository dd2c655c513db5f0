"""The numpy fixed-point reference: the layers exactly as the HLS kernels compute them.

The convention (docs/codegen.md, "Fixed-point convention") in one paragraph: a value is its
raw two's-complement integer ``q`` with ``F`` fraction bits; MAC layers accumulate exactly
(int64 here, a 2W+16-bit ``acc_t`` in HLS and RTL), add the bias shifted to the
accumulator's scale, and round once with :func:`requant` (round half toward +infinity,
saturate). Because the accumulation is exact, the order of summation (the folding) cannot
change a result: HLS, RTL and numpy agree bit for bit.

All arrays are int64 numpy arrays of raw values. Images are (N, C, H, W) here (the model's
layout); the stream order on the wire (HWC) is the generator's business.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bapipe.numformats import NUMBER_FORMATS


@dataclass(frozen=True)
class Fmt:
    """A signed fixed-point format: ``width`` bits, ``frac`` fraction bits (ap_fixed<width, width-frac>)."""

    name: str
    width: int
    frac: int

    @property
    def int_bits(self) -> int:
        """Integer bits including the sign (ap_fixed's I)."""
        return self.width - self.frac

    @property
    def qmin(self) -> int:
        """Smallest raw value."""
        return -(1 << (self.width - 1))

    @property
    def qmax(self) -> int:
        """Largest raw value."""
        return (1 << (self.width - 1)) - 1

    @property
    def acc_width(self) -> int:
        """Accumulator width: exact for fewer than 2^16 products."""
        return 2 * self.width + 16

    @property
    def acc_frac(self) -> int:
        """Accumulator fraction bits (those of a product)."""
        return 2 * self.frac

    @property
    def hls_type(self) -> str:
        """The Vitis HLS data type."""
        return f"ap_fixed<{self.width},{self.int_bits},AP_RND,AP_SAT>"

    @property
    def hls_acc_type(self) -> str:
        """The Vitis HLS accumulator type (default truncation/wrap never trigger: it is exact)."""
        return f"ap_fixed<{self.acc_width},{self.acc_width - self.acc_frac}>"


#: plan number_format -> format. fixed16 follows hls4ml's default ap_fixed<16,6>.
FORMATS: dict[str, Fmt] = {n: Fmt(n, f.width, f.frac) for n, f in NUMBER_FORMATS.items() if f.fixed}

#: avgpool reciprocal fraction bits: R = round(2^AVG_BITS / n), an ap_ufixed<AVG_BITS+1, 1>
AVG_BITS = 18


def get_fmt(fmt: str | Fmt) -> Fmt:
    """A format by plan name (``fixed16``, ``int8``) or passed through; ValueError otherwise."""
    if isinstance(fmt, Fmt):
        return fmt
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"no fixed-point convention for number format {fmt!r}; "
                         f"expected one of {', '.join(FORMATS)}") from None


def saturate(q, fmt: str | Fmt) -> np.ndarray:
    """Clamp raw values to the format's range (AP_SAT)."""
    f = get_fmt(fmt)
    return np.clip(np.asarray(q, dtype=np.int64), f.qmin, f.qmax)


def quantize(x, fmt: str | Fmt) -> np.ndarray:
    """Real values -> raw ints: round half toward +infinity (AP_RND), then saturate."""
    f = get_fmt(fmt)
    scaled = np.floor(np.asarray(x, dtype=np.float64) * (1 << f.frac) + 0.5)
    return saturate(np.clip(scaled, f.qmin, f.qmax).astype(np.int64), f)


def dequantize(q, fmt: str | Fmt) -> np.ndarray:
    """Raw ints -> real values (float64, exact)."""
    f = get_fmt(fmt)
    return np.asarray(q, dtype=np.float64) / (1 << f.frac)


def requant(acc, fmt: str | Fmt) -> np.ndarray:
    """Accumulator (2F fraction bits) -> data format: (acc + 2^(F-1)) >> F, then saturate."""
    f = get_fmt(fmt)
    acc = np.asarray(acc, dtype=np.int64)
    return saturate((acc + (1 << (f.frac - 1))) >> f.frac, f)


def _bias_acc(b_q, fmt: Fmt) -> np.ndarray:
    return np.asarray(b_q, dtype=np.int64) << fmt.frac


# ---------------------------------------------------------------- dense

def imatmul(a, b) -> np.ndarray:
    """Exact integer ``a @ b`` as int64.

    numpy's int64 matmul has no BLAS (~1 GMAC/s); float64 BLAS is exact whenever every partial
    sum is an integer below 2^53, which max|a| * max|b| * K < 2^53 guarantees (raw 16-bit
    values: K up to 2^23). Otherwise the int64 product is used.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    k = a.shape[-1]
    if a.size == 0 or b.size == 0:
        return np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64)
    bound = float(np.max(np.abs(a))) * float(np.max(np.abs(b))) * k
    if bound < 2.0 ** 53:
        return np.rint(np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)).astype(np.int64)
    return np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64)


def dense_fwd(x_q, w_q, b_q, fmt: str | Fmt) -> np.ndarray:
    """y = requant(W x + b<<F). x: (..., MW), w: (MH, MW), b: (MH,) or None -> (..., MH)."""
    f = get_fmt(fmt)
    acc = imatmul(x_q, np.asarray(w_q).T)
    if b_q is not None:
        acc = acc + _bias_acc(b_q, f)
    return requant(acc, f)


def dense_bwd_input(dy_q, w_q, fmt: str | Fmt) -> np.ndarray:
    """dx = requant(W^T dy). dy: (..., MH), w: (MH, MW) -> (..., MW)."""
    return requant(imatmul(dy_q, w_q), fmt)


def dense_bwd_weight(dy_q, x_q, fmt: str | Fmt) -> tuple[np.ndarray, np.ndarray]:
    """(dW, db) summed over the batch: dW = requant(sum_n dy_n x_n^T), db = sat(sum_n dy_n)."""
    dy = np.asarray(dy_q, dtype=np.int64).reshape(-1, np.shape(dy_q)[-1])
    x = np.asarray(x_q, dtype=np.int64).reshape(-1, np.shape(x_q)[-1])
    return requant(imatmul(dy.T, x), fmt), saturate(dy.sum(axis=0), fmt)


# ---------------------------------------------------------------- conv2d (sliding window + MVU)

def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if np.isscalar(v) else (int(v[0]), int(v[1]))


def conv_out_hw(h: int, w: int, kernel, stride, padding) -> tuple[int, int]:
    """Output height and width of a sliding window."""
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


def conv_weight_matrix(w_q) -> np.ndarray:
    """OIHW weights -> the MVU matrix (MH=O, MW=kh*kw*C) with column (ky*kw+kx)*C + c."""
    w = np.asarray(w_q, dtype=np.int64)
    o, c, kh, kw = w.shape
    return w.transpose(0, 2, 3, 1).reshape(o, kh * kw * c)


def im2col(x_q, kernel, stride, padding, pad_value: int = 0) -> np.ndarray:
    """Sliding window: (N, C, H, W) -> (N, Ho*Wo, kh*kw*C), column (ky*kw+kx)*C + c."""
    x = np.asarray(x_q, dtype=np.int64)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    ho, wo = conv_out_hw(h, w, kernel, stride, padding)
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), pad_value, dtype=np.int64)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    cols = np.empty((n, ho, wo, kh, kw, c), dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + sh * (ho - 1) + 1:sh, kx:kx + sw * (wo - 1) + 1:sw]  # (N, C, Ho, Wo)
            cols[:, :, :, ky, kx, :] = patch.transpose(0, 2, 3, 1)
    return cols.reshape(n, ho * wo, kh * kw * c)


def conv2d_fwd(x_q, w_q, b_q, fmt: str | Fmt, stride=1, padding=0) -> np.ndarray:
    """Convolution as sliding window + MVU: x (N, C, H, W), w (O, C, kh, kw) -> (N, O, Ho, Wo)."""
    w = np.asarray(w_q)
    n, _, h, wd = np.shape(x_q)
    kernel = w.shape[2:]
    ho, wo = conv_out_hw(h, wd, kernel, stride, padding)
    y = dense_fwd(im2col(x_q, kernel, stride, padding), conv_weight_matrix(w), b_q, fmt)  # (N, P, O)
    return y.transpose(0, 2, 1).reshape(n, w.shape[0], ho, wo)


def conv2d_bwd_input(dy_q, w_q, in_hw: tuple[int, int], fmt: str | Fmt, stride=1, padding=0) -> np.ndarray:
    """dx: the exact col2im of W^T dy, rounded once. dy (N, O, Ho, Wo) -> (N, C, H, W)."""
    w = np.asarray(w_q, dtype=np.int64)
    o, c, kh, kw = w.shape
    dy = np.asarray(dy_q, dtype=np.int64)
    n, _, ho, wo = dy.shape
    h, wd = in_hw
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    dcol = imatmul(dy.reshape(n, o, ho * wo).transpose(0, 2, 1), conv_weight_matrix(w))   # (N, P, kh*kw*C) exact
    dcol = dcol.reshape(n, ho, wo, kh, kw, c)
    acc = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc[:, :, ky:ky + sh * (ho - 1) + 1:sh, kx:kx + sw * (wo - 1) + 1:sw] += \
                dcol[:, :, :, ky, kx, :].transpose(0, 3, 1, 2)
    return requant(acc[:, :, ph:ph + h, pw:pw + wd], fmt)


def conv2d_bwd_weight(dy_q, x_q, kernel, fmt: str | Fmt, stride=1, padding=0) -> tuple[np.ndarray, np.ndarray]:
    """(dW (O, C, kh, kw), db (O,)) summed over batch and pixels, rounded once."""
    dy = np.asarray(dy_q, dtype=np.int64)
    n, o, ho, wo = dy.shape
    c = np.shape(x_q)[1]
    kh, kw = _pair(kernel)
    cols = im2col(x_q, kernel, stride, padding).reshape(n * ho * wo, -1)   # (NP, kh*kw*C)
    d = dy.transpose(0, 2, 3, 1).reshape(n * ho * wo, o)
    dwm = requant(imatmul(d.T, cols), fmt)                                 # (O, kh*kw*C)
    return dwm.reshape(o, kh, kw, c).transpose(0, 3, 1, 2), saturate(d.sum(axis=0), fmt)


# ---------------------------------------------------------------- elementwise, pooling, adds

def relu_fwd(x_q) -> np.ndarray:
    """max(q, 0): exact."""
    return np.maximum(np.asarray(x_q, dtype=np.int64), 0)


def relu_bwd(dy_q, x_q) -> np.ndarray:
    """dy where the forward input was positive, else 0."""
    return np.where(np.asarray(x_q) > 0, np.asarray(dy_q, dtype=np.int64), 0)


def _windows(x_q, kernel, stride, padding, pad_value) -> np.ndarray:
    """(N, C, H, W) -> (N, C, Ho, Wo, kh*kw)."""
    n, c, h, w = np.shape(x_q)
    ho, wo = conv_out_hw(h, w, kernel, stride, padding)
    kk = _pair(kernel)[0] * _pair(kernel)[1]
    cols = im2col(x_q, kernel, stride, padding, pad_value).reshape(n, ho, wo, kk, c)
    return cols.transpose(0, 4, 1, 2, 3)


def maxpool_fwd(x_q, kernel, stride=None, padding=0) -> np.ndarray:
    """Max over each window; padded positions never win (they hold the most negative int)."""
    stride = kernel if stride is None else stride
    return _windows(x_q, kernel, stride, padding, np.iinfo(np.int64).min).max(axis=-1)


def avg_recip(n: int) -> int:
    """R = round(2^AVG_BITS / n): the avgpool reciprocal as an integer (ap_ufixed<AVG_BITS+1,1>)."""
    return ((1 << (AVG_BITS + 1)) + n) // (2 * n)   # floor(2^B/n + 1/2), integers only


def avg_of_sums(s, n: int, fmt: str | Fmt) -> np.ndarray:
    """Window sums (scale F) -> mean: floor((s*R + 2^(B-1)) / 2^B), saturated."""
    s = np.asarray(s, dtype=np.int64)
    return saturate((s * avg_recip(n) + (1 << (AVG_BITS - 1))) >> AVG_BITS, fmt)


def avgpool_fwd(x_q, kernel, fmt: str | Fmt, stride=None, padding=0) -> np.ndarray:
    """Mean over each window, padded zeros counted (PyTorch's count_include_pad)."""
    stride = kernel if stride is None else stride
    kh, kw = _pair(kernel)
    return avg_of_sums(_windows(x_q, kernel, stride, padding, 0).sum(axis=-1), kh * kw, fmt)


def globalavgpool_fwd(x_q, fmt: str | Fmt) -> np.ndarray:
    """(N, C, H, W) -> (N, C): the mean of each channel."""
    x = np.asarray(x_q, dtype=np.int64)
    return avg_of_sums(x.sum(axis=(2, 3)), x.shape[2] * x.shape[3], fmt)


def batchnorm_fwd(x_q, scale_q, shift_q, fmt: str | Fmt) -> np.ndarray:
    """Folded batchnorm: requant(x*scale + shift<<F) per channel.

    The channel is axis 1 of images (N, C, H, W) and the last axis otherwise (as in layers.py).
    """
    f = get_fmt(fmt)
    x = np.asarray(x_q, dtype=np.int64)
    shape = (1, -1, 1, 1) if x.ndim == 4 else (1,) * (x.ndim - 1) + (-1,)
    acc = x * np.asarray(scale_q, dtype=np.int64).reshape(shape) + _bias_acc(shift_q, f).reshape(shape)
    return requant(acc, f)


def fold_batchnorm(gamma, beta, mean, var, fmt: str | Fmt, eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Inference batchnorm -> quantized (scale, shift): scale = gamma/sqrt(var+eps), shift = beta - mean*scale."""
    scale = np.asarray(gamma, dtype=np.float64) / np.sqrt(np.asarray(var, dtype=np.float64) + eps)
    shift = np.asarray(beta, dtype=np.float64) - np.asarray(mean, dtype=np.float64) * scale
    return quantize(scale, fmt), quantize(shift, fmt)


def add_fwd(a_q, b_q, fmt: str | Fmt) -> np.ndarray:
    """Residual add: exact sum, saturated."""
    return saturate(np.asarray(a_q, dtype=np.int64) + np.asarray(b_q, dtype=np.int64), fmt)


# ---------------------------------------------------------------- imported CNN layers (issue #20)
# SqueezeNet's concat, MobileNet's depthwise conv and ReLU6, EfficientNet's SiLU and
# squeeze-excite product: each exactly as the HLS library computes it (bapipe_layers.h).

def grouped_conv2d_fwd(x_q, w_q, b_q, fmt: str | Fmt, groups: int, stride=1, padding=0) -> np.ndarray:
    """Grouped convolution (depthwise when groups = C): w (O, C/G, kh, kw); output channels
    [g*O/G, (g+1)*O/G) read input channels [g*C/G, (g+1)*C/G). Each output is one exact sum
    rounded once, so the groups are independent :func:`conv2d_fwd` calls."""
    x = np.asarray(x_q, dtype=np.int64)
    w = np.asarray(w_q, dtype=np.int64)
    c, o = x.shape[1], w.shape[0]
    cg, og = c // groups, o // groups
    b = None if b_q is None else np.asarray(b_q, dtype=np.int64)
    return np.concatenate([conv2d_fwd(x[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og],
                                      None if b is None else b[g * og:(g + 1) * og], fmt, stride, padding)
                           for g in range(groups)], axis=1)


#: piecewise-linear sigmoid (PLAN: H. Amin, K. M. Curtis, B. R. Hayes-Gill, "Piecewise linear
#: approximation applied to nonlinear function of a neural network", IEE Proc. Circuits, Devices
#: and Systems 144(6), 1997, Table 1; max error 0.0189): for |x| in [lo, hi), y = |x| / 2^shift + c;
#: y = 1 from 5 on; sigmoid(-x) = 1 - sigmoid(x). Slopes are shifts, so the engine needs no multiplier.
PLAN_SEGMENTS = ((0.0, 1.0, 2, 0.5), (1.0, 2.375, 3, 0.625), (2.375, 5.0, 5, 0.84375))


def sigmoid_consts(fmt: str | Fmt) -> tuple[int, int, int, int, int, int, int]:
    """(T1, T2, T3, C1, C2, C3, ONE): the raw segment bounds 1, 2.375, 5 and offsets 0.5, 0.625,
    0.84375 in the format (rounded half up), and the raw 1.0; the HLS template's parameters."""
    f = get_fmt(fmt)
    q = lambda v: int(quantize(v, f))   # noqa: E731
    (_, t1, _, c1), (_, t2, _, c2), (_, t3, _, c3) = PLAN_SEGMENTS
    return q(t1), q(t2), q(t3), q(c1), q(c2), q(c3), 1 << f.frac


def sigmoid_fwd(x_q, fmt: str | Fmt) -> np.ndarray:
    """PLAN sigmoid on raw values: |x| >> shift rounded half up, plus the segment's offset,
    at most 1; negative inputs give 1 - y. Exact integer steps (the HLS engine's)."""
    t1, t2, t3, c1, c2, c3, one = sigmoid_consts(fmt)
    q = np.asarray(x_q, dtype=np.int64)
    a = np.abs(q)
    y = np.where(a >= t3, one, np.where(a >= t2, ((a + 16) >> 5) + c3,
                                         np.where(a >= t1, ((a + 4) >> 3) + c2, ((a + 2) >> 2) + c1)))
    y = np.minimum(y, one)
    return saturate(np.where(q < 0, one - y, y), fmt)


def silu_fwd(x_q, fmt: str | Fmt) -> np.ndarray:
    """SiLU x * sigmoid(x): the exact product of x and the PLAN sigmoid, rounded once."""
    x = np.asarray(x_q, dtype=np.int64)
    return requant(x * sigmoid_fwd(x, fmt), fmt)


def clip_bounds(fmt: str | Fmt, lo: float | None = None, hi: float | None = None) -> tuple[int, int]:
    """Raw (LO, HI) of a clip: the bounds quantized (half up), an open bound the format's end."""
    f = get_fmt(fmt)
    return (f.qmin if lo is None else int(quantize(lo, f)), f.qmax if hi is None else int(quantize(hi, f)))


def clip_fwd(x_q, fmt: str | Fmt, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Clamp to [lo, hi] (ReLU6: 0, 6): exact."""
    a, b = clip_bounds(fmt, lo, hi)
    return np.clip(np.asarray(x_q, dtype=np.int64), a, b)


def mul_fwd(a_q, b_q, fmt: str | Fmt) -> np.ndarray:
    """Product of two activations, broadcast (numpy rules on the batched arrays), rounded once."""
    return requant(np.asarray(a_q, dtype=np.int64) * np.asarray(b_q, dtype=np.int64), fmt)


def _per_sample(x, shape: tuple, rank: int) -> np.ndarray:
    """A batch (N, *shape) viewed as (N, 1.., *shape) of ``rank`` per-sample axes (layers.py's
    broadcasting: leading unit axes)."""
    x = np.asarray(x, dtype=np.int64)
    return x.reshape((len(x),) + (1,) * (rank - len(shape)) + tuple(shape))


# ---------------------------------------------------------------- whole layers

#: layer types the fixed-point reference (and the HLS generator) implement
SUPPORTED = ("dense", "conv2d", "relu", "maxpool", "avgpool", "globalavgpool", "batchnorm", "add", "flatten",
             "concat", "mul", "sigmoid", "silu", "clip", "reshape")


def layer_fwd(layer, inputs: list[np.ndarray], params: dict[str, np.ndarray], fmt: str | Fmt) -> np.ndarray:
    """Forward of one bapipe ``Layer`` on a batch: inputs are (N, *in_shape) raw arrays.

    ``params``: dense/conv2d ``w`` (dense (MH, MW), conv (O, C, kh, kw)) and ``b`` (or none);
    batchnorm ``scale`` and ``shift``.
    """
    a = layer.attr
    t = layer.type
    x = inputs[0]
    if t == "dense":
        return dense_fwd(x, params["w"], params.get("b"), fmt)
    if t == "conv2d":
        if a.get("groups", 1) != 1:
            return grouped_conv2d_fwd(x, params["w"], params.get("b"), fmt, a["groups"], a["stride"], a["padding"])
        return conv2d_fwd(x, params["w"], params.get("b"), fmt, a["stride"], a["padding"])
    if t == "sigmoid":
        return sigmoid_fwd(x, fmt)
    if t == "silu":
        return silu_fwd(x, fmt)
    if t == "clip":
        return clip_fwd(x, fmt, a.get("min"), a.get("max"))
    if t == "mul":
        r = len(layer.out_shape)
        out = _per_sample(inputs[0], layer.in_shapes[0], r)
        for other, s in zip(inputs[1:], layer.in_shapes[1:]):
            out = mul_fwd(out, _per_sample(other, s, r), fmt)
        return out
    if t == "concat":
        return np.concatenate([np.asarray(v, dtype=np.int64) for v in inputs], axis=a["axis"] + 1)
    if t == "reshape":
        return np.asarray(x, dtype=np.int64).reshape((len(x),) + tuple(layer.out_shape))
    if t == "relu":
        return relu_fwd(x)
    if t == "maxpool":
        return maxpool_fwd(x, a["kernel"], a["stride"], a["padding"])
    if t == "avgpool":
        return avgpool_fwd(x, a["kernel"], fmt, a["stride"], a["padding"])
    if t == "globalavgpool":
        return globalavgpool_fwd(x, fmt)
    if t == "batchnorm":
        return batchnorm_fwd(x, params["scale"], params["shift"], fmt)
    if t == "add":
        out = inputs[0]
        for other in inputs[1:]:
            out = add_fwd(out, other, fmt)
        return out
    if t == "flatten":
        return np.asarray(x, dtype=np.int64).reshape(len(x), -1)
    raise ValueError(f"layer '{layer.name}': type '{t}' has no fixed-point implementation "
                     f"(supported: {', '.join(SUPPORTED)})")


def model_fwd(layers, tensors: dict[str, np.ndarray], params: dict[str, dict], fmt: str | Fmt) -> dict[str, np.ndarray]:
    """Run ``layers`` in order; ``tensors`` maps names to batches (model inputs, or a stage's inputs).

    Returns the dict extended with every layer's output.
    """
    out = dict(tensors)
    for l in layers:
        out[l.name] = layer_fwd(l, [out[i] for i in l.inputs], params.get(l.name, {}), fmt)
    return out


# ---------------------------------------------------------------- backward of the other layers

def maxpool_bwd(x_q, dy_q, kernel, stride=None, padding=0, fmt: str | Fmt = "fixed16") -> np.ndarray:
    """dy goes to the first maximum of each window (scan order ky, kx; padding never wins);
    overlapping windows add up exactly, then saturate."""
    stride = kernel if stride is None else stride
    x = np.asarray(x_q, dtype=np.int64)
    dy = np.asarray(dy_q, dtype=np.int64)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    win = _windows(x, kernel, stride, padding, np.iinfo(np.int64).min)     # (N, C, Ho, Wo, kh*kw)
    arg = win.argmax(axis=-1)                                              # first maximum
    ho, wo = dy.shape[2:]
    acc = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=np.int64)
    oy, ox = np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij")
    iy = oy[None, None] * sh + arg // kw
    ix = ox[None, None] * sw + arg % kw
    nn, cc = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
    np.add.at(acc, (nn[:, :, None, None].repeat(ho, 2).repeat(wo, 3), cc[:, :, None, None].repeat(ho, 2).repeat(wo, 3),
                    iy, ix), dy)
    return saturate(acc[:, :, ph:ph + h, pw:pw + w], fmt)


def avgpool_bwd(dy_q, in_hw: tuple[int, int], kernel, fmt: str | Fmt, stride=None, padding=0) -> np.ndarray:
    """dx[pos] = round(R/2^B * sum of dy over the windows holding pos): exact sum, one rounding."""
    stride = kernel if stride is None else stride
    dy = np.asarray(dy_q, dtype=np.int64)
    n, c, ho, wo = dy.shape
    h, w = in_hw
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    acc = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc[:, :, ky:ky + sh * (ho - 1) + 1:sh, kx:kx + sw * (wo - 1) + 1:sw] += dy
    return avg_of_sums(acc[:, :, ph:ph + h, pw:pw + w], kh * kw, fmt)


def globalavgpool_bwd(dy_q, in_hw: tuple[int, int], fmt: str | Fmt) -> np.ndarray:
    """(N, C) -> (N, C, H, W): every position gets round(dy * R / 2^B)."""
    h, w = in_hw
    d = avg_of_sums(np.asarray(dy_q, dtype=np.int64), h * w, fmt)
    return np.broadcast_to(d[:, :, None, None], d.shape + (h, w)).copy()


def batchnorm_bwd(dy_q, scale_q, fmt: str | Fmt) -> np.ndarray:
    """Frozen (folded) batchnorm: dx = requant(dy * scale)."""
    dy = np.asarray(dy_q, dtype=np.int64)
    shape = (1, -1, 1, 1) if dy.ndim == 4 else (1,) * (dy.ndim - 1) + (-1,)
    return requant(dy * np.asarray(scale_q, dtype=np.int64).reshape(shape), fmt)


def layer_bwd(layer, inputs: list[np.ndarray], dy: np.ndarray, params: dict, fmt: str | Fmt):
    """Backward of one layer on a batch: (input grads in input order, weight grads dict)."""
    a, t = layer.attr, layer.type
    x = inputs[0]
    if t == "dense":
        dw, db = dense_bwd_weight(dy, x, fmt)
        return [dense_bwd_input(dy, params["w"], fmt)], {"dw": dw, "db": db}
    if t == "conv2d":
        dw, db = conv2d_bwd_weight(dy, x, a["kernel"], fmt, a["stride"], a["padding"])
        return ([conv2d_bwd_input(dy, params["w"], x.shape[2:], fmt, a["stride"], a["padding"])],
                {"dw": dw, "db": db})
    if t == "relu":
        return [relu_bwd(dy, x)], {}
    if t == "maxpool":
        return [maxpool_bwd(x, dy, a["kernel"], a["stride"], a["padding"], fmt)], {}
    if t == "avgpool":
        return [avgpool_bwd(dy, x.shape[2:], a["kernel"], fmt, a["stride"], a["padding"])], {}
    if t == "globalavgpool":
        return [globalavgpool_bwd(dy, x.shape[2:], fmt)], {}
    if t == "batchnorm":
        return [batchnorm_bwd(dy, params["scale"], fmt)], {}
    if t == "add":
        return [np.asarray(dy, dtype=np.int64)] * len(inputs), {}
    if t == "flatten":
        return [np.asarray(dy, dtype=np.int64).reshape(x.shape)], {}
    raise ValueError(f"layer '{layer.name}': type '{t}' has no fixed-point backward")


def stage_bwd(layers, inputs: dict[str, np.ndarray], out_grads: dict[str, np.ndarray], params: dict,
              fmt: str | Fmt) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Backward of a run of layers over one micro-batch, the way the HLS backward kernel does it.

    Recomputes the forward from ``inputs``; gradients start from ``out_grads`` (per output
    tensor) and flow in reverse layer order; a tensor read by several layers sums its
    gradients with a saturating add, in that reverse order. Returns (grads of every
    tensor reached, including the stage inputs; weight grads per layer).
    """
    acts = model_fwd(layers, inputs, params, fmt)
    return walk_bwd(layers, acts, out_grads,
                    lambda l, xs, dy: layer_bwd(l, xs, dy, params.get(l.name, {}), fmt),
                    lambda a, b: add_fwd(a, b, fmt))


def walk_bwd(layers, acts: dict, out_grads: dict, bwd, add) -> tuple[dict, dict]:
    """The reverse walk every fixed-point backward shares (inference-format stage_bwd here,
    training formats in fpga_models.train_fixed): layers in reverse order, each reached layer's
    ``bwd(layer, inputs, dy) -> (dxs, wgrads)``; a tensor read by several layers sums its
    gradients with ``add`` in that reverse order. Returns (gradients of every tensor reached,
    weight gradients per layer)."""
    g = {t: np.asarray(d, dtype=np.int64) for t, d in out_grads.items()}
    wgrads = {}
    for l in reversed(list(layers)):
        if l.name not in g:
            continue
        dxs, wg = bwd(l, [acts[i] for i in l.inputs], g[l.name])
        if wg:
            wgrads[l.name] = wg
        for src, dx in zip(l.inputs, dxs):
            g[src] = add(g[src], dx) if src in g else dx
    return g, wgrads
