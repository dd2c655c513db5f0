"""Training RTL: a `mode: train` plan lowered to per-board training engines and rendered.

A pass over the plan beside the forward lowering (``codegen.design.dataflow``): every board of the
pipeline gets, per layer, the engines its F and B ops need, and one op sequencer running
the plan's schedule (``bapipe.schedules.device_ops``: GPipe, 1F1B, eager-1F1B):

- dense: ``train_mvu_fwd`` (forward), ``mvu_bwd_in`` (dx = W^T dy; none for a layer reading
  the model's input, fpga_models.gradients: board 0's gradient port then carries zeros), ``mvu_bwd_w`` (dW, db
  summed exactly over the iteration's micro-batches), ``sgd_update`` (owns the weight
  memory both MVUs read; SGD with momentum once per iteration), ``stash_mem`` (the input x);
- relu: ``train_relu`` forward and backward, ``stash_mem`` (the input);
- links: ``train_vec_tx`` / ``train_vec_rx`` on each board and the board-to-board transport
  (``net_link``: framing, sequence numbers, credits; codegen.design.links) per direction
  (activations forward, gradients backward) with the cluster's bandwidth and latency; the
  vectors' packing and the transport's timing are fpga_models.engines' ``link_*`` functions,
  which the planner prices a link with.

An op runs its layers' engines one after another (F: the layers in order; B: in reverse,
per dense layer the input gradient then the weight gradient), each for exactly its cycles
from ``fpga_models.engines`` (the planner prices a stage with the same sums: plan.yaml
``cycles.fwd`` / ``cycles.bwd``); stashes hold ``bapipe.schedules.stash_count`` micro-batches
(micro-batch k in slot k mod count). Each dense layer's SGD update (``engines.sgd_update_cycles``)
starts one cycle after its last weight-gradient pass of the iteration starts and trails it
tile by tile, so the update adds about one cycle to the iteration (the plan charges none). The design is recorded in
build/design.json under ``train``.

Arithmetic: exactly ``fpga_models.train_fixed`` (docs/training.md; the numpy twin of a run is
:func:`train_reference`, ``train_fixed.train_step`` per iteration): forward in the activation
format, input gradients in the gradient format, exact weight-gradient sums over the
iteration's micro-batches, ``train_fixed.sgd_update`` on 32-bit master weights and 48-bit
velocities, the forward engines reading a 16-bit copy rounded from the master weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from bapipe.schedules import chunk_ops, chunk_stash_count, device_ops, stash_count
from bapipe.fpga_models import engines
from bapipe.fpga_models import train_fixed as tfx
from bapipe.fpga_models.gradients import no_input_gradient

from bapipe.codegen.design.dataflow import LinkSpec, clog2, elem_format, make_link, plan_weights
from bapipe.codegen.design.unsupported import Unsupported

#: SGD learning rate and momentum of the hardware optimizer (host/optim.py's SGD default at
#: its reference batch, docs/host.md; momentum 0.9 as there); the integer constants are
#: fpga_models.train_fixed.sgd_constants(lr, momentum, global batch)
LEARNING_RATE = 0.05
MOMENTUM = 0.9
#: layer types the training RTL builds
TRAIN_TYPES = ("dense", "relu", "conv2d", "maxpool", "avgpool", "flatten", "batchnorm", "add", "globalavgpool")
#: layers with weights (a forward, input-gradient and weight-gradient engine and an sgd_update)
WEIGHT_KINDS = ("dense", "conv2d")
#: layers whose parameters an sgd_update trains: dense and conv2d, and batchnorm (scale and shift as its
#: MH = C, MW = 1 weights and biases; codegen.design.train_dag)
TRAINED_KINDS = WEIGHT_KINDS + ("batchnorm",)


@dataclass
class TrainLayer:
    """One layer of a board: its engines' parameters and cycles (from fpga_models.engines)."""

    name: str
    kind: str                 # dense | relu | conv2d | maxpool | avgpool | flatten
    ident: str                # Verilog-safe name
    n_in: int
    n_out: int
    pe: int = 1
    simd: int = 1
    lanes: int = 1
    fwd_cycles: int = 0
    bwd_in_cycles: int = 0
    bwd_w_cycles: int = 0
    update_cycles: int = 0
    mh: int = 0               # weight matrix rows / columns (dense: units x inputs; conv2d: O x K*K*C)
    mw: int = 0
    geom: dict = field(default_factory=dict)   # conv2d / pools: c, h, w, k, stride, pad, oh, ow
    inputs: tuple = ()        # the board layers it reads, in order ("": the board's input vector)
    fork_cycles: int = 0      # two board layers read its output: the backward sum of their gradients
    dx: bool = True           # builds its input-gradient engine (fpga_models.gradients: not for the model input)
    bias: bool = True         # a dense / conv2d layer's bias (bias: false: no bias sums, none in the ring, b stays 0)

    @property
    def bwd_cycles(self) -> int:
        return self.bwd_in_cycles + self.bwd_w_cycles + self.fork_cycles


