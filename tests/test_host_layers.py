"""host.layers_np, host.program, host.optim: numpy forward/backward checked by brute force."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapipe.spec import parse_model
from bapipe.zoo import get
from bapipe.host import layers_np as L
from bapipe.host.optim import Optimizer
from bapipe.host.program import StageProgram, init_stage_params
from tolerances import U32

F64 = np.float64


def _model(layers, input_shape):
    return parse_model({"name": "t", "input": list(input_shape), "layers": layers})


def _conv_naive(x, w, b, stride, pad, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, o, ho, wo))
    og = o // groups
    for ni in range(n):
        for oi in range(o):
            g = oi // og
            for i in range(ho):
                for j in range(wo):
                    patch = xp[ni, g * cg:(g + 1) * cg, i * stride:i * stride + kh, j * stride:j * stride + kw]
                    y[ni, oi, i, j] = (patch * w[oi]).sum() + b[oi]
    return y


def test_conv2d_forward_matches_naive_loops():
    m = _model([{"name": "c", "type": "conv2d", "out_channels": 4, "kernel": 3, "stride": 2, "padding": 1,
                 "groups": 2}], (4, 7, 6))
    layer = m.layers[0]
    rng = np.random.default_rng(0)
    p = L.init_params(layer, rng)
    p["b"] = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    y, _ = L.forward(layer, p, [x], True, {})
    assert y.shape == (2,) + layer.out_shape
    # float32 dot products of K = 2 x 3 x 3 terms plus the bias against float64 loops: the
    # componentwise worst case (K + 1) u32 times the same sums of absolute values (Higham, 3.1)
    want = _conv_naive(x, p["W"], p["b"], 2, 1, 2)
    scale = _conv_naive(np.abs(x), np.abs(p["W"]), np.abs(p["b"]), 2, 1, 2)
    assert np.all(np.abs(y - want) <= (2 * 3 * 3 + 1) * U32 * scale)


def test_pools_match_naive():
    m = _model([{"name": "mp", "type": "maxpool", "kernel": 2},
                {"name": "ap", "type": "avgpool", "kernel": 3, "stride": 1, "padding": 1}], (2, 6, 6))
    x = np.random.default_rng(1).standard_normal((3, 2, 6, 6)).astype(np.float32)
    y, _ = L.forward(m.layers[0], {}, [x], True, {})
    np.testing.assert_array_equal(y, x.reshape(3, 2, 3, 2, 3, 2).max(axis=(3, 5)))
    z, _ = L.forward(m.layers[1], {}, [y], True, {})
    yp = np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(yp[:, :, i:i + 3, j:j + 3] for i in range(3) for j in range(3)) / 9
    # a float32 sum of 9 terms and the division by 9: at most 10 roundings (worst case),
    # relative to the mean of the absolute values
    scale = sum(np.abs(yp[:, :, i:i + 3, j:j + 3]) for i in range(3) for j in range(3)) / 9
    assert np.all(np.abs(z - want) <= 10 * U32 * scale)


# every layer type: directional finite difference of <y, r> against <backward, u>
CASES = [
    ([{"name": "l", "type": "dense", "units": 5}], [(7,)]),
    ([{"name": "l", "type": "dense", "units": 3}], [(4, 6)]),
    ([{"name": "l", "type": "conv2d", "out_channels": 3, "kernel": 3, "padding": 1}], [(2, 5, 5)]),
    ([{"name": "l", "type": "conv2d", "out_channels": 4, "kernel": 2, "stride": 2, "groups": 2}], [(2, 6, 6)]),
    ([{"name": "l", "type": "maxpool", "kernel": 2}], [(2, 4, 4)]),
    ([{"name": "l", "type": "avgpool", "kernel": 3, "stride": 2, "padding": 1}], [(2, 5, 5)]),
    ([{"name": "l", "type": "globalavgpool"}], [(3, 4, 4)]),
    ([{"name": "l", "type": "relu"}], [(9,)]),
    ([{"name": "l", "type": "tanh"}], [(9,)]),
    ([{"name": "l", "type": "sigmoid"}], [(9,)]),
    ([{"name": "l", "type": "gelu"}], [(9,)]),
    ([{"name": "l", "type": "softmax"}], [(6,)]),
    ([{"name": "l", "type": "batchnorm"}], [(3, 4, 4)]),
    ([{"name": "l", "type": "batchnorm"}], [(6,)]),
    ([{"name": "l", "type": "layernorm"}], [(3, 8)]),
    ([{"name": "l", "type": "flatten"}], [(2, 3, 3)]),
    ([{"name": "a", "type": "relu"}, {"name": "l", "type": "add", "inputs": ["a", "input"]}], [(5,)]),
    ([{"name": "a", "type": "tanh"}, {"name": "l", "type": "concat", "inputs": ["a", "input"], "axis": 0}],
     [(2, 3)]),
    ([{"name": "l", "type": "take", "index": 1}], [(3, 4)]),
]


@pytest.mark.parametrize("layers,shapes", CASES, ids=[c[0][-1]["type"] + str(c[1][0]) for c in CASES])
def test_backward_matches_finite_differences(layers, shapes):
    m = _model(layers, shapes[0])
    prog = StageProgram(m, 0, len(m.layers) - 1)
    params, state = init_stage_params(m, 0, len(m.layers) - 1, seed=3)
    rng = np.random.default_rng(5)
    for lp in params.values():  # non-trivial biases and scales
        for k in lp:
            lp[k] = (lp[k] + 0.3 * rng.standard_normal(lp[k].shape)).astype(np.float32)
    x = rng.standard_normal((4,) + shapes[0]).astype(np.float32)
    out, cache = prog.forward(params, {"input": x}, True, state)
    name = prog.outputs[0]
    r = rng.standard_normal(out[name].shape).astype(np.float32)
    gin, gw = prog.backward(cache, {name: r})

    def f(xv, pv):
        o, _ = prog.forward(pv, {"input": xv}, True, {k: dict(v) for k, v in state.items()})
        return float((o[name].astype(F64) * r).sum())

    # Central differences with eps = 1e-2 in float32: truncation eps^2 / 6 x the third
    # derivative and rounding u32 |f| / eps are both about 1e-5 here; the bound 2e-2 (relative,
    # or absolute below 1) is for a direction that crosses a kink of relu or maxpool (an O(eps)
    # jump), and it still catches a wrong backward, whose error is O(1)
    eps = 1e-2
    u = rng.standard_normal(x.shape).astype(np.float32)
    num = (f(x + eps * u, params) - f(x - eps * u, params)) / (2 * eps)
    ana = float((gin["input"].astype(F64) * u).sum())
    assert abs(num - ana) <= 2e-2 * max(1.0, abs(ana)), (num, ana)
    for lname, lp in params.items():
        for pname, w in lp.items():
            du = rng.standard_normal(w.shape).astype(np.float32)
            plus = {k: dict(v) for k, v in params.items()}
            minus = {k: dict(v) for k, v in params.items()}
            plus[lname][pname] = w + eps * du
            minus[lname][pname] = w - eps * du
            num = (f(x, plus) - f(x, minus)) / (2 * eps)
            ana = float((gw[lname][pname].astype(F64) * du).sum())
            assert abs(num - ana) <= 2e-2 * max(1.0, abs(ana)), (lname, pname, num, ana)


def test_softmax_cross_entropy_value_and_gradient():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 10)).astype(np.float32) * 3
    y = np.array([0, 3, 9, 3, 1])
    loss, g = L.softmax_cross_entropy(z, y, 0.25)
    zz = z.astype(F64)
    want = (np.log(np.exp(zz).sum(1)) - zz[np.arange(5), y]).sum() * 0.25
    # per sample in float32: log of a sum of K = 10 exponentials <= 1 (K + 2 roundings of a
    # value of size 1, plus log K), minus the shifted target logit (one rounding of its size),
    # minus again (one rounding of nll's size); the sum over samples is float64
    K = z.shape[1]
    shifted = zz - zz.max(1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(5), y]
    err = 0.25 * U32 * (K + 2 + np.log(K) + np.abs(shifted[np.arange(5), y]) + nll).sum()
    assert loss == pytest.approx(want, rel=0, abs=err)
    prob = np.exp(zz) / np.exp(zz).sum(1, keepdims=True)
    p = prob.copy()
    p[np.arange(5), y] -= 1
    # softmax in float32: each probability within (K + 4) u32 relative (exp, the sum of K,
    # the division), the target's - 1 one more rounding, times 0.25 exact
    assert np.all(np.abs(g - p * 0.25) <= 0.25 * U32 * ((K + 4) * prob + 1))


def test_sgd_momentum_two_steps():
    w = {"l": {"W": np.array([1.0, -2.0], np.float32)}}
    opt = Optimizer("sgd", lr=0.1, momentum=0.9)
    g1, g2 = np.array([0.5, 1.0], np.float32), np.array([-1.0, 2.0], np.float32)
    opt.step(w, {"l": {"W": g1}})
    opt.step(w, {"l": {"W": g2}})
    v1 = g1
    v2 = 0.9 * v1 + g2
    # float32: 0.1 and 0.9 rounded (2), v *= , v += , lr x v and w -= per step (4 each):
    # 10 roundings, each at most the size of the largest term |w0| + 0.1 (|v1| + |v2|)
    want = np.array([1.0, -2.0]) - 0.1 * v1 - 0.1 * v2
    scale = np.array([1.0, 2.0]) + 0.1 * (np.abs(v1) + np.abs(v2))
    assert np.all(np.abs(w["l"]["W"] - want) <= 10 * U32 * scale)


def test_adam_first_step_is_lr_times_sign():
    w = {"l": {"W": np.zeros(3, np.float32)}}
    opt = Optimizer("adam", lr=0.01)
    g = np.array([3.0, -0.2, 1e-3], np.float32)
    opt.step(w, {"l": {"W": g}})
    # exactly -lr g / (|g| + eps) (eps = 1e-8 moves the 1e-3 entry by 1e-5 relative), through
    # about 12 float32 roundings (beta, 1 - beta, m, s, bias corrections, sqrt, +, /, x, -=)
    want = -0.01 * g.astype(F64) / (np.abs(g.astype(F64)) + 1e-8)
    np.testing.assert_allclose(w["l"]["W"], want, rtol=12 * U32, atol=0)
    # lr x sign: eps / |g| = 1e-8 / 1e-3 relative for the smallest entry, plus the roundings above
    np.testing.assert_allclose(w["l"]["W"], [-0.01, 0.01, -0.01], rtol=1e-8 / 1e-3 + 12 * U32, atol=0)
    st = opt.state()
    opt2 = Optimizer("adam", lr=0.01)
    opt2.load(st)
    assert opt2.step_count == 1 and np.array_equal(opt2.slots["m"]["l"]["W"], opt.slots["m"]["l"]["W"])


RESNETISH = [
    {"name": "c1", "type": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "b1", "type": "batchnorm"},
    {"name": "r1", "type": "relu"},
    {"name": "c2", "type": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
    {"name": "r2", "type": "relu"},
    {"name": "add", "type": "add", "inputs": ["r2", "r1"]},
    {"name": "p", "type": "maxpool", "kernel": 2},
    {"name": "f", "type": "flatten"},
    {"name": "d", "type": "dense", "units": 10},
]


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_stage_chain_equals_whole_model(data):
    """Any cut of a model with a skip connection and batch-norm: chained stages == one stage."""
    m = _model(RESNETISH, (2, 6, 6)) if data.draw(st.booleans()) else get("tiny-cnn")
    n = len(m.layers)
    cuts = sorted(data.draw(st.sets(st.integers(0, n - 2), max_size=4)))
    bounds = [-1, *cuts, n - 1]
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = rng.random((3,) + m.inputs[0].shape).astype(np.float32)
    whole = StageProgram(m, 0, n - 1)
    wp, ws = init_stage_params(m, 0, n - 1, 1)
    y, cache = whole.forward(wp, {"input": x}, True, ws)
    r = rng.standard_normal(y[whole.outputs[0]].shape).astype(np.float32)
    _, gw = whole.backward(cache, {whole.outputs[0]: r})
    progs, caches, tensors = [], [], {"input": x}
    for a, b in zip(bounds, bounds[1:]):
        pr = StageProgram(m, a + 1, b)
        p, s = init_stage_params(m, a + 1, b, 1)
        out, c = pr.forward(p, {k: tensors[k] for k in pr.inputs}, True, s)
        progs.append(pr)
        caches.append(c)
        tensors = out
    # the chained stages run the same float32 operations on the same arrays as the whole model:
    # bit-identical
    np.testing.assert_array_equal(tensors[whole.outputs[0]], y[whole.outputs[0]])
    grads = {whole.outputs[0]: r}
    got = {}
    for pr, c in zip(reversed(progs), reversed(caches)):
        gin, g = pr.backward(c, {k: grads[k] for k in pr.outputs})
        got.update(g)
        grads = gin
    for lname, d in gw.items():
        for pname, g in d.items():
            np.testing.assert_array_equal(got[lname][pname], g)  # same operations: bit-identical


def test_unsupported_layer_is_a_spec_error():
    from bapipe.errors import SpecError

    m = _model([{"name": "l", "type": "lstm", "hidden": 4}], (3, 2))
    with pytest.raises(SpecError, match="lstm"):
        StageProgram(m, 0, 0)
