"""The weight-update (SGD with momentum) kernel of a training stage and, for a replicated stage,
the all-reduce kernel between its replicas, decided here and printed by stage_update.cpp.j2 and
stage_allreduce.cpp.j2 (helpers: hls_templates/hls/bapipe_update.h.j2); their cycles are
fpga_models.update's and fpga_models.allreduce's, the functions the planner prices them with.

Update: one call per iteration, after the backward kernel's flush (and the replicas'
all-reduce): for every weight array of the stage (layer weights and biases, kernel layout) it reads

- the exact batch-summed gradient the backward kernel wrote (``wsum_t``, 22 fraction bits),
- the master weights (32[24], m_axi) and the momentum velocity (48[22] in 64-bit words, m_axi),

applies fpga_models.train_fixed.sgd_update bit for bit (constants MU, LR and SHIFT of
train_fixed.sgd_constants are s_axilite arguments, so a run's --lr and momentum need no
rebuild) and writes master and velocity back, plus the 16[10] forward copy twice: in the
backward kernel's layout (``data_t [MH][MW]``, the m_axi weight arguments of stage<i>_bwd) and,
for engine kernels (codegen.design.tm_kernel), in the forward MVU's banked layout
``[NF*SF][PE][SIMD]`` (its writable m_axi weight arrays; biases ``[NF][PE]``). One word of
``LANES`` elements a trip (512-bit beats of sums and velocities), at the II fpga_models.update
gives the array (its banks' bandwidth; a forward copy whose words do not land whole is written
an element a cycle); the arrays follow one another.

All-reduce (replicas > 1): each replica's ``stage<i>_allreduce`` reads the exact gradient sums
its backward kernel flushed and runs a ring reduce-scatter and all-gather with its neighbours
over two AXI4-Stream ports, one word of ``LANES`` sums (480 bits, a network beat's payload) a
trip; each step is a DATAFLOW region of a sender and a receiver process, so no write and read
on the ring share a loop (fpga_models.allreduce). The totals are written back in place before
the update kernel reads them.

Batchnorm scale and shift train like biases: the backward kernel's exact per-channel sums
(ds_*/dsh_*, codegen.design.backward), the forward's ``[C/LANES][LANES]`` arrays written in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bapipe.fpga_models import allreduce as ar
from bapipe.fpga_models import update as upd
from bapipe.codegen.design.weight_layout import take_flat


#: elements of a weight array on which the forward layout is checked at gen time (spread evenly;
#: a column order that is wrong moves nearly every element, so a few thousand find it)
CHECK_ELEMENTS = 4096


@dataclass
class UpdateArray:
    """One weight array the update kernel rewrites (kernel layout: rows x cols)."""

    name: str                 # the weight array (StageCtx.weights: forward/backward argument name)
    layer: str
    key: str                  # "w" | "b" (fpga_models.train_fixed's keys)
    grad: str                 # the backward kernel's weight-gradient array (dw_* / db_*)
    rows: int
    cols: int
    rom: str | None = None    # the forward engine kernel's banked array it also writes
    pe: int = 1               # banking of ``rom``: rows in PE lanes ...
    simd: int = 1             # ... and columns in SIMD lanes
    colmap: list[int] | None = None   # forward column of each kernel column (a dense layer behind a
                                      # flatten reads its vector in HWC order); None: the same
    ii: int = 1               # the update loop's II (fpga_models.update.update_ii)
    flat: tuple[int, int] | None = None   # (C, H x W) of the flattened image a dense layer reads in HWC
                                          # order (colmap is its transposition)
    elem_bytes: int = 2       # bytes of a forward-format weight (the staging buffer's)

    @property
    def words(self) -> int:
        """Words of LANES elements the update loop takes (the buffers are whole words)."""
        return -(-self.count // ar.LANES)

    @property
    def permuted(self) -> bool:
        """Does the forward read its columns in another order than the kernel layout?"""
        return self.colmap is not None and list(self.colmap) != list(range(self.cols))

    def mode(self) -> str:
        """How its forward copy is written (fpga_models.update.write_mode): wide, transpose, narrow."""
        return upd.write_mode(self.count, self.rom is not None, self.cols, self.simd, self.permuted, self.flat,
                              self.pe, self.elem_bytes)

    @property
    def wide(self) -> bool:
        """Does every word land whole in the forward's banked copy (fpga_models.update.wide)?"""
        return upd.wide(self.count, self.rom is not None, self.cols, self.simd, self.permuted)

    @property
    def transposed(self) -> bool:
        """Is its forward copy written through the staging buffer (mode "transpose")?"""
        return self.mode() == "transpose"

    @property
    def blocks(self) -> int:
        """PE-row blocks (NF) of a transposed array; words of one: PE x cols / LANES."""
        return max(1, self.rows // max(1, self.pe))

    @property
    def block_words(self) -> int:
        return self.pe * self.cols // ar.LANES

    @property
    def hw_inverse(self) -> int:
        """H x W's inverse mod LANES (odd: the staging buffer's bank of lane u is (L0 + u HW) mod 8)."""
        return pow(self.flat[1], -1, ar.LANES) if self.flat else 1

    @property
    def rom_param(self) -> str | None:
        """The C parameter of the forward's banked array it writes: words when they land whole or
        are transposed, else elements."""
        if self.rom is None:
            return None
        if self.wide or self.transposed:
            return f"bapipe::wword_t {self.rom}[{self.count // ar.LANES}]"
        return f"bapipe::rom_t {self.rom}[{self.count}]"

    @property
    def colmap_name(self) -> str:
        return f"colmap_{self.name}"

    @property
    def count(self) -> int:
        return self.rows * self.cols

    def dest(self, e: np.ndarray) -> np.ndarray:
        """Where kernel-layout element e lands in the forward's array (flat): the same index
        arithmetic as bapipe::banked_index."""
        e = np.asarray(e, dtype=np.int64)
        r, c = e // self.cols, e % self.cols
        if self.colmap is not None:
            c = np.asarray(self.colmap, dtype=np.int64)[c]
        sf = self.cols // self.simd
        return ((r // self.pe * sf + c // self.simd) * self.pe + r % self.pe) * self.simd + c % self.simd

    def banked(self, kernel_q) -> np.ndarray:
        """Kernel-layout values placed as the update kernel writes the forward's array (flat)."""
        out = np.zeros(self.count, dtype=np.int64)
        out[self.dest(np.arange(self.count))] = np.asarray(kernel_q, dtype=np.int64).reshape(-1)
        return out

    def matches(self, kernel_q, rom_values) -> bool:
        """Does the placement put the weights where the Design's array holds them? Checked on at
        most CHECK_ELEMENTS elements spread over the array (VGG-16's fc6 has 102 M)."""
        n = self.count
        e = np.unique(np.linspace(0, n - 1, min(n, CHECK_ELEMENTS)).astype(np.int64))
        size = rom_values.size if hasattr(rom_values, "size") else np.asarray(rom_values).size
        return size == n and bool(np.array_equal(take_flat(rom_values, self.dest(e)), take_flat(kernel_q, e)))



@dataclass
class UpdateCtx:
    """A stage's update kernel: its arrays and the banked forward arrays in argument order."""

    name: str
    stage: str
    arrays: list[UpdateArray]
    roms: list[tuple[str, int]]     # the forward kernel's external arrays (name, elements), argument order
    grads: list[tuple[str, int]] = field(default_factory=list)   # the backward kernel's gradient arrays
    replicas: int = 1               # data-parallel copies of the stage: > 1 adds the all-reduce kernel
    mb: int = 1                     # samples of a replica's micro-batch (the backward kernel's MB)
    ring: ar.RingTiming | None = None   # the all-reduce as built (fpga_models.allreduce), replicas > 1
    elem_bytes: int = 2             # bytes of one forward-format weight
    banks: int = 1                  # memory banks the update's streams spread over (fpga_models.update)
    bank_bpc: float = 64.0          # bytes a cycle of one of them
    clock_hz: float = 300e6         # the kernels' clock (the board's)
    bwd_flush: int = 0              # the backward kernel's flush as its tiled engines build it (0: none)
    rom_bundles: dict = field(default_factory=dict)   # forward array -> m_axi bundle (codegen.design.bundles.mirror_bundles)

    @property
    def consts(self):
        """The SGD constants the testbenches' pattern mode uses (lr 0.05, momentum 0.9, MB)."""
        from bapipe.fpga_models.train_fixed import get_formats, sgd_constants

        return sgd_constants(0.05, 0.9, self.mb, get_formats("fixed16"))

    @property
    def lanes(self) -> int:
        return ar.LANES

    @property
    def send_depth(self) -> int:
        return ar.SEND_DEPTH

    @property
    def recv_depth(self) -> int:
        return ar.RECV_DEPTH

    @property
    def update_depth(self) -> int:
        return upd.UPDATE_DEPTH

    @property
    def transpose_depth(self) -> int:
        return upd.TRANSPOSE_DEPTH

    @property
    def allreduce_name(self) -> str:
        return f"{self.stage}_allreduce"

    @property
    def grad_words(self) -> list[tuple[str, int, int]]:
        """(name, sums, words) of every gradient array (buffers of whole words)."""
        return [(g, n, -(-n // ar.LANES)) for g, n in self.grads]

    @property
    def allreduce_params(self) -> list[str]:
        """The all-reduce kernel's C parameters: the ring's two stream ports, then per gradient
        array (the backward kernel's dw_*/db_* memory) a read-only view for the sender
        (``snd_<name>``) and the read-write view of the receiver (the host passes one buffer
        to both), this replica's rank and the replica count."""
        out = ["hls::stream<bapipe::ring_t> &ring_in", "hls::stream<bapipe::ring_t> &ring_out"]
        out += [f"const bapipe::gword_t snd_{g}[{w}]" for g, _n, w in self.grad_words]
        out += [f"bapipe::gword_t {g}[{w}]" for g, _n, w in self.grad_words]
        return out + ["int rank", "int replicas"]

    @property
    def allreduce_args(self) -> list[str]:
        return (["ring_in", "ring_out"] + [f"snd_{g}" for g, _n, _w in self.grad_words]
                + [g for g, _n, _w in self.grad_words] + ["rank", "replicas"])

    @staticmethod
    def ring_lanes(elem_bits: int) -> int:
        """The ring's word (fpga_models.allreduce.WORD_BITS) in elements of the plan's format
        (network channels size their stage ports in elements)."""
        return ar.WORD_BITS // elem_bits

    def ring_elements(self, elem_bits: int) -> int:
        """Elements of one ring step (a chunk of every array), as a network channel counts a
        sample's elements."""
        return sum(self.ring.chunks if self.ring else ()) * self.ring_lanes(elem_bits)

    @property
    def allreduce_cycles(self) -> int:
        """Cycles of one all-reduce call (fpga_models.allreduce.RingTiming.cycles)."""
        return self.ring.cycles if self.ring is not None else 0

    @property
    def params(self) -> list[str]:
        """The C parameter list of the top function (whole words: the same memory as the
        backward kernel's [MH][MW] arguments and the forward's banked ones)."""
        out = []
        for a in self.arrays:
            out += [f"const bapipe::gword_t g_{a.name}[{a.words}]", f"bapipe::mword_t m_{a.name}[{a.words}]",
                    f"bapipe::gword_t v_{a.name}[{a.words}]", f"bapipe::wword_t {a.name}[{a.words}]"]
        by_rom = {a.rom: a for a in self.arrays if a.rom is not None}
        out += [by_rom[r].rom_param for r, _n in self.roms]
        return out + ["int mu", "int lr", "int shift"]

    @property
    def args(self) -> list[str]:
        out = []
        for a in self.arrays:
            out += [f"g_{a.name}", f"m_{a.name}", f"v_{a.name}", a.name]
        return out + [r for r, _ in self.roms] + ["mu", "lr", "shift"]

    @property
    def cycles(self) -> int:
        """Cycles of one call (fpga_models.update.update_cycles: each array's words at its II)."""
        return upd.update_cycles([upd.UpdArray(a.count, a.rom is not None, a.mode(), a.blocks)
                                  for a in self.arrays], self.elem_bytes, self.banks, self.bank_bpc)

    @property
    def flush_cycles(self) -> float:
        """Cycles of the backward kernel's flush of the sums: its tiled engines' (bwd_flush,
        fpga_models.bwd_tiles.kernel_flush_cycles), else a beat of 8 sums a cycle an array
        (fpga_models.update.flush_cycles), as fpga_models.update.stage_tail prices it."""
        return self.bwd_flush or upd.flush_cycles([n for _g, n in self.grads], self.bank_bpc)

    def host_config(self) -> dict:
        clk = self.clock_hz
        return {"kernel": self.name,
                "arrays": [{"name": a.name, "layer": a.layer, "kind": a.key, "grad": a.grad, "elements": a.count,
                            "words": a.words, "rows": a.rows, "cols": a.cols, "rom": a.rom, "ii": a.ii,
                            "rom_words": a.rom is not None and a.mode() != "narrow",
                            "write": a.mode()} for a in self.arrays],
                "roms": [{"name": r, "elements": n} for r, n in self.roms],
                "formats": {"master": "int32 raw, 24 fraction bits", "velocity": "int64 raw (48-bit saturating), "
                            "22 fraction bits", "gradient": "int64 exact sum, 22 fraction bits"},
                "constants": "mu, lr, shift: fpga_models.train_fixed.sgd_constants (s_axilite)",
                "lanes": ar.LANES, "cycles": self.cycles, "seconds": self.cycles / clk,
                "flush_cycles": self.flush_cycles, "flush_s": self.flush_cycles / clk,
                "allreduce": None if self.replicas < 2 else {
                    "kernel": self.allreduce_name, "replicas": self.replicas, "cycles": self.allreduce_cycles,
                    "seconds": self.allreduce_cycles / clk,
                    "ii_reduce_scatter": self.ring.ii_rs, "ii_all_gather": self.ring.ii_ag,
                    "latency": self.ring.latency, "chunk_words": list(self.ring.chunks),
                    "arrays": [{"name": g, "elements": n, "words": w} for g, n, w in self.grad_words],
                    "ring": f"reduce-scatter then all-gather, {ar.LANES} sums of {ar.WIRE_BITS} bits a word "
                            "(a network beat's payload); ring_out of replica k feeds ring_in of replica k+1 mod R"}}


@dataclass(frozen=True)
class KernelSite:
    """Where a stage's update and all-reduce kernels run, as their timing needs it: the ring's
    slowest hop (bytes a cycle, latency cycles), the board's clock and memory banks, the
    global batch (the ring's sums must fit fpga_models.allreduce.WIRE_BITS) and the weights'
    bytes. Defaults: an ideal link and memory (unit tests of the layouts)."""

    link_bpc: float = float("inf")
    link_latency: int = 1
    clock_hz: float = 300e6
    banks: int = 1
    bank_bpc: float = float("inf")
    samples: int = 1
    elem_bytes: int = 2


def kernel_site(sc, st, cluster, board, samples: int, elem_bytes: int) -> KernelSite:
    """The KernelSite of plan stage ``st`` (StageCtx ``sc``) on ``board`` (fpga_models.boards.Board,
    None when unknown) in ``cluster``: the ring over its replicas' boards in order, the
    slowest hop's bandwidth and latency (the planner's Explorer.ring)."""
    clk = board.clock_hz if board is not None else 300e6
    bpc, lat = float("inf"), 1
    names = list(sc.boards)
    if cluster is not None and len(names) > 1:
        bw, lat_s = float("inf"), 0.0
        for a, b in zip(names, names[1:] + names[:1]):
            bw = min(bw, cluster.path_bandwidth(a, b))
            lat_s = max(lat_s, cluster.path_latency(a, b))
        bpc, lat = bw / clk, max(1, round(lat_s * clk))
    banks = upd.bank_count(board) if board is not None else 1
    bank = upd.bank_Bps(board) / clk if board is not None else float("inf")
    return KernelSite(bpc, lat, clk, banks, bank, max(1, samples), elem_bytes)


def _sum_terms(layer, samples: int) -> int:
    """Products one exact weight-gradient sum of ``layer`` adds over ``samples`` samples (its
    largest array's): a vector per output pixel (conv2d), per row (dense), per position
    (batchnorm)."""
    from math import prod
    if layer.type == "conv2d":
        return samples * int(layer.out_shape[1]) * int(layer.out_shape[2])
    if layer.type == "batchnorm":
        return samples * (int(prod(layer.out_shape)) // int(layer.out_shape[0]))
    return samples * int(prod(layer.in_shapes[0][:-1]))


def build_update(sc, model=None, replicas: int = 1, site: KernelSite | None = None) -> UpdateCtx | None:
    """The update kernel of training stage ``sc`` (a codegen.design.context.StageCtx with its backward
    kernel), or None for an inference stage or one without weights. ValueError names a layer it
    cannot train, or a replicated stage whose sums do not fit the ring's word.
    ``model`` (the spec Model) finds a flatten in an earlier stage (the forward's column order);
    ``site`` where it runs (its cycles)."""
    site = site or KernelSite()
    from bapipe.codegen.design.dataflow import legal

    if sc.bwd is None:
        return None
    grads = {(g.layer, g.key): g for g in sc.bwd.grad_arrays}
    roms = {r.name: r for r in (sc.engine.roms if sc.engine is not None else [])}
    arrays: list[UpdateArray] = []
    for lc in sc.layers:
        for w in lc.weights:
            key = w.name.rsplit("_", 1)[1]
            g = grads.get((lc.name, {"w": "dw", "b": "db"}.get(key, key)))
            if g is None:
                raise ValueError(f"layer '{lc.name}': weight array '{w.name}' has no gradient from the backward "
                                 f"kernel, so the update kernel cannot train it (dense and conv2d weights and "
                                 f"biases, batchnorm scale and shift are trained)")
            rows, cols = (w.shape[0], int(w.kernel_q.size) // w.shape[0])
            a = UpdateArray(w.name, lc.name, key, g.name, rows, cols)
            rom = roms.get(f"s{sc.index}_{legal(lc.name)}_mvu_{key}")   # codegen.design.dataflow's MVU node name
            if rom is None and key in ("scale", "shift"):   # a batchnorm node's [C/LANES][LANES] arrays
                rom = roms.get(f"s{sc.index}_{legal(lc.name)}_{key}")
            if rom is not None:
                if not rom.external:
                    raise ValueError(f"stage {sc.index}: forward array {rom.name} is ROM; a training build keeps "
                                     f"every weight array in writable m_axi memory")
                a.rom = rom.name
                if key == "w":
                    a.pe, a.simd = rom.shape[1], rom.shape[2]
                    _place_columns(a, lc, sc, rom, w.kernel_q, model)
                else:
                    a.pe, a.simd = rom.shape[1], 1
                    a.rows, a.cols = rom.shape[0] * rom.shape[1], 1
                    if not a.matches(w.kernel_q, rom.values):
                        raise ValueError(f"stage {sc.index}: bias {w.name} is not laid out as {rom.name}")
            arrays.append(a)
    if not arrays:   # no weights (pools, flatten, adds only): nothing to update or all-reduce
        return None
    ext = [(r.name, r.size) for r in (sc.engine.external if sc.engine is not None else [])]
    written = {a.rom for a in arrays}
    missing = [r for r, _ in ext if r not in written]
    if missing:
        raise ValueError(f"stage {sc.index}: forward arrays {', '.join(missing)} have no update")
    for a in arrays:
        a.elem_bytes = site.elem_bytes
        a.ii = upd.update_ii(site.elem_bytes, a.rom is not None, a.mode() != "narrow", site.banks, site.bank_bpc)
    grads = [(g.name, g.count) for g in sc.bwd.grad_arrays]
    r = max(1, replicas)
    ring = None
    if r > 1:
        bits = max((ar.sum_bits(_sum_terms(lc.layer, site.samples), 8 * site.elem_bytes)
                    for lc in sc.layers if lc.layer is not None and lc.weights), default=0)
        if bits > ar.WIRE_BITS:
            raise ValueError(f"stage {sc.index}: the all-reduce carries {ar.WIRE_BITS}-bit sums, its gradients "
                             f"need {bits} bits over {site.samples} samples (fpga_models.allreduce)")
        ring = ar.ring_timing([n for _g, n in grads], r, site.link_bpc, site.link_latency, site.bank_bpc)
    from bapipe.fpga_models.bwd_tiles import kernel_flush_cycles
    return UpdateCtx(name=f"{sc.name}_update", stage=sc.name, arrays=arrays, roms=ext, grads=grads,
                     replicas=r, mb=sc.bwd.mb, ring=ring, elem_bytes=site.elem_bytes, banks=site.banks,
                     bank_bpc=site.bank_bpc, clock_hz=site.clock_hz, bwd_flush=kernel_flush_cycles(sc.bwd.tiles))


def stage_update(sc, model=None, replicas: int = 1, site: KernelSite | None = None) -> tuple[UpdateCtx | None, str | None]:
    """(the update kernel, None), or (None, why not) for a training stage it cannot train
    (gen still writes the forward and backward kernels), or (None, None) for inference."""
    try:
        return build_update(sc, model, replicas, site), None
    except ValueError as e:
        return None, str(e)


def update_config(sc) -> dict | None:
    """The stage's ``update`` entry of host_config.json (from StageCtx.update, set by
    codegen.design.context.build_project)."""
    u, why = sc.update, sc.update_note
    if u is None:
        return None if why is None else {"kernel": None, "not_generated": why}
    return u.host_config()


def _place_columns(a: UpdateArray, lc, sc, rom, kernel_q, model) -> None:
    """Find how the forward MVU's array orders the columns of weight array ``a``: as the kernel
    layout, or (a dense layer reading a flattened image) in the HWC stream order of
    codegen.design.dataflow.flatten_perm; checked against the values the Design placed in ``rom``."""
    from bapipe.codegen.design.dataflow import flatten_perm

    tries: list[list[int] | None] = [None]
    layer = lc.layer
    if layer is not None and layer.type == "dense":
        src = layer.inputs[0]
        flat = next((x.layer for x in sc.layers if x.name == src), None)
        shape = flat.in_shapes[0] if flat is not None and flat.type == "flatten" else None
        if shape is None and model is not None and src in model.index:   # a flatten in an earlier stage
            prev = model.layers[model.index[src]]
            shape = prev.in_shapes[0] if prev.type == "flatten" else None
        if shape is not None and len(shape) == 3:
            tries.insert(0, np.argsort(flatten_perm(*shape)).tolist())
    for cm in tries:
        a.colmap = cm
        if a.matches(kernel_q, rom.values):
            if cm is not None:   # the flatten's transposition of a C x H x W image
                a.flat = (int(shape[0]), int(shape[1]) * int(shape[2]))
            return
    raise ValueError(f"stage {sc.index}: weight array {a.name} is laid out in {rom.name} in an order the update "
                     f"kernel does not know")



@dataclass
class LossCtx:
    """The loss-gradient kernel behind the last stage: softmax cross-entropy of CLASSES logits
    a sample, exactly fpga_models.train_fixed.softmax_xent_grad (constants from there)."""

    name: str
    stage: str                # the last stage (the kernel's files live in its folder)
    classes: int
    max_samples: int          # labels memory: one iteration's samples
    act_frac: int
    grad_frac: int

    @property
    def cycles_per_sample(self) -> int:
        """Three II=1 passes over the logits (max, exp and sum, gradient) and the divider."""
        return 3 * self.classes + 1

    def _tf(self):
        from bapipe.fpga_models import train_fixed as tfx

        return tfx

    @property
    def lut(self) -> list[int]:
        return [int(v) for v in self._tf().EXP2_LUT]

    @property
    def log2e(self) -> int:
        return self._tf().LOG2E_Q

    @property
    def exp_frac(self) -> int:
        return self._tf().EXP_FRAC

    @property
    def exp_mask(self) -> int:
        """t mod 2^EXP_FRAC as a bit mask (the table index)."""
        return (1 << self.exp_frac) - 1

    @property
    def exp_out(self) -> int:
        return self._tf().EXP_OUT

    @property
    def t_shift(self) -> int:
        return self.act_frac + self._tf().LOG2E_FRAC - self.exp_frac

    @property
    def recip_bits(self) -> int:
        return self._tf().RECIP_BITS

    @property
    def p_shift(self) -> int:
        return self.recip_bits - self.grad_frac

    @property
    def max_shift(self) -> int:
        """softmax_fixed's cap on the right shift of 2^t (2^16 >> 40 is 0 already)."""
        return 40

    def host_config(self) -> dict:
        return {"kernel": self.name, "stage": self.stage, "classes": self.classes, "max_samples": self.max_samples,
                "cycles_per_sample": self.cycles_per_sample,
                "arithmetic": "fpga_models.train_fixed.softmax_xent_grad (dz: 16 bits, 12 fraction bits)"}


def build_loss(plan, last) -> LossCtx | None:
    """The loss kernel of a training plan whose last stage ``last`` (StageCtx) puts out one
    vector of logits; None otherwise."""
    from bapipe.fpga_models import train_fixed as tfx

    if plan.mode != "train" or len(last.outputs) != 1 or len(last.outputs[0].shape) != 1:
        return None
    tf = tfx.get_formats(plan.number_format) if plan.number_format in tfx.TRAIN_FORMATS else None
    if tf is None:
        return None
    return LossCtx(name=f"{last.name}_loss", stage=last.name, classes=last.outputs[0].elements,
                   max_samples=max(1, plan.microbatches) * max(1, plan.microbatch_size),
                   act_frac=tf.act.frac, grad_frac=tf.grad.frac)


def loss_config(plan, stages) -> dict | None:
    """The ``loss`` entry of host_config.json (the lowering's loss kernel)."""
    loss = stages[-1].loss if stages else None
    return None if loss is None else loss.host_config()
