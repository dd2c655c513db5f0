"""fpga_models.train_fixed: the fixed-point training arithmetic (docs/training.md).

Three kinds of checks: bit-exact against brute-force integer loops (small cases); against
float64 on the same raw inputs with the bound each rounding implies (half an LSB of the
destination format, plus the relative error of a quantised constant); and the accumulator
width rule on the largest reduction of VGG-16.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from bapipe import zoo
from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models import train_fixed as T
from tolerances import U64

TF = T.get_formats("fixed16")
A, G = TF.act, TF.grad
HALF_G = 2.0 ** -(G.frac + 1)          # half an LSB of an activation gradient


def rnd(rng, shape, lo=-3000, hi=3000):
    return rng.integers(lo, hi, size=shape, dtype=np.int64)


def rshift_round_int(v: int, s: int) -> int:
    return (v + (1 << (s - 1))) >> s


def sat_int(v: int, width: int) -> int:
    return max(-(1 << (width - 1)), min((1 << (width - 1)) - 1, v))


# ---------------------------------------------------------------- primitives


def test_rounding_is_half_up_and_saturates():
    assert T.rshift_round(np.array([5, 6, 7, -5, -6, -7]), 2).tolist() == [1, 2, 2, -1, -1, -2]  # 1.25 1.5 1.75 ...
    assert T.rescale(np.array([1 << 40, -(1 << 40)]), 22, G).tolist() == [G.qmax, G.qmin]
    assert T.get_formats("fixed16").wgrad_frac == 22
    with pytest.raises(ValueError, match="fixed16"):
        T.get_formats("int4")


def test_initial_master_weights_load_from_16_bit_images():
    a = np.random.default_rng(2).normal(0, 3, 100)
    m = T.initial_master(a, TF)
    assert (m & ((1 << 14) - 1) == 0).all() and np.array_equal(T.rescale(m, 24, A), fx.quantize(a, A))


# ---------------------------------------------------------------- dense vs float64


def test_dense_backward_vs_float64():
    rng = np.random.default_rng(1)
    x, w, dy = rnd(rng, (7, 20)), rnd(rng, (12, 20)), rnd(rng, (7, 12))
    dx = T.dense_bwd_input(dy, w, TF)
    ref = T.dequantize(dy, G) @ fx.dequantize(w, A)      # float64: exact (products < 2^53)
    # accumulation exact, one rounding to G: at most half an LSB (none saturated here)
    assert np.abs(T.dequantize(dx, G) - ref).max() <= HALF_G
    assert np.abs(ref).max() < 8 - 1
    dw, db = T.dense_bwd_weight(dy, x, TF)
    # weight gradients are not rounded at all: equal to the float64 sum scaled to 22 bits
    assert np.array_equal(dw, np.rint((T.dequantize(dy, G).T @ fx.dequantize(x, A)) * 2 ** 22).astype(np.int64))
    assert np.array_equal(db, dy.sum(axis=0) << 10)


# ---------------------------------------------------------------- conv2d vs brute-force loops


def brute_conv_bwd(x, w, dy, stride, pad):
    """dx (rounded to G) and exact dW, db by plain Python loops over every index."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    _, _, ho, wo = dy.shape
    dx_acc = np.zeros(x.shape, dtype=object)
    dw = np.zeros(w.shape, dtype=object)
    db = [0] * o
    for b in range(n):
        for oc in range(o):
            for oy in range(ho):
                for ox in range(wo):
                    g = int(dy[b, oc, oy, ox])
                    db[oc] += g << 10
                    for ic in range(c):
                        for ky in range(kh):
                            for kx in range(kw):
                                iy, ix = oy * stride + ky - pad, ox * stride + kx - pad
                                if 0 <= iy < h and 0 <= ix < wd:
                                    dx_acc[b, ic, iy, ix] += g * int(w[oc, ic, ky, kx])
                                    dw[oc, ic, ky, kx] += g * int(x[b, ic, iy, ix])
    dx = np.vectorize(lambda v: sat_int(rshift_round_int(int(v), 10), 16))(dx_acc).astype(np.int64)
    return dx, dw.astype(np.int64), np.array(db, dtype=np.int64)


