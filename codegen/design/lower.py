"""The one lowering: plan + model + cluster -> Design, by an ordered list of small named passes.

``bapipe gen`` calls :func:`lower` once; the HLS renderer (codegen.hls), the RTL renderer
(codegen.rtl), the packaging (codegen.package) and design.json (codegen.design.record) read the
Design it returns and never lower again. Each pass reads what earlier passes set and fills its
own fields; none touches the disk. The order is the flow of decisions:

1. ``check_plan``        every stage can be generated (layer types, folding divisibility)
2. ``draw_weights``      the weights, drawn deterministically from the plan fingerprint
3. ``stage_contexts``    each FPGA stage's layers wired into a graph of streams (HLS kernels)
4. ``lower_dataflow``    the plan's engines, streams and links (codegen.design.dataflow): the
                         structure the RTL renders and the HLS engine kernels are built from
5. ``engine_kernels``    each single-input, single-output stage as one engine kernel
6. ``training_kernels``  backward, update/all-reduce and stash tees of a training plan
7. ``loss_kernel``       the loss kernel behind the last stage
8. ``bundle_ports``      the engine kernels' m_axi bundles (codegen.design.bundles)
9. ``boards``            kernels, movers, connections and SLRs per board -> the ProjectCtx
10. ``backward_memory``  each backward kernel's memory record (fpga_models.bwd_memory)
11. ``training_rtl``     the training RTL's lowering (codegen.design.training.train_design)
12. ``stage_benches``    each stage lowered alone, fed at its first engine's width
13. ``rtl_kernels``      each stage lowered alone, fed one element a beat (packaged RTL kernels)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from bapipe.errors import SpecError
from bapipe.plan import Plan, Stage
from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models.boards import bytes_per_element, get_board

from bapipe.codegen.design.backward import build_bwd, design_backward_memory
from bapipe.codegen.design.bundles import assign_bundles, mirror_bundles
from bapipe.codegen.design.bwd_engines import design_blocks
from bapipe.codegen.design.context import (ProjectCtx, StageCtx, build_boards, build_stage, check_plan, format_ctx, header_lines,
                      make_weights, weight_seed)
from bapipe.codegen.design.dataflow import Pipeline, Unsupported, build_pipeline
from bapipe.codegen.design.stash import build_stashes
from bapipe.codegen.design.tm_kernel import engine_stage, onchip_budget
from bapipe.codegen.design.train_kernels import build_loss, kernel_site, stage_update
from bapipe.codegen.design.training import train_design
from bapipe.codegen.design.weight_image import stage_slots


@dataclass
class Design:
    """A plan lowered to hardware: everything the renderers, checks and host read."""

    plan: Plan
    model: object
    cluster: object | None
    plan_file: str = "plan.yaml"
    engines: str = "hls"                        # which kernels the build packages: hls or rtl
    sgd: object | None = None                   # the training RTL's SGD constants (default: its own)
    weights: dict = field(default_factory=dict)
    contexts: dict = field(default_factory=dict)        # stage position -> StageCtx (FPGA stages)
    pipeline: Pipeline | None = None                    # the dataflow lowering, when it builds the plan
    pipeline_error: Exception | None = None             # why it does not (Unsupported or SpecError)
    project: ProjectCtx | None = None
    backward_memory: list = field(default_factory=list)
    train: object | None = None                         # codegen.rtl.train.TrainDesign
    train_error: str | None = None
    benches: list = field(default_factory=list)         # stage i alone: its Pipeline
    kernels: list = field(default_factory=list)         # stage i alone, one element a beat

    @property
    def stages(self) -> list[StageCtx]:
        """The generated stages' contexts, in plan order."""
        return self.project.stages if self.project is not None else []


def check(d: Design) -> None:
    """Refuse a plan the generators cannot build, before anything is decided."""
    check_plan(d.plan, d.model, d.plan_file)


def draw_weights(d: Design) -> None:
    """The weights every kernel, RTL image and host reference share (seeded by the plan), unless
    the caller gave its own (a host run building the RTL around trained weights)."""
    if not d.weights:
        d.weights = make_weights(d.plan, d.model)


def stage_contexts(d: Design) -> None:
    """Each FPGA stage's layers wired into its graph of streams."""
    d.contexts = {pos: build_stage(d.plan, d.model, st, d.weights)
                  for pos, st in enumerate(d.plan.stages) if st.style != "gpu"}


