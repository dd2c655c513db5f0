"""Shared cocotb testbench pieces (run inside the simulator process).

cocotbext-axi drives and consumes the AXI4-Stream ports (sources, sinks, monitors with
random pause generators for idle cycles and backpressure); :class:`Handshakes` samples a
port's valid/ready at every rising edge and records the cycle of every transfer, which is
what throughput and latency are measured from.
"""
from __future__ import annotations

import itertools
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, ReadOnly
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamMonitor, AxiStreamSink, AxiStreamSource


async def start(dut, cycles: int = 5):
    """Start a 10 ns clock on dut.clk and hold dut.rst high for ``cycles`` cycles."""
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await ClockCycles(dut.clk, cycles)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


def pauses(rng: random.Random, p_pause: float):
    """An endless generator of pause flags: True with probability p_pause (in random bursts)."""
    def gen():
        while True:
            if rng.random() < p_pause:
                for _ in range(rng.randint(1, 4)):
                    yield True
            else:
                yield False
    return gen()


def source(dut, prefix: str, elem_w: int, rng: random.Random | None = None, p_idle: float = 0.0):
    """AxiStreamSource on ``prefix`` with elem_w-bit lanes, optionally idling at random."""
    src = AxiStreamSource(AxiStreamBus.from_prefix(dut, prefix), dut.clk, dut.rst, byte_size=elem_w)
    if rng is not None and p_idle > 0:
        src.set_pause_generator(pauses(rng, p_idle))
    return src


def sink(dut, prefix: str, elem_w: int, rng: random.Random | None = None, p_stall: float = 0.0):
    """AxiStreamSink on ``prefix``, optionally deasserting tready at random (backpressure)."""
    snk = AxiStreamSink(AxiStreamBus.from_prefix(dut, prefix), dut.clk, dut.rst, byte_size=elem_w)
    if rng is not None and p_stall > 0:
        snk.set_pause_generator(pauses(rng, p_stall))
    return snk


def monitor(dut, prefix: str, elem_w: int):
    """AxiStreamMonitor on ``prefix`` (records every transfer without driving anything)."""
    return AxiStreamMonitor(AxiStreamBus.from_prefix(dut, prefix), dut.clk, dut.rst, byte_size=elem_w)


def to_unsigned(vals, elem_w: int) -> list[int]:
    """Signed lanes -> the unsigned words cocotbext-axi carries."""
    m = (1 << elem_w) - 1
    return [int(v) & m for v in vals]


def to_signed(vals, elem_w: int) -> list[int]:
    """Unsigned lane words -> signed ints."""
    half = 1 << (elem_w - 1)
    return [int(v) - (1 << elem_w) if int(v) >= half else int(v) for v in vals]


async def send_all(src, words: list[int], lanes: int):
    """Queue ``words`` as beats of ``lanes`` lanes (one frame per beat: there is no tlast)."""
    for i in range(0, len(words), lanes):
        await src.send(AxiStreamFrame(words[i:i + lanes]))


async def recv_words(snk, n_words: int) -> list[int]:
    """Collect ``n_words`` lane words from a sink."""
    out: list[int] = []
    while len(out) < n_words:
        frame = await snk.recv()
        out.extend(frame.tdata)
    return out


class Handshakes:
    """Cycle numbers of the transfers on one port (valid && ready at a rising edge)."""

    def __init__(self, dut, prefix: str, ready: bool = True):
        self.valid = getattr(dut, f"{prefix}_tvalid")
        self.ready = getattr(dut, f"{prefix}_tready") if ready else None
        self.clk = dut.clk
        self.cycles: list[int] = []
        self.cycle = 0
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        for self.cycle in itertools.count():
            await RisingEdge(self.clk)
            if int(self.valid.value) and (self.ready is None or int(self.ready.value)):
                self.cycles.append(self.cycle)


class Counter:
    """A free-running cycle counter (shares the numbering of Handshakes started with it)."""

    def __init__(self, dut):
        self.clk = dut.clk
        self.cycle = 0
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        for self.cycle in itertools.count():
            await RisingEdge(self.clk)


async def settle():
    """Wait until signal values of this time step are final."""
    await ReadOnly()


async def stream_check(dut, words: list[int], lanes_in: int, expect: list[int], lanes_out: int, elem_w: int,
                       rng: random.Random | None = None, p_idle: float = 0.0, p_stall: float = 0.0,
                       s_prefix: str = "s_axis", m_prefix: str = "m_axis"):
    """Drive ``words`` in, collect as many words as ``expect`` out, compare exactly.

    Also checks the input monitor saw exactly ``words`` and that nothing extra comes out.
    Returns (input Handshakes, output Handshakes) for timing checks.
    """
    from cocotb.triggers import ClockCycles
    hin, hout = Handshakes(dut, s_prefix), Handshakes(dut, m_prefix)
    src = source(dut, s_prefix, elem_w, rng, p_idle)
    snk = sink(dut, m_prefix, elem_w, rng, p_stall)
    mon = monitor(dut, s_prefix, elem_w)
    cocotb.start_soon(send_all(src, words, lanes_in))
    got = await recv_words(snk, len(expect))
    seen = await recv_words(mon, len(words))
    assert seen == words, "the input monitor saw different beats than were sent"
    if got != expect:
        bad = next(i for i, (a, b) in enumerate(zip(got, expect)) if a != b)
        raise AssertionError(f"output differs first at word {bad}: got {got[bad:bad + 8]}, expected {expect[bad:bad + 8]}")
    await ClockCycles(dut.clk, 30)
    assert snk.empty(), "extra beats after the end (duplicates)"
    return hin, hout
