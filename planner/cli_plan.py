"""`bapipe plan MODEL CLUSTER -o plan.yaml`: the handler and its human-readable table."""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import replace

from bapipe.errors import SpecError
from bapipe.schedules import SCHEDULES
from bapipe.fpga_models.boards import FORMATS

from .planning import make_plan, summary
from .placement import PLACE_WORK_MAX
from .search import Request


def parse_partition(text: str, n: int) -> list[tuple]:
    """'0-5,6-11,12' -> [(0, 5, None, None), ...]; a range may carry replicas and boards:
    '0-16x12,17-24x3,25-38' (12, 3 and 1 replicas) or '0-5@fpga0+fpga1,6-11x1@fpga3'
    (the listed boards; xR must then equal their count). SpecError naming --partition otherwise."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        rng, at, boards = part.partition("@")
        if at and not boards.strip():   # '0-4@' once dropped the empty list and placed the range anywhere
            raise SpecError(None, None, "--partition", f"expected board names after '@' in {part!r}")
        rng, _, reps = rng.partition("x")
        try:
            if "-" in rng:
                a, b = rng.split("-", 1)
                a, b = int(a), int(b)
            else:
                a = b = int(rng)
            r = int(reps) if reps else None
        except ValueError:
            raise SpecError(None, None, "--partition", f"expected ranges like 0-5,6-11 (optionally 0-5x2 or "
                                                       f"0-5@board+board); got {part!r}") from None
        bl = tuple(x.strip() for x in boards.split("+")) if boards else None
        if r is not None and r < 1:
            raise SpecError(None, None, "--partition", f"expected at least 1 replica in {part!r}")
        if bl is not None and (not all(bl) or len(set(bl)) != len(bl)):
            raise SpecError(None, None, "--partition", f"expected distinct board names joined by '+' in {part!r}")
        if bl is not None and r is not None and r != len(bl):
            raise SpecError(None, None, "--partition", f"{part!r} asks for {r} replicas but lists {len(bl)} boards")
        out.append((a, b, r, bl))
    for a, b, _r, _bl in out:
        if not 0 <= a <= b < n:
            raise SpecError(None, None, "--partition", f"range {a}-{b} outside layers 0-{n - 1}")
    return out


def _measured(path: str | None, model):
    """Per-board-type measured per-sample times from bapipe.profiles (when that module exists).

    Returns {board type or None (any board): {layer: {fwd_s, bwd_s, ...}}}, scaled to 1 sample.
    """
    if not path:
        return None
    if importlib.util.find_spec("bapipe.profiles") is None:
        raise SpecError(path, None, "--profile", "measured profiles are not available in this build")
    from bapipe.profiles import load_profiles
    return load_profiles(path, model, batch=1, require_batch=True)


def request_from_args(args, model) -> Request:
    """Validate CLI options into a Request."""
    sched = getattr(args, "schedule", "auto") or "auto"
    if sched != "auto" and sched not in SCHEDULES:
        raise SpecError(None, None, "--schedule", f"expected auto or one of {', '.join(SCHEDULES)}, got {sched!r}")
    fmt = getattr(args, "format", "fixed16")
    if fmt not in FORMATS:
        raise SpecError(None, None, "--format", f"expected one of {', '.join(FORMATS)}, got {fmt!r}")
    mb = getattr(args, "microbatches", "auto")
    mb = "auto" if mb is None else str(mb).strip()   # an empty value is refused, not read as auto
    if mb == "auto":
        m = None
    else:
        try:
            m = int(mb)
        except ValueError:
            raise SpecError(None, None, "--microbatches", f"expected auto or a positive integer, got {mb!r}") from None
        if m < 1:
            raise SpecError(None, None, "--microbatches", f"expected a positive integer, got {m}")
    gb = getattr(args, "global_batch", None)
    if gb is not None and gb < 1:
        raise SpecError(None, None, "--global-batch", f"expected a positive integer, got {gb}")
    cap = float(getattr(args, "cap", 0.8))
    if not 0 < cap <= 1:
        raise SpecError(None, None, "--cap", f"expected a utilisation cap in (0, 1], got {cap}")
    mode = getattr(args, "mode", "train")
    mode = "inference" if mode in ("infer", "inference") else mode
    part = getattr(args, "partition", None)
    spec = parse_partition(part, len(model.layers)) if part is not None else None
    meshes = parse_meshes(getattr(args, "mesh", "1"))
    if spec is not None and meshes != (1,):   # a given partition is priced one board per replica
        raise SpecError(None, None, "--mesh", "applies to searched plans only; a --partition stage runs on one "
                                              "board per replica (drop --mesh, or drop --partition)")
    if spec is not None and getattr(args, "no_replication", False) and any((r or 1) > 1 for _a, _b, r, _bl in spec):
        raise SpecError(None, None, "--partition", "asks for replicas (xR) but --no-replication is given")
    places = getattr(args, "placements", None)
    if places is not None and not 0 <= places <= PLACE_WORK_MAX:
        raise SpecError(None, None, "--placements", f"expected a count 0..{PLACE_WORK_MAX} (0: board orders only), "
                                                    f"got {places}")
    if places is not None and spec is not None:
        raise SpecError(None, None, "--placements", "applies to searched plans only; a --partition gives every "
                                                    "stage's boards (drop --placements, or drop --partition)")
    return Request(schedule=sched, microbatches=m, global_batch=gb, fmt=fmt, mode=mode,
                   optimizer=getattr(args, "optimizer", "sgd"), cap=cap,
                   replication=not getattr(args, "no_replication", False), max_boards=getattr(args, "boards", None),
                   partition=spec,
                   measured=_measured(getattr(args, "measured", None), model),
                   meshes=meshes,
                   whole_blocks=bool(getattr(args, "whole_blocks", False)), placement_limit=places)


def parse_meshes(text) -> tuple[int, ...] | None:
    """--mesh: "auto" -> None (explore 1 and the host size), "4" or "1,4" -> sizes to explore
    (uniform over the stages), "4+1+1+1+1" -> one per-stage vector (a tuple in the result)."""
    text = str(text if text is not None else "1").strip()
    if text == "auto":
        return None
    try:
        ks = tuple(tuple(int(y) for y in x.split("+")) if "+" in x else int(x) for x in text.split(","))
    except ValueError:
        ks = ()
    if not ks or any(min(k) < 1 if isinstance(k, tuple) else k < 1 for k in ks):
        raise SpecError(None, None, "--mesh", f"expected auto, a positive board count or a list like 1,4, got {text!r}")
    return ks


def _check_result(plan, model, cluster, args) -> None:
    """The plan passes the check every later command applies (fpga_models.plancheck): inputs
    the search accepts but that make an out-of-range plan (a profile's huge times) are
    refused here, before a plan is written that `bapipe sim` and `gen` would refuse."""
    from bapipe.fpga_models.plancheck import validate

    try:
        validate(plan, model, cluster, str(getattr(args, "output", None) or "plan.yaml"))
    except SpecError as e:
        src = getattr(args, "measured", None) or getattr(args, "model", None) or "MODEL"
        raise SpecError(str(src), None, None, f"the plan made from it is out of range ({e.field}: "
                                              f"{e.expected})"[:400]) from None


def plan_outcome(model, cluster, model_ref: str, cluster_ref: str, args) -> tuple:
    """Plan ``model`` on ``cluster`` (loaded objects; ``model_ref``/``cluster_ref``: the names
    the plan file records, which reload them) with the options in ``args`` (the `plan` command's
    dests; bapipe.api.plan fills the defaults): the planner's Outcome and its --json object
    (without ``output``: nothing is written here, bapipe.api.Plan.save writes)."""
    opaque = {k: tuple(v) for k, v in model_opaque(args).items()} or None
    req = request_from_args(args, model)
    peer_cost = None
    if getattr(args, "cost_model", "bapipe") == "pipedream":
        req, peer_cost = peer_layout(args, model, cluster, req)
    if sys.stderr.isatty():  # big models on big clusters search for seconds (resnet50 on 64xU55C: ~10 s)
        sys.stderr.write(f"bapipe plan: searching {len(model.layers)} layers over {len(cluster.boards)} boards "
                         "(the zoo's largest on 64 boards: ~10 s)\n")
    out = make_plan(model, cluster, model_ref, cluster_ref, req)
    if opaque:  # the plan must reload the same model (resolve() checks the fingerprint)
        out.plan.opaque = {k: list(v) for k, v in sorted(opaque.items())}
    if getattr(args, "pareto", False):
        from .pareto import pareto_plans
        out.pareto = pareto_plans(model, cluster, replace(req, global_batch=out.plan.global_batch))
    _check_result(out.plan, model, cluster, args)
    res = summary(out)
    res["cost_model"] = getattr(args, "cost_model", "bapipe")
    if peer_cost is not None:
        res["pipedream_cost"] = peer_cost
    res.update(limits(out))
    return out, res


def limits(out) -> dict:
    """What limits the plan (docs/planner.md, "What limits a plan"): per pipeline position
    the iteration split into compute, fills, off-chip, link, all-reduce, update and bubble
    (planner.breakdown), the DSP and off-chip rooflines (planner.roofline) and the one
    resource that holds the plan back."""
    from .breakdown import breakdown, unpriced
    from .roofline import limit, roofline

    ex, best = out.explorer, out.best
    pos = breakdown(ex, best)
    roof = roofline(ex.model, ex.boards, ex.req.fmt, ex.train, out.plan.global_batch, best.iteration_s, pos)
    return {"breakdown": pos, "unpriced": unpriced(ex, best), "roofline": roof,
            "limit": limit(pos, best.iteration_s)}


def model_opaque(args) -> dict:
    """--opaque OP=fwd_s,bwd_s given for an ONNX model, parsed ({} when none)."""
    from bapipe.onnx_import import parse_opaque

    return parse_opaque(args.opaque) if getattr(args, "opaque", None) else {}


#: options --cost-model pipedream cannot honour: it searches every layout of all the boards itself
_NOT_WITH_PEER_COST = (("partition", "--partition"), ("pareto", "--pareto"), ("boards", "--boards"),
                       ("no_replication", "--no-replication"), ("whole_blocks", "--whole-blocks"))


def peer_layout(args, model, cluster, req: Request) -> tuple[Request, dict]:
    """--cost-model pipedream: the layout (stages, boards) least under PipeDream's formula over
    every flat plan (planner.peer_search, exact), as a --partition for bapipe's model to price,
    scheduled as PipeDream (asynchronous) unless another schedule is asked for; and the
    formula's figures: this plan, the peer DP's value and its plan priced (per profiled
    minibatch). One-line SpecError when the formula cannot apply."""
    from bapipe.profiles import load_profile

    from .peer_pipedream import cluster_levels, peer_input, price, solve
    from .peer_search import search

    for dest, opt in _NOT_WITH_PEER_COST:
        if getattr(args, dest, None) not in (None, False):
            raise SpecError(None, None, opt, "applies to --cost-model bapipe (--cost-model pipedream searches "
                                             "every layout of the cluster's boards itself)")
    if str(getattr(args, "mesh", "1")).strip() != "1":
        raise SpecError(None, None, "--mesh", "applies to --cost-model bapipe (PipeDream's formula has no "
                                              "tensor-parallel stages)")
    if not getattr(args, "measured", None):
        raise SpecError(None, None, "--cost-model", "pipedream prices measured per-layer times: add --profile FILE")
    if req.mode != "train":
        raise SpecError(None, None, "--cost-model", "pipedream prices training (forward + backward); "
                                                    "expected --mode train")
    lv = cluster_levels(cluster)
    if lv is None:
        raise SpecError(None, None, "--cost-model", f"pipedream needs at least 2 hosts with the same number of boards "
                                                    f"(its two levels); {cluster.name} has "
                                                    f"{len({cb.host for cb in cluster.boards})} host(s)")
    levels, cols = lv
    inp = peer_input(model, load_profile(args.measured, model, require_batch=True))
    peer_s, peer_stages = solve(inp, levels)
    peer_priced = price(inp, peer_stages, levels)
    ours_s, stages = search(inp, levels, bound=peer_priced)
    names = [cb.name for cb in cluster.boards]
    G = levels[0].units
    board = lambda b: names[cols[b // G][b % G]]  # noqa: E731  (host-major index -> cluster board)
    spec = [(s.first, s.last, len(s.boards), tuple(board(b) for b in s.boards)) for s in stages]
    sched = "pipedream" if req.schedule == "auto" else req.schedule
    shape = lambda st: ",".join(f"{s.first}-{s.last}x{len(s.boards)}" for s in st)  # noqa: E731
    info = {"plan_s": ours_s, "peer_dp_s": peer_s, "peer_plan_s": peer_priced, "peer_plan": shape(peer_stages),
            "plan": shape(stages), "per": "profiled minibatch (the profile's batch)",
            "peer_over_plan": peer_priced / ours_s}
    return replace(req, partition=spec, schedule=sched), info


def _t(x) -> str:
    from bapipe.units import seconds

    return seconds(x)


def board_list(names) -> str:
    """Boards of a stage, consecutive numbers of one prefix as a range:
    [fpga0, fpga1, fpga2, fpga3, fpga6] -> 'fpga0-3,fpga6'."""
    runs: list[list] = []   # [prefix, first, last] or [name, None, None]
    for n in names:
        m = re.fullmatch(r"(.*?)(\d+)", n)
        if m and runs and runs[-1][1] is not None and runs[-1][0] == m.group(1) \
                and int(m.group(2)) == runs[-1][2] + 1 and m.group(2) == str(int(m.group(2))):
            runs[-1][2] += 1
        elif m and m.group(2) == str(int(m.group(2))):
            runs.append([m.group(1), int(m.group(2)), int(m.group(2))])
        else:
            runs.append([n, None, None])
    return ",".join(p if a is None else f"{p}{a}" if a == b else f"{p}{a}-{b}" for p, a, b in runs)


def compare(plan_s: float, other_s: float) -> str:
    """The plan's time against another as a factor above 1: 'plan is 1.62x faster',
    'plan is 3.45x slower', or 'same time' when the two agree to the 2 printed decimals."""
    r = other_s / plan_s
    if f"{r:.2f}" == "1.00" or f"{1 / r:.2f}" == "1.00":
        return "plan takes the same time (1.00x)"
    return f"plan is {r:.2f}x faster" if r > 1 else f"plan is {1 / r:.2f}x slower"


def show_plan(res: dict) -> str:
    """Human-readable plan table (bytes in IEC units, times and rates in engineering notation)."""
    from bapipe.units import count, nbytes, si
    bw = max([22] + [len(board_list(s["boards"])) for s in res["stages"]])
    lines = [f"plan {res['model']} on {res['cluster']} ({res['mode']}): schedule {res['schedule']}"
             + (f" v={res['chunks']}" if res['chunks'] > 1 else "")
             + f", {count(res['microbatches'], 'micro-batch')} of {res['microbatch_size']}, global batch {res['global_batch']}"
             + (f", {res['replicas']} replicas per stage" if isinstance(res['replicas'], int) and res['replicas'] > 1
                else f", replicas per stage {'-'.join(map(str, res['replicas']))}" if isinstance(res['replicas'], list)
                else "")
             + (f", {res['boards_used']} of {res['boards_total']} boards" if res.get('boards_used', 0)
                < res.get('boards_total', 0) else "")
             + (", activation recomputation" if res['recompute'] else "")
             + (f", tensor-parallel meshes {'x'.join(map(str, res['stages'][0]['mesh']))}"
                if res['stages'] and res['stages'][0].get('mesh', [1]) != [1] else ""),
             f"{'stage':>5} {'layers':>9} {'boards':<{bw}} {'style':<16} {'fwd':>9} {'bwd':>9} {'send':>9} {'memory':>10}"]
    for i, s in enumerate(res["stages"]):
        b = board_list(s["boards"])
        lines.append(f"{i:>5} {s['layers'][0]:>4}-{s['layers'][1]:<4} {b:<{bw}} {s['style']:<16} "
                     f"{_t(s['fwd_s']):>9} {_t(s['bwd_s']):>9} {_t(s['send_s']):>9} {nbytes(s['memory_bytes']):>10}")
    # every number here is the planner's prediction (its cycle model and link model), not a measurement
    lines.append(f"predicted by the planner: iteration {_t(res['iteration_time_s'])}, "
                 f"{si(res['throughput_samples_per_s'], 'samples/s')}, bubble {res['bubble_fraction']:.1%} "
                 f"(idle share of the busiest board); lower bound {_t(res['lower_bound_s'])}")
    lines += show_limits(res)
    if res["baselines"]:
        lines.append("baselines (predicted by the same model):")
    for name, b in res["baselines"].items():
        if "infeasible" in b:
            lines.append(f"  {name:<15} infeasible: {b['infeasible']}")
        else:
            lines.append(f"  {name:<15} {_t(b['iteration_time_s']):>9} ({b['schedule']}, m={b['microbatches']}): "
                         + compare(res["iteration_time_s"], b["iteration_time_s"]))
    for q in res.get("pareto") or []:
        lines.append(f"  pareto: {_t(q['iteration_time_s'])} peak {nbytes(q['peak_memory_bytes'])} "
                     f"{q['boards']} boards ({q['schedule']}, m={q['microbatches']}, r={q['replicas']}"
                     + (f", mesh {q['mesh']}" if q.get("mesh", 1) != 1 else "") + ")")
    pc = res.get("pipedream_cost")
    if pc:
        lines.append(f"layout searched under PipeDream's formula (--cost-model pipedream): {pc['plan']}, "
                     f"{_t(pc['plan_s'])} per profiled minibatch; the peer's DP plans {pc['peer_plan']} at "
                     f"{_t(pc['peer_plan_s'])} ({pc['peer_over_plan']:.4f}x)")
    lines.append(f"wrote {res['output']}")
    return "\n".join(lines)


def show_limits(res: dict) -> list[str]:
    """The breakdown, roofline and limit lines of the plan table (none when absent)."""
    from bapipe.units import si

    pos, roof, lim = res.get("breakdown"), res.get("roofline"), res.get("limit")
    if not pos:
        return []
    T = res["iteration_time_s"]
    bw = max([12] + [len(board_list(q["boards"])) for q in pos])
    heads = ("compute", "fills", "off-chip", "link", "all-reduce", "update", "bubble")
    un = res.get("unpriced") or []
    lines = ["where the iteration goes, per pipeline position (share of the iteration"
             + (f"; not priced yet, shown as 0: {', '.join(un)}" if un else "") + "):",
             f"{'pos':>5} {'boards':<{bw}} " + " ".join(f"{h:>10}" for h in heads)]
    keys = ("compute_s", "fills_s", "offchip_s", "link_s", "allreduce_s", "update_s", "bubble_s")
    for q in pos:
        lines.append(f"{q['position']:>5} {board_list(q['boards']):<{bw}} "
                     + " ".join(f"{q[k] / T:>10.1%}" for k in keys))
    if roof and roof.get("fraction") is not None:
        mem = roof.get("offchip_roofline_samples_per_s")
        lines.append(f"roofline: {si(roof['throughput_samples_per_s'], 'samples/s')} is {roof['fraction']:.1%} of the "
                     f"DSP roofline {si(roof['dsp_roofline_samples_per_s'], 'samples/s')} ({roof['boards']} boards, "
                     f"{si(roof['peak_macs_per_s'], 'MAC/s')} peak, {si(roof['macs_per_sample'], 'MAC')} a sample)"
                     + (f"; off-chip roofline {si(mem, 'samples/s')} ({roof['offchip_fraction']:.1%} reached)"
                        if mem else "")
                     + ("; the off-chip roofline binds" if roof.get("bound") == "offchip" else ""))
    if lim:
        lines.append(f"limited by: {lim['resource']} on position {lim['position']}: {lim['where']}")
    return lines
