"""The board-to-board transport's sizing: every parameter of net_pack, net_tx, net_channel,
net_rx and net_unpack (hls_templates/rtl/net_*.v.j2), decided once from a link.

A link (``rtl_model.LinkSpec``: bandwidth and latency in cycles, from the cluster via
``rtl_model.make_link``) carries a stage's DATA_W-bit words packed into BEAT_W-bit network
beats, the XUP VNx network layer's AXI4-Stream width (docs/network.md). Each beat has a
HDR_W-bit header in its top bits (SEQ_W sequence number, CNT_W word count, spare bits) and
``words = (BEAT_W - HDR_W) // DATA_W`` payload words.

Sizing (docs/network.md, "RTL transport"):
- round trip = 2 * latency + ACK_PERIOD + ``NET_LOOP``: from a beat leaving net_tx's output
  register to its acknowledgement (or the credit its buffer slot frees) being usable there;
- window = ceil(line beats/cycle x round trip) + ``WINDOW_SLACK``: both net_rx's buffer (the
  credits) and net_tx's retransmit buffer (rounded up to a power of two) hold this many
  beats, so neither ever throttles a fault-free link;
- timeout = round trip + 2 * ACK_PERIOD + FRAME_BEATS: no fault-free beat waits that long
  for its acknowledgement (a lost acknowledgement is replaced ACK_PERIOD cycles later).

Cycle model (fault-free): a sample of S words leaves as ceil(S / words) beats, each taking
``engines.link_beat_cycles(BEAT_W / 8, bandwidth)`` cycles of line; packing and unpacking
move one word a cycle, so a sample costs max(S, beats x line cycles) cycles; its last word
reaches the receiving stage latency + ``NET_DELAY`` + (words in its last beat - 1) cycles
after it left the sending stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from bapipe.fpga_models import engines

from bapipe.codegen.design.netnames import DEST_BITS as DEST_W  # XUP VNx: 16-bit TDEST

BEAT_W = engines.LINK_BEAT_BITS  # XUP VNx: 512-bit data


def clog2(n: int) -> int:
    """Address bits for ``n`` entries (at least 1); as codegen.design.dataflow.clog2."""
    return max(1, (n - 1).bit_length())


def count_bits(n: int) -> int:
    """Bits to hold every value 0..n (at least 1); as codegen.design.dataflow.count_bits."""
    return max(1, int(n).bit_length())

SEQ_W = 16
CNT_W = 8
# the transport's timing constants have one home, fpga_models.engines (the planner's link cost
# and the cycle simulator read the same); the templates take them as parameters from here
HDR_W = engines.LINK_HEADER_BITS
FRAME_BEATS = engines.LINK_FRAME_BEATS
ACK_PERIOD = engines.LINK_ACK_PERIOD
NET_LOOP = engines.LINK_LOOP
WINDOW_SLACK = engines.LINK_WINDOW_SLACK
NET_DELAY = engines.LINK_FRAMING_DELAY


@dataclass(frozen=True)
class Faults:
    """Channel fault injection: probabilities per frame (forward) / per message (acks)."""

    p_loss: float = 0.0
    p_reorder: float = 0.0
    p_ack_loss: float = 0.0
    seed: int = 1


def _p16(p: float, what: str) -> int:
    """A probability as a 16-bit threshold (the LFSR draw is below it with probability p)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{what}: expected a probability in [0, 1), got {p}")
    return round(p * 65536)


