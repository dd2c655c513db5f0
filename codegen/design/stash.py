"""Activation stashes of a training build: the forward kernel writes each layer input its
backward kernel reads (codegen.design.backward's stash ports), decided here and printed by stage.cpp.j2
(the tee engine ``bapipe::stash_write``, hls_templates/hls/bapipe_stash.h.j2).

For every tensor a backward stash port reads, the forward kernel's stream carrying it (read off
the Design: the stage input, or the output of the last Design node of the layer producing it)
is teed: a ``stash_write`` process passes every beat on unchanged and writes its elements to an
m_axi argument ``st_<tensor>`` of MB samples (one micro-batch, the backward kernel's MB). A
relu fused into the MVU before it has no stream of its input; its backward reads the sign of
its output instead (the same bits: relu(x) > 0 exactly when x > 0), so every stash is a stream
of the forward. A dense layer behind a flatten reads its stash in the flattened (C, H, W)
order while the stream is HWC: the writer permutes the addresses.

Slots: the host gives the forward call of micro-batch j and the backward call of the same j
the same buffer, slot j mod S of S = bapipe.schedules.chunk_stash_count(schedule, devices, device,
micro-batches, chunks, chunk) buffers per tensor (the peak of the stage's forwards whose backward
has not run; the plan's ``stashes`` of the stage).
Stashes are off chip: the forward and backward are two kernels, which share no on-chip memory.

Time-multiplexed stages (the layers take turns, one sample at a time): the tee goes into the
turn that writes the stream, and the turns' loop hands it the stash at sample i. A stream the
tee cannot reach (written by no single engine, or in a turn that runs once a call) leaves the
stage without stash writers, and ``stash_note`` says why (codegen.check.csim_train then replays them
from the host and lists it in ``not_in_hls``; the xrt host refuses the build).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models.engines import ddr_words_per_beat
from bapipe.schedules import chunk_stash_count


@dataclass
class StashBuf:
    """One stashed tensor: the forward kernel's m_axi argument and the backward ports reading it."""

    name: str               # forward kernel argument st_<tensor>
    tensor: str
    stream: str             # the forward stream it copies
    lanes: int
    elements: int           # per sample
    mb: int                 # samples per call (one micro-batch of one replica)
    slots: int              # buffers per tensor: bapipe.schedules.chunk_stash_count
    chw: tuple[int, int, int] | None = None   # (C, H, W): write HWC beats in flattened C,H,W order
    ports: list[str] = field(default_factory=list)   # the backward kernel's stash arguments
    beats: int = 1          # 512-bit port beats a vector takes (fpga_models.engines.ddr_words_per_beat)
    bundle: str = ""        # its m_axi bundle (codegen.design.bundles)

    @property
    def call(self) -> str:
        c, h, w = self.chw or (1, 1, 1)
        return (f"bapipe::stash_write<{self.lanes}, {self.elements}, {c}, {h}, {w}, "
                f"{'true' if self.chw else 'false'}, {self.beats}>({self.stream}_st, {self.stream}, {self.name}, n)")

    def host_config(self) -> dict:
        return {"arg": self.name, "tensor": self.tensor, "elements": self.elements, "samples": self.mb,
                "slots": self.slots, "backward_args": self.ports,
                "order": "flattened C,H,W (a dense layer behind a flatten)" if self.chw else "stream (HWC)",
                "slot_rule": "micro-batch mod slots (bapipe.schedules.chunk_stash_count)"}


def _ident(t: str) -> str:
    from bapipe.names import legal   # the one way a tensor name becomes an identifier

    return legal(t)


