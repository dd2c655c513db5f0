"""Fixed-point training arithmetic: the one home of how BaPipe hardware trains (docs/training.md).

Everything here is a pure numpy integer function on raw two's-complement values (int64
arrays), built on :mod:`fpga_models.fixedpoint` (its forward layers, ``im2col``,
``imatmul`` and the avgpool reciprocal). The RTL/HLS training engines and the host's
numpy fixed16 backend compute exactly this, bit for bit.

Formats (``TrainFormats``; fixed16 plans, fraction bits in brackets):

* activations ``A``: 16 bits [10] (the inference format, ap_fixed<16,6>); the forward pass
  is :func:`fpga_models.fixedpoint.layer_fwd` unchanged.
* forward weights: 16 bits [10], rounded from the master weights before every forward.
* master weights ``W``: 32 bits [24] (ap_fixed<32,8>), what the update writes.
* activation gradients ``G``: 16 bits [12] (ap_fixed<16,4>, range [-8, 8)).
* weight gradients: exact integer sums with ``A.frac + G.frac`` = 22 fraction bits, in an
  accumulator of :func:`acc_width` bits for the layer's reduction (never wraps); summed
  over micro-batches and replicas by exact integer addition, so the order cannot change it.
* velocity ``V``: 48 bits [22] (the gradient scale), saturating.

Rounding everywhere: round half toward +infinity, ``(x + 2^(s-1)) >> s`` (AP_RND), then
saturate to the destination width (AP_SAT). Each gradient is rounded once, after an exact
accumulation.

The loss is softmax cross-entropy summed over the batch: the per-sample logit gradient is
``p - onehot`` (format G, computed by :func:`softmax_xent_grad` with an exp2 table and one
reciprocal per sample); the 1/batch of the mean loss is folded into the learning rate
constant of :func:`sgd_constants`. SGD with momentum (PyTorch's form, v = mu v + g;
w -= lr v) is :func:`sgd_update`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import fixedpoint as fx


@dataclass(frozen=True)
class TrainFormats:
    """The formats of one training run (see the module docstring)."""

    act: fx.Fmt          # activations and forward weights
    grad: fx.Fmt         # activation gradients
    master: fx.Fmt       # master weights
    vel: fx.Fmt          # momentum velocity

    @property
    def wgrad_frac(self) -> int:
        """Fraction bits of weight-gradient accumulators: those of an activation x gradient product."""
        return self.act.frac + self.grad.frac


TRAIN_FORMATS: dict[str, TrainFormats] = {
    "fixed16": TrainFormats(act=fx.FORMATS["fixed16"], grad=fx.Fmt("grad16", 16, 12),
                            master=fx.Fmt("master32", 32, 24), vel=fx.Fmt("vel48", 48, 22)),
}

#: exp2 table of the softmax: EXP2_LUT[j] = round(2^(j / 2^EXP_FRAC) * 2^EXP_OUT), j < 2^EXP_FRAC
EXP_FRAC = 10
EXP_OUT = 15
EXP2_LUT = np.array([math.floor(2.0 ** (j / (1 << EXP_FRAC)) * (1 << EXP_OUT) + 0.5)
                     for j in range(1 << EXP_FRAC)], dtype=np.int64)
#: log2(e) as an unsigned fixed-point constant with LOG2E_FRAC fraction bits
LOG2E_FRAC = 16
LOG2E_Q = math.floor(math.log2(math.e) * (1 << LOG2E_FRAC) + 0.5)
#: the softmax reciprocal: R = round(2^RECIP_BITS / S); p = (e R + 2^(RECIP_SHIFT-1)) >> RECIP_SHIFT
RECIP_BITS = 43
#: momentum constant fraction bits: MU = round(mu 2^MU_FRAC)
MU_FRAC = 16
#: the learning-rate constant is scaled into [2^(LR_BITS-1), 2^LR_BITS)
LR_BITS = 16


def get_formats(number_format: str) -> TrainFormats:
    """The training formats of a plan number format; ValueError names the supported ones."""
    try:
        return TRAIN_FORMATS[number_format]
    except KeyError:
        raise ValueError(f"no fixed-point training arithmetic for number format {number_format!r}; "
                         f"expected one of {', '.join(TRAIN_FORMATS)}") from None


# ---------------------------------------------------------------- primitives

def sat(q, width: int) -> np.ndarray:
    """Clamp raw values to a signed ``width``-bit range (AP_SAT)."""
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    return np.clip(np.asarray(q, dtype=np.int64), lo, hi)


def rshift_round(x, s: int) -> np.ndarray:
    """x / 2^s rounded half toward +infinity (AP_RND); s == 0 is the identity, s < 0 an exact left shift."""
    x = np.asarray(x, dtype=np.int64)
    if s <= 0:
        return x << (-s)
    return (x + (1 << (s - 1))) >> s


def rescale(x, from_frac: int, to: fx.Fmt) -> np.ndarray:
    """Raw values with ``from_frac`` fraction bits -> format ``to``: one rounding, then saturation."""
    return sat(rshift_round(x, from_frac - to.frac), to.width)


def acc_width(terms: int, a_width: int = 16, b_width: int = 16) -> int:
    """Bits of a signed accumulator that sums ``terms`` products of a_width x b_width signed values exactly.

    A product lies in (-2^(a+b-2), 2^(a+b-2)] (the top only for (-2^(a-1)) (-2^(b-1))), so a sum
    of T products lies in (-T 2^(a+b-2), T 2^(a+b-2)], inside a signed n-bit register when
    T 2^(a+b-2) <= 2^(n-1) - 1, i.e. T < 2^(n-a-b+1): n = a + b - 1 + ceil(log2(T + 1)),
    the fewest bits that never wrap (tests/test_train_fixed.py checks both sides).
    """
    return a_width + b_width - 1 + math.ceil(math.log2(max(1, terms) + 1))


def quantize(x, fmt: fx.Fmt) -> np.ndarray:
    """Real values -> raw values of ``fmt`` (round half up, saturate)."""
    return sat(np.floor(np.asarray(x, dtype=np.float64) * (1 << fmt.frac) + 0.5), fmt.width)


def dequantize(q, fmt: fx.Fmt) -> np.ndarray:
    """Raw values -> real values (float64, exact for widths up to 53 bits)."""
    return np.asarray(q, dtype=np.float64) / (1 << fmt.frac)


# ---------------------------------------------------------------- weights

def initial_master(a, tf: TrainFormats) -> np.ndarray:
    """Float initial weights -> master weights: rounded to the forward format, then widened exactly
    (the low master fraction bits are 0), so an engine loads them from a 16-bit image."""
    return quantize(a, tf.act) << (tf.master.frac - tf.act.frac)


def master_from_float(params: dict, tf: TrainFormats) -> dict:
    """Float initial weights {layer: {name: array}} -> master weights (:func:`initial_master`)."""
    return {l: {n: initial_master(a, tf) for n, a in d.items()} for l, d in params.items()}


def forward_weights(master: dict, tf: TrainFormats) -> dict:
    """Master weights -> the 16-bit weights the forward and backward engines read (one rounding)."""
    return {l: {n: rescale(a, tf.master.frac, tf.act) for n, a in d.items()} for l, d in master.items()}


# ---------------------------------------------------------------- dense

def dense_bwd_input(dy_g, w_q, tf: TrainFormats) -> np.ndarray:
    """dx = W^T dy: dy (..., MH) format G, w (MH, MW) format A -> (..., MW) format G."""
    return rescale(fx.imatmul(dy_g, w_q), tf.act.frac + tf.grad.frac, tf.grad)


def dense_bwd_weight(dy_g, x_q, tf: TrainFormats) -> tuple[np.ndarray, np.ndarray]:
    """Exact (dW (MH, MW), db (MH,)) summed over the batch, at wgrad_frac fraction bits (no rounding)."""
    dy = np.asarray(dy_g, dtype=np.int64).reshape(-1, np.shape(dy_g)[-1])
    x = np.asarray(x_q, dtype=np.int64).reshape(-1, np.shape(x_q)[-1])
    return fx.imatmul(dy.T, x), dy.sum(axis=0) << tf.act.frac


# ---------------------------------------------------------------- conv2d

def conv2d_bwd_input(dy_g, w_q, in_hw: tuple[int, int], tf: TrainFormats, stride=1, padding=0) -> np.ndarray:
    """dx: the exact col2im of W^T dy, rounded once to G. dy (N, O, Ho, Wo) -> (N, C, H, W)."""
    w = np.asarray(w_q, dtype=np.int64)
    o, c, kh, kw = w.shape
    dy = np.asarray(dy_g, dtype=np.int64)
    n, _, ho, wo = dy.shape
    h, wd = in_hw
    (sh, sw), (ph, pw) = fx._pair(stride), fx._pair(padding)
    dcol = fx.imatmul(dy.reshape(n, o, ho * wo).transpose(0, 2, 1), fx.conv_weight_matrix(w))
    dcol = dcol.reshape(n, ho, wo, kh, kw, c)
    acc = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc[:, :, ky:ky + sh * (ho - 1) + 1:sh, kx:kx + sw * (wo - 1) + 1:sw] += \
                dcol[:, :, :, ky, kx, :].transpose(0, 3, 1, 2)
    return rescale(acc[:, :, ph:ph + h, pw:pw + wd], tf.act.frac + tf.grad.frac, tf.grad)


def conv2d_bwd_weight(dy_g, x_q, kernel, tf: TrainFormats, stride=1, padding=0) -> tuple[np.ndarray, np.ndarray]:
    """Exact (dW (O, C, kh, kw), db (O,)) summed over batch and pixels, at wgrad_frac fraction bits."""
    dy = np.asarray(dy_g, dtype=np.int64)
    n, o, ho, wo = dy.shape
    c = np.shape(x_q)[1]
    kh, kw = fx._pair(kernel)
    cols = fx.im2col(x_q, kernel, stride, padding).reshape(n * ho * wo, -1)
    d = dy.transpose(0, 2, 3, 1).reshape(n * ho * wo, o)
    dwm = fx.imatmul(d.T, cols)
    return dwm.reshape(o, kh, kw, c).transpose(0, 3, 1, 2), d.sum(axis=0) << tf.act.frac


# ---------------------------------------------------------------- the other layers

def relu_bwd(dy_g, x_q) -> np.ndarray:
    """dy where the forward input was positive: exact."""
    return fx.relu_bwd(dy_g, x_q)


def maxpool_bwd(x_q, dy_g, kernel, tf: TrainFormats, stride=None, padding=0) -> np.ndarray:
    """dy to the first maximum of each window; overlaps add exactly, then saturate to G."""
    return fx.maxpool_bwd(x_q, dy_g, kernel, stride, padding, tf.grad)


def avgpool_bwd(dy_g, in_hw, kernel, tf: TrainFormats, stride=None, padding=0) -> np.ndarray:
    """Exact window sums of dy times the avgpool reciprocal, rounded once to G."""
    return fx.avgpool_bwd(dy_g, in_hw, kernel, tf.grad, stride, padding)


def globalavgpool_bwd(dy_g, in_hw, tf: TrainFormats) -> np.ndarray:
    """(N, C) -> (N, C, H, W): dy times the 1/(H W) reciprocal, rounded once to G."""
    return fx.globalavgpool_bwd(dy_g, in_hw, tf.grad)


def _chan_shape(ndim: int) -> tuple:
    return (1, -1, 1, 1) if ndim == 4 else (1,) * (ndim - 1) + (-1,)


def batchnorm_bwd_input(dy_g, scale_q, tf: TrainFormats) -> np.ndarray:
    """Affine batchnorm (y = x scale + shift per channel): dx = dy scale, rounded once to G."""
    dy = np.asarray(dy_g, dtype=np.int64)
    return rescale(dy * np.asarray(scale_q, dtype=np.int64).reshape(_chan_shape(dy.ndim)),
                   tf.act.frac + tf.grad.frac, tf.grad)


def batchnorm_bwd_weight(dy_g, x_q, tf: TrainFormats) -> tuple[np.ndarray, np.ndarray]:
    """Exact (d scale, d shift) per channel at wgrad_frac fraction bits."""
    dy = np.asarray(dy_g, dtype=np.int64)
    x = np.asarray(x_q, dtype=np.int64)
    axes = (0, 2, 3) if dy.ndim == 4 else tuple(range(dy.ndim - 1))
    return (dy * x).sum(axis=axes), dy.sum(axis=axes) << tf.act.frac


def add_grads(a_g, b_g, tf: TrainFormats) -> np.ndarray:
    """Two gradients of one tensor (a fork in the forward graph): exact sum, saturated to G."""
    return sat(np.asarray(a_g, dtype=np.int64) + np.asarray(b_g, dtype=np.int64), tf.grad.width)


# ---------------------------------------------------------------- loss

def softmax_fixed(z_q, tf: TrainFormats) -> np.ndarray:
    """Softmax of raw logits (format A) along the last axis -> probabilities in format G.

    t = (z - max z) log2(e) rounded to EXP_FRAC fraction bits; 2^t = EXP2_LUT[t mod 1] >> -floor(t)
    (rounded); p = e R >> RECIP_SHIFT with R = round(2^RECIP_BITS / sum e) (one divider per sample).
    """
    z = np.asarray(z_q, dtype=np.int64)
    d = z - z.max(axis=-1, keepdims=True)                                   # <= 0, A.frac bits
    t = rshift_round(d * LOG2E_Q, tf.act.frac + LOG2E_FRAC - EXP_FRAC)       # EXP_FRAC bits
    k = -(t >> EXP_FRAC)                                                    # >= 0: the right shift
    j = t & ((1 << EXP_FRAC) - 1)
    lut = EXP2_LUT[j]
    k = np.minimum(k, 40)                                                   # 2^16 >> 40 is 0 already
    e = (lut + (np.left_shift(1, k) >> 1)) >> k                             # rounded right shift
    s = e.sum(axis=-1, keepdims=True)                                        # >= 2^EXP_OUT (the max term)
    r = ((1 << (RECIP_BITS + 1)) + s) // (2 * s)                             # round(2^RECIP_BITS / s)
    shift = RECIP_BITS - tf.grad.frac
    return sat((e * r + (1 << (shift - 1))) >> shift, tf.grad.width)


def softmax_xent_grad(z_q, labels, tf: TrainFormats) -> np.ndarray:
    """Per-sample gradient of the summed cross-entropy w.r.t. the logits: p - onehot, format G."""
    p = softmax_fixed(z_q, tf)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(labels)), np.asarray(labels)] = 1 << tf.grad.frac
    return sat(p - onehot, tf.grad.width)


def softmax_xent_loss(z_q, labels, tf: TrainFormats) -> float:
    """The summed cross-entropy of raw logits, in float64 (reported only; no hardware computes it)."""
    z = dequantize(z_q, tf.act)
    z = z - z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    return float((lse - z[np.arange(len(labels)), np.asarray(labels)]).sum())


# ---------------------------------------------------------------- optimizer

@dataclass(frozen=True)
class SgdConstants:
    """The integer constants of one SGD(+momentum) update (computed once per run, baked into hardware)."""

    mu: int          # round(momentum 2^MU_FRAC)
    lr: int          # round(lr / batch 2^lr_scale), in [2^(LR_BITS-1), 2^LR_BITS]
    lr_scale: int    # fraction bits of ``lr``
    shift: int       # right shift of v * lr to the master format


def sgd_constants(lr: float, momentum: float, batch: int, tf: TrainFormats, factor: float = 1.0) -> SgdConstants:
    """Constants for w -= (lr factor / batch) v, v = mu v + g (g the batch-summed gradient).

    ``lr`` sets the scale and the shift; ``factor`` in (0, 1] (a rate schedule's step,
    :func:`sgd_schedule`) scales only the integer rate, so every step of a schedule has the
    same shift and hardware changes one multiplier between steps.
    """
    if not (lr > 0 and math.isfinite(lr)) or not (0 <= momentum < 1) or batch < 1:
        raise ValueError(f"expected lr > 0, 0 <= momentum < 1, batch >= 1; got {lr}, {momentum}, {batch}")
    if not (0 < factor <= 1):
        raise ValueError(f"expected a rate factor in (0, 1], got {factor}")
    eff = lr / batch
    scale = LR_BITS - 1 - math.floor(math.log2(eff))
    shift = tf.wgrad_frac + scale - tf.master.frac
    if shift < 1:
        raise ValueError(f"learning rate {lr} / batch {batch} is too large for the fixed-point update")
    return SgdConstants(mu=math.floor(momentum * (1 << MU_FRAC) + 0.5),
                        lr=max(1, math.floor(eff * factor * (1 << scale) + 0.5)), lr_scale=scale, shift=shift)


@dataclass(frozen=True)
class SgdSchedule:
    """A rate schedule in hardware terms: ``steps[k]`` applies to updates k*period .. (k+1)*period - 1
    (the last step to every later update). Every step has the same mu, lr_scale and shift."""

    steps: tuple[SgdConstants, ...]
    period: int

    def at(self, update: int) -> SgdConstants:
        """The constants of update number ``update`` (0-based)."""
        return self.steps[min(update // self.period, len(self.steps) - 1)]


def sgd_schedule(lr: float, momentum: float, batch: int, tf: TrainFormats, factors, period: int) -> SgdSchedule:
    """The constants of a rate schedule: step k uses rate ``lr * factors[k]`` for ``period`` updates."""
    if period < 1 or not len(factors):
        raise ValueError(f"expected period >= 1 and at least one step, got {period}, {list(factors)}")
    return SgdSchedule(tuple(sgd_constants(lr, momentum, batch, tf, f) for f in factors), int(period))


def as_schedule(sgd) -> SgdSchedule:
    """``sgd`` as a schedule: an SgdSchedule as it is, one SgdConstants as a one-step schedule."""
    return sgd if isinstance(sgd, SgdSchedule) else SgdSchedule((sgd,), 1)


def sgd_update(w_m, v, g_acc, c: SgdConstants, tf: TrainFormats) -> tuple[np.ndarray, np.ndarray]:
    """One update of master weights ``w_m`` (format W) and velocity ``v`` (format V) from the exact
    batch-summed gradient ``g_acc`` (wgrad_frac bits = V's):

        v' = sat_V( ((v MU + 2^(MU_FRAC-1)) >> MU_FRAC) + sat_V(g_acc) )
        w' = sat_W( w - ((v' LR + 2^(shift-1)) >> shift) )
    """
    v = np.asarray(v, dtype=np.int64)
    v_new = sat(rshift_round(v * c.mu, MU_FRAC) + sat(g_acc, tf.vel.width), tf.vel.width)
    w_new = sat(np.asarray(w_m, dtype=np.int64) - rshift_round(v_new * c.lr, c.shift), tf.master.width)
    return w_new, v_new


# ---------------------------------------------------------------- whole layers and models

#: layer types the fixed-point training reference implements
SUPPORTED = ("dense", "conv2d", "relu", "maxpool", "avgpool", "globalavgpool", "batchnorm", "add", "flatten")


def layer_bwd(layer, inputs: list[np.ndarray], dy_g: np.ndarray, wq: dict, tf: TrainFormats):
    """Backward of one layer on a batch: (input gradients in input order, exact weight-gradient sums).

    ``inputs`` are the forward inputs (format A), ``wq`` the layer's forward weights
    (``w``/``b`` for dense (MH, MW) and conv2d (O, C, kh, kw); ``scale``/``shift`` for batchnorm).
    """
    a, t = layer.attr, layer.type
    x = inputs[0]
    if t == "dense":
        dw, db = dense_bwd_weight(dy_g, x, tf)
        g = {"w": dw, **({"b": db} if "b" in wq else {})}
        return [dense_bwd_input(dy_g, wq["w"], tf)], g
    if t == "conv2d":
        dw, db = conv2d_bwd_weight(dy_g, x, a["kernel"], tf, a["stride"], a["padding"])
        g = {"w": dw, **({"b": db} if "b" in wq else {})}
        return [conv2d_bwd_input(dy_g, wq["w"], x.shape[2:], tf, a["stride"], a["padding"])], g
    if t == "relu":
        return [relu_bwd(dy_g, x)], {}
    if t == "maxpool":
        return [maxpool_bwd(x, dy_g, a["kernel"], tf, a["stride"], a["padding"])], {}
    if t == "avgpool":
        return [avgpool_bwd(dy_g, x.shape[2:], a["kernel"], tf, a["stride"], a["padding"])], {}
    if t == "globalavgpool":
        return [globalavgpool_bwd(dy_g, x.shape[2:], tf)], {}
    if t == "batchnorm":
        ds, dsh = batchnorm_bwd_weight(dy_g, x, tf)
        return [batchnorm_bwd_input(dy_g, wq["scale"], tf)], {"scale": ds, "shift": dsh}
    if t == "add":
        return [np.asarray(dy_g, dtype=np.int64)] * len(inputs), {}
    if t == "flatten":
        return [np.asarray(dy_g, dtype=np.int64).reshape(x.shape)], {}
    raise ValueError(f"layer '{layer.name}': type '{t}' has no fixed-point training arithmetic "
                     f"(supported: {', '.join(SUPPORTED)})")


def layers_fwd(layers, tensors: dict, wq: dict, tf: TrainFormats) -> dict:
    """Forward of a run of layers (fpga_models.fixedpoint's arithmetic); returns every tensor."""
    return fx.model_fwd(layers, tensors, wq, tf.act)


def layers_bwd(layers, acts: dict, out_grads: dict, wq: dict, tf: TrainFormats) -> tuple[dict, dict]:
    """Backward of a run of layers from the gradients of its outputs.

    ``acts`` holds every forward tensor (layers_fwd's result). Gradients flow in reverse layer
    order; a tensor read by several layers adds its gradients with :func:`add_grads`, in that
    order. Returns (gradients of every tensor reached, exact weight gradients per layer).
    """
    return fx.walk_bwd(layers, acts, out_grads, lambda l, xs, dy: layer_bwd(l, xs, dy, wq.get(l.name, {}), tf),
                       lambda a, b: add_grads(a, b, tf))


def accumulate(total: dict, grads: dict) -> dict:
    """Exact integer sum of weight gradients {layer: {name: array}} (micro-batches, replicas)."""
    out = {l: dict(d) for l, d in total.items()}
    for l, d in grads.items():
        dst = out.setdefault(l, {})
        for n, a in d.items():
            dst[n] = dst[n] + np.asarray(a, dtype=np.int64) if n in dst else np.asarray(a, dtype=np.int64).copy()
    return out


def allreduce(replica_grads: list[dict]) -> dict:
    """Sum of every replica's gradients, added in replica order 0, 1, ... (ring order).

    The sums are exact integers, so every replica (and any order) gets the same bits; the
    order is fixed anyway so a saturating implementation would stay deterministic.
    """
    total: dict = {}
    for g in replica_grads:
        total = accumulate(total, g)
    return total


def train_step(model, master: dict, vel: dict, x_q, labels, consts: SgdConstants, tf: TrainFormats,
               microbatches: int = 1) -> tuple[dict, dict, dict]:
    """One synchronous training iteration of the whole model on a batch.

    ``master``/``vel``: {layer: {name: raw}} master weights and velocities (vel may be {}:
    zeros); ``x_q`` raw inputs (format A), ``labels`` ints. The batch is cut into
    ``microbatches`` equal parts in order (the result does not depend on it: the weight
    gradients are exact sums). Returns (new master, new velocity, info) where info has
    ``grads`` (the exact batch sums), ``loss`` (summed cross-entropy, float) and ``logits``.
    """
    wq = forward_weights(master, tf)
    name = model.inputs[0].name
    out_name = model.layers[-1].name
    total: dict = {}
    loss = 0.0
    logits = []
    for part in np.array_split(np.arange(len(labels)), microbatches):
        acts = layers_fwd(model.layers, {name: np.asarray(x_q, dtype=np.int64)[part]}, wq, tf)
        z = acts[out_name]
        loss += softmax_xent_loss(z, np.asarray(labels)[part], tf)
        logits.append(z)
        dz = softmax_xent_grad(z, np.asarray(labels)[part], tf)
        _, wg = layers_bwd(model.layers, acts, {out_name: dz}, wq, tf)
        total = accumulate(total, wg)
    new_m, new_v = {}, {}
    for l, d in master.items():
        new_m[l], new_v[l] = {}, {}
        for n, w in d.items():
            g = total.get(l, {}).get(n, np.zeros_like(w))
            v0 = vel.get(l, {}).get(n, np.zeros_like(w))
            new_m[l][n], new_v[l][n] = sgd_update(w, v0, g, consts, tf)
    return new_m, new_v, {"grads": total, "loss": loss, "logits": np.concatenate(logits)}


# ---------------------------------------------------------------- accumulator sizing

def reductions(layer, batch: int) -> dict[str, int]:
    """Terms summed per output value by each engine of ``layer`` over a batch of ``batch`` samples.

    ``fwd`` and ``bwd_input`` are per sample (a bias counts as one more term); ``wgrad`` sums
    over the whole batch (micro-batches x their size x replicas) and, for a convolution,
    every output pixel.
    """
    a, t = layer.attr, layer.type
    if t == "dense":
        return {"fwd": layer.in_shapes[0][-1] + 1, "bwd_input": a["units"], "wgrad": batch}
    if t == "conv2d":
        c = layer.in_shapes[0][0]
        kh, kw = a["kernel"]
        ho, wo = layer.out_shape[1:]
        return {"fwd": c * kh * kw + 1, "bwd_input": a["out_channels"] * kh * kw, "wgrad": batch * ho * wo}
    if t == "batchnorm":
        pix = math.prod(layer.out_shape[1:]) if len(layer.out_shape) == 3 else 1
        return {"fwd": 2, "bwd_input": 1, "wgrad": batch * pix}
    return {}


def model_acc_widths(model, batch: int) -> dict[str, dict[str, int]]:
    """Accumulator bits per layer and engine that never wrap for ``batch`` samples (acc_width rule)."""
    return {l.name: {k: acc_width(n) for k, n in reductions(l, batch).items()}
            for l in model.layers if reductions(l, batch)}
