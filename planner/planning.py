"""From a model and a cluster to a Plan: best plan, baselines, lower bound, Pareto set."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from bapipe.errors import SpecError
from bapipe.plan import Folding, Plan, Stage
from bapipe.spec import Model
from bapipe.fpga_models.cluster import Cluster
from bapipe.fpga_models.allocate import fwd_kernel_blocks
from bapipe.fpga_models.cost import layer_cost, matrix_shape, onchip_blocks, weight_copies

from .search import Candidate, Config, Explorer, Request, _ckey

BASELINE_SLACK = 0.05   # baselines replay fewer near-optimal candidates than the plan itself


@dataclass
class Outcome:
    """Everything `bapipe plan` reports."""

    plan: Plan
    best: Candidate
    baselines: dict
    lower_bound_s: float
    pareto: list[dict] = field(default_factory=list)
    searched: int = 0
    boards_total: int = 0
    placement_exact: bool = False   # every placement searched (Explorer.every_placement)
    explorer: Explorer | None = field(default=None, repr=False)   # what priced it (planner.breakdown reads it)


def lower_bound_s(model: Model, explorer: Explorer) -> float:
    """Total MAC work of one iteration / aggregate peak MAC rate of the boards used
    (with a measured profile: G samples over the boards' summed per-sample rates)."""
    G = explorer.G
    if any(t.measured_f is not None for t in explorer.tables.values()):
        # measured profile: each board's per-sample time of the whole model, boards in parallel
        speed = 0.0
        for cb in explorer.boards:
            t = explorer.tables[cb.board.name]
            speed += 1.0 / float(t.measured_f.sum() + (t.measured_b.sum() if explorer.train else 0.0))
        return G / speed
    work = model.fwd_macs + (model.bwd_macs if explorer.train else 0)
    rate = 0.0
    for cb in explorer.boards:
        b = cb.board
        if b.kind == "gpu":
            from bapipe.fpga_models.cost import gpu_format
            rate += b.peak_flops[gpu_format(b, explorer.req.fmt)] / 2
        else:
            rate += b.usable_dsp / b.dsp_per_mac.get(explorer.req.fmt, 1.0) * b.clock_hz
    return G * work / rate


def replicas_of(c: Candidate) -> int | list[int]:
    """The replica count of every stage: one number when they agree, else per stage."""
    rs = [s["replicas"] for s in c.stages] if c.stages else [c.config.r]
    return rs[0] if len(set(rs)) == 1 else rs


def _result(c: Candidate, G: int) -> dict:
    return {"iteration_time_s": c.iteration_s, "throughput_samples_per_s": G / c.iteration_s,
            "schedule": c.config.schedule, "microbatches": c.config.m, "stages": len(c.stages),
            "replicas": replicas_of(c), "boards": c.boards_used, "recompute": c.config.recompute}


def infeasible_reason(model: Model, ex: Explorer, p: int, r: int) -> str:
    """One line naming the binding memory constraint when nothing fits on p stages x r replicas."""
    return weights_reason(model, ex, p) or (
        f"no split of {model.name} into {p} stage(s) fits the boards' memory with its activation stashes "
        f"(even with recomputation at 1 sample per micro-batch) and its kernels' BRAM and URAM "
        f"(fpga_models.bwd_memory.stage_blocks_fit, UG573 blocks)")


def weights_reason(model: Model, ex: Explorer, p: int) -> str | None:
    """The one line when a layer alone, or all the weights with their optimizer state, cannot fit
    ``p`` of the largest boards (no search needed to know it), else None."""
    req = ex.req
    best_cap = max(ex.stage_model(t, 1, True, "1f1b").capacity for t in ex.tables)
    copies = weight_copies(req.optimizer, req.mode)
    bpe = ex.bpe
    for l in model.layers:
        need = l.params * bpe * copies + l.in_elems * bpe
        if need > best_cap:
            return (f"layer '{l.name}' alone needs {need / 1e9:.3g} GB (weights x{copies} + activations) but the "
                    f"largest board holds {best_cap / 1e9:.3g} GB (over by {(need - best_cap) / 1e9:.3g} GB)")
    total = model.params * bpe * copies
    cap = best_cap * p
    if total > cap:
        return (f"{model.name} needs {total / 1e9:.4g} GB of weights and optimizer state (x{copies}) but "
                f"{p} stage(s) hold at most {cap / 1e9:.4g} GB (over by {(total - cap) / 1e9:.4g} GB)")
    return None


#: the shares of a stage's DSP/LUT budget the planner folds layers within, tried in turn until
#: some plan's kernels fit the boards' BRAM and URAM (fewer lanes: fewer banks) [design choice]
FOLD_SCALES = (1.0, 0.5, 0.25)


def _fitting_explorer(ex: Explorer) -> Explorer:
    """``ex``, or one whose tables fold every layer within a smaller share of the budget
    (:data:`FOLD_SCALES`) when no plan at the full share has kernels that fit the boards' BRAM
    and URAM (fpga_models.bwd_memory.stage_blocks_fit): a smaller folding takes fewer banks
    (resnet50 --whole-blocks on 4xU250-ring: no stage fits at 3,072 lanes). The first scale
    with a fitting plan wins; none: ``ex`` (make_plan says why nothing fits)."""
    if not _has_fpga(ex):
        return ex
    for scale in FOLD_SCALES:
        cand = _folded(ex, scale, {})
        found = cand.search(cand.configs(cand.schedules(), list(range(1, cand.N + 1)) if ex.req.replication else [1],
                                         (False, True)))
        if found and _priced(found[0]):
            cand._found = found
            return cand
    return ex


def _has_fpga(ex: Explorer) -> bool:
    return any(t.board.kind == "fpga" for t in ex.tables.values())


def _priced(c: Candidate | None) -> bool:
    """Whether a candidate was found and replays to a finite time (its kernels fit the blocks)."""
    return c is not None and math.isfinite(c.iteration_s or math.inf)


def _folded(ex: Explorer, scale: float, made: dict) -> Explorer:
    """``ex`` at ``scale`` of its folding budget (``ex`` itself at its own scale), built once in
    ``made`` (the baselines share theirs; kept off ``ex``, which a plan's outcome carries)."""
    if scale == ex.fold_scale:
        return ex
    if scale not in made:
        made[scale] = Explorer(ex.model, ex.cluster, ex.req, fold_scale=scale)
    return made[scale]


def make_plan(model: Model, cluster: Cluster, model_arg: str, cluster_arg: str, req: Request) -> Outcome:
    """Search plans; raise SpecError (one line, the binding constraint) when none fits."""
    ex = Explorer(model, cluster, req)
    if ex.G < 1:
        raise SpecError(None, None, "--global-batch", "expected a positive global batch")
    if req.microbatches is not None and ex.G % req.microbatches:
        raise SpecError(None, None, "--microbatches", f"{req.microbatches} does not divide the global batch {ex.G}")
    replicas = list(range(1, ex.N + 1)) if req.replication else [1]
    rc = (False, True) if ex.train else (False,)
    scheds = ex.schedules()
    if not ex.train and req.schedule not in ("auto", "gpipe"):
        raise SpecError(None, None, "--schedule", f"inference runs forward passes only (planned as gpipe); expected "
                                                  f"auto or gpipe, got {req.schedule}")
    if ex.train and req.schedule == "interleaved" and min(ex.N, ex.n) < 2:
        raise SpecError(None, None, "--schedule", f"interleaved needs at least 2 boards and 2 layers "
                                                  f"(v = 2 chunks on each of p >= 2 boards); got {ex.N} board(s), "
                                                  f"{ex.n} layer(s)")
    found = None
    if req.partition is None and weights_reason(model, ex, ex.N) is not None:   # hopeless: say so at once
        how = "" if req.schedule == "auto" else f" with schedule {req.schedule}"
        raise SpecError(model.name, None, "memory", f"{model.name} does not fit {cluster.name}{how}: "
                                              + weights_reason(model, ex, ex.N))
    if req.partition is None and ex.train:
        ex = _fitting_explorer(ex)
    if req.partition is not None:
        best = _user_partition(ex, req.partition, scheds, rc)
        searched = 1
    else:
        configs = ex.configs(scheds, replicas, rc)
        found = getattr(ex, "_found", None) or ex.search(configs)
        found = [f for f in found if f.iteration_s is None or math.isfinite(f.iteration_s)]
        searched = len(found)
        if not found:
            how = "" if req.schedule == "auto" else f" with schedule {req.schedule}"
            raise SpecError(model.name, None, "memory", f"{model.name} does not fit {cluster.name}{how}: "
                                                  + infeasible_reason(model, ex, ex.N, 1))
        best = found[0]
    baselines, alts = baselines_of(model, ex, best, found if req.partition is None else None)
    if req.partition is None:
        # the baselines lie in the search space: never report a plan slower than one of them
        for alt in alts:
            # a baseline replaces the plan only when it is what was asked for (its schedule)
            if alt is None or (alt.config.r > 1 and not req.replication) or 1 not in ex.mesh_sizes() or \
                    (req.schedule != "auto" and ex.train and alt.config.schedule != req.schedule):
                continue
            if (alt.iteration_s, alt.config) < (best.iteration_s, best.config):
                best = alt
        best = ex.retune(best)
    lb = lower_bound_s(model, ex)
    plan = to_plan(model, cluster, model_arg, cluster_arg, ex, best, baselines, lb)
    check_cap(plan, ex)
    return Outcome(plan, best, baselines, lb, searched=searched, boards_total=ex.N,
                   placement_exact=req.partition is None and ex.placement_exact, explorer=ex)


def user_groups(ex: Explorer, spec) -> tuple[tuple[int, ...], ...] | None:
    """Boards of every stage of a ``--partition`` (ranges with optional ``xR`` replicas and
    ``@board+board`` lists): listed boards as given, the others the next unused boards in
    topology order. None when no stage names replicas or boards (one board each, in order)."""
    if all(r is None and bl is None for _a, _b, r, bl in spec):
        return None
    names = {cb.name: i for i, cb in enumerate(ex.boards)}
    taken: set[int] = set()
    for _a, _b, r, bl in spec:
        for b in bl or ():
            if b not in names:
                raise SpecError(None, None, "--partition", f"board '{b}' is not among the {ex.N} boards planned on "
                                                           f"({', '.join(list(names)[:4])}...)")
            if names[b] in taken:
                raise SpecError(None, None, "--partition", f"board '{b}' is given to two stages")
            taken.add(names[b])
    free = [i for i in range(ex.N) if i not in taken]
    need = sum(r or 1 for _a, _b, r, bl in spec if bl is None)
    if need > len(free):
        raise SpecError(None, None, "--partition", f"the stages need {need + len(taken)} boards but only "
                                                   f"{ex.N} are planned on")
    out = []
    for _a, _b, r, bl in spec:
        if bl is not None:
            out.append(tuple(names[b] for b in bl))
        else:
            out.append(tuple(free[:r or 1]))
            free = free[r or 1:]
    return tuple(out)


def _user_partition(ex: Explorer, spec, scheds, rc) -> Candidate:
    """Price a given partition (with optional per-stage replicas and boards): the best
    micro-batch count and recomputation for each requested schedule, fastest replay wins."""
    spec = [tuple(x) + (None, None) if len(x) == 2 else tuple(x) for x in spec]
    bounds = [(a, b) for a, b, _r, _bl in spec]
    S = len(bounds)
    if bounds[0][0] != 0 or bounds[-1][1] != ex.n - 1 or any(b[0] != a[1] + 1 for a, b in zip(bounds, bounds[1:])) \
            or any(a > b for a, b in bounds):
        raise SpecError(None, None, "--partition", f"expected contiguous ranges covering layers 0-{ex.n - 1}")
    if ex.req.whole_blocks:   # a cut inside a residual block would price as infeasible: say why
        for _a, b in bounds[:-1]:
            if ex.open_cuts[b]:
                ok = [k for k in range(ex.n - 1) if not ex.open_cuts[k]]
                near = min(ok, key=lambda k: (abs(k - b), k)) if ok else None
                raise SpecError(None, None, "--partition", f"the cut after layer {b} ('{ex.model.layers[b].name}') "
                                                           f"leaves a skip connection open, which --whole-blocks "
                                                           f"forbids" + (f"; the nearest cut between blocks is "
                                                                         f"after layer {near}" if near is not None
                                                                         else ""))
    groups = user_groups(ex, spec)
    interleaved = ex.train and scheds == ["interleaved"]
    if interleaved:
        # the ranges are the p x v chunks in pipeline order; chunk s runs on board s mod p
        if groups is not None or S % 2 or S < 4:
            raise SpecError(None, None, "--partition", f"interleaved takes an even number (>= 4) of ranges without "
                                                       f"replicas or boards (v = 2 chunks on each of ranges / 2 "
                                                       f"boards, in pipeline order); got {S} range(s)")
        if S // 2 > ex.N:
            raise SpecError(None, None, "--partition", f"{S} chunks need {S // 2} boards but only {ex.N} are "
                                                       "planned on")
    elif groups is None and S > ex.N:
        raise SpecError(None, None, "--partition", f"{S} stages but only {ex.N} boards")
    v = 2 if interleaved else 1
    p = S // v
    best = None
    tried = []
    for sched in (scheds if p > 1 else ex.one_stage_schedules(scheds)):
        tried.append(sched)
        if not ex.m_candidates(1, p, sched) and ex.req.schedule != "auto":
            need = "a multiple of" if sched == "interleaved" else "at least"
            raise SpecError(None, None, "--microbatches", f"{sched} on {p} boards needs {need} {p} micro-batches "
                                                          f"dividing the global batch {ex.G}")
        for m in ex.m_candidates(1, p, sched):
            if groups is not None and max(len(g) for g in groups) > ex.G // m:
                continue   # a replica would get no sample
            for r in rc:
                c = Config(sched, v, 1, p, m, ex.G // m, r, groups=groups or ())
                if groups is not None and c.groups == tuple((d,) for d in range(p)):
                    c = replace(c, groups=())   # one board per stage in topology order: the plain layout
                if any(ex.stage_type(c, d) is None for d in range(p)):
                    raise SpecError(None, None, "--partition", "a stage's replicas mix board types; give each "
                                                               "stage boards of one type")
                cand = ex.fixed_config(c, bounds)
                if cand is None:
                    continue
                ex.finish(cand)
                if best is None or (cand.iteration_s, cand.config) < (best.iteration_s, best.config):
                    best = cand
    if best is None:
        how = f" with schedule {'/'.join(tried)}" if ex.req.schedule != "auto" else ""
        raise SpecError(None, None, "--partition", f"the given partition does not fit the boards' memory{how}: "
                        + infeasible_reason(ex.model, ex, p, 1))
    return best


def _best_of(ex: Explorer, configs: list[Config], bounds_fn=None, replays: int = 2) -> Candidate | None:
    """The fastest replayed candidate among the ``replays`` best by J of ``configs``."""
    found = []
    for c in configs:
        cand = ex.fixed_config(c, bounds_fn(c)) if bounds_fn else ex.solve_config(c)
        if cand is not None:
            found.append(cand)
    found.sort(key=lambda x: (x.objective, x.config))
    best = None
    for cand in found[:replays]:
        ex.finish(cand)
        if best is None or (cand.iteration_s, cand.config) < (best.iteration_s, best.config):
            best = cand
    return best


def equal_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """Equal layer counts per stage (the first n % p stages take one more)."""
    q, rem = divmod(n, p)
    out, a = [], 0
    for d in range(p):
        ln = q + (1 if d < rem else 0)
        out.append((a, a + ln - 1))
        a += ln
    return out


def _best_among(ex: Explorer, found: list[Candidate] | None, keep) -> Candidate | None:
    """The fastest replay among the two best by J of the explored candidates ``keep`` accepts
    (None when the exploration kept none of them)."""
    cands = [x for x in (found or []) if keep(x)]
    cands.sort(key=lambda x: (x.objective, _ckey(x.config)))
    best = None
    for cand in cands[:2]:
        if cand.iteration_s is None:
            ex.finish(cand)
        if best is None or (cand.iteration_s, _ckey(cand.config)) < (best.iteration_s, _ckey(best.config)):
            best = cand
    return best


def _best_folded(ex: Explorer, configs: list[Config], made: dict, bounds_fn=None) -> Candidate | None:
    """:func:`_best_of` at ``ex``'s folding, else at the smaller shares of the budget the plan
    itself would be folded within (:data:`FOLD_SCALES`, :func:`_fitting_explorer`): a baseline is
    priced as the planner would build it (vgg16's data parallel fits a U250 only at half folding,
    as its one-board plan does)."""
    got = _best_of(ex, configs, bounds_fn)
    if _priced(got) or not _has_fpga(ex):
        return got
    for scale in (s for s in FOLD_SCALES if s < ex.fold_scale):
        alt = _best_of(_folded(ex, scale, made), configs, bounds_fn)
        if _priced(alt):
            return alt
    return got


def baselines_of(model: Model, ex: Explorer, best: Candidate,
                 found: list[Candidate] | None = None) -> tuple[dict, list]:
    """Data parallel on every board, equal-layer GPipe, best without replication, best on
    fewer boards (and their candidates). ``found``: the plan's own exploration, whose
    candidates serve the last two when it kept any (else they are searched on their own)."""
    out: dict = {}
    nr = None
    rc = (False, True) if ex.train else (False,)
    N = ex.N
    one = ex.single_stage_schedule
    dp_cfg = [Config(one, 1, N, 1, m, ex.G // m // N, r) for m in ex.m_candidates(N, 1, one) for r in rc]
    folded: dict = {}   # the smaller foldings' explorers, shared by the two baselines
    dp = _best_folded(ex, dp_cfg, folded) if ex.group_type(N, 0) is not None and not ex.G % N else None
    if ex.group_type(N, 0) is None:
        out["data_parallel"] = {"infeasible": "the cluster mixes board types; data parallelism needs identical replicas"}
    elif ex.G % N:
        out["data_parallel"] = {"infeasible": f"global batch {ex.G} does not split over {N} boards"}
    elif dp is None:
        out["data_parallel"] = {"infeasible": infeasible_reason(model, ex, 1, N)}
    else:
        out["data_parallel"] = _result(dp, ex.G)
    p = min(N, ex.n)
    sched = "gpipe" if ex.train else "gpipe"
    eq_cfg = [Config(sched, 1, 1, p, m, ex.G // m, r) for m in ex.m_candidates(1, p, sched) for r in rc]
    eq = _best_folded(ex, eq_cfg, folded, lambda c: equal_bounds(ex.n, c.p))
    out["equal_split"] = _result(eq, ex.G) if eq else {"infeasible": "equal-layer split: "
                                                       + infeasible_reason(model, ex, p, 1)}
    scheds = ex.schedules()
    if replicas_of(best) == 1:
        out["no_replication"] = _result(best, ex.G)
    else:
        nr = _best_among(ex, found, lambda x: all(ex.reps(x.config, d) == 1 for d in range(x.config.p)))
        if nr is None:
            got = ex.search(ex.configs(scheds, [1], rc), BASELINE_SLACK)
            nr = got[0] if got else None
        out["no_replication"] = _result(nr, ex.G) if nr else {"infeasible": infeasible_reason(model, ex, N, 1)}
    few = None
    if N > 1:
        # the best plan that leaves at least one board idle (the search's own space, cut down)
        if best.boards_used < N:
            few = best
        else:
            few = _best_among(ex, found, lambda x: ex.boards_used(x.config) < N)
            if few is None:
                reps = list(range(1, N)) if ex.req.replication else [1]
                got = ex.search([c for c in ex.configs(scheds, reps, rc) if ex.boards_used(c) < N], BASELINE_SLACK)
                few = got[0] if got and got[0].iteration_s is not None else None
        out["fewer_boards"] = _result(few, ex.G) if few else {"infeasible": f"no plan fits fewer than {N} boards"}
    return out, [dp, eq, nr, few]


def _stage_cycles(s: dict, clk: float, slowest: int) -> dict[str, float]:
    """fwd/bwd cycles per micro-batch and ``fwd_interval``: forward cycles per sample in steady
    state (a long stream of samples), what `bapipe rtlsim` measures per stage; a training stage
    also ``bwd_rtl``, its backward as the training RTL builds it (one engine per layer,
    fpga_models.engines: codegen.design.training) where ``bwd`` is the HLS backward kernel's
    (tiled engines, fpga_models.bwd_tiles); a training FPGA
    stage also its per-iteration ``flush``, ``allreduce`` and ``update`` cycles (what the
    Design's kernels record, codegen.design.train_kernels).

    Dataflow stages overlap their layers, so the slowest layer's cycles set the interval
    (unless off-chip traffic is slower); time-multiplexed stages take every layer's turn for
    every sample, so the interval is the micro-batch's cycles over its samples.
    """
    fwd = int(round(s["fwd_s"] * clk))
    interval = fwd / s["beta"]
    if s["style"] == "dataflow" and s["fwd_s"] <= s["compute_f"] * (1 + 1e-9):
        interval = float(slowest)
    out = {"fwd": fwd, "bwd": int(round(s["bwd_s"] * clk)), "fwd_interval": round(interval, 3)}
    if s.get("bwd_s") and s["style"] != "gpu":   # training: the backward as the training RTL's engines run it
        out["bwd_rtl"] = int(round(s.get("bwd_rtl_s", s["bwd_s"]) * clk))
    if s.get("update_s"):   # the per-iteration tail as the HLS kernels build it (fpga_models.update)
        out.update(flush=int(round(s["flush_s"] * clk)), allreduce=int(round(s["allreduce_s"] * clk)),
                   update=int(round(s["update_s"] * clk)))
    return out


_CAPPED = (("dsp", "usable_dsp", "DSP"), ("lut", "usable_lut", "LUT"))


def check_cap(plan: Plan, ex: Explorer) -> None:
    """Refuse (SpecError naming --cap) a plan whose engines exceed the utilisation cap.

    The smallest folding of a layer (one PE, one SIMD lane) still needs its DSPs and LUTs, so
    a tiny cap leaves no plan; the time-multiplexed allocation falls back to that folding
    rather than fail, and this says so instead of writing a plan that every later command
    refuses. The bound is the one plan validation applies on load (fpga_models.plancheck:
    ceil(usable x cap)); the cap suggested is the largest fraction any stage of this plan
    needs, rounded up to 3 significant digits: enough for that stage, not a minimum (another
    partition with smaller stages may fit a smaller cap)."""
    worst = None   # (fraction needed, stage, board, need, label, usable)
    over = False
    for s in plan.stages:
        board = ex.tables[s.board_type].board
        if board.kind != "fpga":
            continue
        for key, attr, label in _CAPPED:
            usable, need = getattr(board, attr), s.resources.get(key, 0)
            over |= need > math.ceil(usable * plan.utilisation_cap - 1e-9)
            if usable and (worst is None or need / usable > worst[0]):
                smallest = all(f.pe == 1 and f.simd == 1 and f.lanes in (None, 1) for f in s.folding.values())
                worst = (need / usable, s.index, board.name, need, label, usable, smallest)
    if over and worst is not None:
        frac, idx, bname, need, label, usable, smallest = worst
        if not smallest:   # the search chose foldings above the cap: its own inconsistency, not the user's
            raise SpecError(None, None, "--cap", f"internal: the planner's stage {idx} on a {bname} needs {need} "
                                                 f"{label}, above --cap {plan.utilisation_cap:g} ({frac:.3g} of "
                                                 f"{usable} usable), with foldings larger than the smallest; the plan "
                                                 f"is not written (plan validation would refuse it)")
        e = math.floor(math.log10(frac)) - 2
        suggest = math.ceil(frac / 10 ** e - 1e-9) * 10 ** e
        raise SpecError(None, None, "--cap", f"no plan fits within --cap {plan.utilisation_cap:g}: stage {idx} on a "
                                             f"{bname} needs {need} {label} at its smallest foldings "
                                             f"({frac:.3g} of {usable} usable); expected a larger cap "
                                             f"(--cap {suggest:.3g} fits that stage)")


def _bwd_resources(model: Model, layers, board, s: dict, ex: Explorer, c) -> dict:
    """plan.yaml ``resources`` of the stage's backward kernel: ``bwd_bram36``, ``bwd_uram``,
    ``bwd_dsp`` (fpga_models.bwd_memory.bwd_kernel_resources: what `bapipe check` counts in the
    generated C++)."""
    from bapipe.fpga_models.allocate import kernel_onchip_budget
    from bapipe.fpga_models.bwd_memory import bwd_kernel_resources

    fold = {l.name: tuple(s["folding"][l.name]) for l in layers}
    room = (ex.bwd_room(s["first"], s["last"], s["board_type"], c.v, s.get("port_lanes"))
            if s["style"] == "time-multiplexed" else None)
    r = bwd_kernel_resources(model, layers, board, fold, ex.req.fmt, s["style"], s["beta"], c.m * s["beta"],
                             kernel_onchip_budget(board, ex.req.cap, c.v, True), room)
    return {"bwd_bram36": int(math.ceil(r["bram36"])), "bwd_uram": int(r["uram"]), "bwd_dsp": int(r["dsp"])}


def to_plan(model: Model, cluster: Cluster, model_arg: str, cluster_arg: str, ex: Explorer, best: Candidate,
            baselines: dict, lb: float) -> Plan:
    """The plan.yaml dataclass of the best candidate."""
    c = best.config
    stages = []
    for s in best.stages:
        layers = model.layers[s["first"]: s["last"] + 1]
        board = ex.tables[s["board_type"]].board
        folding, dsp, lut, slowest = {}, 0, 0, 0
        for l in layers:
            pe, simd = s["folding"][l.name]
            # element-wise engines carry lanes; the search keeps them as (1, lanes)
            folding[l.name] = Folding(pe, simd) if matrix_shape(l) is not None else Folding(lanes=pe * simd)
            if board.kind == "fpga":
                lc = layer_cost(l, board, pe, simd, ex.req.fmt, s["beta"])
                if s["style"] == "dataflow":   # every layer has its own engine
                    dsp, lut = dsp + lc.dsp, lut + lc.lut
                    slowest = max(slowest, layer_cost(l, board, pe, simd, ex.req.fmt, 1).fwd_cycles)
                else:   # counted as one shared engine, the largest layer's (fpga_models.allocate.engines_dsp;
                    # the generators build one array per layer: docs/planner.md, the board budget)
                    dsp, lut = max(dsp, lc.dsp), max(lut, lc.lut)
        res = {"dsp": dsp, "lut": lut}
        if board.kind == "fpga" and ex.train:   # the backward kernel in blocks (fpga_models.bwd_memory)
            res.update(_bwd_resources(model, layers, board, s, ex, c))
        onchip_used = min(s["memory_bytes"], s["onchip"])
        res.update(onchip_blocks(board, onchip_used, ex.req.cap) if board.kind == "fpga" else {"uram": 0, "bram36": 0})
        res["offchip_bytes"] = max(0, s["memory_bytes"] - onchip_used)
        if board.kind == "fpga":   # the forward kernel's own memory in blocks (fpga_models.allocate)
            fb = fwd_kernel_blocks(layers, board, s["folding"], ex.req.fmt, ex.req.cap, c.v, ex.req.mode == "train",
                                   s["style"], s.get("port_lanes"))
            res.update({"fwd_bram36": fb.bram36, "fwd_uram": fb.uram})
        clk = board.clock_hz
        stages.append(Stage(
            index=s["index"], layers=[l.name for l in layers], first=s["first"], last=s["last"], boards=s["boards"],
            board_type=s["board_type"], replicas=s["replicas"], mesh=[1, s["mesh"]] if s["mesh"] > 1 else [1],
            layout=s.get("layout"), chunk=s["chunk"], device=s["device"],
            style=s["style"], folding=folding, fwd_s=s["fwd_s"],
            bwd_s=s["bwd_s"], time_s=s["time_s"], send_bytes=s["send_bytes"], send_s=s["send_s"],
            allreduce_s=s["allreduce_s"], flush_s=s.get("flush_s", 0.0), update_s=s.get("update_s", 0.0),
            memory_bytes=s["memory_bytes"], weight_bytes=s["weight_bytes"],
            stash_bytes=s["stash_bytes"], stashes=s["stashes"], resources=res,
            cycles=dict(_stage_cycles(s, clk, slowest), **({"bwd_flush": int(round(s["flush_s"] * clk))}
                                                            if s.get("flush_s") else {}))))
    # iteration_time_s: one iteration from an empty pipeline (what `bapipe sim` replays with
    # one iteration); steady_iteration_time_s: per iteration once running, what plans are
    # ranked by (equal for flushed schedules, lower for PipeDream-2BW)
    first = best.first_iteration_s if best.first_iteration_s is not None else best.iteration_s
    predicted = {"iteration_time_s": first, "steady_iteration_time_s": best.iteration_s,
                 "throughput_samples_per_s": ex.G / best.iteration_s,
                 "bubble_fraction": best.bubble, "objective_s": best.objective, "recompute": c.recompute,
                 "peak_memory_bytes": best.peak_memory, "boards_used": best.boards_used,
                 "link_latency_s": [s["send_lat"] for s in best.stages[:-1]],
                 "link_occupancy_s": [s["send_occ"] for s in best.stages[:-1]],
                 "exact_partition": best.exact,
                 "latency_s": sum(s["fwd_s"] + s["send_s"] for s in best.stages),
                 # memory_bytes = fixed_bytes + stashes x stash_bytes_per_microbatch, per stage
                 "stash_bytes_per_microbatch": [s["stash_mb_bytes"] for s in best.stages],
                 "fixed_bytes": [s["fixed_bytes"] for s in best.stages]}
    return Plan(model=model_arg, model_fingerprint=model.fingerprint(), cluster=cluster_arg,
                cluster_fingerprint=cluster.fingerprint(), mode=ex.req.mode, schedule=c.schedule, chunks=c.v,
                microbatches=c.m, microbatch_size=c.beta * c.r, global_batch=ex.G, number_format=ex.req.fmt,
                optimizer=ex.req.optimizer, utilisation_cap=ex.req.cap, stages=stages, predicted=predicted,
                baselines=baselines, lower_bound_s=lb)


def summary(out: Outcome) -> dict:
    """The --json object."""
    p = out.plan
    it = out.best.iteration_s
    dp = out.baselines.get("data_parallel", {})
    return {
        "model": p.model, "cluster": p.cluster, "mode": p.mode,
        "iteration_time_s": it, "throughput_samples_per_s": p.global_batch / it, "schedule": p.schedule,
        "first_iteration_time_s": p.predicted["iteration_time_s"],
        "chunks": p.chunks, "microbatches": p.microbatches, "microbatch_size": p.microbatch_size,
        "global_batch": p.global_batch, "replicas": replicas_of(out.best), "boards_used": out.best.boards_used,
        "boards_total": out.boards_total, "placement_exact": out.placement_exact,
        "recompute": out.best.config.recompute,
        "bubble_fraction": out.best.bubble, "latency_s": p.predicted["latency_s"],
        "stages": [{"layers": [s.first, s.last], "boards": s.boards, "board_type": s.board_type,
                    "device": s.device, "chunk": s.chunk, "style": s.style, "time_s": s.time_s, "fwd_s": s.fwd_s,
                    "bwd_s": s.bwd_s, "send_s": s.send_s, "allreduce_s": s.allreduce_s,
                    "memory_bytes": s.memory_bytes, "mesh": s.mesh, "layout": s.layout} for s in p.stages],
        "baselines": out.baselines, "lower_bound_s": out.lower_bound_s,
        "speedup_vs_data_parallel": (dp["iteration_time_s"] / it) if "iteration_time_s" in dp else None,
        "pareto": out.pareto,
    }
