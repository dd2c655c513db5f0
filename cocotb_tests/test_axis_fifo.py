"""axis_fifo: randomised no-loss/no-reorder runs, full-rate throughput, one-cycle latency."""
from __future__ import annotations

import random

import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config


# ----------------------------------------------------------------- cocotb side

try:
    import cocotb
    from cocotb.triggers import ClockCycles

    from bapipe.codegen.check import sim_tb as tb

    @cocotb.test()
    async def fifo_random(dut):
        """Random idle and backpressure: every beat out exactly once, in order."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes = cfg["lanes"]
        await tb.start(dut)
        src = tb.source(dut, "s_axis", ELEM_W, rng, cfg["p_idle"])
        snk = tb.sink(dut, "m_axis", ELEM_W, rng, cfg["p_stall"])
        mon = tb.monitor(dut, "s_axis", ELEM_W)
        words = [rng.randrange(1 << ELEM_W) for _ in range(cfg["beats"] * lanes)]
        cocotb.start_soon(tb.send_all(src, words, lanes))
        got = await tb.recv_words(snk, len(words))
        seen = await tb.recv_words(mon, len(words))
        assert seen == words, "monitor saw different input beats"
        assert got == words, "beats lost, duplicated or reordered"
        await ClockCycles(dut.clk, 20)
        assert snk.empty(), "extra beats after the end"

    @cocotb.test()
    async def fifo_timing(dut):
        """No backpressure: one beat per cycle, first beat out one cycle after it went in."""
        cfg = tb_config()
        lanes, n = cfg["lanes"], cfg["beats"]
        await tb.start(dut)
        hin, hout = tb.Handshakes(dut, "s_axis"), tb.Handshakes(dut, "m_axis")
        src = tb.source(dut, "s_axis", ELEM_W)
        snk = tb.sink(dut, "m_axis", ELEM_W)
        words = list(range(n * lanes))
        cocotb.start_soon(tb.send_all(src, words, lanes))
        assert await tb.recv_words(snk, len(words)) == words
        latency = hout.cycles[0] - hin.cycles[0]
        interval = (hout.cycles[-1] - hout.cycles[0]) / (n - 1)
        dut._log.info("latency %d cycles, %.4f cycles/beat", latency, interval)
        assert latency == 1, latency   # whole cycles
        # a beat every cycle measured over n - 1 beats: off by at most one period (one cycle),
        # 1 / (n - 1) cycles per beat
        assert abs(interval - 1.0) <= 1 / (n - 1), interval
except ImportError:  # imported by pytest without cocotb's simulator context
    pass


# ----------------------------------------------------------------- pytest side

pytestmark = [*needs_verilator, xdist_group("axis_fifo")]


def _build(depth: int, lanes: int):
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import clog2, count_bits
    return build("axis_fifo", {"axis_fifo.v": render_template("axis_fifo")},
                 {"DATA_W": lanes * ELEM_W, "DEPTH": depth, "ADDR_W": clog2(depth), "COUNT_W": count_bits(depth)})


@pytest.mark.parametrize("depth,lanes", [(5, 2)])
def test_fifo_short(depth, lanes):
    d = _build(depth, lanes)
    check(d, "axis_fifo", "cocotb_tests.test_axis_fifo", "fifo_timing", lanes=lanes, beats=500)
    check(d, "axis_fifo", "cocotb_tests.test_axis_fifo", "fifo_random", lanes=lanes, beats=2000, seed=depth,
          p_idle=0.3, p_stall=0.3)


@pytest.mark.slow
@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_fifo_100k():
    d = _build(5, 2)
    check(d, "axis_fifo", "cocotb_tests.test_axis_fifo", "fifo_random", lanes=2, beats=100_000, seed=7,
          p_idle=0.2, p_stall=0.2)
