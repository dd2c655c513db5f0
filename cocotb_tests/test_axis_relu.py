"""axis_relu: max(q, 0) per lane, bit-exact against numpy, zero latency, full rate."""
from __future__ import annotations

import random

import numpy as np
import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config

try:
    import cocotb

    from bapipe.codegen.check import sim_tb as tb

    @cocotb.test()
    async def relu_random(dut):
        """Random idle/backpressure; output = numpy relu of the input, beat for beat."""
        from bapipe.fpga_models.fixedpoint import relu_fwd
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes = cfg["lanes"]
        await tb.start(dut)
        x = np.random.default_rng(cfg["seed"]).integers(-32768, 32768, cfg["beats"] * lanes)
        words, expect = tb.to_unsigned(x, ELEM_W), tb.to_unsigned(relu_fwd(x), ELEM_W)
        hin, hout = await tb.stream_check(dut, words, lanes, expect, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"])
        if cfg["p_idle"] == 0 and cfg["p_stall"] == 0:
            span = hout.cycles[-1] - hout.cycles[0]
            rate = (len(hout.cycles) - 1) / span
            # a pattern that repeats every q cycles, measured over a span of S cycles, is off by at most one period: q / S (q = 1)
            assert hout.cycles[0] == hin.cycles[0] and abs(rate - 1) <= 1 / span
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("axis_relu")]


def _build(lanes):
    from bapipe.codegen.rtl.env import render_template
    return build("axis_relu", {"axis_relu.v": render_template("axis_relu")}, {"LANES": lanes, "ELEM_W": ELEM_W})


def test_relu_short():
    d = _build(3)
    check(d, "axis_relu", "cocotb_tests.test_axis_relu", "relu_random", lanes=3, beats=400, seed=0, p_idle=0, p_stall=0)
    check(d, "axis_relu", "cocotb_tests.test_axis_relu", "relu_random", lanes=3, beats=2000, seed=1,
          p_idle=0.3, p_stall=0.3)


@pytest.mark.slow
@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_relu_100k():
    d = _build(3)
    check(d, "axis_relu", "cocotb_tests.test_axis_relu", "relu_random", lanes=3, beats=100_000, seed=2,
          p_idle=0.1, p_stall=0.1)
