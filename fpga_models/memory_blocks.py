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
