"""The board catalog: FPGA and GPU figures the planner and the cost model build on.

Every figure carries a source (see ``Board.sources`` and docs/boards.md). Figures marked
[verify] in the comments are documented defaults, not truths: override them per board in
a cluster YAML (``overrides:``) or with :func:`with_overrides`.

Units: counts are plain integers, clocks in Hz, sizes in bytes, bandwidths in bytes/s,
``peak_flops`` in FLOP/s with 2 FLOP per multiply-accumulate.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from bapipe.errors import SpecError
from bapipe.numformats import FORMATS, NUMBER_FORMATS
from bapipe.yamlio import Node, _kind

_BYTES = {n: f.bytes for n, f in NUMBER_FORMATS.items()}   # the one table: bapipe.numformats

GiB = 2**30
BRAM36_BYTES = 36 * 1024 // 8  # one BRAM36 holds 36 Kib
URAM_BYTES = 288 * 1024 // 8  # one UltraRAM holds 288 Kib


def bytes_per_element(fmt: str) -> int:
    """Storage bytes of one element in number format ``fmt``."""
    try:
        return _BYTES[fmt]
    except (KeyError, TypeError):
        raise SpecError(None, None, "format", f"unknown number format {fmt!r}; expected one of {', '.join(FORMATS)}") from None


class FrozenMap(dict):
    """A read-only, hashable dict (keeps Board and Cluster hashable and immutable)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def _readonly(self, *a: Any, **k: Any) -> None:
        raise TypeError("FrozenMap is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _readonly  # type: ignore[assignment]

    def __reduce__(self):
        return (FrozenMap, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenMap({dict.__repr__(self)})"


@dataclass(frozen=True)
class Board:
    """One board type: datasheet totals, what is usable after the shell, memory and I/O."""

    name: str
    kind: str  # "fpga" | "gpu"
    description: str
    lut: int
    ff: int
    dsp: int
    bram36: int
    uram: int
    usable_lut: int
    usable_ff: int
    usable_dsp: int
    usable_bram36: int
    usable_uram: int
    clock_hz: float
    offchip_bytes: int
    offchip_bw_Bps: float
    network_ports: int
    port_bw_Bps: float
    pcie_bw_Bps: float
    dsp_per_mac: Mapping[str, float] = field(default_factory=FrozenMap)
    peak_flops: Mapping[str, float] = field(default_factory=FrozenMap)
    sources: tuple[str, ...] = ()
    slrs: tuple["Slr", ...] = ()        # super logic regions (FPGAs; monolithic dies have one)
    banks: tuple["Bank", ...] = ()      # off-chip memory banks as v++ names them (sp=)
    qsfp_slr: int = 0                   # SLR holding the QSFP28 transceivers (network kernels go there)

    def to_dict(self) -> dict:
        """All fields as plain JSON-friendly values."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Mapping):
                v = {k: v[k] for k in sorted(v)}
            elif isinstance(v, tuple):
                v = [x.to_dict() if hasattr(x, "to_dict") else x for x in v]
            out[f.name] = v
        return out

    def bank(self, name: str) -> "Bank | None":
        """The memory bank called ``name`` (``DDR[1]``, ``HBM[7]``), or None."""
        return next((b for b in self.banks if b.name == name), None)


RESOURCES = ("lut", "ff", "dsp", "bram36", "uram")


@dataclass(frozen=True)
class Slr:
    """One super logic region: its resources in total and what the shell leaves usable."""

    index: int
    lut: int
    ff: int
    dsp: int
    bram36: int
    uram: int
    usable_lut: int
    usable_ff: int
    usable_dsp: int
    usable_bram36: int
    usable_uram: int

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def on_chip_bytes(self) -> int:
        """Usable BRAM36 x 36 Kib + URAM x 288 Kib of this SLR, in bytes."""
        return self.usable_bram36 * BRAM36_BYTES + self.usable_uram * URAM_BYTES


@dataclass(frozen=True)
class Bank:
    """One off-chip memory bank: its v++ name (``sp=<cu>.<port>:<name>``), size, bandwidth and
    the SLR its controller (DDR) or switch (HBM) sits in."""

    name: str
    kind: str            # "ddr" | "hbm"
    bytes: int
    bw_Bps: float
    slr: int

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def derived_peak_flops(usable_dsp: int, dsp_per_mac: Mapping[str, float], clock_hz: float) -> FrozenMap:
    """FPGA peak FLOP/s per format: 2 * usable_dsp / dsp_per_mac * clock_hz."""
    return FrozenMap({fmt: 2.0 * usable_dsp / d * clock_hz for fmt, d in sorted(dsp_per_mac.items())})


def on_chip_bytes(board: Board) -> int:
    """Usable on-chip RAM: BRAM36 x 36 Kib + URAM x 288 Kib, in bytes."""
    return board.usable_bram36 * BRAM36_BYTES + board.usable_uram * URAM_BYTES


# DSP blocks per MAC per cycle on AMD DSP48E2 parts (UG1399 operator tables, WP486):
# fixed point up to 18x27 bits: 1 DSP per MAC; int8: 2 MACs share a DSP (WP486);
# floating point [verify]: fp32 fmul 3 + fadd 2 = 5, fp16/bf16 hmul 2 + hadd 1 = 3 DSPs.
_AMD_DSP_PER_MAC = {"fixed16": 1.0, "int8": 0.5, "fp16": 3.0, "bf16": 3.0, "fp32": 5.0}
# Intel Stratix 10 variable-precision DSP: two 18x19 multipliers per block, and a hard
# IEEE-754 single-precision multiply-add per block (Intel Stratix 10 DSP user guide UG-S10-DSP).
# fp16/bf16 run on the fp32 datapath; int8 counted like 18x19 (no extra packing) [verify].
_INTEL_DSP_PER_MAC = {"fixed16": 0.5, "int8": 0.5, "fp16": 1.0, "bf16": 1.0, "fp32": 1.0}

_QSFP28_AURORA_Bps = 11.9e9  # Aurora 64B/66B on 4x25.78 Gb/s, ~95 Gb/s payload (AMD PG074)
_SFP_PLUS_AURORA_Bps = 1.19e9  # Aurora 64B/66B on one 10.3125 Gb/s lane, ~9.5 Gb/s payload [verify]
_PCIE_GEN3_X16_Bps = 12.0e9  # XDMA effective, of 15.75 GB/s raw (AMD PG195 / UG1393) [verify]
_ALVEO_KERNEL_CLOCK_HZ = 300e6  # Vitis default kernel clock on Alveo platforms (UG1393, UG1120)


def slr_table(total_rows, usable_rows) -> tuple[Slr, ...]:
    """SLRs from per-SLR rows of (LUT, FF, DSP, BRAM36, URAM), totals and usable."""
    return tuple(Slr(i, *t, *u) for i, (t, u) in enumerate(zip(total_rows, usable_rows, strict=True)))


def bank_table(kind: str, count: int, each_bytes: int, each_bw_Bps: float, slrs, first: int = 0) -> tuple[Bank, ...]:
    """``count`` equal banks ``DDR[first..]`` / ``HBM[first..]``; ``slrs``: one SLR index, or one per bank."""
    slr_of = list(slrs) if isinstance(slrs, (list, tuple)) else [slrs] * count
    return tuple(Bank(f"{kind.upper()}[{first + k}]", kind, int(each_bytes), float(each_bw_Bps), slr_of[k])
                 for k in range(count))


def _fpga(name, description, total, usable, clock_hz, offchip_bytes, offchip_bw_Bps,
          network_ports, port_bw_Bps, pcie_bw_Bps, dsp_per_mac, sources, slrs=(), banks=(), qsfp_slr=0) -> Board:
    lut, ff, dsp, bram36, uram = total
    ulut, uff, udsp, ubram, uuram = usable
    dpm = FrozenMap(sorted(dsp_per_mac.items()))
    return Board(
        name=name, kind="fpga", description=description,
        lut=lut, ff=ff, dsp=dsp, bram36=bram36, uram=uram,
        usable_lut=ulut, usable_ff=uff, usable_dsp=udsp, usable_bram36=ubram, usable_uram=uuram,
        clock_hz=float(clock_hz), offchip_bytes=int(offchip_bytes), offchip_bw_Bps=float(offchip_bw_Bps),
        network_ports=network_ports, port_bw_Bps=float(port_bw_Bps), pcie_bw_Bps=float(pcie_bw_Bps),
        dsp_per_mac=dpm, peak_flops=derived_peak_flops(udsp, dpm, clock_hz), sources=tuple(sources),
        slrs=tuple(slrs), banks=tuple(banks), qsfp_slr=qsfp_slr,
    )


# Per-SLR tables: (LUT, FF, DSP, BRAM36, URAM). Totals split the die's datasheet figures over
# its SLRs (AMD DS923: the Virtex UltraScale+ HBM/VU9P/VU13P dies are stacks of equal SLRs);
# usable rows are FINN's per-SLR platform tables (src/finn/util/platforms.py, "observed from
# Vivado"; UG1120's per-SLR "available" tables are a few percent lower), BRAM_18K / 2 = BRAM36.
_U250_SLRS = slr_table([(432_000, 864_000, 3_072, 672, 320)] * 4,
                       [(375_000, 750_000, 2_880, 576, 320)] * 4)
_VU37P_SLRS_TOTAL = [(434_560, 869_120, 3_008, 672, 320)] * 3   # XCU280 / XCU55C: 1,303,680 LUT in 3 SLRs
_U280_USABLE = [(400_800, 801_600, 2_736, 600, 320), (382_080, 764_160, 2_880, 576, 320),
                (380_640, 761_280, 2_880, 576, 320)]
_U280_SLRS = slr_table(_VU37P_SLRS_TOTAL, _U280_USABLE)
# VU9P (VCU118, U200): 3 equal SLRs; usable: FINN Alveo_NxU200_Platform (SLR1 holds the static shell)
_VU9P_SLRS = slr_table([(394_080, 788_160, 2_280, 720, 320)] * 3,
                       [(385_920, 771_840, 2_268, 714, 320), (199_680, 399_360, 1_320, 420, 160),
                        (385_920, 771_840, 2_268, 714, 320)])


def _gpu(name, description, clock_hz, offchip_bytes, offchip_bw_Bps, network_ports, port_bw_Bps,
         pcie_bw_Bps, peak_flops, sources) -> Board:
    return Board(
        name=name, kind="gpu", description=description,
        lut=0, ff=0, dsp=0, bram36=0, uram=0,
        usable_lut=0, usable_ff=0, usable_dsp=0, usable_bram36=0, usable_uram=0,
        clock_hz=float(clock_hz), offchip_bytes=int(offchip_bytes), offchip_bw_Bps=float(offchip_bw_Bps),
        network_ports=network_ports, port_bw_Bps=float(port_bw_Bps), pcie_bw_Bps=float(pcie_bw_Bps),
        dsp_per_mac=FrozenMap(), peak_flops=FrozenMap(sorted(peak_flops.items())), sources=tuple(sources),
    )


# Usable figures for Alveo cards: FINN's per-SLR platform tables (src/finn/util/platforms.py,
# "observed from Vivado"), summed over SLRs; BRAM_18K / 2 = BRAM36.
BOARDS: dict[str, Board] = {
    "U250": _fpga(
        "U250", "AMD Alveo U250 (XCU250, 4 SLRs), 64 GB DDR4",
        # DS962: 1,728K LUT, 3,456K FF, 12,288 DSP, 2,688 BRAM36, 1,280 URAM
        total=(1_728_000, 3_456_000, 12_288, 2_688, 1_280),
        # FINN Alveo_NxU250_Platform: 4 x [375,000 LUT, 750,000 FF, 576 BRAM36, 320 URAM, 2,880 DSP]
        usable=(1_500_000, 3_000_000, 11_520, 2_304, 1_280),
        clock_hz=_ALVEO_KERNEL_CLOCK_HZ,
        offchip_bytes=64 * GiB,
        offchip_bw_Bps=4 * 19.2e9,  # 4 x DDR4-2400 x 64 bit = 76.8 GB/s (DS962)
        network_ports=2, port_bw_Bps=_QSFP28_AURORA_Bps, pcie_bw_Bps=_PCIE_GEN3_X16_Bps,
        dsp_per_mac=_AMD_DSP_PER_MAC,
        sources=("AMD DS962 (Alveo U200/U250 data sheet)", "FINN src/finn/util/platforms.py (usable)",
                 "AMD UG1393 / UG1120 (300 MHz kernel clock)", "AMD PG074 (Aurora 64B/66B)", "AMD WP486 (int8 packing)"),
        slrs=_U250_SLRS,
        # UG1120 (U250 platform): four DDR4 channels, DDR[k] attached to SLR k, 16 GB and 19.2 GB/s each
        banks=bank_table("ddr", 4, 16 * GiB, 19.2e9, [0, 1, 2, 3]),
        qsfp_slr=2,   # XUP VNx config_files: cmac/networklayer in SLR2 (FINN's table says SLR3 [verify])
    ),
    "U280": _fpga(
        "U280", "AMD Alveo U280 (XCU280, 3 SLRs), 8 GB HBM2 + 32 GB DDR4",
        # DS963: 1,304K LUT, 2,607K FF, 9,024 DSP, 2,016 BRAM36, 960 URAM; the exact LUT/FF
        # counts of the XCVU37P die (DS923): 1,303,680 LUT, 2,607,360 FF
        total=(1_303_680, 2_607_360, 9_024, 2_016, 960),
        # FINN Alveo_NxU280_Platform: LUT 400,800+382,080+380,640; BRAM36 600+576+576; DSP 2,736+2,880+2,880
        usable=(1_163_520, 2_327_040, 8_496, 1_752, 960),
        clock_hz=_ALVEO_KERNEL_CLOCK_HZ,
        offchip_bytes=(8 + 32) * GiB,
        offchip_bw_Bps=460e9 + 2 * 19.2e9,  # HBM2 460 GB/s + 2 x DDR4-2400 (DS963)
        network_ports=2, port_bw_Bps=_QSFP28_AURORA_Bps, pcie_bw_Bps=_PCIE_GEN3_X16_Bps,
        dsp_per_mac=_AMD_DSP_PER_MAC,
        sources=("AMD DS963 (Alveo U280 data sheet)", "FINN src/finn/util/platforms.py (usable)",
                 "AMD UG1393 / UG1120 (300 MHz kernel clock)", "AMD PG074 (Aurora 64B/66B)", "AMD WP486 (int8 packing)"),
        slrs=_U280_SLRS,
        # UG1120 (U280 platform): 32 HBM2 pseudo-channels of 256 MB behind the HBM switch in SLR0
        # (460 GB/s / 32 = 14.375 GB/s each); DDR[0] in SLR0, DDR[1] in SLR1 (16 GB, 19.2 GB/s)
        banks=bank_table("hbm", 32, 8 * GiB // 32, 460e9 / 32, 0)
        + bank_table("ddr", 2, 16 * GiB, 19.2e9, [0, 1]),
        qsfp_slr=2,   # XUP VNx config_files (slr=cmac_0:SLR2); FINN Alveo_NxU280_Platform eth_slr=2
    ),
    "U55C": _fpga(
        "U55C", "AMD Alveo U55C (XCU55C), 16 GB HBM2",
        # DS978: 1,304K LUT, 2,607K FF, 9,024 DSP, 2,016 BRAM36, 960 URAM (exact: 1,303,680 / 2,607,360,
        # the XCU280's die, DS923)
        total=(1_303_680, 2_607_360, 9_024, 2_016, 960),
        # FINN's U55C entry reuses the U280 per-SLR figures [verify]
        usable=(1_163_520, 2_327_040, 8_496, 1_752, 960),
        clock_hz=_ALVEO_KERNEL_CLOCK_HZ,
        offchip_bytes=16 * GiB,
        offchip_bw_Bps=460e9,  # HBM2 (DS978)
        network_ports=2, port_bw_Bps=_QSFP28_AURORA_Bps, pcie_bw_Bps=_PCIE_GEN3_X16_Bps,
        dsp_per_mac=_AMD_DSP_PER_MAC,
        sources=("AMD DS978 (Alveo U55C data sheet)", "FINN src/finn/util/platforms.py (usable, as U280) [verify]",
                 "AMD UG1393 / UG1120 (300 MHz kernel clock)", "AMD PG074 (Aurora 64B/66B)", "AMD WP486 (int8 packing)"),
        slrs=_U280_SLRS,
        # UG1120 (U55C platform): 32 HBM2 pseudo-channels of 512 MB in SLR0, no DDR
        banks=bank_table("hbm", 32, 16 * GiB // 32, 460e9 / 32, 0),
        qsfp_slr=2,   # as U280 (same die and QSFP28 quads) [verify]
    ),
    "VCU118": _fpga(
        "VCU118", "AMD VCU118 evaluation kit (Virtex UltraScale+ XCVU9P), 2 x 4 GB DDR4",
        # DS923 (XCVU9P): 1,182,240 LUT, 2,364,480 FF, 6,840 DSP, 2,160 BRAM36, 960 URAM
        total=(1_182_240, 2_364_480, 6_840, 2_160, 960),
        # No Vitis shell, but DDR controllers, Aurora and host DMA take a similar share:
        # FINN's U200 (same VU9P die) usable figures [verify]
        usable=(971_520, 1_943_040, 5_856, 1_848, 800),
        clock_hz=250e6,  # [verify] typical timing closure for a full-chip VU9P design
        offchip_bytes=8 * GiB,  # two 4 GB DDR4 component banks (UG1224) [verify]
        offchip_bw_Bps=2 * 19.2e9,  # 2 x DDR4-2400 x 64 bit [verify]
        network_ports=2, port_bw_Bps=_QSFP28_AURORA_Bps, pcie_bw_Bps=_PCIE_GEN3_X16_Bps,
        dsp_per_mac=_AMD_DSP_PER_MAC,
        sources=("AMD DS923 (Virtex UltraScale+ data sheet)", "AMD UG1224 (VCU118 user guide)",
                 "FINN src/finn/util/platforms.py (U200 usable) [verify]", "AMD PG074 (Aurora 64B/66B)"),
        slrs=_VU9P_SLRS,
        # UG1224: two DDR4 component banks (C1, C2) of 4 GB; the SLRs their I/O banks sit in [verify]
        banks=bank_table("ddr", 2, 4 * GiB, 19.2e9, [0, 1]),
        qsfp_slr=2,   # [verify]: no Vitis shell, QSFP28 quads per UG1224
    ),
    "ZCU102": _fpga(
        "ZCU102", "AMD ZCU102 evaluation kit (Zynq UltraScale+ XCZU9EG), 4 GB PS DDR4",
        # DS891 (XCZU9EG): 274,080 LUT, 548,160 FF, 2,520 DSP, 912 BRAM36, no URAM
        total=(274_080, 548_160, 2_520, 912, 0),
        # FINN ZU9EG_Platform: [274,000 LUT, 548,000 FF, 1,824 BRAM18, 0 URAM, 2,520 DSP]
        usable=(274_000, 548_000, 2_520, 912, 0),
        clock_hz=200e6,  # [verify] typical PL clock for ZCU102 accelerators
        offchip_bytes=4 * GiB,  # PS DDR4 (UG1182)
        offchip_bw_Bps=19.2e9,  # DDR4-2400 x 64 bit, REFERENCES ~19 GB/s [verify]
        network_ports=4, port_bw_Bps=_SFP_PLUS_AURORA_Bps,  # 4 SFP+ cages (UG1182)
        pcie_bw_Bps=2.0e9,  # PCIe Gen2 x4 [verify]
        dsp_per_mac=_AMD_DSP_PER_MAC,
        sources=("AMD DS891 (Zynq UltraScale+ MPSoC overview)", "AMD UG1182 (ZCU102 user guide)",
                 "FINN src/finn/util/platforms.py (usable)"),
        # one die, no stacked SLRs (DS891): one region holding everything
        slrs=slr_table([(274_080, 548_160, 2_520, 912, 0)], [(274_000, 548_000, 2_520, 912, 0)]),
        banks=bank_table("ddr", 1, 4 * GiB, 19.2e9, 0),   # PS DDR4 (UG1182)
    ),
    "S10MX": _fpga(
        "S10MX", "Intel Stratix 10 MX 2100 (1SM21B) board, 16 GB HBM2",
        # Intel Stratix 10 MX product table (MX 2100): 702,720 ALMs, 2,810,880 ALM registers,
        # 3,960 DSP blocks, 6,847 M20K blocks. lut = 2 x ALMs (two LUT outputs per ALM) [verify].
        # bram36 = M20K blocks converted to 36 Kib equivalents: 6,847 x 20 / 36 = 3,803.
        total=(1_405_440, 2_810_880, 3_960, 3_803, 0),
        # BSP (DMA, HBM and network IP) share assumed 10% of everything [verify]
        usable=(1_264_896, 2_529_792, 3_564, 3_423, 0),
        clock_hz=300e6,  # [verify] typical HLS/OpenCL kernel clock on Stratix 10
        offchip_bytes=16 * GiB,  # HBM2 up to 16 GB, 512 GB/s (Intel Stratix 10 MX overview)
        offchip_bw_Bps=512e9,
        network_ports=4, port_bw_Bps=_QSFP28_AURORA_Bps,  # board-dependent, e.g. 4 x QSFP28 [verify]
        pcie_bw_Bps=_PCIE_GEN3_X16_Bps,
        dsp_per_mac=_INTEL_DSP_PER_MAC,
        sources=("Intel Stratix 10 MX FPGA product table", "Intel Stratix 10 variable precision DSP user guide",
                 "board network ports and BSP share [verify]"),
        # monolithic core fabric (HBM2 stacks attach through EMIB): one region [verify];
        # 2 HBM2 stacks x 16 pseudo-channels = 32 of 512 MB, 16 GB/s each (512 GB/s / 32)
        slrs=slr_table([(1_405_440, 2_810_880, 3_960, 3_803, 0)], [(1_264_896, 2_529_792, 3_564, 3_423, 0)]),
        banks=bank_table("hbm", 32, 16 * GiB // 32, 512e9 / 32, 0),
    ),
    "V100": _gpu(
        "V100", "NVIDIA Tesla V100 SXM2 32 GB",
        clock_hz=1530e6,  # boost clock (V100 data sheet)
        offchip_bytes=32 * GiB, offchip_bw_Bps=900e9,  # HBM2 900 GB/s
        # NVLink 2.0: 6 links x 25 GB/s per direction = 150 GB/s per direction per GPU
        # (300 GB/s counting both directions). port_bw is one link, one direction.
        network_ports=6, port_bw_Bps=25e9,
        pcie_bw_Bps=_PCIE_GEN3_X16_Bps,  # PCIe Gen3 x16, ~12 GB/s effective of 15.75 raw [verify]
        # fp32 15.7 TFLOPS, fp16 tensor 125 TFLOPS, int8 via dp4a 4 x fp32 rate = 62.8 TOPS [verify];
        # no bf16 hardware on Volta
        peak_flops={"fp32": 15.7e12, "fp16": 125e12, "int8": 62.8e12},
        sources=("NVIDIA Tesla V100 data sheet", "NVIDIA Volta architecture whitepaper (NVLink 2.0)"),
    ),
    "A100": _gpu(
        "A100", "NVIDIA A100 SXM4 40 GB",
        clock_hz=1410e6,  # boost clock (A100 data sheet)
        offchip_bytes=40 * GiB, offchip_bw_Bps=1555e9,  # HBM2 1,555 GB/s
        # NVLink 3: 12 links x 25 GB/s per direction = 300 GB/s per direction (600 GB/s total)
        network_ports=12, port_bw_Bps=25e9,
        pcie_bw_Bps=25e9,  # PCIe Gen4 x16, ~25 GB/s effective of 31.5 raw [verify]
        # dense (no structured sparsity): fp32 19.5T, bf16/fp16 tensor 312T, int8 624 TOPS
        peak_flops={"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12, "int8": 624e12},
        sources=("NVIDIA A100 data sheet", "NVIDIA Ampere GA100 architecture whitepaper"),
    ),
}


# Added with the per-SLR tables (issue 16): appended after the GPUs so that the catalog's
# order (and the "expected one of ..." lists) of the boards above stays as it was.
BOARDS["U200"] = _fpga(
    "U200", "AMD Alveo U200 (XCU200, 3 SLRs), 64 GB DDR4",
    # DS962: 1,182K LUT, 2,364K FF, 6,840 DSP, 75.9 Mb BRAM (2,160 BRAM36), 270 Mb URAM (960):
    # the VU9P die's 1,182,240 / 2,364,480 (DS923)
    total=(1_182_240, 2_364_480, 6_840, 2_160, 960),
    # FINN Alveo_NxU200_Platform: 385,920 + 199,680 + 385,920 LUT; DSP 2,268 + 1,320 + 2,268
    usable=(971_520, 1_943_040, 5_856, 1_848, 800),
    clock_hz=_ALVEO_KERNEL_CLOCK_HZ,
    offchip_bytes=64 * GiB,
    offchip_bw_Bps=4 * 19.2e9,  # 4 x DDR4-2400 x 64 bit = 76.8 GB/s (DS962: 77 GB/s)
    network_ports=2, port_bw_Bps=_QSFP28_AURORA_Bps, pcie_bw_Bps=_PCIE_GEN3_X16_Bps,
    dsp_per_mac=_AMD_DSP_PER_MAC,
    sources=("AMD DS962 (Alveo U200/U250 data sheet)", "FINN src/finn/util/platforms.py (usable)",
             "AMD UG1120 / platforminfo (DDR banks per SLR)", "AMD UG1393 / UG1120 (300 MHz kernel clock)",
             "AMD PG074 (Aurora 64B/66B)", "AMD WP486 (int8 packing)"),
    slrs=_VU9P_SLRS,
    # the U200 xdma platform's memory report (platforminfo, UG1120): DDR[0] SLR0, DDR[1] and
    # DDR[2] SLR1 (DDR[1] in the static region), DDR[3] SLR2; 16 GB and 19.2 GB/s each
    banks=bank_table("ddr", 4, 16 * GiB, 19.2e9, [0, 1, 1, 2]),
    qsfp_slr=2,   # XUP VNx config_files (slr=cmac_0:SLR2); FINN Alveo_NxU200_Platform eth_slr=2
)
BOARDS["U50"] = _fpga(
    "U50", "AMD Alveo U50 (XCU50, 2 SLRs), 8 GB HBM2",
    # DS965: 872K LUT, 1,743K FF, 5,952 DSP, 47.3 Mb BRAM (1,344 BRAM36), 180 Mb URAM (640);
    # exact LUT/FF: 871,680 / 1,743,360 (two SLRs of 435,840 LUT) [verify]
    total=(871_680, 1_743_360, 5_952, 1_344, 640),
    # FINN Alveo_NxU50_Platform ("observed from Vivado"): SLR0 374,400 LUT, 564 BRAM36, 304 URAM,
    # 2,592 DSP; SLR1 368,160 LUT, 564 BRAM36, 304 URAM, 2,760 DSP
    usable=(742_560, 1_485_120, 5_352, 1_128, 608),
    clock_hz=_ALVEO_KERNEL_CLOCK_HZ,
    offchip_bytes=8 * GiB,
    offchip_bw_Bps=316e9,  # HBM2 (DS965) [verify: later revisions of the card quote 201 GB/s]
    network_ports=1, port_bw_Bps=_QSFP28_AURORA_Bps, pcie_bw_Bps=_PCIE_GEN3_X16_Bps,  # one QSFP28 cage
    dsp_per_mac=_AMD_DSP_PER_MAC,
    sources=("AMD DS965 (Alveo U50 data sheet)", "FINN src/finn/util/platforms.py (usable)",
             "AMD UG1120 (U50 platform: HBM[0:31] in SLR0)", "AMD UG1393 / UG1120 (300 MHz kernel clock)",
             "AMD PG074 (Aurora 64B/66B)", "AMD WP486 (int8 packing)"),
    slrs=slr_table([(435_840, 871_680, 2_976, 672, 320)] * 2,
                   [(374_400, 748_800, 2_592, 564, 304), (368_160, 736_320, 2_760, 564, 304)]),
    # UG1120 (U50 gen3x16 xdma platform): 8 GB of HBM through 32 pseudo-channels, HBM[0:31] in SLR0
    banks=bank_table("hbm", 32, 8 * GiB // 32, 316e9 / 32, 0),
    qsfp_slr=1,   # XUP VNx builds for the U50 move its network kernels to SLR1 (its Makefile)
)


def get_board(name: str) -> Board:
    """The catalog entry for ``name``; an unknown name is a SpecError listing the known ones."""
    if isinstance(name, str) and name in BOARDS:
        return BOARDS[name]
    shown = repr(name) if isinstance(name, str) else _kind(name)
    raise SpecError(None, None, "board", f"unknown board type {shown}; expected one of {', '.join(BOARDS)}")


# --- overrides ----------------------------------------------------------------------------

INT_FIELDS = ("lut", "ff", "dsp", "bram36", "uram",
              "usable_lut", "usable_ff", "usable_dsp", "usable_bram36", "usable_uram",
              "offchip_bytes", "network_ports")
FLOAT_FIELDS = ("clock_hz", "offchip_bw_Bps", "port_bw_Bps", "pcie_bw_Bps")
OVERRIDABLE = INT_FIELDS + FLOAT_FIELDS + ("description", "dsp_per_mac", "peak_flops")

# PyYAML (YAML 1.1) reads `12e9` (no dot) as a string: accept such strings as numbers.
_NUM_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def read_number(node: Node, key: str, *, positive: bool = True, minimum: float | None = None) -> float:
    """A finite number at ``node[key]`` (numeric strings like '12e9' accepted)."""
    v = node[key]
    if isinstance(v, str) and _NUM_RE.match(v.strip()):
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise node.error(key, f"expected a finite number, got {_kind(v)}")
    if positive and v <= 0:
        raise node.error(key, f"expected a number > 0, got {v}")
    if minimum is not None and v < minimum:
        raise node.error(key, f"expected a number >= {minimum}, got {v}")
    return float(v)


def read_int(node: Node, key: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer at ``node[key]`` (integral floats like 1.5e6 accepted)."""
    v = node[key]
    if isinstance(v, str) and _NUM_RE.match(v.strip()):
        v = float(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise node.error(key, f"expected an integer, got {_kind(v)}")
    if v < minimum:
        raise node.error(key, f"expected an integer >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise node.error(key, f"expected an integer <= {maximum}, got {v}")
    return v


def _format_map(node: Node, key: str) -> dict[str, float]:
    m = node[key]
    if not isinstance(m, Node):
        raise node.error(key, f"expected a mapping of number format to number, got {_kind(m)}")
    out = {}
    for fmt in m:
        if fmt not in FORMATS:
            raise m.error(fmt, f"unknown number format '{fmt}'; expected one of {', '.join(FORMATS)}")
        out[fmt] = read_number(m, fmt)
    return out


def with_overrides(board: Board, node: Any) -> Board:
    """``board`` with fields replaced from a YAML mapping; SpecError on bad keys or values.

    Any numeric field and ``description`` may be overridden. ``dsp_per_mac`` entries are
    merged per format (FPGAs only); an FPGA's ``peak_flops`` is always re-derived from
    usable_dsp, dsp_per_mac and clock_hz, a GPU's ``peak_flops`` entries may be overridden.
    """
    if not isinstance(node, Node):
        line = getattr(node, "line", None)
        raise SpecError(getattr(node, "file", None), line, getattr(node, "path", None) or "overrides",
                        f"expected a mapping of board fields, got {_kind(node)}")
    changes: dict[str, Any] = {}
    for key in node:
        if key not in OVERRIDABLE:
            raise node.error(key, f"unknown board field '{key}'; expected one of {', '.join(OVERRIDABLE)}")
        if key in INT_FIELDS:
            changes[key] = read_int(node, key, minimum=1 if key == "network_ports" else 0)
        elif key in FLOAT_FIELDS:
            changes[key] = read_number(node, key)
        elif key == "description":
            v = node[key]
            if not isinstance(v, str) or not v.strip():
                raise node.error(key, f"expected a non-empty string, got {_kind(v)}")
            changes[key] = v
        elif key == "dsp_per_mac":
            if board.kind != "fpga":
                raise node.error(key, f"only FPGA boards have dsp_per_mac; {board.name} is a {board.kind}")
            changes[key] = FrozenMap(sorted({**board.dsp_per_mac, **_format_map(node, key)}.items()))
        elif key == "peak_flops":
            if board.kind == "fpga":
                raise node.error(key, "an FPGA's peak_flops is derived from usable_dsp, dsp_per_mac and clock_hz; "
                                      "override those instead")
            changes[key] = FrozenMap(sorted({**board.peak_flops, **_format_map(node, key)}.items()))
    new = replace(board, **changes)
    for res in ("lut", "ff", "dsp", "bram36", "uram"):
        if getattr(new, "usable_" + res) > getattr(new, res):
            key = "usable_" + res if "usable_" + res in node else res
            raise node.error(key, f"expected usable_{res} ({getattr(new, 'usable_' + res)}) <= {res} "
                                  f"({getattr(new, res)})")
    if new.kind == "fpga":
        new = replace(new, peak_flops=derived_peak_flops(new.usable_dsp, new.dsp_per_mac, new.clock_hz))
    return replace(new, slrs=rescale_slrs(new), banks=rescale_banks(new))


def _split(total: int, weights: list[int]) -> list[int]:
    """``total`` split over ``len(weights)`` parts in proportion to ``weights`` (equal parts when
    they are all 0), largest remainder first, ties to the lower index: the parts sum to ``total``."""
    n = len(weights)
    w = weights if sum(weights) > 0 else [1] * n
    raw = [total * x / sum(w) for x in w]
    parts = [int(math.floor(r)) for r in raw]
    for i in sorted(range(n), key=lambda i: (-(raw[i] - parts[i]), i))[: total - sum(parts)]:
        parts[i] += 1
    return parts


def rescale_slrs(board: Board) -> tuple[Slr, ...]:
    """The board's SLRs with every resource rescaled (in proportion) so that the SLR sums equal
    the board's totals and usable figures again (after an override of a board figure)."""
    if not board.slrs:
        return board.slrs
    cols: dict[str, list[int]] = {}
    for res in RESOURCES:
        for key in (res, "usable_" + res):
            old = [getattr(s, key) for s in board.slrs]
            cols[key] = old if sum(old) == getattr(board, key) else _split(getattr(board, key), old)
    return tuple(replace(s, **{k: v[i] for k, v in cols.items()}) for i, s in enumerate(board.slrs))


def rescale_banks(board: Board) -> tuple[Bank, ...]:
    """The board's banks with sizes and bandwidths rescaled to its (overridden) off-chip figures."""
    if not board.banks:
        return board.banks
    sizes = [b.bytes for b in board.banks]
    if sum(sizes) != board.offchip_bytes:
        sizes = _split(board.offchip_bytes, sizes)
    bw = sum(b.bw_Bps for b in board.banks)
    scale = 1.0 if bw == board.offchip_bw_Bps else board.offchip_bw_Bps / bw
    return tuple(replace(b, bytes=n, bw_Bps=b.bw_Bps * scale) for b, n in zip(board.banks, sizes))


def board_overrides(board: Board) -> dict[str, Any]:
    """The overrides mapping that turns the catalog entry into ``board`` (plain values)."""
    base = get_board(board.name)
    out: dict[str, Any] = {}
    for key in OVERRIDABLE:
        a, b = getattr(base, key), getattr(board, key)
        if key in ("dsp_per_mac", "peak_flops"):
            if key == "peak_flops" and board.kind == "fpga":
                continue
            diff = {f: b[f] for f in sorted(b) if f not in a or a[f] != b[f]}
            if diff:
                out[key] = diff
        elif a != b:
            out[key] = b
    return dict(sorted(out.items()))
