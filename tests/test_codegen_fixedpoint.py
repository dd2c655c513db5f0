"""The numpy fixed-point reference against float brute force: one rounding, half an LSB."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapipe.fpga_models import fixedpoint as fx

F16 = fx.FORMATS["fixed16"]
LSB = 2.0 ** -F16.frac


def test_quantize_rounds_half_up_and_saturates():
    q = fx.quantize([0.5 * LSB, -0.5 * LSB, 1.5 * LSB, -1.5 * LSB, 0.49 * LSB, 100.0, -100.0], F16)
    assert q.tolist() == [1, 0, 2, -1, 0, 32767, -32768]
    assert fx.dequantize(q[:4], F16).tolist() == [LSB, 0.0, 2 * LSB, -LSB]
    assert F16.hls_type == "ap_fixed<16,6,AP_RND,AP_SAT>" and F16.hls_acc_type == "ap_fixed<48,28>"


def test_requant_is_floor_of_half_up():
    acc = np.array([512, -512, 1536, -1536, 511, -513, 1 << 40, -(1 << 40)])   # 2F = 20 fraction bits: 512 = 0.5 LSB
    assert fx.requant(acc, F16).tolist() == [1, 0, 2, -1, 0, -1, 32767, -32768]


def _conv_float(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((n, o, ho, wo))
    for oy in range(ho):
        for ox in range(wo):
            patch = xp[:, :, oy * stride:oy * stride + kh, ox * stride:ox * stride + kw]
            y[:, :, oy, ox] = np.einsum("nckl,ockl->no", patch, w) + b
    return y


def _within_half_lsb(y_q, exact):
    exact_q = exact / LSB
    inside = (exact_q < F16.qmax) & (exact_q > F16.qmin)
    # one round-to-nearest onto the LSB grid: within half an LSB. The float64 reference is
    # exact: integers times powers of two, sums far below 2**53
    assert np.all(np.abs(y_q[inside] - exact_q[inside]) <= 0.5)
    assert np.all(y_q[~inside] == np.clip(np.floor(exact_q[~inside] + 0.5), F16.qmin, F16.qmax))


@settings(max_examples=30, deadline=None)
@given(mh=st.integers(1, 9), mw=st.integers(1, 20), n=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_dense_forward_and_backward_round_once(mh, mw, n, seed):
    rng = np.random.default_rng(seed)
    x, w, b = rng.integers(-4096, 4096, (n, mw)), rng.integers(-1024, 1024, (mh, mw)), rng.integers(-512, 512, mh)
    xf, wf, bf = x * LSB, w * LSB, b * LSB
    _within_half_lsb(fx.dense_fwd(x, w, b, F16), xf @ wf.T + bf)
    dy = rng.integers(-2048, 2048, (n, mh))
    _within_half_lsb(fx.dense_bwd_input(dy, w, F16), (dy * LSB) @ wf)
    dw, db = fx.dense_bwd_weight(dy, x, F16)
    _within_half_lsb(dw, (dy * LSB).T @ xf)
    assert db.tolist() == np.clip(dy.sum(0), F16.qmin, F16.qmax).tolist()


@settings(max_examples=20, deadline=None)
@given(c=st.integers(1, 3), o=st.integers(1, 4), hw=st.integers(3, 7), k=st.sampled_from([1, 2, 3]),
       stride=st.integers(1, 2), pad=st.integers(0, 1), seed=st.integers(0, 2**31))
def test_conv2d_forward_and_backward_against_brute_force(c, o, hw, k, stride, pad, seed):
    if pad >= k:
        pad = 0
    rng = np.random.default_rng(seed)
    x, w, b = rng.integers(-2048, 2048, (2, c, hw, hw)), rng.integers(-512, 512, (o, c, k, k)), rng.integers(-64, 64, o)
    y = fx.conv2d_fwd(x, w, b, F16, stride, pad)
    _within_half_lsb(y, _conv_float(x * LSB, w * LSB, b * LSB, stride, pad))
    # backward by the adjoint: <conv(x), dy> = <x, dx_exact>; compare with a float autograd-free brute force
    dy = rng.integers(-1024, 1024, y.shape)
    dx_exact = np.zeros(x.shape)
    dw_exact = np.zeros(w.shape)
    xp = np.pad(x * LSB, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dxp = np.zeros(xp.shape)
    for oy in range(y.shape[2]):
        for ox in range(y.shape[3]):
            g = dy[:, :, oy, ox] * LSB                                   # (n, o)
            dxp[:, :, oy * stride:oy * stride + k, ox * stride:ox * stride + k] += np.einsum("no,ockl->nckl", g, w * LSB)
            dw_exact += np.einsum("no,nckl->ockl", g, xp[:, :, oy * stride:oy * stride + k, ox * stride:ox * stride + k])
    dx_exact = dxp[:, :, pad:pad + hw, pad:pad + hw]
    _within_half_lsb(fx.conv2d_bwd_input(dy, w, (hw, hw), F16, stride, pad), dx_exact)
    dw, db = fx.conv2d_bwd_weight(dy, x, k, F16, stride, pad)
    _within_half_lsb(dw, dw_exact)
    assert db.tolist() == np.clip(dy.sum((0, 2, 3)), F16.qmin, F16.qmax).tolist()


def test_pools_relu_add_batchnorm():
    rng = np.random.default_rng(3)
    x = rng.integers(-3000, 3000, (2, 3, 7, 7))
    mp = fx.maxpool_fwd(x, 3, 2, 1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=np.iinfo(np.int64).min)
    for oy in range(mp.shape[2]):
        for ox in range(mp.shape[3]):
            assert (mp[:, :, oy, ox] == xp[:, :, 2 * oy:2 * oy + 3, 2 * ox:2 * ox + 3].max(axis=(2, 3))).all()
    ap2 = fx.avgpool_fwd(x[:, :, :6, :6], 2, F16)
    exact2 = x[:, :, :6, :6].reshape(2, 3, 3, 2, 3, 2).mean(axis=(3, 5))
    assert (ap2 == np.floor(exact2 + 0.5)).all()                     # power of two: exact then one rounding
    ap3 = fx.avgpool_fwd(x, 3, F16, 2, 1)
    xz = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    exact3 = np.array([[[[xz[n, c, 2 * i:2 * i + 3, 2 * j:2 * j + 3].mean() for j in range(4)] for i in range(4)]
                        for c in range(3)] for n in range(2)])
    # 1/9 as R = round(2**AVG_BITS / 9) (off by at most 1/2, so a window sum s is off by
    # |s| / 2**(AVG_BITS + 1)), then one rounding (half an LSB)
    assert np.all(np.abs(ap3 - exact3) <= 0.5 + np.abs(9 * exact3) / 2 ** (fx.AVG_BITS + 1))
    assert (fx.relu_fwd(x) == np.maximum(x, 0)).all()
    assert fx.add_fwd([30000, -30000], [5000, -5000], F16).tolist() == [32767, -32768]
    scale, shift = fx.fold_batchnorm([1.0, 2.0], [0.0, 0.5], [0.0, 1.0], [1.0, 4.0], F16, eps=0.0)
    assert scale.tolist() == [1024, 1024] and shift.tolist() == [0, -512]   # shift = 0.5 - 1.0*1.0
    assert fx.batchnorm_fwd(np.array([[[[10]], [[20]]]]), scale, shift, F16).reshape(-1).tolist() == [10, 20 - 512]
    assert fx.globalavgpool_fwd(np.full((1, 2, 2, 2), 7), F16).tolist() == [[7, 7]]


def test_unsupported_type_raises():
    from bapipe.layers import Layer

    with pytest.raises(ValueError, match="type 'softmax' has no fixed-point implementation"):
        fx.layer_fwd(Layer("sm", "softmax", ("x",), ((4,),), (4,)), [np.zeros((1, 4))], {}, F16)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 300), st.integers(1, 20), st.sampled_from([8, 16, 24]),
       st.integers(0, 2**31 - 1))
def test_imatmul_is_exact(m, k, n, bits, seed):
    """The float64 BLAS shortcut equals int64 matmul, and wide values fall back to int64."""
    from bapipe.fpga_models.fixedpoint import imatmul

    rng = np.random.default_rng(seed)
    lim = 1 << (bits - 1)
    a = rng.integers(-lim, lim, size=(m, k), dtype=np.int64)
    b = rng.integers(-lim, lim, size=(k, n), dtype=np.int64)
    got = imatmul(a, b)
    assert got.dtype == np.int64 and np.array_equal(got, a @ b)
