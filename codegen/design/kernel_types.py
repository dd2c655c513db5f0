"""The data of a stage's HLS engine kernel (codegen.design.tm_kernel builds it): its constant
arrays, streams, turn functions, off-chip frames and the kernel itself; and the backward
kernel's streams and arrays (BStream, BArray: codegen.design.backward, codegen.design.bwd_engines).
Plain dataclasses, read by the weight-memory, MAC-sharing and stash passes and printed by the
templates."""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

#: Vitis HLS's default hls::stream depth (a wire with no FIFO node on it)
DEFAULT_DEPTH = 2
#: ROM words per bank up to which a weight bank is LUTRAM rather than BRAM (a BRAM18 holds
#: 1024 x 18 bit; a bank this shallow would waste most of one) [design choice]
LUTRAM_WORDS = 64
#: nodes that are wiring, not processes
_ALIASES = ("fifo", "link_rx", "link_tx", "gate", "ddr_frame")


@dataclass
class Rom:
    """One constant array of the kernel: C name, shape, raw values, storage."""

    name: str
    shape: tuple[int, ...]
    values: np.ndarray              # or codegen.design.weight_layout.Banked (an MVU's weights, built when read)
    partition_dims: tuple[int, ...] = ()   # 1-based dims split completely into registers/banks
    impl: str = "bram"                     # BIND_STORAGE impl of each bank
    external: bool = False                 # an m_axi kernel argument (filled from roms.bin), not a ROM
    word_bits: int = 0                     # external, read as packed words of this many bits (codegen.design.weight_memory)
    words: int = 0                         # ... that many of them
    buffer: bool = False                   # an on-chip buffer the kernel writes (the weight tiles), not a ROM
    banks: int = 0                         # buffer: cyclic banks of its last dim (elements read a cycle)
    copy_of: str = ""                      # buffer: what it is an on-chip copy of (for the comment)
    copied: bool = False                   # external, copied on chip once a call (never read in a loop)
    offset: int = 0                        # elements before it in the stage's weight image (codegen.design.weight_image)
    bank: object = None                    # buffer: a packed weight buffer's banks (fpga_models.memory_blocks.WeightBanks)
    bundle: str = ""                       # external: its m_axi bundle (codegen.design.bundles)

    @property
    def size(self) -> int:
        """Elements."""
        return int(np.prod(self.shape))

    @property
    def dims(self) -> str:
        """C array dimensions, e.g. ``[64][8][9]`` (packed words: ``[words]``)."""
        return f"[{self.words}]" if self.word_bits else "".join(f"[{d}]" for d in self.shape)

    @property
    def ctype(self) -> str:
        """C element type: the raw integer, or the packed word of an m_axi array read in bursts."""
        return f"ap_uint<{self.word_bits}>" if self.word_bits else "bapipe::rom_t"

    @property
    def param(self) -> str:
        """The C parameter declaring it (ROMs and m_axi arrays read-only, a buffer writable)."""
        return f"{'' if self.buffer else 'const '}{self.ctype} {self.name}{self.dims}"

    @property
    def pragmas(self) -> list[str]:
        """The HLS pragmas of an on-chip array (a ROM or a buffer), as the Design chose them: a
        packed weight buffer (``bank``, dims [halves][banks][depth][elements]) partitioned into
        its halves and banks with a bank word's elements reshaped into one word; others split
        completely along ``partition_dims``; the storage (BIND_STORAGE, UG1399)."""
        out = []
        if self.bank is not None:
            if self.shape[0] > 1:
                out.append(f"#pragma HLS ARRAY_PARTITION variable={self.name} complete dim=1")
            out.append(f"#pragma HLS ARRAY_PARTITION variable={self.name} complete dim=2")
            out.append(f"#pragma HLS ARRAY_RESHAPE variable={self.name} complete dim=4")
        else:
            out += [f"#pragma HLS ARRAY_PARTITION variable={self.name} complete dim={d}" for d in self.partition_dims]
        kind = "ram_2p" if self.buffer else "rom_1p"
        out.append(f"#pragma HLS BIND_STORAGE variable={self.name} type={kind} impl={self.impl}")
        return out

    def text(self) -> str:
        """The C initializer of the raw integers, nested by dims."""

        def walk(a: np.ndarray, indent: str) -> str:
            if a.ndim == 1:
                return "{" + ", ".join(str(int(v)) for v in a) + "}"
            inner = indent + " "
            return "{" + f",\n{inner}".join(walk(x, inner) for x in a) + "}"

        return walk(np.asarray(self.values).reshape(self.shape), "    ")


@dataclass
class VStream:
    """A packed stream between two engines."""

    name: str
    lanes: int
    depth: int
    impl: str = ""      # BIND_STORAGE impl of a frame buffer FIFO (codegen.design.tm_kernel); "" leaves Vitis's default


@dataclass
class UnitFn:
    """One turn of a time-multiplexed stage: a function with its own DATAFLOW region over the
    engines of one layer, called once per sample; streams that cross turns are parameters."""

    name: str
    params: list[VStream]           # streams shared with other turns or the ports
    streams: list[VStream]          # streams inside the turn
    calls: list[str]
    roms: list["Rom"] = field(default_factory=list)   # the m_axi weight arrays its engines read
    frames: list["DdrFrame"] = field(default_factory=list)   # the off-chip frame buffers it writes or reads
    once: bool = False              # called once a call, before the samples' turns (codegen.design.weight_memory)
    stashes: list = field(default_factory=list)   # training: the stash writers in this turn (codegen.design.stash)
    sequential: bool = False        # its calls run one after another (one process: the weight loads), not DATAFLOW


