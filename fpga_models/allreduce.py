"""The HLS all-reduce kernel as built (``bapipe::ring_allreduce``, hls_templates/hls/library/
bapipe_update.h.j2): the one home of its word format and its cycles, read by the planner
(planner.search, planner.breakdown), the simulator (fpga_models.sim), the Design
(codegen.design.train_kernels) and csim (the kernel's declared II and link latency).

A stage's R replicas reduce their exact weight-gradient sums (int64 in memory, one array per
weight and bias) in a ring: R - 1 reduce-scatter steps then R - 1 all-gather steps
(``collective.ring_steps``, Patarasuk & Yuan 2009). Per step every replica sends one chunk of
every array to the next replica and receives one from the previous:

- a **word** is :data:`LANES` sums: one 512-bit memory beat of int64 sums, carried on the wire
  as :data:`LANES` x :data:`WIRE_BITS` = 480 bits, one network beat's payload
  (``engines.LINK_BEAT_BITS - LINK_HEADER_BITS``: XUP VNx's 512-bit AXI4-Stream behind our
  32-bit framing header), so the link moves a whole word a beat;
- an array of n sums is ceil(n / LANES) words cut into R chunks of ceil(words / R) words (the
  last one padded with zero sums on the wire, never written back);
- a step is one DATAFLOW region of a sender (reads its chunk, writes ``ring_out``) and a
  receiver (reads ``ring_in``; reduce-scatter: adds its own chunk and writes the sum back,
  all-gather: writes the total). The two are separate processes, so each port has one writer
  or one reader and no order between a write and a read exists to get wrong: bounded FIFOs of
  any depth cannot deadlock (tests/test_allreduce.py shows the old single-loop order deadlock);
- both loops run at the step's II: the link's beat (one word a beat at the link's bytes per
  cycle) or the gradient bank's bandwidth, whichever is slower, rounded up to whole cycles (the
  kernel's ``#pragma HLS PIPELINE II``): a reduce-scatter word touches memory 3 times (send
  read, own read, sum write), an all-gather word twice (send read, total write), 64 bytes each,
  all in the one bank the gradient buffer lives in;
- a step ends when the receiver has its last word: :data:`RECV_DEPTH` + the chunk's words x II
  per array, after the link's delivery latency (``engines.link_delivery_cycles`` of a
  one-word-a-beat stream).

The sums travel as :data:`WIRE_BITS`-bit two's complement: exact while every partial and total
sum fits, which :func:`sum_bits` bounds (the global batch's products, ``train_fixed.acc_width``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .collective import ring_steps
from .engines import LINK_BEAT_BITS, LINK_HEADER_BITS, link_beat_cycles, link_delivery_cycles

#: bits of one int64 sum in memory (the backward kernel's ``wsum_t``)
SUM_MEM_BITS = 64
#: bits of one memory beat (the m_axi ports' width)
MEM_WORD_BITS = 512
#: sums a ring word: one memory beat of int64 sums
LANES = MEM_WORD_BITS // SUM_MEM_BITS
#: bits of one sum on the wire: LANES of them fill one network beat's payload
WIRE_BITS = (LINK_BEAT_BITS - LINK_HEADER_BITS) // LANES
#: bits of one ring word on the wire (the kernel's ``ring_t``, the network port's stage word)
WORD_BITS = LANES * WIRE_BITS
#: memory beats a ring word costs in a reduce-scatter step (send read, own read, sum write) ...
RS_ACCESSES = 3
#: ... and in an all-gather step (send read, total write)
AG_ACCESSES = 2
#: pipeline depth of the sender's and the receiver's loops (their BAPIPE_LOOP depth): an m_axi
#: read, the pack / the unpack and add, the write (the receiver is the longer of the two)
SEND_DEPTH = 3
RECV_DEPTH = 4


def sum_bits(terms: int, elem_bits: int = 16) -> int:
    """Bits of an exact sum of ``terms`` products of two ``elem_bits`` values
    (``train_fixed.acc_width``): a gradient summed over the global batch's vectors fits the
    wire when this is <= :data:`WIRE_BITS`."""
    from .train_fixed import acc_width
    return acc_width(terms, elem_bits, elem_bits)


def chunk_words(n: int, r: int) -> int:
    """Words of one chunk of an array of ``n`` sums among ``r`` replicas: ceil(ceil(n / LANES) / r)."""
    return -(-(-(-int(n) // LANES)) // r)


def step_ii(accesses: int, link_bytes_per_cycle: float, bank_bytes_per_cycle: float) -> int:
    """II of a step's loops: the cycles the link needs per beat (one word a beat) or the bank
    per word's ``accesses`` 64-byte beats, whichever is more, in whole cycles (at least 1).
    A bandwidth that is not finite (no link, an ideal memory) does not bound it."""
    need = [1.0]
    if math.isfinite(link_bytes_per_cycle) and link_bytes_per_cycle > 0:
        need.append(link_beat_cycles(LINK_BEAT_BITS // 8, link_bytes_per_cycle))
    if math.isfinite(bank_bytes_per_cycle) and bank_bytes_per_cycle > 0:
        need.append(accesses * (MEM_WORD_BITS // 8) / bank_bytes_per_cycle)
    # 1e-9: the bandwidths are float quotients (19.2e9 / 300e6 = 64 exactly, or 1 ulp off)
    return max(1, math.ceil(max(need) - 1e-9))


def ring_cycles(words, arrays, r: int, ii_rs: int, ii_ag: int, latency: int):
    """Cycles of a call whose arrays' chunks add up to ``words`` words over ``arrays`` arrays
    (numpy arrays allowed: the partition search prices every range at once): per step the
    link's latency, then per array its receive loop (chunk x II + RECV_DEPTH); R - 1 steps at
    each II; 0 for R <= 1."""
    if r <= 1:
        return 0 * words
    return (r - 1) * (2 * latency + (ii_rs + ii_ag) * words + 2 * RECV_DEPTH * arrays)


@dataclass(frozen=True)
class RingTiming:
    """One replica's all-reduce call as built: per array its chunk words, the steps' II and
    latency, and the cycles of the whole call."""

    replicas: int
    chunks: tuple[int, ...]     # words of one chunk, per array
    ii_rs: int                  # II of a reduce-scatter step's loops
    ii_ag: int                  # II of an all-gather step's loops
    latency: int                # cycles from a step's first word leaving to its arrival

    @property
    def steps(self) -> int:
        return ring_steps(self.replicas)

    def step_cycles(self, ii: int) -> int:
        """Cycles of one step: the link's latency, then per array the receiver's loop."""
        return self.latency + sum(c * ii + RECV_DEPTH for c in self.chunks)

    @property
    def cycles(self) -> int:
        """The whole call: R - 1 reduce-scatter steps and R - 1 all-gather steps (0 for R = 1;
        :func:`ring_cycles`, :meth:`step_cycles` each)."""
        return ring_cycles(sum(self.chunks), len(self.chunks), self.replicas, self.ii_rs, self.ii_ag, self.latency)

    @property
    def words(self) -> int:
        """Words one replica sends in the call."""
        return self.steps * sum(self.chunks)

    def hop(self) -> tuple[float, int]:
        """(cycles a step holds the hop on average, latency cycles): steps x (the two) = cycles."""
        if self.replicas <= 1:
            return 0.0, 0
        return self.cycles / self.steps - self.latency, self.latency


def ring_timing(counts, r: int, link_bytes_per_cycle: float, latency_cycles: int,
                bank_bytes_per_cycle: float) -> RingTiming:
    """The all-reduce of arrays of ``counts`` sums among ``r`` replicas over a hop of
    ``link_bytes_per_cycle`` and ``latency_cycles`` (the channel's, framing excluded), the sums
    in a bank of ``bank_bytes_per_cycle``."""
    chunks = tuple(chunk_words(n, r) for n in counts if n > 0)
    lat = link_delivery_cycles(max(1, max(chunks, default=1)), WORD_BITS, max(1, int(latency_cycles)))
    return RingTiming(r, chunks, step_ii(RS_ACCESSES, link_bytes_per_cycle, bank_bytes_per_cycle),
                      step_ii(AG_ACCESSES, link_bytes_per_cycle, bank_bytes_per_cycle), lat)
