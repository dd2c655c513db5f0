"""The board-to-board transport's timing has one home (fpga_models.engines link_*): the planner's
and bapipe sim's price of a transfer (engines.link_transfer) is what the RTL's transport
(codegen.design.links.TransportSpec) does with the same vector, for every message size and line rate
tried; a link that is not between two FPGAs carries the bare payload."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from bapipe.codegen.design.links import transport
from bapipe.codegen.design.dataflow import make_link
from bapipe.fpga_models import engines

CLOCK = 300e6


@pytest.mark.parametrize("bw_Bps", [1.19e10, 2.5e10, 4.0e9, 3.0e10])
def test_link_transfer_is_the_transports_timing(bw_Bps):
    """For 1..300 fixed16 elements a sample and 1 or 3 samples: line bytes / bytes per cycle =
    samples x TransportSpec.cycles_per_sample of the engines' packing (link_lanes), and the
    framing latency = TransportSpec.delivery_latency - the channel's latency; never below the
    payload (a beat carries 60 payload bytes at most)."""
    link = make_link("a", "b", bw_Bps, 5e-7, CLOCK, 2)
    bpc = Fraction(link.bw_num, link.bw_den)
    bw = float(bpc) * CLOCK          # the bandwidth the RTL link carries (limit_denominator(64))
    for samples in (1, 3):
        elems = np.arange(1, 301)
        line, extra = engines.link_transfer(elems * 2 * samples, 2, samples, bw, CLOCK)
        for n, lb, ex in zip(elems, line, extra):
            lanes = engines.link_lanes(int(n), 16, bpc)
            t = transport(link, lanes, 16, int(n) // lanes)
            # float seconds and bytes against exact fractions: a few roundings of 2^-52
            assert lb / float(bpc) == pytest.approx(samples * float(t.cycles_per_sample), rel=1e-12)
            assert ex * CLOCK == pytest.approx(t.delivery_latency - link.latency, rel=1e-12)
            assert lb >= n * 2 * samples
            assert t.slices == 1 and lanes * 16 <= engines.LINK_BEAT_BITS - engines.LINK_HEADER_BITS


def test_hand_counted_messages():
    """64 fixed16 elements at 119/3 B/cycle: 16 lanes, one 256-bit word a beat, 4 beats of 64 B =
    256 line bytes, 3 framing cycles; 10 elements: one 160-bit word, one beat, 64 B; 1 element:
    a 16-bit word in one beat, 64 B."""
    bw = 119 / 3 * CLOCK
    line, extra = engines.link_transfer(np.array([128, 20, 2]), 2, 1, bw, CLOCK)
    assert line.tolist() == pytest.approx([256.0, 64.0, 64.0], rel=1e-15)   # float bytes / cycle x cycles
    assert (extra * CLOCK).tolist() == pytest.approx([3.0, 3.0, 3.0], rel=1e-12)
    assert engines.link_lanes(64, 16, Fraction(119, 3)) == 16


def test_not_our_transport_carries_the_payload():
    """GPU links (no transport clock) and same-board routes (infinite bandwidth) carry the payload
    as it is, no framing latency."""
    pb = np.array([128.0, 1e6])
    line, extra = engines.link_transfer(pb, 2, 1, 5e10, None)
    assert line.tolist() == pb.tolist() and extra.tolist() == [0.0, 0.0]
    line, extra = engines.link_transfer(128.0, 2, 1, float("inf"), CLOCK)
    assert (line, extra) == (128.0, 0.0)

    class B:
        def __init__(self, kind, clock_hz):
            self.kind, self.clock_hz = kind, clock_hz
    assert engines.link_clock(B("fpga", 3e8), B("fpga", 2.5e8)) == 2.5e8
    assert engines.link_clock(B("fpga", 3e8), B("gpu", 1.5e9)) is None