@dataclass
class DdrFrame:
    """A time-multiplexed stage's frame buffer placed off chip (fpga_models.allocate.frames_offchip), between
    forward turns here or backward turns (codegen.design.backward):
    an m_axi argument of ``words`` words of ``bits`` (one sample's frame, beats x words a beat),
    written by one turn through ``bapipe::frame_write`` and read by the next through ``frame_read``."""

    name: str            # the kernel argument (and its bundle)
    stream: str          # the frame's stream, now two deep inside the writer's and the reader's turns
    lanes: int
    depth: int           # the depth the stream had on chip (codegen.design.onchip: the bytes it frees)
    beats: int           # beats per sample
    bits: int            # bits of one memory word (fpga_models.engines.DDR_WORD_BITS)
    words: int
    bundle: str = ""     # its m_axi bundle (codegen.design.bundles)

    @property
    def bytes(self) -> int:
        """Bytes of off-chip memory it takes."""
        return self.words * self.bits // 8


@dataclass
class EngineStage:
    """The body of a stage kernel read off the Design: port lanes, streams, engine calls, ROMs.

    Dataflow stages: ``streams`` and ``calls`` form one DATAFLOW region. Time-multiplexed
    stages: ``units`` take turns per sample (``streams``: the ones declared in the top
    function, the frame buffers between turns); ``calls`` is then empty."""

    in_lanes: int
    out_lanes: int
    streams: list[VStream]
    calls: list[str]
    roms: list[Rom] = field(default_factory=list)
    line_buffer_elems: int = 0      # window generators' line buffers (elements)
    units: list[UnitFn] = field(default_factory=list)
    feed: UnitFn | None = None      # time-multiplexed: engines beside the turns (input converters)
    turn_streams: list[VStream] = field(default_factory=list)   # the frame buffers between turns (on chip)
    frames: list[DdrFrame] = field(default_factory=list)   # the frame buffers placed off chip
    onchip_budget: int | None = None   # bytes the kernel may keep on chip (fpga_models.allocate)
    acc_bytes: int = 0              # pool engines' per-channel accumulators (C acc_t each)
    node_out: dict[str, str] = field(default_factory=dict)   # Design node -> the stream it writes
    writers: dict[str, str] = field(default_factory=dict)    # stream -> the call that writes it
    stashes: list = field(default_factory=list)   # training: stash writers (codegen.design.stash.StashBuf)
    loads: list[str] = field(default_factory=list)   # dataflow: weight copies filled per call (codegen.design.weight_memory)
    load_roms: list[Rom] = field(default_factory=list)   # ... the m_axi arrays they read, in argument order
    rings: list = field(default_factory=list)   # window generators' rings: (banks, width, depth, storage)
    pool_accs: list = field(default_factory=list)   # pool engines' accumulators: (banks, width, depth)

    @property
    def buffers(self) -> list[Rom]:
        """The on-chip buffers the kernel writes (weight tiles or copies), declared in its top function."""
        return [r for r in self.roms if r.buffer]

    @property
    def turn_params(self) -> list[VStream]:
        """The streams the turns take from the top function: ports and the feed's output."""
        local = {v.name for v in self.turn_streams}
        seen = {v.name: v for u in self.units for v in u.params if v.name not in local}
        return [seen[k] for k in sorted(seen)]

    @property
    def external(self) -> list[Rom]:
        """The weight arrays that are m_axi kernel arguments, in argument order."""
        return [r for r in self.roms if r.external]


@dataclass
class BStream:
    """A stream inside the backward kernel."""

    name: str
    beat: str              # C type of one beat
    depth: int
    beat_bits: int
    storage: str = ""      # BIND_STORAGE impl of a whole-frame FIFO (fpga_models.bwd_tiles.fifo_storage)

    @property
    def bytes(self) -> int:
        """On-chip bytes of its FIFO."""
        return self.depth * ((self.beat_bits + 7) // 8)


@dataclass
class BArray:
    """A static array of the kernel (accumulators, line buffers) or an engine's local buffer."""

    name: str
    ctype: str
    dims: tuple[int, ...]
    bits: int               # per element
    storage: str            # "bram" | "uram" | "lutram" | "registers" | "off-chip"
    local: bool = False     # an engine's own buffer (counted, not declared by the kernel)
    partitions: list[tuple[int, int]] = field(default_factory=list)   # (factor, dim) cyclic
    reshape: tuple = ()     # (factor, dim) cyclic ARRAY_RESHAPE: factor elements a word

    @property
    def bytes(self) -> int:
        return prod(self.dims) * ((self.bits + 7) // 8)

    @property
    def cdims(self) -> str:
        return "".join(f"[{d}]" for d in self.dims)

    @property
    def decl(self) -> str:
        """Its C declaration as a parameter."""
        return f"{self.ctype} {self.name}{self.cdims}"
