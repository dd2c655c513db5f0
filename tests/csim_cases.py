"""Layer cases for the csim harness: each returns (HarnessCase, expected outputs from numpy)."""
from __future__ import annotations

import numpy as np

from bapipe.codegen.check.csim import HarnessCase, HarnessIO
from bapipe.codegen.check.cxx_run import to_stream
from bapipe.fpga_models import fixedpoint as fx

FMT = "fixed16"
ONE = 1 << fx.FORMATS[FMT].frac


def _r(rng, shape, span=2.0):
    lim = int(span * ONE)
    return rng.integers(-lim, lim, size=shape, dtype=np.int64)


def _dims(shape) -> str:
    return "".join(f"[{d}]" for d in shape)


def _arr(name, a) -> HarnessIO:
    a = np.asarray(a)
    return HarnessIO(name, int(a.size), _dims(a.shape), a)


def _tp(*v) -> str:
    return ", ".join(map(str, v))


def dense(rng, mh, mw, pe, simd, n=3, span=2.0, fmt=FMT):
    """Forward dense: MVU y = W x + b."""
    w, b, x = _r(rng, (mh, mw), 0.5), _r(rng, (mh,), 0.25), _r(rng, (n, mw), span)
    case = HarnessCase(f"dense {mh}x{mw} pe={pe} simd={simd}",
                       f"bapipe::dense<{_tp(mh, mw, pe, simd)}>(x, y, w, b)", n,
                       [_arr("w", w), _arr("b", b)], [HarnessIO("x", x.size, data=x)],
                       [HarnessIO("y", n * mh)], [])
    return case, [fx.dense_fwd(x, w, b, fmt).reshape(-1)]