def _layer_nodes(sc, layer: str, node_out: dict[str, str], design_stage) -> list[str]:
    """The Design nodes of ``layer`` that compute it (not forks copying its output): named
    s<i>_<layer> or s<i>_<layer>_<engine>, the longest of the stage's layer names that fits
    owning a node (stem_bn's nodes are not stem's)."""
    from bapipe.codegen.design.dataflow import legal

    names = sorted({legal(lc.name) for lc in sc.layers} | {legal(layer)}, key=len, reverse=True)
    kinds = {b.inst: b.kind for b in design_stage.blocks}

    def owner(inst: str) -> str | None:
        return next((m for m in names if inst == f"s{sc.index}_{m}" or inst.startswith(f"s{sc.index}_{m}_")), None)

    return [n for n in node_out if owner(n) == legal(layer) and kinds.get(n) != "fork"]


def _stream_of(tensor: str, sc, model, node_out: dict[str, str], design_stage) -> tuple[str, tuple | None]:
    """The forward stream carrying ``tensor`` (and the (C,H,W) of an image it carries when the
    tensor is its flattened copy). ValueError when the forward has no such stream."""
    if any(p.tensor == tensor for p in sc.inputs):
        return "in0", None
    layer = model.layers[model.index[tensor]]
    nodes = _layer_nodes(sc, tensor, node_out, design_stage)
    if nodes:
        last = nodes[-1]
        blk = next((b for b in design_stage.blocks if b.inst == last), None)
        if blk is not None and blk.kind == "mvu" and blk.mvu.relu:
            raise ValueError(f"stage {sc.index}: tensor '{tensor}' is the input of a relu fused into "
                             f"{last}: the forward has no stream of it")
        return node_out[last], None
    if layer.type == "relu":    # fused into the layer before it: that node's stream is the relu's output
        src = layer.inputs[0]
        prev = model.layers[model.index[src]] if src in model.index else None
        pn = _layer_nodes(sc, src, node_out, design_stage) if prev is not None else []
        blk = next((b for b in design_stage.blocks if pn and b.inst == pn[-1]), None)
        if blk is None or blk.kind != "mvu" or not blk.mvu.relu:
            raise ValueError(f"stage {sc.index}: relu '{tensor}' has no forward stream")
        return node_out[pn[-1]], None
    if layer.type == "flatten":
        stream, _ = _stream_of(layer.inputs[0], sc, model, node_out, design_stage)
        shape = layer.in_shapes[0]
        return stream, (tuple(int(v) for v in shape) if len(shape) == 3 else None)
    raise ValueError(f"stage {sc.index}: tensor '{tensor}' ({layer.type}) has no forward stream")


def plan_stashes(sc, model, design_stage, schedule: str, devices: int, device: int,
                 microbatches: int, chunks: int = 1, chunk: int = 0, elem_bits: int = 16) -> list[StashBuf]:
    """The stash writers of training stage ``sc`` (a dataflow engine kernel with its backward
    kernel), one per stashed tensor, in the backward kernel's port order; slots: the stage's
    own stash count (bapipe.schedules.chunk_stash_count, the plan's ``stashes``)."""
    es = sc.engine
    slots = chunk_stash_count(schedule, devices, device, microbatches, chunks, chunk)
    out: dict[str, StashBuf] = {}
    for p in sc.bwd.stashes:
        if p.tensor not in out:
            stream, chw = _stream_of(p.tensor, sc, model, es.node_out, design_stage)
            every = es.streams + es.turn_streams + [v for u in es.units for v in u.params + u.streams]
            lanes = es.in_lanes if stream == "in0" else es.out_lanes if stream == "out0" else \
                next(v.lanes for v in every if v.name == stream)
            out[p.tensor] = StashBuf(f"st_{_ident(p.tensor)}", p.tensor, stream, lanes, p.elements, sc.bwd.mb,
                                     slots, chw, beats=ddr_words_per_beat(lanes, elem_bits))
        out[p.tensor].ports.append(p.name)
    return list(out.values())