def lower_dataflow(d: Design) -> None:
    """The plan's engines, streams and links, when the dataflow lowering builds it."""
    if d.cluster is None:
        return
    try:
        d.pipeline = build_pipeline(d.plan, d.model, d.cluster, d.weights)
    except (Unsupported, SpecError) as e:
        d.pipeline_error = e


def _engine_positions(d: Design) -> list[int]:
    """Stages the streaming engines build (one tensor in and out), when the dataflow lowering
    built the plan."""
    if d.pipeline is None:
        return []
    return [pos for pos, sc in d.contexts.items() if len(sc.inputs) == 1 and len(sc.outputs) == 1]


def engine_kernels(d: Design) -> None:
    """Each single-input, single-output stage as one engine kernel (codegen.design.tm_kernel)."""
    for pos in _engine_positions(d):
        st, sc = d.plan.stages[pos], d.contexts[pos]
        sc.engine = engine_stage(d.pipeline.stages[pos], [d.model.layers[d.model.index[n]] for n in st.layers],
                                 d.weights, external=not sc.embed_weights, writable=d.plan.mode == "train",
                                 onchip_budget=onchip_budget(d.plan, st, d.cluster),
                                 number_format=d.plan.number_format, board=_board_of(d, st))


def _board_of(d: Design, st: Stage):
    """The catalog board a stage runs on (the cluster's, else the catalog's), None when unknown."""
    board = None
    if d.cluster is not None:
        board = next((cb.board for cb in d.cluster.boards if cb.board.name == st.board_type), None)
    if board is None:
        try:
            board = get_board(st.board_type)
        except Exception:  # a custom board type of a cluster file not given here: no on-chip budget
            board = None
    return board


def training_kernels(d: Design) -> None:
    """A training plan's backward kernel, update (and all-reduce) kernels and the forward
    kernels' stash tees, per stage."""
    if d.plan.mode != "train":
        return
    engines = set(_engine_positions(d))
    for pos, sc in d.contexts.items():
        st = d.plan.stages[pos]
        sc.bwd = build_bwd(d.plan, d.model, st, sc, fx.get_fmt(d.plan.number_format), _board_of(d, st))
        samples = max(1, d.plan.microbatches) * max(1, d.plan.microbatch_size)
        site = kernel_site(sc, st, d.cluster, _board_of(d, st), samples, bytes_per_element(d.plan.number_format))
        sc.update, sc.update_note = stage_update(sc, d.model, st.replicas, site)
        if pos in engines:   # the forward kernel writes the backward's stashes
            sc.stash_note = build_stashes(sc, d.model, d.pipeline.stages[pos], d.plan, pos)


def loss_kernel(d: Design) -> None:
    """The loss kernel behind the last stage (codegen.design.train_kernels)."""
    if d.plan.mode == "train" and d.contexts:
        last = d.contexts[max(d.contexts)]
        last.loss = build_loss(d.plan, last)


def weight_images(d: Design) -> None:
    """Each stage's weight image (codegen.design.weight_image): its arrays in the order and layout
    its forward kernel reads them, and where each lies in the one file every reader shares."""
    for sc in d.contexts.values():
        sc.image = stage_slots(sc)
        at = {(s.layer, s.key): s for s in sc.image}
        for lc in sc.layers:
            for w in lc.weights:
                w.slot = at[(lc.name, w.name.rsplit("_", 1)[1])]
                w.offset = w.slot.offset
        if sc.engine is not None:
            by_name = {s.rom: s for s in sc.image}
            for r in sc.engine.roms:
                if r.name in by_name:
                    r.offset = by_name[r.name].offset


def bundle_ports(d: Design) -> None:
    """Each engine kernel's m_axi arguments in as few bundles as its concurrency allows, and the
    training kernels' ports onto its buffers in bundles mirroring its (codegen.design.bundles: at
    most 15 masters a memory bank, UG1393)."""
    for sc in d.contexts.values():
        if getattr(sc, "engine", None) is not None:
            assign_bundles(sc.engine)
            mirror_bundles(sc)


