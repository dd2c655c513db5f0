"""Inter-board link: link_tx + link_emulator + link_rx with credit-based flow control.

Checks: no beat lost, duplicated or reordered under random idle and backpressure, no
overflow ever (credits are exact); without backpressure the link runs at its configured
bandwidth (>= 98%, model within 2%) with latency LATENCY + 1 cycles (the receiver FIFO);
with too few credits the rate drops to credits / (2*LATENCY + LINK_LOOP), as modelled.
"""
from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config

try:
    import cocotb

    from bapipe.codegen.check import sim_tb as tb

    @cocotb.test()
    async def link_random(dut):
        """Random idle and backpressure: exact stream, overflow flag never raised."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes = cfg["lanes"]
        await tb.start(dut)
        words = [rng.randrange(1 << ELEM_W) for _ in range(cfg["beats"] * lanes)]
        await tb.stream_check(dut, words, lanes, words, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"])
        assert int(dut.overflow.value) == 0, "a beat arrived with no room: credit accounting is wrong"

    @cocotb.test()
    async def link_timing(dut):
        """No backpressure: measured beats/cycle and latency against the model."""
        cfg = tb_config()
        lanes = cfg["lanes"]
        await tb.start(dut)
        hlink = tb.Handshakes(dut, "link", ready=False)
        words = [i & 0xFFFF for i in range(cfg["beats"] * lanes)]
        hin, hout = await tb.stream_check(dut, words, lanes, words, lanes, ELEM_W)
        n = len(hout.cycles)
        rate = (n - 1) / (hout.cycles[-1] - hout.cycles[0])
        latency = hout.cycles[0] - hin.cycles[0]
        expect_rate = float(Fraction(cfg["rate"]))
        util = rate * cfg["beat_bytes"] / float(Fraction(cfg["bw"]))
        dut._log.info("rate %.4f beats/cycle (model %.4f), link utilisation %.4f, latency %d (model %d)",
                      rate, expect_rate, util, latency, cfg["latency"])
        assert len(hlink.cycles) == cfg["beats"]
        # the link moves p beats every q cycles (rate p / q): over a span of S cycles the beat
        # count is off by at most one period's p beats, so the rate by rate x q / S
        span = hout.cycles[-1] - hout.cycles[0]
        q = Fraction(cfg["rate"]).denominator
        assert abs(rate - expect_rate) <= expect_rate * q / span
        assert latency == cfg["latency"]   # whole cycles: the model's latency exactly
        assert int(dut.overflow.value) == 0
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("link")]
WRAPPER = Path(__file__).with_name("link_chain.v")


def link_files() -> dict[str, str]:
    """Sources of the link_chain testbench top."""
    from bapipe.codegen.rtl.env import render_template
    files = {f"{n}.v": render_template(n) for n in ("axis_fifo", "link_tx", "link_rx", "link_emulator")}
    files["link_chain.v"] = WRAPPER.read_text()
    return files


def link_params(lanes: int, bw: Fraction, latency: int, credits: int | None = None) -> tuple[dict, object]:
    """link_chain parameters for a link of ``bw`` bytes/cycle, sized by codegen.design.dataflow."""
    from bapipe.codegen.design.dataflow import LinkSpec, clog2, count_bits, credit_depth
    beat_bytes = lanes * ELEM_W // 8
    rate = min(Fraction(1), bw / beat_bytes)
    link = LinkSpec("a", "b", beat_bytes, bw.numerator, bw.denominator, latency,
                    credits if credits is not None else credit_depth(rate, latency))
    p = link.emulator_params(lanes, ELEM_W)
    p.update(CREDITS=link.credits, CREDIT_W=count_bits(link.credits), ADDR_W=clog2(link.credits))
    return p, link


# The inference pipelines now cross boards through the transport (test_transport.py); this
# single-clock credit link remains for the training RTL (codegen/rtl/train.py) and
# bench/bench_rtl.py, so its runs moved to make test-all.
@pytest.mark.soak
@pytest.mark.parametrize("lanes,bw,latency", [(4, Fraction(5), 20), (1, Fraction(3, 4), 3)])
def test_link_short(lanes, bw, latency):
    from bapipe.codegen.design.dataflow import LINK_LOOP
    params, link = link_params(lanes, bw, latency)
    d = build("link_chain", link_files(), params)
    check(d, "link_chain", "cocotb_tests.test_link", "link_timing", lanes=lanes, beats=1500, bw=str(bw),
          beat_bytes=link.beat_bytes, rate=str(link.beats_per_cycle), latency=latency + 1)
    check(d, "link_chain", "cocotb_tests.test_link", "link_random", lanes=lanes, beats=1500, seed=lanes,
          p_idle=0.3, p_stall=0.4)
    assert link.credits >= link.beats_per_cycle * (2 * latency + LINK_LOOP)


@pytest.mark.soak
def test_link_credit_starved():
    """Half the credits the round trip needs: the rate falls to credits per round trip."""
    from bapipe.codegen.design.dataflow import LINK_LOOP
    params, link = link_params(4, Fraction(8), 20, credits=20)
    d = build("link_chain", link_files(), params)
    rate = Fraction(20, 2 * 20 + LINK_LOOP)
    check(d, "link_chain", "cocotb_tests.test_link", "link_timing", lanes=4, beats=1500, bw="8",
          beat_bytes=8, rate=str(rate), latency=21)


@pytest.mark.slow
@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_link_100k():
    params, _ = link_params(4, Fraction(5), 20)
    d = build("link_chain", link_files(), params)
    check(d, "link_chain", "cocotb_tests.test_link", "link_random", lanes=4, beats=100_000, seed=11,
          p_idle=0.15, p_stall=0.15)