def dense_ties(fmt=FMT):
    """Every output an exact half LSB: w = 0.5, one input, odd raw x of both signs (AP_RND ties)."""
    x = np.array([[-7], [-5], [-3], [-1], [1], [3], [5], [7]], dtype=np.int64)
    w, b = np.array([[ONE // 2]], dtype=np.int64), np.zeros(1, dtype=np.int64)
    case = HarnessCase("dense ties 1x1 pe=1 simd=1 (half-LSB ties)", "bapipe::dense<1, 1, 1, 1>(x, y, w, b)", len(x),
                       [_arr("w", w), _arr("b", b)], [HarnessIO("x", x.size, data=x)], [HarnessIO("y", len(x))], [])
    y = fx.dense_fwd(x, w, b, fmt).reshape(-1)
    assert y.tolist() == [-3, -2, -1, 0, 1, 2, 3, 4]      # x/2 rounded half toward +infinity
    return case, [y]


def conv(rng, c, h, wd, o, k, s, p, pe, simd, n=2, fmt=FMT):
    """Forward conv2d: sliding window + MVU, HWC streams."""
    w, b, x = _r(rng, (o, c, k, k), 0.5), _r(rng, (o,), 0.25), _r(rng, (n, c, h, wd))
    tp = _tp(c, h, wd, o, k, k, s, s, p, p, pe, simd)
    case = HarnessCase(f"conv2d {c}x{h}x{wd}->{o} k{k} s{s} p{p} pe={pe} simd={simd}",
                       f"bapipe::conv2d<{tp}>(x, y, w, b)", n,
                       [_arr("w", fx.conv_weight_matrix(w)), _arr("b", b)], [HarnessIO("x", x.size, data=to_stream(x))],
                       [HarnessIO("y", int(n * o * np.prod(fx.conv_out_hw(h, wd, k, s, p))))], [])
    return case, [to_stream(fx.conv2d_fwd(x, w, b, fmt, s, p)).reshape(-1)]


def relu(rng, shape, pe, n=2):
    x = _r(rng, (n,) + shape)
    N = int(np.prod(shape))
    case = HarnessCase(f"relu {shape} pe={pe}", f"bapipe::relu<{_tp(N, pe)}>(x, y)", n, [],
                       [HarnessIO("x", x.size, data=to_stream(x))], [HarnessIO("y", x.size)], [])
    return case, [to_stream(fx.relu_fwd(x)).reshape(-1)]


def pool(rng, kind, c, h, wd, k, s, p, pe, n=2, fmt=FMT):
    x = _r(rng, (n, c, h, wd))
    ho, wo = fx.conv_out_hw(h, wd, k, s, p)
    if kind == "max":
        call = f"bapipe::maxpool<{_tp(c, h, wd, k, k, s, s, p, p, pe)}>(x, y)"
        ref = fx.maxpool_fwd(x, k, s, p)
    else:
        call = f"bapipe::avgpool<{_tp(c, h, wd, k, k, s, s, p, p, pe, fx.avg_recip(k * k))}>(x, y)"
        ref = fx.avgpool_fwd(x, k, fmt, s, p)
    case = HarnessCase(f"{kind}pool {c}x{h}x{wd} k{k} s{s} p{p} pe={pe}", call, n, [],
                       [HarnessIO("x", x.size, data=to_stream(x))], [HarnessIO("y", n * c * ho * wo)], [])
    return case, [to_stream(ref).reshape(-1)]


def gap(rng, c, h, wd, pe, n=2, fmt=FMT):
    x = _r(rng, (n, c, h, wd))
    case = HarnessCase(f"globalavgpool {c}x{h}x{wd} pe={pe}",
                       f"bapipe::globalavgpool<{_tp(c, h, wd, pe, fx.avg_recip(h * wd))}>(x, y)", n, [],
                       [HarnessIO("x", x.size, data=to_stream(x))], [HarnessIO("y", n * c)], [])
    return case, [fx.globalavgpool_fwd(x, fmt).reshape(-1)]


def batchnorm(rng, shape, pe, n=2, fmt=FMT):
    ch = shape[0] if len(shape) == 3 else shape[-1]
    x = _r(rng, (n,) + shape)
    scale, shift = _r(rng, (ch,), 1.5), _r(rng, (ch,), 0.5)
    N = int(np.prod(shape))
    case = HarnessCase(f"batchnorm {shape} pe={pe}", f"bapipe::batchnorm<{_tp(N, ch, pe)}>(x, y, scale, shift)", n,
                       [_arr("scale", scale), _arr("shift", shift)], [HarnessIO("x", x.size, data=to_stream(x))],
                       [HarnessIO("y", x.size)], [])
    return case, [to_stream(fx.batchnorm_fwd(x, scale, shift, fmt)).reshape(-1)]


def add(rng, shape, pe, n=2, span=2.0, fmt=FMT):
    a, b = _r(rng, (n,) + shape, span), _r(rng, (n,) + shape, span)
    N = int(np.prod(shape))
    case = HarnessCase(f"add {shape} pe={pe} span={span}", f"bapipe::add<{_tp(N, pe)}>(a, b, y)", n, [],
                       [HarnessIO("a", a.size, data=to_stream(a)), HarnessIO("b", b.size, data=to_stream(b))],
                       [HarnessIO("y", a.size)], [])
    return case, [to_stream(fx.add_fwd(a, b, fmt)).reshape(-1)]


def flatten(rng, c, h, wd, n=2):
    x = _r(rng, (n, c, h, wd))
    case = HarnessCase(f"flatten {c}x{h}x{wd}", f"bapipe::flatten<{_tp(c, h, wd)}>(x, y)", n, [],
                       [HarnessIO("x", x.size, data=to_stream(x))], [HarnessIO("y", x.size)], [])
    return case, [x.reshape(-1)]


def all_cases(seed: int = 1):
    """Every layer type x at least 3 foldings, forward (the backward engines are tested through whole
    backward kernels: tests/test_csim_bwd.py)."""
    rng = np.random.default_rng(seed)
    out = []
    for pe, simd in ((1, 1), (4, 8), (16, 24), (2, 3)):
        out.append(dense(rng, 16, 24, pe, simd))
    out.append(dense(rng, 8, 12, 2, 4, span=24.0))          # saturation on the output
    out.append(dense_ties())
    for pe, simd in ((1, 1), (2, 9), (4, 27)):
        out.append(conv(rng, 3, 6, 5, 4, 3, 1, 1, pe, simd))
    out.append(conv(rng, 2, 7, 7, 6, 3, 2, 0, 3, 6))         # stride 2, no padding
    for pe in (1, 2, 4):
        out.append(relu(rng, (4, 3, 3), pe))
        out.append(pool(rng, "max", 4, 6, 6, 2, 2, 0, pe))
        out.append(pool(rng, "avg", 4, 6, 6, 2, 2, 0, pe))
        out.append(batchnorm(rng, (4, 3, 3), pe))
        out.append(add(rng, (4, 3, 3), pe))
        out.append(gap(rng, 4, 3, 3, pe))
    out.append(pool(rng, "max", 4, 7, 7, 3, 2, 1, 2))        # padded window
    out.append(pool(rng, "avg", 4, 7, 7, 3, 2, 1, 2))        # 1/9: inexact reciprocal
    out.append(batchnorm(rng, (12,), 3))                     # vector input
    out.append(add(rng, (16,), 1, span=30.0))                # saturation
    out.append(flatten(rng, 3, 2, 4))
    return out