@dataclass
class TrainBoard:
    """A board's training engines, schedule and stash count."""

    index: int
    name: str
    module: str
    layers: list[TrainLayer]
    ops: list[tuple[str, int]]     # (F|B, micro-batch)
    stashes: int
    in_elems: int
    out_elems: int
    plan_fwd_cycles: float
    plan_bwd_cycles: float
    beta: int = 1                  # samples per micro-batch
    rank: int = 0                  # replica index of its stage (replicated stages)
    replicas: int = 1              # replicas of its stage
    ring: dict | None = None       # replicated: the all-reduce engine's parameters (_ring_spec)
    serial: bool = False           # a time-multiplexed stage: one engine at a time (else samples overlap)
    device: int = 0                # pipeline position (interleaved: several chunk boards share one)
    chunk: int = 0                 # interleaved: the model chunk this board's engines hold

    @property
    def engine_layers(self) -> list[TrainLayer]:
        """The layers with engines (a flatten is a wire both ways): the sequencer's units."""
        return [l for l in self.layers if l.kind != "flatten"]

    @property
    def fwd_cycles(self) -> int:
        return sum(l.fwd_cycles for l in self.layers)

    @property
    def bwd_cycles(self) -> int:
        return sum(l.bwd_cycles for l in self.layers)

    def bwd_units(self) -> list[tuple[TrainLayer, str]]:
        """The B op's units in order: per engine layer from the last, a forked layer's gradient
        sum (``"fs"``: a unit of its own, so on a dataflow stage it sums sample j + 1 while the
        layer's backward takes sample j, as the planner's dataflow stage overlaps every pass),
        then the layer's own backward (``"b"``: a weighted layer's input gradient, then its
        weight gradient)."""
        out = []
        for l in reversed(self.engine_layers):
            if l.fork_cycles:
                out.append((l, "fs"))
            out.append((l, "b"))
        return out

    def unit_cycles(self, phase: str) -> list[int]:
        """Each F (``phase`` "F") or B unit's engine cycles a sample, in unit order."""
        if phase == "F":
            return [l.fwd_cycles for l in self.engine_layers]
        return [l.fork_cycles if part == "fs" else l.bwd_in_cycles + l.bwd_w_cycles for l, part in self.bwd_units()]

    def unit_fills(self, phase: str) -> list[int]:
        """Cycles each F (``phase`` "F") or B unit idles after its engine's done before it has
        finished a sample: none on a dataflow stage; on a time-multiplexed one (``serial``) the
        units are turns on one shared array, each costing its engine's pipeline fill
        (``engines.turn_fill``) when it has cycles, and the last unit also the sequencer's
        switch (``engines.TM_SWITCH``), as the planner prices the stage
        (fpga_models.allocate.time_multiplexed). A fork's gradient sum is a turn of its layer's
        (no fill of its own: the layer's unit has it when the two have cycles)."""
        if phase == "F":
            units = [(l, "f") for l in self.engine_layers]
            cyc = self.unit_cycles("F")
        else:
            units = self.bwd_units()
            cyc = [l.bwd_cycles if part == "b" else 0 for l, part in units]
        if not self.serial:
            return [0] * len(units)
        fills = [engines.turn_fill(engines.engine_kind(l.kind)) if c else 0 for (l, _p), c in zip(units, cyc)]
        if fills and sum(cyc):
            fills[-1] += engines.TM_SWITCH
        return fills

    def _op_cycles(self, phase: str) -> int:
        """An op's cycles from its units' cycles a sample. Dataflow: the samples stream through
        the units (each starts a sample once the unit before has finished it and it has finished
        the one before), sum + (beta - 1) x max, fpga_models.allocate.dataflow's stage cycles;
        time-multiplexed (``serial``): one unit at a time, each with its fill
        (:meth:`unit_fills`), beta x sum."""
        cyc = self.unit_cycles(phase)
        if not cyc:
            return 0
        if self.serial:
            return self.beta * (sum(cyc) + sum(self.unit_fills(phase)))
        return sum(cyc) + (self.beta - 1) * max(cyc)

    @property
    def op_fwd_cycles(self) -> int:
        """An F op: the micro-batch's samples through the forward units (:meth:`_op_cycles`)."""
        return self._op_cycles("F")

    @property
    def op_bwd_cycles(self) -> int:
        """A B op: through the backward units (a weighted layer's unit runs its input gradient,
        then its weight gradient)."""
        return self._op_cycles("B")

    @property
    def update_cycles(self) -> int:
        return sum(l.update_cycles for l in self.layers)

    def steps(self) -> list[tuple[str, str, int]]:
        """(phase, engine instance, cycles) in sequencer order: F steps, then B steps (the weight
        updates are not steps: each trails its layer's last weight-gradient pass)."""
        out = [("F", f"{l.ident}_f", l.fwd_cycles) for l in self.layers if l.kind != "flatten"]
        for l in reversed(self.layers):
            if l.fork_cycles:                # the two gradients of its output summed first
                out.append(("B", f"{l.ident}_fs", l.fork_cycles))
            if l.kind in WEIGHT_KINDS:
                out += [("B", f"{l.ident}_bi", l.bwd_in_cycles)] if l.dx else []
                out += [("B", f"{l.ident}_bw", l.bwd_w_cycles)]
            elif l.kind != "flatten":       # a flatten is a wire both ways (no engine, no cycles)
                out.append(("B", f"{l.ident}_b", l.bwd_in_cycles))
        return out


