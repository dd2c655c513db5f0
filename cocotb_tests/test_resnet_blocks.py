"""Residual-CNN engines: axis_batchnorm, axis_fork, axis_add and pool_unit as a global
average pool. Bit-exact against fpga_models.fixedpoint under random idle and backpressure;
1 beat/cycle without stalls; the stream glue (fork, add) also over 100k beats (-m slow)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config

MOD = "cocotb_tests.test_resnet_blocks"


def bn_params(c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel raw (scale, shift), folded as codegen.design.context.make_weights folds the project's
    draws (fpga_models.weights), with variances down to 0.05 so larger scales occur too."""
    from bapipe.fpga_models.fixedpoint import fold_batchnorm
    rng = np.random.default_rng(seed)
    gamma, beta = rng.uniform(0.5, 1.5, c), rng.uniform(-0.5, 0.5, c)
    mean, var = rng.uniform(-0.5, 0.5, c), rng.uniform(0.05, 1.0, c)
    scale, shift = fold_batchnorm(gamma, beta, mean, var, "fixed16")
    # Extremes too, so saturation is exercised.
    scale[0], shift[-1] = 32767, -32768
    return scale, shift


def _full_rate(hin, hout, latency: int) -> None:
    span = hout.cycles[-1] - hout.cycles[0]
    rate = (len(hout.cycles) - 1) / span
    # a pattern that repeats every q cycles, measured over a span of S cycles, is off by at most one period: q / S (q = 1)
    assert hout.cycles[0] - hin.cycles[0] == latency and abs(rate - 1) <= 1 / span, (hout.cycles[0] - hin.cycles[0], rate)