@pytest.mark.parametrize("stride,pad", [(1, 1), (2, 0), (2, 1)])
def test_conv2d_backward_bit_exact_vs_loops(stride, pad):
    rng = np.random.default_rng(stride * 10 + pad)
    x, w = rnd(rng, (2, 3, 5, 6)), rnd(rng, (4, 3, 3, 3), -20000, 20000)
    ho, wo = fx.conv_out_hw(5, 6, 3, stride, pad)
    dy = rnd(rng, (2, 4, ho, wo), -30000, 30000)            # large enough that some dx saturate
    dx, dw, db = brute_conv_bwd(x, w, dy, stride, pad)
    got_dx = T.conv2d_bwd_input(dy, w, (5, 6), TF, stride, pad)
    got_dw, got_db = T.conv2d_bwd_weight(dy, x, 3, TF, stride, pad)
    assert np.array_equal(got_dx, dx) and np.array_equal(got_dw, dw) and np.array_equal(got_db, db)
    assert (np.abs(dx) == G.qmax).any() or (dx == G.qmin).any()  # the saturating path ran


def test_pool_backward_bit_exact_vs_loops():
    rng = np.random.default_rng(5)
    x = rnd(rng, (2, 2, 4, 4), -50, 50)                     # small range: ties in windows happen
    dy = rnd(rng, (2, 2, 2, 2))
    want = np.zeros_like(x)
    for b in range(2):
        for c in range(2):
            for oy in range(2):
                for ox in range(2):
                    win = [(x[b, c, 2 * oy + ky, 2 * ox + kx], ky, kx) for ky in range(2) for kx in range(2)]
                    best = max(v for v, _, _ in win)
                    _, ky, kx = next(t for t in win if t[0] == best)   # the first maximum in scan order
                    want[b, c, 2 * oy + ky, 2 * ox + kx] += dy[b, c, oy, ox]
    assert np.array_equal(T.maxpool_bwd(x, dy, 2, TF), want)
    # avgpool 2x2: every input gets round(dy * R / 2^18) with R = round(2^18 / 4) = 2^16: dy / 4 rounded half up
    got = T.avgpool_bwd(dy, (4, 4), 2, TF)
    want_avg = np.vectorize(lambda v: rshift_round_int(int(v), 2))(np.repeat(np.repeat(dy, 2, 2), 2, 3))
    assert np.array_equal(got, want_avg)


def test_batchnorm_and_fanout_backward():
    rng = np.random.default_rng(6)
    x, dy, scale = rnd(rng, (3, 4, 2, 2)), rnd(rng, (3, 4, 2, 2)), rnd(rng, (4,), -2048, 2048)
    dx = T.batchnorm_bwd_input(dy, scale, TF)
    ref = T.dequantize(dy, G) * fx.dequantize(scale, A)[None, :, None, None]
    assert np.abs(T.dequantize(dx, G) - ref).max() <= HALF_G
    ds, dsh = T.batchnorm_bwd_weight(dy, x, TF)
    assert ds.tolist() == [int((dy[:, c] * x[:, c]).sum()) for c in range(4)]
    assert dsh.tolist() == [int(dy[:, c].sum()) << 10 for c in range(4)]
    assert T.add_grads(np.array([30000, -5]), np.array([30000, 7]), TF).tolist() == [G.qmax, 2]


# ---------------------------------------------------------------- loss