@dataclass
class TrainDesign:
    """The training RTL of a plan: boards, links (forward and reverse share a spec), formats."""

    boards: list[TrainBoard]
    links: list[LinkSpec]
    link_lanes: list[int]
    elem_w: int
    frac: int
    fmt: str
    schedule: str
    microbatches: int
    clock_hz: float
    sgd: tfx.SgdSchedule           # the update's rate schedule (one step: a constant rate)
    tf: tfx.TrainFormats
    params: dict = field(default_factory=dict)
    replicas: int = 1              # every stage's replicas: boards are replica-major chains of `stages`
    rings: list = field(default_factory=list)   # replicated: per ring hop (src, dst, LinkSpec, lanes, words)
    turns: list = field(default_factory=list)   # interleaved: per device its chunk boards and op order (_turns)
    plan_cycles: float | None = None            # the plan's iteration as this build runs it (:func:`rtl_plan_cycles`)

    @property
    def stages(self) -> int:
        return len(self.boards) // self.replicas

    def link_index(self, i: int) -> int:
        """Index into ``links`` of the link leaving board i (chain q, position s)."""
        p = self.stages
        return (i // p) * (p - 1) + i % p

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """(source, destination) board of every link, in ``links`` order."""
        p = self.stages
        return [(q * p + s, q * p + s + 1) for q in range(self.replicas) for s in range(p - 1)]

    @property
    def transports(self) -> list:
        """Per link the board-to-board transport (codegen.design.links) carrying its vectors each way:
        ``link_lanes`` elements a word, one vector a sample."""
        from bapipe.codegen.design.links import transport
        return [transport(l, ln, self.elem_w, self.boards[i].out_elems // ln)
                for l, ln, (i, _j) in zip(self.links, self.link_lanes, self.pairs)]

    @property
    def consts(self) -> tfx.SgdConstants:
        """The schedule's first step: mu, lr_scale and shift are every step's."""
        return self.sgd.steps[0]

    @property
    def lr_table(self) -> str:
        """The schedule's rates as sgd_update's LR_TABLE literal (32 bits a step, step 0 lowest)."""
        n = len(self.sgd.steps)
        v = sum(c.lr << (32 * k) for k, c in enumerate(self.sgd.steps))
        return f"{32 * n}'h{v:0{8 * n}x}"

    @property
    def mu_q(self) -> int:
        return self.consts.mu

    @property
    def acc_w(self) -> int:
        from bapipe.fpga_models.collective import grad_sum_bits
        return grad_sum_bits(self.elem_w)


def link_lanes(elems: int, elem_bytes: int, bytes_per_cycle: Fraction) -> int:
    """Lanes of a training link's stream word: ``fpga_models.engines.link_lanes`` (the packing the
    planner's link cost assumes): the divisor of the message whose framed sample holds the link
    the fewest cycles."""
    return engines.link_lanes(elems, 8 * elem_bytes, bytes_per_cycle)


def train_design(plan, model, cluster, params=None, plan_file: str = "plan.yaml",
                 sgd: tfx.SgdConstants | tfx.SgdSchedule | None = None) -> TrainDesign:
    """Lower a `mode: train` plan to training RTL; Unsupported for what it cannot build.

    ``sgd``: the update's constants or rate schedule (a run's own learning rate and its steps);
    default ``train_fixed.sgd_constants(LEARNING_RATE, MOMENTUM, global batch)``."""
    if plan.mode != "train":
        raise Unsupported("the plan is not a training plan (mode: train)")
    if plan.schedule not in ("gpipe", "1f1b", "eager-1f1b", "interleaved"):
        raise Unsupported(f"the training RTL runs gpipe, 1f1b, eager-1f1b and interleaved, not {plan.schedule}")
    interleaved = plan.schedule == "interleaved"
    if interleaved and any(s.replicas != 1 for s in plan.stages):
        raise Unsupported("interleaved plans with replicated stages are not built for training (a device's chunk "
                          "rings would share its links)")
    elem_w, frac = elem_format(plan.number_format, plan_file)
    params = plan_weights(plan, model) if params is None else params
    # p pipeline positions (devices), v chunks a device: virtual stage s = chunk x p + device, one
    # board module each (the chunks of a device take turns: _turns)
    p, m, v = (plan.devices, plan.microbatches, plan.chunks) if interleaved else (len(plan.stages), plan.microbatches, 1)
    _check_sum_widths(model, m * plan.microbatch_size, 2 * elem_w + 16)
    no_dx = no_input_gradient(model)   # nothing reads the model input's gradient: no engine, no cycles
    boards: list[TrainBoard] = []
    for s in plan.stages:
        if math.prod(s.mesh) != 1:
            raise Unsupported(f"stage {s.index}: meshed stages are not built for training yet")
        if s.replicas != plan.stages[0].replicas:
            raise Unsupported(f"stage {s.index}: {s.replicas} replicas where stage 0 has {plan.stages[0].replicas}; "
                              "the training RTL builds replicated plans whose every stage has the same replicas")
        layers = []
        for name in s.layers:
            l = model.layers[model.index[name]]
            if l.type not in TRAIN_TYPES:
                raise Unsupported(f"layer {name}: no training engine for {l.type} (have {', '.join(TRAIN_TYPES)})")
            t = _train_layer(l, s.folding.get(name))
            if name in no_dx:
                if t.kind not in WEIGHT_KINDS:
                    raise Unsupported(f"layer {name}: the training RTL builds models whose first layers with no "
                                      "input gradient have weights")
                t.dx, t.bwd_in_cycles = False, 0
            layers.append(t)
        from bapipe.codegen.design.train_dag import wire_graph
        wire_graph(model, list(s.layers), layers,
                   streaming=s.style != "time-multiplexed" and plan.microbatch_size // s.replicas > 1)
        d = s.device
        if interleaved:     # the chunk's ops of its device's order; its own stash memory (the chunk's peak)
            mine = chunk_ops(plan.schedule, p, d, m, v, s.chunk)
            ops, stashes = [(op.kind, op.mb) for op in mine], chunk_stash_count(plan.schedule, p, d, m, v, s.chunk)
            module = f"{_ident(s.boards[0])}_c{s.chunk}_train"
        else:
            ops = [(op.kind, op.mb) for op in device_ops(plan.schedule, p, d, m)]
            stashes, module = stash_count(plan.schedule, p, d, m), f"{_ident(s.boards[0])}_train"
        boards.append(TrainBoard(s.index, s.boards[0], module, layers, ops,
                                 stashes, layers[0].n_in, layers[-1].n_out,
                                 float(s.cycles.get("fwd", 0)), float(rtl_bwd_cycles(s)), plan.microbatch_size,
                                 serial=s.style == "time-multiplexed", device=d, chunk=s.chunk if interleaved else 0))
    nrep = plan.stages[0].replicas
    boards = _replicate(plan, boards, nrep)
    clock = min(cb.board.clock_hz for cb in cluster.boards)
    links, lanes = [], []
    p_ = len(plan.stages)
    for a, b in ((boards[q * p_ + k], boards[q * p_ + k + 1]) for q in range(nrep) for k in range(p_ - 1)):
        elems = a.out_elems
        bw = cluster.path_bandwidth(a.name, b.name)
        bpc = Fraction(bw / clock).limit_denominator(64)
        ln = link_lanes(elems, elem_w // 8, bpc)
        links.append(make_link(a.name, b.name, bw, cluster.path_latency(a.name, b.name), clock, ln * elem_w // 8))
        lanes.append(ln)
    try:
        tf = tfx.get_formats(plan.number_format)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    consts = tfx.as_schedule(sgd if sgd is not None else
                             tfx.sgd_constants(LEARNING_RATE, MOMENTUM, m * plan.microbatch_size, tf))
    rings = _ring_links(boards, nrep, p_, cluster, clock, elem_w)
    return TrainDesign(boards, links, lanes, elem_w, frac, plan.number_format, plan.schedule, m, clock, consts, tf,
                       {l.name: params[l.name] for b in boards for l in b.layers if l.kind in TRAINED_KINDS},
                       nrep, rings, _turns(boards, plan.schedule, p, m, v) if interleaved else [],
                       rtl_plan_cycles(plan, model, cluster, clock))


def rtl_bwd_cycles(stage) -> float:
    """A stage's backward cycles a micro-batch as the training RTL builds it: plan.yaml's
    ``cycles.bwd_rtl`` (the planner's per-layer engines, fpga_models.engines); a plan without it
    (hand-made, or written before the HLS backward's tiled engines were priced) has one figure,
    ``cycles.bwd``."""
    c = stage.cycles or {}
    return c.get("bwd_rtl", c.get("bwd", 0))


def _rtl_stages(plan):
    """``plan`` with every stage's ``bwd_s`` the training RTL's (:func:`rtl_bwd_cycles`, at the
    clock the plan's own ``bwd_s`` is of ``cycles.bwd``), or ``plan`` itself when none differs."""
    import dataclasses

    def own(s):
        c = s.cycles or {}
        if not c.get("bwd") or rtl_bwd_cycles(s) == c["bwd"]:
            return s
        bwd = s.bwd_s * rtl_bwd_cycles(s) / c["bwd"]
        return dataclasses.replace(s, bwd_s=bwd, time_s=s.fwd_s + bwd)

    stages = [own(s) for s in plan.stages]
    if all(a is b for a, b in zip(stages, plan.stages)):
        return plan
    return dataclasses.replace(plan, stages=stages)


def rtl_plan_cycles(plan, model, cluster, clock_hz: float) -> float | None:
    """The plan's iteration in cycles of ``clock_hz`` as the training RTL runs it: the planner's
    schedule replay (fpga_models.sim) of the plan's stage times with the RTL's own backward
    (:func:`rtl_bwd_cycles`: one engine a layer, where the plan's ``bwd`` prices the HLS kernel's
    tiled engines) and without the HLS flush and update kernels' tail (plan.yaml's flush_s /
    update_s): the RTL updates each layer as its last weight-gradient pass ends
    (engines.sgd_update_cycles). None when the plan has no prediction."""
    from bapipe.fpga_models.sim import SimConfig, simulate

    if (plan.predicted or {}).get("iteration_time_s") is None:
        return None
    rtl = _rtl_stages(plan)
    if rtl is plan and not any(s.flush_s or s.update_s for s in plan.stages):
        return float(plan.predicted["iteration_time_s"]) * clock_hz
    r = simulate(rtl, model, cluster, iterations=4, config=SimConfig(kernel_tails=False, record=False))
    return float(r.iteration_time_s) * clock_hz


def _check_sum_widths(model, batch: int, bits: int) -> None:
    """Unsupported when a gradient sum of the model at this global batch could wrap in the engines'
    ``bits``-bit exact sums: fpga_models.train_fixed.reductions (a weight gradient sums the batch x
    the output pixels of a conv or batchnorm, an input gradient its units / O x K x K) under the
    acc_width rule (docs/training.md "Accumulators"). tiny-cnn's conv1 (64 output pixels) fits 48
    bits up to a batch of 2,047, where the batch alone would have passed up to 131,071."""
    for name, widths in tfx.model_acc_widths(model, batch).items():
        for eng in ("wgrad", "bwd_input"):
            if widths.get(eng, 0) > bits:
                raise Unsupported(f"layer {name}: at a global batch of {batch} its {eng} sums need "
                                  f"{widths[eng]} bits, wider than the engines' {bits}")


def _turns(boards: list, schedule: str, p: int, m: int, v: int) -> list[dict]:
    """Interleaved: per device d the boards of its chunks (``boards``: index of chunk c's board) and
    the chunk of each of its ops in the device's order (``order``, bapipe.schedules.device_ops). The
    chunk boards' sequencers take turns (train_turns): chunk c's next op may start only while the
    device's op pointer names c, and the pointer moves on when that op ends, so the device runs one
    op at a time in the schedule's order, as the planner replays it."""
    out = []
    for d in range(p):
        mine = {b.chunk: i for i, b in enumerate(boards) if b.device == d}
        out.append({"device": d, "boards": [mine[c] for c in range(v)],
                    "order": [op.chunk for op in device_ops(schedule, p, d, m, v)]})
    return out


def _square(v) -> int | None:
    """The one value of a square kernel / stride / padding pair, else None."""
    a, b = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    return int(a) if a == b else None


def _window_geom(l) -> dict:
    """c, h, w, k, stride, pad, oh, ow of a conv2d or pool layer (CHW images, square windows)."""
    a = l.attr
    if len(l.in_shapes[0]) != 3:
        raise Unsupported(f"layer {l.name}: the training RTL convolves and pools C x H x W images only")
    k, st = _square(a["kernel"]), _square(a.get("stride") or a["kernel"])
    pad = _square(a.get("padding", 0))
    if None in (k, st, pad) or a.get("groups", 1) != 1:
        raise Unsupported(f"layer {l.name}: the training RTL builds square, ungrouped windows only")
    c, h, w = l.in_shapes[0]
    _o, oh, ow = l.out_shape
    return {"c": c, "h": h, "w": w, "k": k, "stride": st, "pad": pad, "oh": oh, "ow": ow}


def _train_layer(l, f) -> TrainLayer:
    """One layer's training engines and their cycles per sample (fpga_models.engines, the
    functions the planner prices the layer with: plan.yaml ``cycles.fwd`` / ``cycles.bwd``)."""
    name, ident = l.name, _ident(l.name)
    if l.type in WEIGHT_KINDS:
        if f is None:   # the plan gives the layer no PE x SIMD of its own (e.g. a stage's layers share one array)
            raise Unsupported(f"layer {name}: the plan has no folding for it; the training RTL builds one engine "
                              "per folded layer")
        if l.type == "dense":
            mh, mw, pix, geom = l.out_elems, l.in_elems, 1, {}
        else:
            geom = _window_geom(l)
            mh, mw, pix = l.attr["out_channels"], geom["k"] ** 2 * geom["c"], geom["oh"] * geom["ow"]
        if mh % f.pe or mw % f.simd:
            raise Unsupported(f"layer {name}: PE {f.pe} / SIMD {f.simd} do not divide {mh} x {mw}")
        if l.type == "dense":
            fc = engines.mvu_vector_cycles(mh, mw, f.pe, f.simd)
            bi, bw = engines.mvu_bwd_cycles(mh, mw, f.pe, f.simd)
        else:
            g = geom
            fc, bi, bw = engines.conv_train_cycles(mh, mw, pix, f.pe, f.simd)
            win = engines.conv_window_cycles(g["c"], g["h"], g["w"], g["k"], g["pad"], g["stride"], f.simd)
            if win > fc:
                raise Unsupported(f"layer {name}: the planner prices its window generator ({win} cycles a sample) "
                                  f"above its MVU ({fc}); the training engine reads its image from memory")
        return TrainLayer(name, l.type, ident, l.in_elems, l.out_elems, pe=f.pe, simd=f.simd, fwd_cycles=fc,
                          bwd_in_cycles=bi, bwd_w_cycles=bw, bias=bool(l.attr.get("bias", True)),
                          update_cycles=engines.sgd_update_cycles(mh, mw, f.pe, f.simd), mh=mh, mw=mw, geom=geom)
    lanes = f.ew_lanes if f is not None else 1
    if l.type == "flatten":
        return TrainLayer(name, "flatten", ident, l.in_elems, l.out_elems)
    if l.type == "relu":
        n = l.out_elems
        return TrainLayer(name, "relu", ident, n, n, lanes=lanes, fwd_cycles=engines.stream_cycles(n, lanes),
                          bwd_in_cycles=engines.relu_bwd_cycles(n, lanes))
    if l.type in ("batchnorm", "add", "globalavgpool"):
        from bapipe.codegen.design.train_dag import stream_layer
        return stream_layer(l, lanes, TrainLayer)
    geom = _window_geom(l)
    fc, bc = engines.pool_train_cycles(engines.stream_elements(l), lanes)
    return TrainLayer(name, l.type, ident, l.in_elems, l.out_elems, lanes=lanes, fwd_cycles=fc, bwd_in_cycles=bc,
                      geom=geom)


def _replicate(plan, boards: list, r: int) -> list:
    """The boards of a plan whose every stage has ``r`` replicas: replica-major chains (replica q of
    stage s is board q * stages + s, on the stage's q-th board), each replica computing
    1/r of every micro-batch's samples (plan microbatch_size / r, the planner's share) and
    reducing its weight-gradient sums with the other replicas of its stage (:func:`_ring_spec`)."""
    if r == 1:
        return boards
    from dataclasses import replace
    if plan.microbatch_size % r:
        raise Unsupported(f"micro-batches of {plan.microbatch_size} samples do not split over {r} replicas")
    for b in boards:
        if any(l.kind not in TRAIN_TYPES for l in b.layers):
            raise Unsupported(f"stage {b.index}: replicated stages are built for {', '.join(TRAIN_TYPES)} layers only")
    out = []
    for q in range(r):
        for b, s in zip(boards, plan.stages):
            out.append(replace(b, name=s.boards[q], module=f"{_ident(s.boards[q])}_train", beta=b.beta // r,
                               rank=q, replicas=r, ring=_ring_spec(b, q, r)))
    return out


def _flat_layers(b) -> list[tuple[object, int, int]]:
    """(layer, offset, sums) of a board's weighted layers in its flat gradient vector: every
    dense layer's MH x MW weight sums in tile order, then its MH bias sums."""
    out, off = [], 0
    for l in b.layers:
        if l.kind in TRAINED_KINDS:           # the MH x MW matrix, then MH biases (batchnorm: C scales, C shifts)
            n = l.mh * l.mw + (l.mh if l.bias else 0)   # a layer without a bias reduces no bias sums
            out.append((l, off, n))
            off += n
    return out


def _ring_spec(b, rank: int, r: int) -> dict:
    """The all-reduce engine's parameters of replica ``rank``: shares of ceil(N / r) sums
    (fpga_models.collective.ring_share_elems); word lanes are set with the ring's links."""
    from bapipe.fpga_models.collective import ring_share_elems
    n = sum(k for _l, _o, k in _flat_layers(b))
    return {"r": r, "rank": rank, "n": n, "share": ring_share_elems(n, r),
            "offsets": {l.ident: o for l, o, _k in _flat_layers(b)}}


def _ring_links(boards: list, r: int, p: int, cluster, clock: float, elem_w: int) -> list:
    """Per stage and replica q the ring hop q -> q + 1 (a board-to-board transport carrying
    ``collective.ring_step_cycles`` lanes of gradient sums a word, one share a message); sets
    every replica board's ring word lanes and words per share."""
    from bapipe.fpga_models.collective import grad_sum_bits, ring_step_cycles
    if r == 1:
        return []
    out = []
    bits = grad_sum_bits(elem_w)
    for s in range(p):
        for q in range(r):
            a, b = boards[q * p + s], boards[((q + 1) % r) * p + s]
            bw = cluster.path_bandwidth(a.name, b.name)
            bpc = Fraction(bw / clock).limit_denominator(64)
            lat = cluster.path_latency(a.name, b.name)
            link = make_link(a.name, b.name, bw, lat, clock, 1)
            ln, _occ, _d = ring_step_cycles(a.ring["n"], r, elem_w, bpc, link.latency)
            words = -(-a.ring["share"] // ln)
            link = make_link(a.name, b.name, bw, lat, clock, ln * bits // 8)
            a.ring.update(lanes=ln, words=words, aw=clog2(a.ring["share"] * r + ln + 1) + 1,
                          cnt_w=clog2(words + 1))
            out.append((q * p + s, ((q + 1) % r) * p + s, link, ln, words))
    return out


def _ident(name: str) -> str:
    from bapipe.names import legal
    return legal(name)


# ------------------------------------------------------------------ numpy reference

def train_reference(model, params: dict, m: int, fmt: str, consts: tfx.SgdConstants | tfx.SgdSchedule,
                    x_q: np.ndarray,
                    labels: np.ndarray, iterations: int, beta: int = 1):
    """What the training RTL must compute: ``fpga_models.train_fixed.train_step`` per iteration.

    ``params``: {dense layer: {"w", "b"}} raw forward-format initial weights (the master
    weights start at them, exactly); ``x_q``: (iterations * m * beta, in_elems) raw inputs (m
    micro-batches of ``beta`` samples an iteration),
    ``labels`` the class of each. Returns (per iteration {layer: {"w", "b"}} master weights
    after its update; the outputs (logits) (iterations*m, out); the loss gradients the host
    feeds the last board (iterations*m, out), train_fixed.softmax_xent_grad of those logits).
    """
    tf = tfx.get_formats(fmt)
    up = tf.master.frac - tf.act.frac
    master = {n: {k: np.asarray(a, dtype=np.int64) << up for k, a in p.items()} for n, p in params.items()}
    vel: dict = {}
    sched = tfx.as_schedule(consts)
    snaps, outs, dys = [], [], []
    for it in range(iterations):
        n = m * beta
        xs = np.asarray(x_q[it * n:(it + 1) * n], dtype=np.int64).reshape((n,) + tuple(model.inputs[0].shape))
        ls = np.asarray(labels[it * n:(it + 1) * n])
        master, vel, info = tfx.train_step(model, master, vel, xs, ls, sched.at(it), tf, microbatches=m)
        outs.append(info["logits"])
        dys.append(tfx.softmax_xent_grad(info["logits"], ls, tf))
        snaps.append({n: {k: a.copy() for k, a in p.items()} for n, p in master.items()})
    return snaps, np.concatenate(outs), np.concatenate(dys)


# ------------------------------------------------------------------ render

def weight_matrix(w) -> np.ndarray:
    """A layer's weights as its MH x MW engine matrix: dense as is, conv2d (O, C, kh, kw) as
    fpga_models.fixedpoint.conv_weight_matrix (column (ky*kw + kx)*C + c)."""
    from bapipe.fpga_models.fixedpoint import conv_weight_matrix
    w = np.asarray(w)
    return conv_weight_matrix(w) if w.ndim == 4 else w


def tile_order(wmat: np.ndarray, pe: int, simd: int) -> np.ndarray:
    """Weights in the tile memory order: element a*PE*SIMD + p*SIMD + i = W[nf*PE+p][sf*SIMD+i]."""
    mh, mw = wmat.shape
    nf, sf = mh // pe, mw // simd
    return np.asarray(wmat).reshape(nf, pe, sf, simd).transpose(0, 2, 1, 3).reshape(-1)


def from_tile_order(flat: np.ndarray, mh: int, mw: int, pe: int, simd: int) -> np.ndarray:
    """Inverse of :func:`tile_order`."""
    nf, sf = mh // pe, mw // simd
    return np.asarray(flat).reshape(nf, sf, pe, simd).transpose(0, 2, 1, 3).reshape(mh, mw)


def hex_lines(values, elem_w: int) -> str:
    """One two's-complement element per line ($readmemh)."""
    mask = (1 << elem_w) - 1
    digits = (elem_w + 3) // 4
    return "".join(f"{int(v) & mask:0{digits}x}\n" for v in values)


def read_hex(text: str, elem_w: int) -> np.ndarray:
    """$writememh output (one element a line, comments skipped) -> signed int64."""
    vals = [int(t, 16) for line in text.splitlines() for t in line.split("//")[0].split() if not t.startswith("@")]
    a = np.array(vals, dtype=np.int64)
    return np.where(a >= 1 << (elem_w - 1), a - (1 << elem_w), a)
