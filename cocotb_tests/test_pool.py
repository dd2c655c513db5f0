"""Pooling (swg + pool_unit): max and average bit-exact against fpga_models.fixedpoint.

The window generator is tested on its own in test_swg.py; here pool_unit reduces its
windows. Timing model: one input beat per cycle, output beat latency 1 after the last tap.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config

try:
    import cocotb

    from bapipe.codegen.check import sim_tb as tb

    def _case(cfg, n_img, seed):
        from bapipe.fpga_models.fixedpoint import im2col, maxpool_fwd, avgpool_fwd
        c, h, w, k, pad = cfg["c"], cfg["h"], cfg["w"], cfg["k"], cfg["pad"]
        rng = np.random.default_rng(seed)
        x = rng.integers(-32768, 32768, (n_img, c, h, w))
        cols = im2col(x, k, k, pad)                                   # the window stream the swg makes
        if cfg["mode"] == 0:
            y = maxpool_fwd(x, k, k, pad)
        else:
            y = avgpool_fwd(x, k, "fixed16", k, pad)
        return (tb.to_unsigned(cols.reshape(-1), ELEM_W),
                tb.to_unsigned(y.transpose(0, 2, 3, 1).reshape(-1), ELEM_W))

    @cocotb.test()
    async def pool_random(dut):
        """Random idle/backpressure over several images of windows."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        await tb.start(dut)
        words, expect = _case(cfg, cfg["images"], cfg["seed"])
        hin, hout = await tb.stream_check(dut, words, cfg["simd"], expect, cfg["simd"], ELEM_W, rng,
                                          cfg["p_idle"], cfg["p_stall"])
        if cfg["p_idle"] == 0 and cfg["p_stall"] == 0:
            taps, cf = cfg["k"] ** 2, cfg["c"] // cfg["simd"]
            span = hin.cycles[-1] - hin.cycles[0]
            rate = (len(hin.cycles) - 1) / span
            assert abs(rate - 1) <= 1 / span   # a pattern that repeats every q cycles, measured over a span of S cycles, is off by at most one period: q / S (q = 1)
            assert hout.cycles[0] - hin.cycles[(taps - 1) * cf] == 1
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("pool")]


def _build(c, simd, k, mode):
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import clog2
    from bapipe.fpga_models.fixedpoint import AVG_BITS, avg_recip
    taps = k * k
    return build("pool_unit", {"pool_unit.v": render_template("pool_unit")},
                 {"C": c, "SIMD": simd, "TAPS": taps, "MODE": mode, "ELEM_W": ELEM_W, "ACC_W": ELEM_W + clog2(taps) + 1,
                  "AVG_R": avg_recip(taps), "AVG_BITS": AVG_BITS, "TAP_W": clog2(taps), "CF_W": clog2(c // simd)})


@pytest.mark.parametrize("mode,k,simd", [(0, 2, 2), pytest.param(1, 3, 1, marks=pytest.mark.soak)])
def test_pool_short(mode, k, simd):
    d = _build(4, simd, k, mode)
    env = dict(c=4, h=6, w=6, k=k, pad=0, mode=mode, simd=simd)
    check(d, "pool_unit", "cocotb_tests.test_pool", "pool_random", **env, images=3, seed=0, p_idle=0, p_stall=0)
    check(d, "pool_unit", "cocotb_tests.test_pool", "pool_random", **env, images=8, seed=1, p_idle=0.3, p_stall=0.3)


@pytest.mark.slow
@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_pool_100k():
    d = _build(4, 1, 3, 1)
    # 3x3 windows of a 6x6x4 image, 1 channel per beat: 144 beats per image, 700 images = 100.8k beats
    check(d, "pool_unit", "cocotb_tests.test_pool", "pool_random", c=4, h=6, w=6, k=3, pad=0, mode=1, simd=1,
          images=700, seed=3, p_idle=0.1, p_stall=0.1)
