"""On-chip memory in the blocks a device has, not in bytes.

An array bank of ``width`` bits x ``depth`` words is built from RAM primitives in one of their
fixed width x depth modes (AMD UG573, UltraScale Architecture Memory Resources):

- RAMB18E2 (18 Kib): 16K x 1, 8K x 2, 4K x 4, 2K x 9, 1K x 18, 512 x 36 (the x36 mode is
  simple dual port);
- RAMB36E2 (36 Kib): 32K x 1, 16K x 2, 8K x 4, 4K x 9, 2K x 18, 1K x 36, 512 x 72 (x72 simple
  dual port);
- URAM288 (288 Kib): 4K x 72, one mode; deeper banks cascade further URAMs (UG573, "UltraRAM").

A bank takes ceil(width / w) x ceil(depth / d) primitives of the cheapest mode. Counts are in
BRAM18 units (what Vitis HLS reports as BRAM_18K); the board catalog counts BRAM36, two units
each. Small banks go to LUTs: a LUT6 of a SLICEM is a 64 x 1 RAM (AMD UG574, "Distributed RAM").

Pure functions; the planner, the Design and ``bapipe check`` (codegen.check.physical_rules) share them
so that the three count blocks the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

#: RAMB18E2 modes (depth, width): UG573 table "RAMB18E2 port aspect ratios"
BRAM18_MODES = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36))
#: RAMB36E2 modes (depth, width): UG573 table "RAMB36E2 port aspect ratios"
BRAM36_MODES = ((32768, 1), (16384, 2), (8192, 4), (4096, 9), (2048, 18), (1024, 36), (512, 72))
#: URAM288: 4K x 72, fixed (UG573, "UltraRAM")
URAM_DEPTH, URAM_WIDTH = 4096, 72
#: bits of one LUT6 used as distributed RAM (64 x 1, UG574)
LUTRAM_BITS_PER_LUT = 64
#: ports of one BRAM or URAM bank per cycle: true dual port (UG573: two read/write ports on a
#: RAMB36E2/RAMB18E2; URAM288 has ports A and B, each one read or write a cycle)
PORTS_PER_BANK = 2
#: the largest bank Vitis HLS leaves in LUTRAM when no BIND_STORAGE says otherwise, in bits.
#: [assumption] UG1399 documents no threshold for arrays; we use the FIFO rule's 1,024 bits
#: (config_storage -auto_srl_max_bits, UG1399) for arrays too.
AUTO_LUTRAM_MAX_BITS = 1024
#: config_storage fifo defaults (UG1399 "config_storage"): FIFOs within either limit are SRLs
AUTO_SRL_MAX_DEPTH = 2
AUTO_SRL_MAX_BITS = 1024


def _tiles(width: int, depth: int, modes) -> int:
    return min(math.ceil(width / w) * math.ceil(depth / d) for d, w in modes)


@lru_cache(maxsize=1 << 16)   # pure; the planner asks for the same banks millions of times (resnet50)
def bram18_units(width: int, depth: int) -> int:
    """BRAM18 units of one bank of ``width`` bits x ``depth`` words: the cheaper of a tiling by
    RAMB18E2 (one unit each) and by RAMB36E2 (two units each), each in its best mode."""
    if width <= 0 or depth <= 0:
        return 0
    return min(_tiles(width, depth, BRAM18_MODES), 2 * _tiles(width, depth, BRAM36_MODES))


def uram_blocks(width: int, depth: int) -> int:
    """URAM288 blocks of one bank: ceil(width / 72) x ceil(depth / 4096) (4K x 72 fixed, cascaded)."""
    if width <= 0 or depth <= 0:
        return 0
    return math.ceil(width / URAM_WIDTH) * math.ceil(depth / URAM_DEPTH)


def lutram_luts(width: int, depth: int) -> int:
    """LUTs of one bank as distributed RAM (64 x 1 per LUT6)."""
    if width <= 0 or depth <= 0:
        return 0
    return width * math.ceil(depth / LUTRAM_BITS_PER_LUT)


@dataclass(frozen=True)
class Blocks:
    """What some storage takes: BRAM18 units, URAM blocks, LUTs (LUTRAM/SRL) and flip-flops."""

    bram18: int = 0
    uram: int = 0
    lut: int = 0
    ff: int = 0

    @property
    def bram36(self) -> float:
        """BRAM36 equivalents (two BRAM18 units each), as the board catalog counts them."""
        return self.bram18 / 2

    def __add__(self, o: "Blocks") -> "Blocks":
        return Blocks(self.bram18 + o.bram18, self.uram + o.uram, self.lut + o.lut, self.ff + o.ff)

    def scaled(self, k: int) -> "Blocks":
        """``k`` copies."""
        return Blocks(self.bram18 * k, self.uram * k, self.lut * k, self.ff * k)

    def to_dict(self) -> dict:
        return {"bram18": self.bram18, "bram36": self.bram36, "uram": self.uram, "lut": self.lut, "ff": self.ff}


@lru_cache(maxsize=1 << 16)   # pure, and Blocks is frozen: one shared answer a bank shape
def bank_blocks(impl: str, width: int, depth: int) -> Blocks:
    """One bank of ``width`` x ``depth`` bound to ``impl``: bram | uram | lutram | srl |
    register | auto (no BIND_STORAGE: LUTRAM up to AUTO_LUTRAM_MAX_BITS, else BRAM)."""
    if impl == "auto":
        impl = "lutram" if width * depth <= AUTO_LUTRAM_MAX_BITS else "bram"
    if impl == "bram":
        return Blocks(bram18=bram18_units(width, depth))
    if impl == "uram":
        return Blocks(uram=uram_blocks(width, depth))
    if impl in ("lutram", "srl"):
        # an SRL32 (UG574) holds 32 deep x 1; LUTRAM 64 x 1
        per = 32 if impl == "srl" else LUTRAM_BITS_PER_LUT
        return Blocks(lut=width * math.ceil(depth / per))
    if impl == "register":
        return Blocks(ff=width * depth)
    raise ValueError(f"unknown storage {impl!r}")


def fifo_impl(width: int, depth: int, bound: str | None = None) -> str:
    """Where Vitis HLS puts an hls::stream FIFO of ``width`` bits x ``depth``: its BIND_STORAGE
    impl when given, else SRL when it is within auto_srl_max_depth or auto_srl_max_bits
    (UG1399 config_storage defaults, read as 'either limit'), else BRAM."""
    if bound:
        return bound
    if depth <= AUTO_SRL_MAX_DEPTH or width * depth <= AUTO_SRL_MAX_BITS:
        return "srl"
    return "bram"


def array_blocks(impl: str, width: int, elements: int, banks: int) -> Blocks:
    """An array of ``elements`` words of ``width`` bits split into ``banks`` equal banks."""
    banks = max(1, banks)
    return bank_blocks(impl, width, math.ceil(elements / banks)).scaled(banks)


# ---------------------------------------------------------------- choosing the storage

#: banks up to this many words are LUTRAM rather than a BRAM18 or a URAM (a BRAM18 holds 1,024 x
#: 18 bits; a bank this shallow would waste most of one) [design choice; codegen's LUTRAM_WORDS]
LUTRAM_DEPTH = 64


#: FIFOs up to this deep are shift registers (one SRLC32E, 32 deep x 1 bit a LUT: UG574)
SRL_DEPTH = 32


def board_fraction(b: Blocks, usable_bram36: int, usable_uram: int) -> float:
    """The larger share ``b`` takes of a board's usable BRAM36 and URAM (what a choice between
    the two should minimise: the scarcer of them)."""
    return max(b.bram36 / max(1, usable_bram36), b.uram / max(1, usable_uram))


def storage_impl(width: int, depth: int, banks: int = 1, usable_bram36: int = 2_304, usable_uram: int = 1_280,
                 fifo: bool = False) -> str:
    """Where ``banks`` banks of ``width`` x ``depth`` go (the one rule the planner and the Design
    share, BIND_STORAGE's impl): a FIFO Vitis would put in SRLs (:func:`fifo_impl`) or up to
    SRL_DEPTH deep is one;
    LUTRAM up to LUTRAM_DEPTH words; else BRAM or URAM, whichever takes the smaller share of the
    board's usable blocks (ties: BRAM). Default usable figures: a U250 (fpga_models.boards)."""
    if fifo and (fifo_impl(width, depth) == "srl" or depth <= SRL_DEPTH):
        return "srl"
    if depth <= LUTRAM_DEPTH:
        return "lutram"
    per = {impl: board_fraction(bank_blocks(impl, width, depth).scaled(banks), usable_bram36, usable_uram)
           for impl in ("bram", "uram")}
    return "uram" if per["uram"] < per["bram"] else "bram"


# ---------------------------------------------------------------- packed weight banks

#: bits of a bank word a packed weight buffer fills: a URAM288's 72, a RAMB36E2's 512 x 72
#: (SDP) or two 1K x 36 ports (UG573)
BANK_WORD_BITS = 72


def packed_elems(elem_bits: int, beat_elems: int, word_elems: "list[int] | tuple[int, ...]") -> int:
    """Elements a bank word of a packed weight buffer holds: as many as fit BANK_WORD_BITS that
    divide an off-chip beat's ``beat_elems`` and every PE x SIMD weight word of ``word_elems``
    (so a beat fills whole bank words and no bank word straddles two weight words)."""
    for e in range(max(1, BANK_WORD_BITS // elem_bits), 0, -1):
        if beat_elems % e == 0 and all(w % e == 0 for w in word_elems):
            return e
    return 1


@dataclass(frozen=True)
class WeightBanks:
    """A packed weight buffer (finn-hlslib's weights as SIMD-wide words per PE, for a shared
    array of ``lanes`` lanes): weight word k of half h (``lanes`` elements, lane l = p*SIMD + s)
    lives in ``banks`` banks of ``elems`` elements a bank word: lane l in bank
    l // (ports*elems), at address ports*k + (l // elems) % ports, element l % elems. Each bank
    serves its ``ports`` (2; 1 when one bank word holds the whole weight word) words of a weight
    word on its two ports (UG573: URAM288 ports A and B; a RAMB36E2's two ports), so one weight
    word a cycle needs lanes / (ports * elems) banks; the halves of a ping-pong buffer are banks
    of their own (one is read while the other is written)."""

    lanes: int
    elem_bits: int
    elems: int          # elements a bank word
    banks: int          # banks a half
    words: int          # weight words a half
    halves: int
    impl: str
    ports: int = 2      # bank words of one weight word a bank (read at once)

    @property
    def depth(self) -> int:
        """Bank words a bank holds (``ports`` per weight word)."""
        return self.ports * self.words

    @property
    def width(self) -> int:
        """Bits of a bank word."""
        return self.elems * self.elem_bits

    @property
    def blocks(self) -> Blocks:
        n = self.halves * self.banks
        return array_blocks(self.impl, self.width, n * self.depth, n)


def weight_banks(lanes: int, elem_bits: int, words: int, halves: int, word_elems, beat_elems: int,
                 usable_bram36: int = 2_304, usable_uram: int = 1_280) -> WeightBanks:
    """The packed buffer of ``words`` weight words of ``lanes`` lanes a half (``word_elems``:
    the PE x SIMD of the matrices it holds), its storage by :func:`storage_impl`."""
    e = packed_elems(elem_bits, beat_elems, list(word_elems) or [lanes])
    ports = 1 if lanes <= e else 2
    banks = max(1, math.ceil(lanes / (ports * e)))
    impl = storage_impl(e * elem_bits, ports * words, banks * halves, usable_bram36, usable_uram)
    return WeightBanks(lanes, elem_bits, e, banks, words, halves, impl, ports)
