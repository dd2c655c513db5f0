"""Matrix-vector unit: bit-exact against fpga_models.fixedpoint, exactly NF*SF cycles per vector.

Fill latency (documented in docs/rtl.md): fpga_models.engines.mvu_fill(SIMD) = 4 cycles plus
the adder tree's register stages, from the step that completes a row fold (for the first row
fold: the cycle the vector's last input beat is taken) to that fold's output beat.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config

FMT = "fixed16"

try:
    import cocotb

    from bapipe.codegen.check import sim_tb as tb

    def _case(cfg, n_vec):
        from bapipe.fpga_models.fixedpoint import dense_fwd, relu_fwd
        w = np.array(cfg["w"], dtype=np.int64)
        b = np.array(cfg["b"], dtype=np.int64)
        rng = np.random.default_rng(cfg["seed"])
        mh, mw = w.shape
        # Half the vectors small (no saturation), half full range (saturates often).
        x = np.concatenate([rng.integers(-2048, 2048, (n_vec - n_vec // 2, mw)),
                            rng.integers(-32768, 32768, (n_vec // 2, mw))])
        y = dense_fwd(x, w, b, FMT)
        if cfg["relu"]:
            y = relu_fwd(y)
        return tb.to_unsigned(x.reshape(-1), ELEM_W), tb.to_unsigned(y.reshape(-1), ELEM_W)

    @cocotb.test()
    async def mvu_random(dut):
        """Random idle and backpressure: outputs equal numpy's, vector after vector."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        await tb.start(dut)
        words, expect = _case(cfg, cfg["vectors"])
        await tb.stream_check(dut, words, cfg["simd"], expect, cfg["pe"], ELEM_W, rng, cfg["p_idle"], cfg["p_stall"])

    @cocotb.test()
    async def mvu_timing(dut):
        """No stalls: exactly NF*SF cycles per vector and mvu_fill(SIMD) cycles of fill latency."""
        from bapipe.fpga_models.engines import mvu_fill
        cfg = tb_config()
        await tb.start(dut)
        n_vec = cfg["vectors"]
        words, expect = _case(cfg, n_vec)
        hin, hout = await tb.stream_check(dut, words, cfg["simd"], expect, cfg["pe"], ELEM_W)
        mh, mw = np.array(cfg["w"]).shape
        nf, sf = mh // cfg["pe"], mw // cfg["simd"]
        starts = hout.cycles[::nf]
        per_vec = [b - a for a, b in zip(starts, starts[1:])]
        fill = hout.cycles[0] - hin.cycles[sf - 1]
        dut._log.info("cycles/vector min %d max %d (model NF*SF = %d), fill %d (model %d)",
                      min(per_vec), max(per_vec), nf * sf, fill, mvu_fill(cfg["simd"]))
        assert set(per_vec) == {nf * sf}, per_vec[:10]
        assert fill == mvu_fill(cfg["simd"])
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("mvu")]


def _spec(mw, mh, pe, simd, relu, seed):
    from bapipe.codegen.design.dataflow import MvuSpec
    rng = np.random.default_rng(seed)
    w = rng.integers(-1500, 1500, (mh, mw))
    b = rng.integers(-3000, 3000, mh)
    return MvuSpec("mvu_t", "fc_t", mw, mh, pe, simd, relu, ELEM_W, 10, w, b)


def _build(spec):
    from bapipe.codegen.rtl.pipeline import mvu_files
    from bapipe.codegen.rtl.mem_words import mvu_word_files
    return build(spec.module, {**mvu_files(spec), **mvu_word_files(spec)})


def _env(spec, seed, **kw):
    return dict(w=spec.weights.tolist(), b=spec.bias.tolist(), pe=spec.pe, simd=spec.simd, relu=spec.relu,
                seed=seed, **kw)


# SIMD 4: one tree stage; 1: none; 3 (odd, non-power-of-two lanes): one; 20: three (20 -> 5 -> 2 -> 1 terms)
CASES = [(8, 6, 2, 4, True), (16, 8, 1, 1, False), (12, 9, 3, 3, True), (40, 6, 3, 20, False)]


@pytest.mark.parametrize("mw,mh,pe,simd,relu", CASES)
def test_mvu_short(mw, mh, pe, simd, relu):
    spec = _spec(mw, mh, pe, simd, relu, seed=mw * mh)
    d = _build(spec)
    check(d, spec.module, "cocotb_tests.test_mvu", "mvu_timing", **_env(spec, 1, vectors=40))
    check(d, spec.module, "cocotb_tests.test_mvu", "mvu_random", **_env(spec, 2, vectors=150, p_idle=0.3, p_stall=0.3))


@pytest.mark.slow
@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_mvu_100k():
    spec = _spec(8, 6, 2, 4, True, seed=48)
    d = _build(spec)
    # 2 input beats per vector: 50k vectors = 100k input beats (150k output beats)
    check(d, spec.module, "cocotb_tests.test_mvu", "mvu_random", **_env(spec, 9, vectors=50_000, p_idle=0.1, p_stall=0.1))


def test_mvu_wide_compiles_fast():
    """PE*SIMD = 4608 lanes (VGG-scale folding, 2304 lanes a PE): the PE's generate blocks
    build in well under a minute, and the unit stays bit-exact with exact timing. Few vectors:
    the cocotb drivers, not the model, dominate the run time at 36864-bit beats."""
    spec = _spec(4608, 4, 2, 2304, True, seed=7)
    d = _build(spec)
    check(d, spec.module, "cocotb_tests.test_mvu", "mvu_timing", **_env(spec, 3, vectors=6))


def test_mvu_images_from_mem_dir():
    """`bapipe rtlsim`'s way: images stay in a directory (mem_dir), only Verilog is passed."""
    from bapipe.codegen.rtl.pipeline import mvu_files
    from bapipe.codegen.rtl.mem_words import mvu_word_files
    from bapipe.codegen.check.sim_harness import CACHE
    spec = _spec(8, 6, 2, 4, False, seed=5)
    mem = CACHE / "mvu_mem_dir"   # a fixed path: the build (keyed by it) is reused across runs
    mem.mkdir(parents=True, exist_ok=True)
    for name, data in mvu_word_files(spec).items():
        (mem / name).write_bytes(data)
    d = build(spec.module, mvu_files(spec), mem_dir=mem)
    assert not list((d / "src").glob("*.hex"))
    check(d, spec.module, "cocotb_tests.test_mvu", "mvu_random", **_env(spec, 4, vectors=60, p_idle=0.2, p_stall=0.2))
