"""Time-multiplexing glue: axis_gate (frame-sized gate) and tm_sequencer (unit grants).

axis_gate is checked in randomised runs against its rule (at most BEATS beats per `en`-high
period, count restarts only while `en` is low) and, without stalls, cycle by cycle against a
model of that rule (0 latency, 1 beat/cycle while open). tm_sequencer is compared every cycle
with a Python model of its rule driven by random frame arrivals and unit handshakes, plus a
directed run of the priority (highest ready stage first) and of the idle cycle between jobs.
"""
from __future__ import annotations

import random

import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import tb_config

#: axis_gate under test: a frame of 7 beats (7 = 2**CNT_W - 1, the widest count) of 2 lanes
GATE_BEATS, GATE_LANES = 7, 2
#: tm_sequencer under test: stage 0 = units 0-1, stage 1 = units 2-4 (one unit sends 1 beat)
SEQ_OUT_BEATS = [3, 1, 4, 2, 5]
SEQ_FIRST, SEQ_LAST = [0, 2], [1, 4]
SEQ_IN_BEATS = [3, 5]
SEQ_FRAMES_MAX = 3  # FRAMES_W = 2: at most 3 whole frames may wait per stage


class SeqModel:
    """Reference of tm_sequencer's rule, one call of :meth:`step` per clock edge.

    A stage becomes ready when IN_BEATS of its in_fire handshakes made a whole frame
    (frames queue up); an idle sequencer starts a job of the highest ready stage, granting its
    units in order; a unit keeps the grant until OUT_BEATS of its own unit_fire handshakes;
    after the job's last unit the sequencer is idle for a cycle before the next start.
    """

    def __init__(self, out_beats, first, last, in_beats):
        self.out_beats, self.first, self.last, self.in_beats = out_beats, first, last, in_beats
        self.busy, self.cur, self.stage, self.sent = False, 0, 0, 0
        self.in_cnt = [0] * len(in_beats)
        self.frames = [0] * len(in_beats)
        self.jobs: list[int] = []  # stage of every job started, in order

    def grant(self) -> int:
        """The grant vector the sequencer shows now (one-hot or zero)."""
        return (1 << self.cur) if self.busy else 0

    def step(self, in_fire: list[int], unit_fire: list[int]) -> None:
        """Advance one clock edge with these handshakes sampled."""
        ready = [s for s, f in enumerate(self.frames) if f]
        start = not self.busy and bool(ready)
        pick = max(ready) if ready else None
        for s, fired in enumerate(in_fire):
            if fired:
                self.in_cnt[s] += 1
                if self.in_cnt[s] == self.in_beats[s]:
                    self.in_cnt[s] = 0
                    self.frames[s] += 1
        if start:
            self.frames[pick] -= 1
            self.busy, self.stage, self.cur, self.sent = True, pick, self.first[pick], 0
            self.jobs.append(pick)
        elif self.busy and unit_fire[self.cur]:
            self.sent += 1
            if self.sent == self.out_beats[self.cur]:
                self.sent = 0
                if self.cur == self.last[self.stage]:
                    self.busy = False
                else:
                    self.cur += 1
        assert all(0 <= f <= SEQ_FRAMES_MAX for f in self.frames), self.frames


def gate_model(ens: list[int], beats: int, n: int) -> list[int]:
    """Handshakes a stall-free axis_gate makes per cycle for this `en` trace (n beats to send)."""
    out, count, sent = [], 0, 0
    for en in ens:
        hs = int(bool(en) and count < beats and sent < n)
        count = count + hs if en else 0
        sent += hs
        out.append(hs)
    return out


# ----------------------------------------------------------------- cocotb side

