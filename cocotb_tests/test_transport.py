"""Board-to-board transport (net_link): net_pack -> net_tx -> net_channel -> net_rx -> net_unpack;
and two boards' net_duplex ends with acknowledgements in band (net_pair).

Checks: with frames lost and reordered and acknowledgements lost and reordered by the
channel model (LFSR-seeded), the receiving stage gets exactly the words sent, in order,
once each, under random idle and backpressure, and the faults really happened (frames lost
and held, retransmissions); without faults the line runs at >= 98% of its configured rate
with no retransmission and no dropped beat; every parameter comes from codegen.design.links.
"""
from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group

try:
    import cocotb

    from bapipe.codegen.check import sim_tb as tb
    from bapipe.codegen.check.sim_harness import tb_config

    def _stats(dut) -> dict[str, int]:
        return {k: int(getattr(dut, k).value) for k in ("lost", "held", "rewinds", "dropped", "overflow")}

    @cocotb.test()
    async def transport_random(dut):
        """Faults injected, random idle and backpressure: the exact stream comes out."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes = cfg["lanes"]
        dut.faults_en.value = 1
        await tb.start(dut)
        words = [rng.randrange(1 << ELEM_W) for _ in range(cfg["stage_beats"] * lanes)]
        hline = tb.Handshakes(dut, "line", ready=False)
        await tb.stream_check(dut, words, lanes, words, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"])
        st = _stats(dut)
        dut._log.info("%d words, %d line beats (%d distinct), faults %s", len(words), len(hline.cycles),
                      cfg["net_beats"], st)
        assert st["overflow"] == 0, "a beat found no room at the receiver: credit accounting is wrong"
        if cfg["faulty"]:
            assert st["lost"] > 0 and st["held"] > 0 and st["rewinds"] > 0, f"no faults were injected: {st}"
            assert len(hline.cycles) > cfg["net_beats"], "faults but no retransmission"

    @cocotb.test()
    async def transport_rate(dut):
        """No faults, no backpressure: measured line beats/cycle against the configured rate."""
        cfg = tb_config()
        lanes = cfg["lanes"]
        dut.faults_en.value = 0
        await tb.start(dut)
        hline = tb.Handshakes(dut, "line", ready=False)
        words = [i & 0xFFFF for i in range(cfg["stage_beats"] * lanes)]
        hin, hout = await tb.stream_check(dut, words, lanes, words, lanes, ELEM_W)
        st = _stats(dut)
        n = len(hline.cycles)
        span = hline.cycles[-1] - hline.cycles[0]
        rate = (n - 1) / span
        expect = float(Fraction(cfg["line_rate"]))
        latency = hout.cycles[0] - hin.cycles[0]
        dut._log.info("line %.5f beats/cycle of %.5f configured (%.4f), %d beats in %d cycles, first word "
                      "latency %d cycles, stats %s", rate, expect, rate / expect, n, span, latency, st)
        assert n == cfg["net_beats"], f"{n} line beats for {cfg['net_beats']} packed beats: retransmissions"
        assert st["rewinds"] == 0 and st["dropped"] == 0 and st["overflow"] == 0, st
        assert rate >= 0.98 * expect, f"line utilisation {rate / expect:.4f} < 0.98"
        # the token bucket never exceeds the configured rate: one beat of burst at most
        assert rate <= expect * (1 + 1 / span) + 1e-12
    @cocotb.test()
    async def transport_duplex(dut):
        """Two boards, a stream each way, acknowledgements in band, faults on both lines."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        lanes = cfg["lanes"]
        dut.faults_en.value = 1
        await tb.start(dut)
        n = cfg["stage_beats"] * lanes
        wa = [rng.randrange(1 << ELEM_W) for _ in range(n)]
        wb = [rng.randrange(1 << ELEM_W) for _ in range(n)]
        other = cocotb.start_soon(tb.stream_check(dut, wb, lanes, wb, lanes, ELEM_W, random.Random(rng.random()),
                                                  cfg["p_idle"], cfg["p_stall"], "b_s_axis", "a_m_axis"))
        await tb.stream_check(dut, wa, lanes, wa, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"],
                              "a_s_axis", "b_m_axis")
        await other
        st = {k: int(getattr(dut, k).value) for k in ("lost", "rewinds", "overflow")}
        dut._log.info("%d words each way, faults %s", n, st)
        assert st["overflow"] == 0 and st["lost"] > 0 and st["rewinds"] > 0, st
    @cocotb.test()
    async def transport_ports(dut):
        """Two framing kernels, three streams at once (two one way, one back), faults on both lines."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        dut.faults_en.value = 1
        await tb.start(dut)
        runs = []
        for src, dst, lanes in (("a_s_axis_tx0", "b_m_axis_rx0", cfg["l0"]), ("a_s_axis_tx1", "b_m_axis_rx1", cfg["l1"]),
                                ("b_s_axis_tx0", "a_m_axis_rx0", cfg["l0"])):
            w = [rng.randrange(1 << ELEM_W) for _ in range(cfg["stage_beats"] * lanes)]
            runs.append(cocotb.start_soon(tb.stream_check(dut, w, lanes, w, lanes, ELEM_W, random.Random(rng.random()),
                                                          cfg["p_idle"], cfg["p_stall"], src, dst)))
        for r in runs:
            await r
        st = {k: int(getattr(dut, k).value) for k in ("lost", "overflow")}
        dut._log.info("3 streams of %d stage beats, faults %s", cfg["stage_beats"], st)
        assert st["overflow"] == 0 and st["lost"] > 0, st
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("transport")]
MODULES = ("axis_width_conv", "net_pack", "net_tx", "net_send", "net_channel", "net_rx", "net_unpack", "net_recv",
           "net_link")


def transport_files() -> dict[str, str]:
    """Sources of the net_link top."""
    from bapipe.codegen.rtl.env import render_template
    return {f"{n}.v": render_template(n) for n in MODULES}


def chain(lanes: int, bw: Fraction, latency: int, sample_words: int, faults=None):
    """(net_link parameters, TransportSpec) for ``lanes`` x 16-bit words over a ``bw`` B/cycle link."""
    from bapipe.codegen.design.links import Faults, transport
    from bapipe.codegen.design.dataflow import LinkSpec
    link = LinkSpec("a", "b", lanes * ELEM_W // 8, bw.numerator, bw.denominator, latency, 0)
    t = transport(link, lanes, ELEM_W, sample_words, dest=3, faults=faults or Faults())
    return t.link_params(), t


def net_beats(t, stage_beats: int) -> int:
    """Packed beats for ``stage_beats`` stage words (``t.slices`` packed words each): full
    beats, plus a partial one per sample end."""
    samples, rest = divmod(stage_beats * t.slices, t.sample_words)
    per_sample = -(-t.sample_words // t.words)
    return samples * per_sample + -(-rest // t.words)


def run_random(lanes, bw, latency, sample_words, stage_beats, seed, p_loss, p_reorder, p_ack_loss):
    from bapipe.codegen.design.links import Faults
    params, t = chain(lanes, bw, latency, sample_words, Faults(p_loss, p_reorder, p_ack_loss, seed))
    d = build("net_link", transport_files(), params)
    check(d, "net_link", "cocotb_tests.test_transport", "transport_random", lanes=lanes, stage_beats=stage_beats,
          seed=seed, p_idle=0.2, p_stall=0.2, faulty=p_loss > 0, net_beats=net_beats(t, stage_beats))
    return d, t


@pytest.mark.slow
def test_transport_2k():
    """One build, two runs. Lossy: 2k network beats (3 words a beat, a partial beat at each
    10-word sample's end), 2% of frames lost, 2% reordered, 5% of acknowledgements lost,
    random idle and backpressure. Fault-free: the line (20 B/cycle = 0.3125 beats/cycle,
    below the 0.4 beats/cycle the source packs) runs at >= 98% of its rate."""
    d, t = run_random(8, Fraction(20), 12, 10, 5000, 7, 0.02, 0.02, 0.05)
    check(d, "net_link", "cocotb_tests.test_transport", "transport_rate", lanes=8, stage_beats=5000,
          line_rate=str(t.line_beats_per_cycle), net_beats=net_beats(t, 5000))


@pytest.mark.soak  # a second build (two boards): make test-all
@pytest.mark.slow
def test_transport_duplex():
    """Acknowledgements in band (net_duplex): 12,000 words each way at once, 4% of the
    datagrams (acknowledgements included) lost and 4% reordered on both lines."""
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.links import Faults
    params, t = chain(8, Fraction(20), 12, 10, Faults(0.04, 0.04, 0.0, 3))
    files = {**transport_files(), **{f"{n}.v": render_template(n) for n in ("net_duplex", "net_pair")}}
    d = build("net_pair", files, params)
    check(d, "net_pair", "cocotb_tests.test_transport", "transport_duplex", lanes=8, stage_beats=1500, seed=3,
          p_idle=0.2, p_stall=0.2)


@pytest.mark.soak  # a third build (two framing kernels): make test-all
@pytest.mark.slow
def test_transport_ports():
    """Framing kernels as codegen.design.netnames names them (bapipe_net_t2r1 on one board,
    bapipe_net_t1r2 on the other): three streams over one line each way, round robin between
    two outgoing channels, acknowledgements in band, TDEST renumbered as socket tables do;
    3% of datagrams lost and 3% reordered on both lines."""
    from bapipe.codegen.design.links import Faults
    from bapipe.codegen.rtl.net_port import render_net_port
    _, t0 = chain(8, Fraction(20), 12, 10)
    _, t1 = chain(40, Fraction(20), 12, 6)
    files = dict(transport_files())
    for tx, rx in (([t0, t1], [t0]), ([t0], [t0, t1])):
        m, text = render_net_port(tx, rx)
        files[f"{m}.v"] = text
    files["net_port_pair.v"] = Path(__file__).with_name("net_port_pair.v").read_text()
    ch = {k: v for k, v in chain(8, Fraction(20), 12, 10, Faults(0.03, 0.03, 0.0, 9))[0].items()
          if k in ("BW_NUM", "BW_DEN", "TOKEN_W", "LATENCY", "PTR_W", "HOLD_W", "HOLD_MAX", "P_LOSS", "P_REORDER", "SEED")}
    d = build("net_port_pair", files, {"W0": 8 * ELEM_W, "W1": 40 * ELEM_W, **ch})
    check(d, "net_port_pair", "cocotb_tests.test_transport", "transport_ports", l0=8, l1=40, stage_beats=600, seed=9,
          p_idle=0.2, p_stall=0.2)


@pytest.mark.soak  # 100k network beats with faults: make test-all
@pytest.mark.slow
@pytest.mark.parametrize("seed,bw,p", [(11, Fraction(64), 0.01), (12, Fraction(21, 2), 0.03)])
def test_transport_lossy_100k(seed, bw, p):
    run_random(30, bw, 20, 100, 100_000, seed, p, p, 2 * p)


@pytest.mark.soak  # stage words wider than a beat's payload: make test-all
@pytest.mark.slow
def test_transport_slices():
    """40 x 16-bit = 640-bit stage words go as two 320-bit slices (one a beat), 3% lost and
    reordered, 6% acks lost: exact after axis_width_conv joins them again."""
    d, t = run_random(40, Fraction(48), 16, 12, 20_000, 5, 0.03, 0.03, 0.06)
    assert (t.data_w, t.slices) == (320, 2)


def test_transport_lint_clean(tmp_path):
    """`verilator --lint-only -Wall` on net_link and net_pair with the parameters the tests
    use: whole words (3 a beat) and words cut into slices (the axis_width_conv branches)."""
    import os
    import subprocess
    from bapipe.toolchain import verilator_bin, wire_verilator
    from bapipe.codegen.rtl.env import render_template
    env = wire_verilator(dict(os.environ))
    files = {**transport_files(), **{f"{n}.v": render_template(n) for n in ("net_duplex", "net_pair")}}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    failures = []
    for lanes, bw in ((8, Fraction(20)), (40, Fraction(48))):
        params, _ = chain(lanes, bw, 12, 12)
        for top in ("net_link", "net_pair"):
            r = subprocess.run([str(verilator_bin() / "verilator"), "--lint-only", "-Wall", f"-I{tmp_path}",
                                "--top-module", top, *(f"-G{k}={v}" for k, v in params.items()),
                                str(tmp_path / f"{top}.v")], capture_output=True, text=True, env=env)
            if r.returncode or r.stderr.strip():
                failures.append(f"{top} lanes={lanes}:\n{r.stderr[:1500]}")
    assert not failures, "\n".join(failures)


def test_transport_sizing():
    """Window, timeout, packing and cycle model from the link, as docs/network.md states them."""
    from bapipe.codegen.design.links import slice_width
    _, t = chain(30, Fraction(40), 20, 64)
    assert t.words == 1 and t.round_trip == 2 * 20 + 8 + 4
    assert t.window == 33 + 2            # ceil(40/64 x 52) + 2
    assert t.timeout == 52 + 16 + 16
    _, t = chain(4, Fraction(5), 7, 10)
    assert t.words == 7                  # (512 - 32) // 64
    assert net_beats(t, 25) == 2 * 2 + 1  # 10 words: 7 + 3; the last 5 words: one beat
    # a 10-word sample is 2 beats of 64 B at 5 B/cycle: 25.6 cycles, slower than 10 words
    assert t.cycles_per_sample == Fraction(128, 5)
    assert t.delivery_latency == 7 + 3 + (3 - 1)   # last beat holds 3 words
    assert [slice_width(n, 16) for n in (30, 40, 128)] == [480, 320, 256]
    _, t = chain(40, Fraction(48), 16, 12)
    assert (t.slices, t.sample_words, t.cycles_per_sample) == (2, 24, 32)   # 24 beats x 64/48
    assert t.delivery_latency == 16 + 3 + 0 + 2    # + the two width converters
    assert net_beats(t, 24) == 48                   # 2 samples x 12 words x 2 slices, one a beat