try:
    import cocotb
    from cocotb.triggers import ClockCycles

    from bapipe.codegen.check import sim_tb as tb

    @cocotb.test()
    async def bn_random(dut):
        """Folded batchnorm per channel of an HWC stream: numpy batchnorm_fwd, beat for beat."""
        from bapipe.fpga_models.fixedpoint import batchnorm_fwd
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes, c = cfg["lanes"], cfg["c"]
        await tb.start(dut)
        scale, shift = bn_params(c, cfg["pseed"])
        x = np.random.default_rng(cfg["seed"]).integers(-32768, 32768, (cfg["beats"] * lanes // c, c))
        words = tb.to_unsigned(x.reshape(-1), ELEM_W)
        expect = tb.to_unsigned(batchnorm_fwd(x, scale, shift, "fixed16").reshape(-1), ELEM_W)
        hin, hout = await tb.stream_check(dut, words, lanes, expect, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"])
        if cfg["p_idle"] == 0 and cfg["p_stall"] == 0:
            _full_rate(hin, hout, 1)

    @cocotb.test()
    async def gap_random(dut):
        """pool_unit with TAPS = H*W on a bare HWC stream = global average pool (globalavgpool_fwd)."""
        from bapipe.fpga_models.fixedpoint import globalavgpool_fwd
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes, c, hw, n = cfg["lanes"], cfg["c"], cfg["hw"], cfg["images"]
        await tb.start(dut)
        x = np.random.default_rng(cfg["seed"]).integers(-32768, 32768, (n, c, hw, 1))
        x[0] = 32767   # saturation of the mean is impossible, but the extreme sums are exercised
        words = tb.to_unsigned(x.transpose(0, 2, 3, 1).reshape(-1), ELEM_W)
        expect = tb.to_unsigned(globalavgpool_fwd(x, "fixed16").reshape(-1), ELEM_W)
        hin, hout = await tb.stream_check(dut, words, lanes, expect, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"])
        if cfg["p_idle"] == 0 and cfg["p_stall"] == 0:
            # one output fold per input fold of the last pixel: n*C/lanes beats over n*HW*C/lanes cycles
            span = hout.cycles[-1] - hin.cycles[0] + 1
            assert abs(span - n * hw * c // lanes - 1) <= 1, span

    @cocotb.test()
    async def fork_random(dut):
        """Broadcast: both outputs get every beat once, in order, each with its own backpressure."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes = cfg["lanes"]
        await tb.start(dut)
        hin, h0 = tb.Handshakes(dut, "s_axis"), tb.Handshakes(dut, "m0_axis")
        src = tb.source(dut, "s_axis", ELEM_W, rng, cfg["p_idle"])
        s0 = tb.sink(dut, "m0_axis", ELEM_W, random.Random(cfg["seed"] + 1), cfg["p_stall"])
        s1 = tb.sink(dut, "m1_axis", ELEM_W, random.Random(cfg["seed"] + 2), cfg["p_stall"])
        words = [rng.randrange(1 << ELEM_W) for _ in range(cfg["beats"] * lanes)]
        cocotb.start_soon(tb.send_all(src, words, lanes))
        got0 = await tb.recv_words(s0, len(words))
        got1 = await tb.recv_words(s1, len(words))
        assert got0 == words and got1 == words, "beats lost, duplicated or reordered"
        await ClockCycles(dut.clk, 20)
        assert s0.empty() and s1.empty(), "extra beats after the end"
        if cfg["p_idle"] == 0 and cfg["p_stall"] == 0:
            _full_rate(hin, h0, 0)

    @cocotb.test()
    async def add_random(dut):
        """Saturating add of two independently paced streams: numpy add_fwd, beat for beat."""
        from bapipe.fpga_models.fixedpoint import add_fwd
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes, n = cfg["lanes"], cfg["beats"] * cfg["lanes"]
        await tb.start(dut)
        h0, hout = tb.Handshakes(dut, "s0_axis"), tb.Handshakes(dut, "m_axis")
        gen = np.random.default_rng(cfg["seed"])
        a, b = gen.integers(-32768, 32768, n), gen.integers(-32768, 32768, n)
        src0 = tb.source(dut, "s0_axis", ELEM_W, random.Random(cfg["seed"] + 1), cfg["p_idle"])
        src1 = tb.source(dut, "s1_axis", ELEM_W, random.Random(cfg["seed"] + 2), cfg["p_idle"])
        snk = tb.sink(dut, "m_axis", ELEM_W, rng, cfg["p_stall"])
        cocotb.start_soon(tb.send_all(src0, tb.to_unsigned(a, ELEM_W), lanes))
        cocotb.start_soon(tb.send_all(src1, tb.to_unsigned(b, ELEM_W), lanes))
        got = await tb.recv_words(snk, n)
        assert got == tb.to_unsigned(add_fwd(a, b, "fixed16"), ELEM_W), "sum differs"
        await ClockCycles(dut.clk, 20)
        assert snk.empty(), "extra beats after the end"
        if cfg["p_idle"] == 0 and cfg["p_stall"] == 0:
            _full_rate(h0, hout, 0)
    @cocotb.test()
    async def swg_pad_min(dut):
        """Window generator with PAD_MIN = 1 (ResNet's padded 3x3/2 max pool): padding is the
        most negative value, as fixedpoint.maxpool_fwd's -inf padding never wins either."""
        from bapipe.fpga_models.fixedpoint import im2col
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        c, h = cfg["c"], cfg["h"]
        await tb.start(dut)
        x = np.random.default_rng(cfg["seed"]).integers(-32768, 32768, (cfg["images"], c, h, h))
        cols = im2col(x, 3, 2, 1, pad_value=-32768)
        words = tb.to_unsigned(x.transpose(0, 2, 3, 1).reshape(-1), ELEM_W)
        await tb.stream_check(dut, words, cfg["simd"], tb.to_unsigned(cols.reshape(-1), ELEM_W), cfg["simd"], ELEM_W,
                              rng, cfg["p_idle"], cfg["p_stall"])
except ImportError:  # imported by pytest without cocotb's simulator context
    pass


pytestmark = [*needs_verilator, xdist_group("resnet_blocks")]


def _bn(lanes: int, c: int, pseed: int):
    from bapipe.codegen.rtl.pipeline import verilog_hex
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import clog2
    scale, shift = bn_params(c, pseed)
    return build("axis_batchnorm", {"axis_batchnorm.v": render_template("axis_batchnorm")},
                 {"LANES": lanes, "ELEM_W": ELEM_W, "FRAC": 10, "C": c, "CF_W": clog2(c // lanes),
                  "SCALE": verilog_hex(list(scale), ELEM_W), "SHIFT": verilog_hex(list(shift), ELEM_W)})


def _glue(name: str, params: dict):
    from bapipe.codegen.rtl.env import render_template
    return build(name, {f"{name}.v": render_template(name)}, params)


def test_batchnorm():
    d = _bn(2, 6, 3)
    check(d, "axis_batchnorm", MOD, "bn_random", lanes=2, c=6, pseed=3, beats=600, seed=0, p_idle=0, p_stall=0)
    check(d, "axis_batchnorm", MOD, "bn_random", lanes=2, c=6, pseed=3, beats=3000, seed=1, p_idle=0.3, p_stall=0.3)


def test_global_avgpool():
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import clog2
    from bapipe.fpga_models.fixedpoint import AVG_BITS, avg_recip
    c, lanes, hw = 8, 2, 49
    d = build("pool_unit", {"pool_unit.v": render_template("pool_unit")},
              {"C": c, "SIMD": lanes, "TAPS": hw, "MODE": 1, "ELEM_W": ELEM_W, "ACC_W": ELEM_W + clog2(hw) + 1,
               "AVG_R": avg_recip(hw), "AVG_BITS": AVG_BITS, "TAP_W": clog2(hw), "CF_W": clog2(c // lanes)})
    check(d, "pool_unit", MOD, "gap_random", lanes=lanes, c=c, hw=hw, images=4, seed=0, p_idle=0, p_stall=0)
    check(d, "pool_unit", MOD, "gap_random", lanes=lanes, c=c, hw=hw, images=8, seed=1, p_idle=0.3, p_stall=0.3)


def test_fork():
    d = _glue("axis_fork", {"DATA_W": 3 * ELEM_W})
    check(d, "axis_fork", MOD, "fork_random", lanes=3, beats=500, seed=0, p_idle=0, p_stall=0)
    check(d, "axis_fork", MOD, "fork_random", lanes=3, beats=3000, seed=1, p_idle=0.3, p_stall=0.3)


def test_add():
    d = _glue("axis_add", {"LANES": 3, "ELEM_W": ELEM_W})
    check(d, "axis_add", MOD, "add_random", lanes=3, beats=500, seed=0, p_idle=0, p_stall=0)
    check(d, "axis_add", MOD, "add_random", lanes=3, beats=3000, seed=1, p_idle=0.3, p_stall=0.3)


@pytest.mark.slow
@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_fork_add_100k():
    check(_glue("axis_fork", {"DATA_W": 3 * ELEM_W}), "axis_fork", MOD, "fork_random", lanes=3, beats=100_000, seed=5,
          p_idle=0.1, p_stall=0.1)
    check(_glue("axis_add", {"LANES": 3, "ELEM_W": ELEM_W}), "axis_add", MOD, "add_random", lanes=3, beats=100_000,
          seed=6, p_idle=0.1, p_stall=0.1)


def test_swg_pad_min():
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import SwgSpec
    spec = SwgSpec(4, 7, 7, 3, 1, 2, 2)
    d = build("swg", {"swg.v": render_template("swg")}, {**spec.params(ELEM_W), "PAD_MIN": 1})
    check(d, "swg", MOD, "swg_pad_min", c=4, h=7, simd=2, images=3, seed=2, p_idle=0.2, p_stall=0.2)