def boards(d: Design) -> None:
    """Kernels, movers, connections and SLRs per board: the ProjectCtx the HLS renderer prints."""
    plan = d.plan
    stages = [d.contexts[pos] for pos in sorted(d.contexts)]
    skipped = [f"stage{st.index}: runs on GPU boards ({st.board_type}), no HLS kernel"
               for st in plan.stages if st.style == "gpu"]
    d.project = ProjectCtx(plan=plan, fingerprint=plan.fingerprint(), header=header_lines(plan),
                           fmt=format_ctx(plan.number_format), stages=stages,
                           boards=build_boards(plan, d.cluster, stages), seed=weight_seed(plan), skipped=skipped)


def backward_memory(d: Design) -> None:
    """Each backward kernel's memory record (design.json ``backward_memory``)."""
    if d.plan.mode == "train" and d.pipeline is not None:
        d.backward_memory = design_backward_memory(d.plan, d.model, d.cluster)
        for pos, rec in enumerate(d.backward_memory):   # the kernel as built: blocks of its arrays and FIFOs
            sc = d.contexts.get(pos)
            if rec is not None and sc is not None and getattr(sc, "bwd", None) is not None:
                rec["resources"] = design_blocks(sc.bwd)


def training_rtl(d: Design) -> None:
    """The training RTL's engines, sequencers and stashes (codegen.design.training.train_design), or
    why it cannot build the plan (not tried when the forward lowering refused the plan)."""
    if d.plan.mode != "train" or d.pipeline_error is not None:
        return
    try:
        d.train = train_design(d.plan, d.model, d.cluster, d.weights, sgd=d.sgd)
    except Unsupported as e:
        d.train_error = str(e)


def _alone(d: Design, i: int, **kw) -> Pipeline:
    sub = replace(d.plan, stages=[d.plan.stages[i]])
    return build_pipeline(sub, d.model, d.cluster, d.weights, partial=True, **kw)


def stage_benches(d: Design) -> None:
    """Each stage lowered alone, fed at its first engine's own width (a stage that forks its
    input at once takes the width the previous stage delivers): its bench shows the stage's
    own pace, which the whole pipeline, moving at its bottleneck's, cannot."""
    if d.pipeline is None:
        return
    d.benches = []
    for i, st in enumerate(d.pipeline.stages):
        try:
            d.benches.append(_alone(d, i))
        except Unsupported:
            d.benches.append(_alone(d, i, in_lanes=st.in_lanes))


def rtl_kernels(d: Design) -> None:
    """Each stage lowered alone, fed one element a beat: the packaged RTL kernels' cores."""
    if d.engines != "rtl" or d.pipeline is None:
        return
    d.kernels = [_alone(d, i, in_lanes=1) for i in range(len(d.plan.stages))]


#: the lowering, in order
PASSES = (check, draw_weights, stage_contexts, lower_dataflow, engine_kernels, training_kernels, loss_kernel,
          weight_images, bundle_ports, boards, backward_memory, training_rtl, stage_benches, rtl_kernels)

#: the passes the HLS project needs (tests and csim build kernels without the RTL's passes)
HLS_PASSES = PASSES[:PASSES.index(boards) + 1]
#: the passes the RTL needs (render_rtl of a plan the HLS generators may refuse)
RTL_PASSES = (draw_weights, lower_dataflow, backward_memory, training_rtl, stage_benches)
#: the passes the training RTL alone needs (the host's verilator backend trains on it)
TRAIN_PASSES = (draw_weights, training_rtl)


def lower(plan: Plan, model, cluster=None, plan_file: str = "plan.yaml", engines: str = "hls",
          passes=PASSES, weights: dict | None = None, sgd=None) -> Design:
    """Run ``passes`` over a new Design of ``plan``; the one place a plan is lowered.
    ``weights``: the parameters to build with (default: drawn from the plan fingerprint);
    ``sgd``: the training RTL's SGD constants or schedule (default: codegen.design.training's)."""
    d = Design(plan=plan, model=model, cluster=cluster, plan_file=plan_file, engines=engines,
               weights=dict(weights) if weights else {}, sgd=sgd)
    for p in passes:
        p(d)
    return d


def build_project(plan: Plan, model, cluster=None, plan_file: str = "plan.yaml") -> ProjectCtx:
    """The HLS project of a plan: the lowering's first passes (no RTL), its ProjectCtx."""
    return lower(plan, model, cluster, plan_file, passes=HLS_PASSES).project