@dataclass(frozen=True)
class TransportSpec:
    """One direction of a board-to-board transport, every number the RTL needs."""

    stage_w: int            # stage word width (lanes x element width)
    data_w: int             # packed word width: stage_w, or a slice of it when wider than a payload
    sample_words: int       # packed words per sample (a beat closes at a sample's end)
    bw_num: int             # line rate = bw_num / bw_den bytes per cycle
    bw_den: int
    latency: int            # cycles, each direction
    dest: int = 0           # TDEST: the socket index of this link
    faults: Faults = Faults()

    @property
    def words(self) -> int:
        """Stage words per network beat."""
        return engines.link_words_per_beat(self.data_w)

    @property
    def line_beats_per_cycle(self) -> Fraction:
        """Network beats the line moves per cycle (at most one)."""
        return min(Fraction(1), Fraction(self.bw_num, self.bw_den) / (BEAT_W // 8))

    @property
    def sample_beats(self) -> int:
        """Network beats per sample (the last one partial unless words divides the sample)."""
        return engines.link_sample_beats(self.sample_words, self.data_w)

    @property
    def cycles_per_sample(self) -> Fraction:
        """Line cycles per sample, or one per word if packing is slower (the cycle model)."""
        return Fraction(engines.link_sample_cycles(self.sample_words, self.data_w,
                                                   Fraction(self.bw_num, self.bw_den)))

    @property
    def delivery_latency(self) -> int:
        """Cycles from a sample's last word leaving the sending stage to reaching the receiver."""
        return engines.link_delivery_cycles(self.sample_words, self.data_w, self.latency, self.slices)

    @property
    def round_trip(self) -> int:
        return engines.link_round_trip(self.latency)

    @property
    def window(self) -> int:
        """Credits = net_rx buffer beats; net_tx's buffer is this rounded up to 2**k."""
        return engines.link_window(Fraction(self.bw_num, self.bw_den), self.latency)

    @property
    def timeout(self) -> int:
        return engines.link_timeout(self.latency)

    @property
    def hold_max(self) -> int:
        """Cycles the channel holds a reordered frame at most when no frame follows it."""
        return self.timeout // 2

    @property
    def slices(self) -> int:
        """Packed words per stage word (1 unless the stage word is cut into slices)."""
        return self.stage_w // self.data_w

    def pack_params(self) -> dict[str, int]:
        return {"DATA_W": self.data_w, "BEAT_W": BEAT_W, "SEQ_W": SEQ_W, "CNT_W": CNT_W, "WORDS": self.words,
                "SAMPLE_WORDS": self.sample_words, "SAMPLE_W": clog2(self.sample_words)}

    def tx_params(self) -> dict[str, int]:
        return {"BEAT_W": BEAT_W, "SEQ_W": SEQ_W, "ADDR_W": clog2(self.window), "CREDITS": self.window,
                "FRAME_BEATS": FRAME_BEATS, "FRAME_W": clog2(FRAME_BEATS), "TIMEOUT": self.timeout,
                "TIMER_W": count_bits(self.timeout), "DEST_W": DEST_W, "DEST": self.dest}

    def rx_params(self) -> dict[str, int]:
        return {"BEAT_W": BEAT_W, "SEQ_W": SEQ_W, "DEPTH": self.window, "ADDR_W": clog2(self.window),
                "ACK_PERIOD": ACK_PERIOD, "ACK_W": clog2(ACK_PERIOD), "DEST_W": DEST_W}

    def unpack_params(self) -> dict[str, int]:
        return {"DATA_W": self.data_w, "BEAT_W": BEAT_W, "SEQ_W": SEQ_W, "CNT_W": CNT_W}

    def link_params(self) -> dict[str, int]:
        """Verilog parameters of net_link (send side, channel, receive side)."""
        p = {"STAGE_W": self.stage_w, "CONV_W": count_bits(self.slices),
             **self.pack_params(), **self.tx_params(), **self.channel_params()}
        rx = self.rx_params()
        p.update(ACK_PERIOD=rx["ACK_PERIOD"], ACK_W=rx["ACK_W"])   # net_recv's DEPTH is net_link's CREDITS
        return p

    def channel_params(self) -> dict[str, int]:
        cost = (BEAT_W // 8) * self.bw_den
        f = self.faults
        return {"BEAT_W": BEAT_W, "DEST_W": DEST_W, "ACK_W": 2 * SEQ_W, "BEAT_BYTES": BEAT_W // 8,
                "BW_NUM": self.bw_num, "BW_DEN": self.bw_den, "TOKEN_W": count_bits(cost + 2 * self.bw_num),
                "LATENCY": self.latency, "PTR_W": clog2(self.latency),
                "HOLD_W": count_bits(FRAME_BEATS), "HOLD_MAX": self.hold_max,
                "P_LOSS": _p16(f.p_loss, "p_loss"), "P_REORDER": _p16(f.p_reorder, "p_reorder"),
                "P_ACK_LOSS": _p16(f.p_ack_loss, "p_ack_loss"), "SEED": f.seed & 0xFFFFFFFF}


def slice_width(lanes: int, elem_w: int) -> int:
    """Packed word width for a stage word of ``lanes`` elements: the whole word if it fits a
    beat's payload, else the widest slice of whole elements, dividing the word, that does."""
    pay = BEAT_W - HDR_W
    d = max(d for d in range(1, lanes + 1) if lanes % d == 0 and d * elem_w <= pay)
    return d * elem_w


def transport(link, lanes: int, elem_w: int, sample_beats: int, dest: int = 0,
              faults: Faults = Faults()) -> TransportSpec:
    """The transport carrying a stage's ``lanes`` x ``elem_w``-bit words, ``sample_beats`` per
    sample, over ``link`` (a rtl_model.LinkSpec: bandwidth and latency in cycles)."""
    from bapipe.codegen.design.unsupported import Unsupported
    if link.latency < 2:
        raise Unsupported(f"link {link.src}->{link.dst}: the channel model needs a latency of 2 cycles or more")
    if elem_w > BEAT_W - HDR_W:
        raise Unsupported(f"link {link.src}->{link.dst}: a {elem_w}-bit element does not fit a network beat")
    w = slice_width(lanes, elem_w)
    return TransportSpec(lanes * elem_w, w, sample_beats * (lanes * elem_w // w), link.bw_num, link.bw_den,
                         link.latency, dest, faults)