def test_softmax_xent_grad_vs_float64():
    rng = np.random.default_rng(7)
    z = fx.quantize(rng.normal(0, 4, (64, 10)), A)
    z[0] = [A.qmax] + [A.qmin] * 9                          # the widest logit spread the format holds
    y = rng.integers(0, 10, 64)
    dz = T.softmax_xent_grad(z, y, TF)
    zf = fx.dequantize(z, A)
    e = np.exp(zf - zf.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    ref = p - np.eye(10)[y]
    d = zf.max(axis=1, keepdims=True) - zf                  # |z - max z| <= 64
    # per element: the exponent t is rounded to 2^-11 and log2(e) to 2^-17 (error |d| 2^-17),
    # the table and the right shift to 2^-16 relative to the max term; each relative error of
    # 2^t enters p twice (numerator and the sum); the reciprocal is relative 2^-28; p is
    # rounded to half an LSB of G.
    rel = math.log(2) * (2.0 ** -11 + d * 2.0 ** -17) + 2.0 ** -16
    bound = p * 2 * rel + 2.0 ** -16 + HALF_G
    err = np.abs(T.dequantize(dz, G) - ref)
    assert (err <= bound).all(), float((err - bound).max())
    assert err.max() > 0                                     # it is an approximation, and the test can see it
    # float64 both sides, two formulas (log-sum-exp minus the target logit; -log of the
    # softmax): per sample about K + 4 roundings of values of size |z_y| + lse + nll, then a
    # sum of 64 positive terms (64 u of the total); twice for the two sides. Measured: equal.
    i, K = np.arange(64), z.shape[1]
    zs = zf - zf.max(axis=1, keepdims=True)
    lse = np.log(np.exp(zs).sum(axis=1))
    nll = lse - zs[i, y]
    err = 2 * U64 * ((K + 4) * (np.abs(zs[i, y]) + lse + nll).sum() + 64 * nll.sum())
    assert T.softmax_xent_loss(z, y, TF) == pytest.approx(float(-np.log(p[i, y]).sum()), rel=0, abs=err)


# ---------------------------------------------------------------- optimizer


def test_sgd_update_vs_float64():
    rng = np.random.default_rng(8)
    lr, mu, batch = 0.05, 0.9, 64
    c = T.sgd_constants(lr, mu, batch, TF)
    assert 1 << 15 <= c.lr <= 1 << 16 and c.shift >= 1
    w = T.quantize(rng.normal(0, 0.3, 500), TF.master)
    v = T.quantize(rng.normal(0, 2.0, 500), TF.vel)
    g = rng.integers(-(1 << 30), 1 << 30, 500)             # batch-summed gradients, 22 fraction bits
    w2, v2 = T.sgd_update(w, v, g, c, TF)
    vf = mu * T.dequantize(v, TF.vel) + g / 2.0 ** 22
    wf = T.dequantize(w, TF.master) - lr / batch * vf
    # v: MU is mu rounded to 2^-17 (error |v| 2^-17), one rounding to half an LSB of V (2^-23)
    vb = np.abs(T.dequantize(v, TF.vel)) * 2.0 ** -17 + 2.0 ** -23
    assert (np.abs(T.dequantize(v2, TF.vel) - vf) <= vb).all()
    # w: the v error scaled by lr/batch, LR relative 2^-16, one rounding to half an LSB of W (2^-25)
    wb = lr / batch * (vb + np.abs(vf) * 2.0 ** -16) + 2.0 ** -25
    assert (np.abs(T.dequantize(w2, TF.master) - wf) <= wb).all()
    # a plain-SGD step too small for the 16-bit forward weights still moves the master weights
    w3, _ = T.sgd_update(w, np.zeros_like(w), np.full(500, 1 << 14), T.sgd_constants(lr, 0.0, batch, TF), TF)
    # (a summed gradient of 2^-8 x lr / batch = 3e-6, a 300th of the 16-bit LSB 2^-10)
    assert (w3 < w).all()
    assert np.mean(T.rescale(w3, 24, A) != T.rescale(w, 24, A)) < 0.02
    with pytest.raises(ValueError):
        T.sgd_constants(lr, 1.0, batch, TF)


# ---------------------------------------------------------------- whole steps


def _mlp_state(seed=0):
    m = zoo.get("tiny-mlp")
    master = {}
    for pos, l in enumerate(m.layers):
        if l.type == "dense":
            r = np.random.default_rng([seed, pos])
            fan_in = l.in_shapes[0][-1]
            master[l.name] = {"w": T.quantize(r.standard_normal((l.attr["units"], fan_in)) * math.sqrt(2 / fan_in),
                                              TF.master),
                              "b": T.quantize(r.normal(0, 0.1, l.attr["units"]), TF.master)}
    return m, master


def test_train_step_microbatch_and_replica_invariant():
    m, master = _mlp_state()
    rng = np.random.default_rng(9)
    x = fx.quantize(rng.random((24, 64)), A)
    y = rng.integers(0, 10, 24)
    c = T.sgd_constants(0.05, 0.9, 24, TF)
    m1, v1, i1 = T.train_step(m, master, {}, x, y, c, TF, microbatches=1)
    m4, v4, i4 = T.train_step(m, master, {}, x, y, c, TF, microbatches=4)
    for l in master:
        for n in master[l]:
            assert np.array_equal(m1[l][n], m4[l][n]) and np.array_equal(v1[l][n], v4[l][n])
    # three replicas each take a shard; the all-reduce in any order gives the same bits
    shards = [T.train_step(m, master, {}, x[a:b], y[a:b], c, TF)[2]["grads"] for a, b in ((0, 5), (5, 16), (16, 24))]
    for order in ((0, 1, 2), (2, 0, 1)):
        tot = T.allreduce([shards[k] for k in order])
        assert all(np.array_equal(tot[l][n], i1["grads"][l][n]) for l in tot for n in tot[l])


def test_train_step_gradients_vs_float64():
    """The fixed-point batch gradient against float64 backprop through the same forward weights.

    Not a rounding bound but an end-to-end figure: activations round to 2^-11 and gradients
    to 2^-13 at each of the 4 dense layers (relative to gradient entries of ~2^-4 that is
    ~2^-9 per layer); measured 0.24% norm-wise, asserted below 2%.
    """
    m, master = _mlp_state()
    rng = np.random.default_rng(10)
    x = fx.quantize(rng.random((32, 64)), A)
    y = rng.integers(0, 10, 32)
    _, _, info = T.train_step(m, master, {}, x, y, T.sgd_constants(0.05, 0.9, 32, TF), TF)
    wq = T.forward_weights(master, TF)
    ws = [(fx.dequantize(wq[l]["w"], A), fx.dequantize(wq[l]["b"], A)) for l in ("fc1", "fc2", "fc3", "fc4")]
    hs = [fx.dequantize(x, A)]
    for k, (w, b) in enumerate(ws):
        z = hs[-1] @ w.T + b
        hs.append(np.maximum(z, 0) if k < 3 else z)
    e = np.exp(hs[-1] - hs[-1].max(1, keepdims=True))
    d = e / e.sum(1, keepdims=True) - np.eye(10)[y]
    worst = 0.0
    for k in range(3, -1, -1):
        name = f"fc{k + 1}"
        gw = d.T @ hs[k]
        got = info["grads"][name]["w"] / 2.0 ** 22
        worst = max(worst, np.linalg.norm(got - gw) / np.linalg.norm(gw))
        d = (d @ ws[k][0]) * (hs[k] > 0) if k else d
    assert 0 < worst < 0.02, worst


# ---------------------------------------------------------------- accumulator sizing


def test_acc_width_rule_on_vgg16_largest_reduction():
    """The largest reduction of a VGG-16 training step (conv1_1's weight gradient: 224 x 224 pixels
    x the batch) fits the width the rule gives; the inference accumulator (48 bits) wraps."""
    model = zoo.get("vgg16")
    batch = 256
    red = {(l.name, k): n for l in model.layers for k, n in T.reductions(l, batch).items()}
    (lname, kind), terms = max(red.items(), key=lambda kv: kv[1])
    assert kind == "wgrad" and terms == 224 * 224 * batch
    width = T.acc_width(terms)
    assert width == 55
    worst = terms * (1 << 30)                                # every product (-2^15)^2, exact Python int
    assert worst <= (1 << (width - 1)) - 1 and worst > (1 << (width - 2)) - 1    # fits, and one bit fewer does not
    assert T.acc_width(1) == 32 and T.acc_width(2) == 33 and T.acc_width(3) == 33   # 2 x 2^30 needs 33 bits
    assert worst > (1 << (A.acc_width - 1)) - 1              # the 48-bit inference acc_t would wrap
    # the same as arrays: the sum wrapped to 48 bits is wrong, to `width` bits exact
    prods = np.full(224 * 224 * 64, 1 << 30, dtype=np.int64)
    exact = int(prods.sum())

    def wrap(v, bits):
        return ((v + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))

    assert wrap(exact, T.acc_width(len(prods))) == exact and wrap(exact, 48) != exact
    # every layer and engine of VGG-16 fits 64 bits up to (2^33 - 1) / (224 x 224) samples per batch
    widths = T.model_acc_widths(model, batch)
    assert max(w for d in widths.values() for w in d.values()) == width <= 64
    assert T.acc_width(224 * 224 * 171_196) == 64 and T.acc_width(224 * 224 * 171_197) == 65


@pytest.mark.slow  # 32x32 convolutions in int64: ~1.8 s
def test_small_resnet_step_with_batchnorm_and_residual_forks():
    """A residual model (conv, batchnorm, add forks, globalavgpool, dense) takes a step; the
    result does not depend on the micro-batching, and every trainable tensor moved."""
    from bapipe.models import load_model

    model = load_model("examples/models/small-resnet.yaml")
    rng = np.random.default_rng(11)
    master = {}
    for l in model.layers:
        if l.type == "conv2d":
            o, c = l.attr["out_channels"], l.in_shapes[0][0]
            kh, kw = l.attr["kernel"]
            master[l.name] = {"w": T.quantize(rng.normal(0, math.sqrt(2 / (c * kh * kw)), (o, c, kh, kw)), TF.master)}
            if l.attr.get("bias", True):
                master[l.name]["b"] = T.quantize(np.zeros(o), TF.master)
        elif l.type == "batchnorm":
            ch = l.in_shapes[0][0]
            master[l.name] = {"scale": T.quantize(np.ones(ch), TF.master), "shift": T.quantize(np.zeros(ch), TF.master)}
        elif l.type == "dense":
            fan_in = l.in_shapes[0][-1]
            master[l.name] = {"w": T.quantize(rng.normal(0, math.sqrt(2 / fan_in), (l.attr["units"], fan_in)),
                                              TF.master), "b": T.quantize(np.zeros(l.attr["units"]), TF.master)}
    x = fx.quantize(rng.random((2, 3, 32, 32)), A)
    y = rng.integers(0, model.layers[-1].out_shape[-1], 2)
    c = T.sgd_constants(0.05, 0.9, 2, TF)
    m1, _, i1 = T.train_step(model, master, {}, x, y, c, TF, microbatches=1)
    m2, _, i2 = T.train_step(model, master, {}, x, y, c, TF, microbatches=2)
    assert np.array_equal(i1["logits"], i2["logits"])
    for l in master:
        for n in master[l]:
            assert np.array_equal(m1[l][n], m2[l][n]), (l, n)
            assert not np.array_equal(m1[l][n], master[l][n]), (l, n)   # a zero gradient would be a broken path


# ---------------------------------------------------------------- rate schedules


def test_linear_schedule_steps_and_one_shift():
    """host.optim.lr_factor linear: 1, 0.8, 0.6, 0.4, 0.2 over 5 epochs (stays at the last step past
    them); the integer schedule keeps one shift and scale, and each step's LR is the peak's times
    the factor to half an integer (round to nearest of lr / batch 2^scale)."""
    from bapipe.host.optim import lr_factor

    assert [lr_factor("linear", e, 5) for e in range(7)] == [1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2]
    assert [lr_factor("constant", e, 5) for e in range(3)] == [1.0] * 3
    with pytest.raises(ValueError):
        lr_factor("cosine", 0, 5)
    lr, b = 0.03535533905932738, 32                   # tiny-mlp's default plan: the sqrt batch rule at 32
    s = T.sgd_schedule(lr, 0.9, b, TF, [lr_factor("linear", e, 5) for e in range(5)], 44)
    peak = T.sgd_constants(lr, 0.9, b, TF)
    assert s.steps[0] == peak and {(c.mu, c.lr_scale, c.shift) for c in s.steps} == {(peak.mu, 25, 23)}
    # lr / b = 0.0011049 in [2^-10, 2^-9): scale 15 + 10 = 25; exact products 37072.7 x (1 .. 0.2)
    assert [c.lr for c in s.steps] == [37073, 29658, 22244, 14829, 7415]
    assert [s.at(i).lr for i in (0, 43, 44, 87, 88, 219, 10_000)] == [37073, 37073, 29658, 29658, 22244, 7415, 7415]
    assert T.as_schedule(peak).at(5) == peak
    with pytest.raises(ValueError):
        T.sgd_constants(lr, 0.9, b, TF, 1.5)
    with pytest.raises(ValueError):
        T.sgd_schedule(lr, 0.9, b, TF, [1.0], 0)


def test_decayed_step_is_the_smaller_update():
    """One update at factor f moves the master weights by f times the peak's step (to the rounding of
    LR, relative 2^-15 at LR >= 2^14, and of the shift, half an LSB of W), momentum unchanged."""
    rng = np.random.default_rng(12)
    w = T.quantize(rng.normal(0, 0.3, 400), TF.master)
    g = rng.integers(-(1 << 30), 1 << 30, 400)
    full = T.sgd_constants(0.05, 0.9, 64, TF)
    half = T.sgd_constants(0.05, 0.9, 64, TF, 0.5)
    w1, v1 = T.sgd_update(w, np.zeros_like(w), g, full, TF)
    w2, v2 = T.sgd_update(w, np.zeros_like(w), g, half, TF)
    assert np.array_equal(v1, v2) and (half.mu, half.shift) == (full.mu, full.shift)
    d1, d2 = (w - w1).astype(np.float64), (w - w2).astype(np.float64)
    # the half rate's LR rounds on its own (relative 2^-15 at LR >= 2^14) and each step's shift
    # rounds to the nearest master LSB (half an LSB each, 1 LSB between the two)
    assert (np.abs(d2 - 0.5 * d1) <= np.abs(d1) * 2.0 ** -15 + 1.0).all()