try:
    import cocotb
    from cocotb.triggers import FallingEdge, RisingEdge, with_timeout

    from bapipe.codegen.check import sim_tb as tb

    class EnDriver:
        """Drives the gate's `en`: high until BEATS beats passed (plus 0..max_hold cycles), then
        low for 1..max_low cycles, repeat; records (en, input hs, output hs) at every edge."""

        def __init__(self, dut, beats: int, rng: random.Random, max_hold: int, max_low: int):
            self.dut, self.beats, self.rng = dut, beats, rng
            self.max_hold, self.max_low = max_hold, max_low
            self.trace: list[tuple[int, int, int]] = []
            dut.en.value = 1
            self._task = cocotb.start_soon(self._run())

        async def _run(self):
            d = self.dut
            state, n, wait = "high", 0, 0
            while True:
                await RisingEdge(d.clk)
                en = int(d.en.value)
                hs_in = int(d.s_axis_tvalid.value) & int(d.s_axis_tready.value)
                hs_out = int(d.m_axis_tvalid.value) & int(d.m_axis_tready.value)
                self.trace.append((en, hs_in, hs_out))
                n += hs_out if en else 0
                if state == "high" and n >= self.beats:
                    state, wait = "hold", self.rng.randint(0, self.max_hold)
                if state == "hold":
                    if wait == 0:
                        d.en.value = 0
                        state, n, wait = "low", 0, self.rng.randint(1, self.max_low)
                    else:
                        wait -= 1
                elif state == "low":
                    wait -= 1
                    if wait == 0:
                        d.en.value = 1
                        state = "high"

    async def _bounded(coro, beats: int):
        """Fail instead of hanging when the gate never reopens: 20 cycles a beat is plenty."""
        return await with_timeout(coro, (20 * beats + 1000) * 10, "ns")

    def _periods(trace) -> list[int]:
        """Output beats in every en-high period of the trace."""
        out, prev = [], 0
        for en, _, hs in trace:
            if en and not prev:
                out.append(0)
            if en:
                out[-1] += hs
            prev = en
        return out

    @cocotb.test()
    async def gate_random(dut):
        """Random idle/backpressure under the `en` pattern: exact stream, <= BEATS per period."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        beats, lanes = cfg["gate_beats"], cfg["lanes"]
        dut.en.value = 0
        await tb.start(dut)
        drv = EnDriver(dut, beats, rng, cfg["max_hold"], cfg["max_low"])
        words = [rng.randrange(1 << ELEM_W) for _ in range(cfg["beats"] * lanes)]
        await _bounded(tb.stream_check(dut, words, lanes, words, lanes, ELEM_W, rng, cfg["p_idle"], cfg["p_stall"]),
                       cfg["beats"])
        trace = list(drv.trace)
        assert all(en or not hs for en, _, hs in trace), "a beat passed while en was low"
        assert all(i == o for _, i, o in trace), "input and output handshakes differ (the gate has no buffer)"
        periods = _periods(trace)
        assert max(periods) <= beats, f"more than {beats} beats in one en-high period"
        # every period but the last was closed by the driver after exactly BEATS beats
        assert all(p == beats for p in periods[:-1]), sorted(set(periods[:-1]))
        assert sum(periods) == cfg["beats"]
        dut._log.info("%d beats in %d cycles, %d en-high periods", sum(periods), len(trace), len(periods))

    @cocotb.test()
    async def gate_timing(dut):
        """No stalls: output handshakes match the gate model every cycle (0 latency, 1 beat/cycle open)."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        beats, lanes, n = cfg["gate_beats"], cfg["lanes"], cfg["beats"]
        dut.en.value = 0
        await tb.start(dut)
        drv = EnDriver(dut, beats, rng, cfg["max_hold"], cfg["max_low"])
        words = [rng.randrange(1 << ELEM_W) for _ in range(n * lanes)]
        await _bounded(tb.stream_check(dut, words, lanes, words, lanes, ELEM_W), n)
        trace = list(drv.trace)
        first = next(i for i, (_, _, hs) in enumerate(trace) if hs)
        ens = [en for en, _, _ in trace[first:]]
        got = [hs for _, _, hs in trace[first:]]
        want = gate_model(ens, beats, n)
        assert got == want, f"first difference at cycle {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
        assert all(i == o for _, i, o in trace), "latency is not 0"
        last = max(i for i, hs in enumerate(got) if hs)
        open_cycles = sum(ens[:last + 1])
        rate = n / (last + 1)
        dut._log.info("%d beats in %d cycles (%d with en high): %.4f beats/cycle, %.4f while en high",
                      n, last + 1, open_cycles, rate, n / open_cycles)
        if cfg["max_hold"] == 0 and cfg["max_low"] == 1:
            # en high for BEATS cycles, low for 1: BEATS/(BEATS+1) beats per cycle, exactly
            assert last + 1 == n + (n - 1) // beats, (last + 1, n)

    async def _seq_run(dut, cycles: int, choose):
        """Every cycle: compare the grant with the model, then drive the next handshakes."""
        cfg = tb_config()
        model = SeqModel(cfg["out_beats"], cfg["first"], cfg["last"], cfg["in_beats"])
        n_units, n_stages = len(cfg["out_beats"]), len(cfg["in_beats"])
        dut.in_fire.value = 0
        dut.unit_fire.value = 0
        await tb.start(dut)
        grants = []
        for cycle in range(cycles):
            await FallingEdge(dut.clk)
            g = int(dut.grant.value)
            assert g == model.grant(), f"cycle {cycle}: grant {g:#x}, model {model.grant():#x}"
            grants.append(g)
            in_fire, unit_fire = choose(cycle, model, g)
            dut.in_fire.value = sum(b << s for s, b in enumerate(in_fire))
            dut.unit_fire.value = sum(b << u for u, b in enumerate(unit_fire))
            await RisingEdge(dut.clk)
            model.step(in_fire, unit_fire)
        assert len(in_fire) == n_stages and len(unit_fire) == n_units
        return model, grants

    @cocotb.test()
    async def seq_random(dut):
        """Random frame arrivals and unit handshakes: grant equals the model's every cycle."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        n_units, n_stages = len(cfg["out_beats"]), len(cfg["in_beats"])
        p_in, p_fire, p_other = cfg["p_in"], cfg["p_fire"], cfg["p_other"]

        def choose(cycle, model, g):
            in_fire = []
            for s in range(n_stages):
                full = model.frames[s] >= SEQ_FRAMES_MAX and model.in_cnt[s] == model.in_beats[s] - 1
                in_fire.append(int(not full and rng.random() < p_in))
            # the granted unit fires often; others now and then (the sequencer must ignore them)
            unit_fire = [int(rng.random() < (p_fire if g >> u & 1 else p_other)) for u in range(n_units)]
            return in_fire, unit_fire

        model, grants = await _seq_run(dut, cfg["cycles"], choose)
        busy = sum(1 for g in grants if g)
        jobs = [model.jobs.count(s) for s in range(n_stages)]
        dut._log.info("%d cycles, %d jobs per stage %s, grant held %.3f of cycles",
                      len(grants), len(model.jobs), jobs, busy / len(grants))
        assert all(j >= 50 for j in jobs), jobs

    @cocotb.test()
    async def seq_directed(dut):
        """Both stages get a frame: stage 1 (highest) first, one idle cycle, then stage 0;
        a stage-0 frame that arrived first still waits behind a later stage-1 frame."""
        cfg = tb_config()
        ob, first, last, inb = cfg["out_beats"], cfg["first"], cfg["last"], cfg["in_beats"]
        n_units = len(ob)
        # cycles 0..: stage 0 and stage 1 frames end on the same edge (cycle F); after that the
        # granted unit fires every cycle
        f = max(inb)
        plan_in = {c: [int(c >= f - inb[0]), int(c >= f - inb[1])] for c in range(f)}
        job1 = [u for u in range(first[1], last[1] + 1) for _ in range(ob[u])]
        job0 = [u for u in range(first[0], last[0] + 1) for _ in range(ob[u])]
        # second scenario, once the first is over: stage-0 frame A starts a job; while it runs,
        # stage-0 frame B ends and then stage 1's frame ends (it began earlier); after A the
        # later-finished stage-1 frame goes first, then B
        t2 = f + 1 + len(job1) + 1 + len(job0) + 3
        events: dict[int, list[int]] = {}
        for k in range(inb[0]):                       # frame A, then frame B
            events.setdefault(t2 + k, [0, 0])[0] = 1
            events.setdefault(t2 + inb[0] + k, [0, 0])[0] = 1
        for k in range(inb[1] - 1):                   # stage 1: all but the last beat early
            events.setdefault(t2 + 1 + k, [0, 0])[1] = 1
        events.setdefault(t2 + 2 * inb[0], [0, 0])[1] = 1
        a_end = t2 + inb[0] + 1 + len(job0) - 1       # last cycle A's grant is held
        assert t2 + 2 * inb[0] < a_end and t2 + inb[1] - 1 < t2 + 2 * inb[0], "scenario needs other sizes"

        def choose(cycle, model, g):
            in_fire = plan_in.get(cycle, events.get(cycle, [0, 0]))
            return list(in_fire), [int(g >> u & 1) for u in range(n_units)]

        cycles = t2 + 2 * inb[0] + inb[1] + 3 * (len(job0) + len(job1)) + 10
        model, grants = await _seq_run(dut, cycles, choose)
        units = [g.bit_length() - 1 if g else None for g in grants]
        # first scenario: grant 2 cycles after the frames' last beat (1 to count, 1 to start)
        want = [None] * (f + 1) + job1 + [None] + job0 + [None]
        assert units[:len(want)] == want, (units[:len(want)], want)
        assert model.jobs == [1, 0, 0, 1, 0], model.jobs
        want2 = [None] * (inb[0] + 1) + job0 + [None] + job1 + [None] + job0 + [None]
        assert units[t2:t2 + len(want2)] == want2, (units[t2:t2 + len(want2)], want2)
        assert all(u is None for u in units[t2 + len(want2):])
        dut._log.info("grant trace: %s", " ".join("-" if u is None else str(u) for u in units))
except ImportError:  # imported by pytest without cocotb's simulator context
    pass


# ----------------------------------------------------------------- pytest side

pytestmark = [*needs_verilator, xdist_group("tm")]

MOD = "cocotb_tests.test_tm"


def _build_gate():
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import count_bits
    return build("axis_gate", {"axis_gate.v": render_template("axis_gate")},
                 {"DATA_W": GATE_LANES * ELEM_W, "BEATS": GATE_BEATS, "CNT_W": count_bits(GATE_BEATS)})


def _seq_env():
    return dict(out_beats=SEQ_OUT_BEATS, first=SEQ_FIRST, last=SEQ_LAST, in_beats=SEQ_IN_BEATS)


def _build_seq():
    from bapipe.codegen.rtl.pipeline import pack_unsigned
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.dataflow import clog2, count_bits
    cnt_w = count_bits(max(SEQ_OUT_BEATS + SEQ_IN_BEATS))
    unit_w = clog2(len(SEQ_OUT_BEATS))
    # the same parameter set the board top gives it (codegen.rtl.pipeline._sequencer_ctx)
    return build("tm_sequencer", {"tm_sequencer.v": render_template("tm_sequencer")},
                 {"N_UNITS": len(SEQ_OUT_BEATS), "N_STAGES": len(SEQ_IN_BEATS), "UNIT_W": unit_w,
                  "STAGE_W": clog2(len(SEQ_IN_BEATS)), "CNT_W": cnt_w, "FRAMES_W": 2,
                  "OUT_BEATS": pack_unsigned(SEQ_OUT_BEATS, cnt_w), "FIRST": pack_unsigned(SEQ_FIRST, unit_w),
                  "LAST": pack_unsigned(SEQ_LAST, unit_w), "IN_BEATS": pack_unsigned(SEQ_IN_BEATS, cnt_w)})


def test_gate_timing():
    d = _build_gate()
    env = dict(gate_beats=GATE_BEATS, lanes=GATE_LANES)
    check(d, "axis_gate", MOD, "gate_timing", **env, beats=700, seed=1, max_hold=0, max_low=1)
    check(d, "axis_gate", MOD, "gate_timing", **env, beats=700, seed=2, max_hold=3, max_low=5)


@pytest.mark.soak  # 100k random beats: make test-all (the short directed runs stay in make test)
def test_gate_100k():
    d = _build_gate()
    check(d, "axis_gate", MOD, "gate_random", gate_beats=GATE_BEATS, lanes=GATE_LANES, beats=100_000, seed=3,
          p_idle=0.2, p_stall=0.2, max_hold=3, max_low=5)


def test_sequencer_model():
    d = _build_seq()
    check(d, "tm_sequencer", MOD, "seq_random", **_seq_env(), cycles=20_000, seed=4, p_in=0.12, p_fire=0.7,
          p_other=0.1)


def test_sequencer_directed():
    d = _build_seq()
    check(d, "tm_sequencer", MOD, "seq_directed", **_seq_env())