def add_stash_writers(sc, bufs: list[StashBuf]) -> None:
    """Tee every stashed stream of the forward kernel: its writer (or the input port) now feeds
    ``<stream>_st``, which stash_write copies to the stream and to the stash memory."""
    from bapipe.codegen.design.kernel_types import DEFAULT_DEPTH, VStream

    es = sc.engine
    if es.units:
        _add_to_turns(es, bufs)
        return
    calls, streams = list(es.calls), list(es.streams)   # changed together at the end (or not at all)
    writer_at = {s: calls.index(c) for s, c in es.writers.items() if c in calls}
    teed: set[str] = set()
    for b in bufs:
        if b.stream in teed:
            raise ValueError(f"stream {b.stream} carries two stashed tensors")
        teed.add(b.stream)
        new = f"{b.stream}_st"
        pat = re.compile(rf"\b{re.escape(b.stream)}\b")
        if b.stream == "in0":   # the input port: its readers read the copy; the tee reads the port
            calls = [pat.sub(new, c) for c in calls]
            tee = b.call.replace(f"({new}, {b.stream},", f"({b.stream}, {new},")
        else:                   # the writer writes the copy; the tee writes the stream its readers read
            k = writer_at.get(b.stream)
            if k is None:   # a pass rewrote the writer's call: the one call naming it past its first argument
                ks = [j for j, c in enumerate(calls) if pat.search(c) and not re.search(rf"\(\s*{re.escape(b.stream)}\b", c)]
                if len(ks) != 1:
                    raise ValueError(f"stream {b.stream}: no single engine writes it")
                k = ks[0]
            calls[k] = pat.sub(new, calls[k])
            tee = b.call
        streams.append(VStream(new, b.lanes, DEFAULT_DEPTH))
        calls.append(tee)
    es.calls, es.streams, es.stashes = calls, streams, bufs


def _add_to_turns(es, bufs: list[StashBuf]) -> None:
    """A time-multiplexed stage: each tee goes into the turn that writes the stream (the stage
    input: the turn that reads it); a turn runs one sample a call, so the turns' loop hands it
    the stash at sample i (stage.cpp.j2). All turns change, or none."""
    from bapipe.codegen.design.kernel_types import DEFAULT_DEPTH, VStream

    units = list(es.units)
    saved = [(u, list(u.calls), list(u.streams), list(u.stashes)) for u in units]
    try:
        for b in bufs:
            new = f"{b.stream}_st"
            pat = re.compile(rf"\b{re.escape(b.stream)}\b")
            if b.stream == "in0":
                at = [u for u in units if any(pat.search(c) for c in u.calls)]
                if len(at) != 1:
                    raise ValueError("the stage input is read by more than one turn")
                u = at[0]
                u.calls = [pat.sub(new, c) for c in u.calls]
                tee = b.call.replace(f"({new}, {b.stream},", f"({b.stream}, {new},")
            else:
                w = es.writers.get(b.stream)
                at = [u for u in units if w in u.calls]
                if len(at) != 1:
                    raise ValueError(f"stream {b.stream}: no single turn writes it")
                u = at[0]
                k = u.calls.index(w)
                u.calls[k] = pat.sub(new, w)
                tee = b.call
            if u.once or u is es.feed:
                raise ValueError(f"stream {b.stream} is not written in a per-sample turn")
            u.streams.append(VStream(new, b.lanes, DEFAULT_DEPTH))
            u.calls.append(tee)
            u.stashes.append(b)
    except ValueError:
        for u, c, s, st in saved:
            u.calls, u.streams, u.stashes = c, s, st
        raise
    es.stashes = bufs


def build_stashes(sc, model, design_stage, plan, position: int) -> str | None:
    """Give training stage ``sc`` its stash writers; returns why not (None when done)."""
    if sc.engine is None or sc.bwd is None or not sc.bwd.stashes:
        return None if sc.bwd is None or not sc.bwd.stashes else "not an engine kernel"
    try:
        st = plan.stages[position]
        bufs = plan_stashes(sc, model, design_stage, plan.schedule, plan.devices, st.device, max(1, plan.microbatches),
                            plan.chunks, st.chunk, fx.get_fmt(plan.number_format).width)
        add_stash_writers(sc, bufs)
    except ValueError as e:
        sc.engine.stashes = []
        return str(e)
    return None
