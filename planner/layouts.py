"""Per-stage replica layouts proposed by the exact layout DP (planner.layout_dp).

On 9 to HIER_BOARDS boards, where every placement cannot be enumerated, the search asks
:func:`dp_layouts` for layouts: for each board order of :func:`dp_orders` and each
(schedule, micro-batch count, recomputation) the search would try, the layout DP returns the
layout (stages' layer ranges and consecutive blocks of replicas) of least J over every
partition x every vector of replica counts on that order. Each becomes a configuration with
per-position groups (planner.search.Config.groups), solved and replayed like the others.

Everything a block is priced with comes from the Explorer: the stage tables of its board
type at ceil(micro-batch / r) samples and the stash count of its distance from the end of
the pipeline (Explorer.stage_table), its ring (Explorer.ring), and the cuts' routes,
loads and framing (Explorer.hop, Explorer.framed), so J of a layout here is J of the
configuration it becomes whenever no link carries transfers of two cuts (tested).
"""
from __future__ import annotations

import math

import numpy as np

from bapipe.fpga_models.engines import link_clock, link_transfer

from . import layout_dp as ldp

#: layouts whose J is within this factor of the best DP layout's are kept (and a DP that cannot
#: come within it stops after its bound): synchronous schedules, whose J is near their replay,
#: and asynchronous PipeDream, whose replay queues its rings beside the transfers (J is not)
DP_SLACK = 0.05
DP_SLACK_ASYNC = 0.25
#: the DP's units: each layer up to this many layers, else this many runs of layers (dp_ends)
DP_LAYERS = 64


def dp_orders(ex) -> list[tuple[int, ...]]:
    """Board orders the DP cuts blocks from (indices into ``ex.boards``, the canonical
    topology order). Host-major (a stage's replicas fill a host before the next, so 12 of 16
    boards are three whole hosts and a 1-board stage sits beside a 3-board one in the fourth:
    the released PipeDream optimizer's 12-3-1), and on a switch of equal hosts slot-major
    (board s of every host, then board s + 1): a block of H boards is one board a host, as
    PipeDream's hierarchical plans replicate a within-server pipeline on every server. (Groups
    of 2 hosts on 4, slot-major inside each, changed none of bench/bench_pipedream.py's plans
    and cost a third of the DP's time.) On rings and tori (their links follow the listing)
    the topology order only."""
    out = [tuple(range(ex.N))]
    hosts: dict = {}
    for i, cb in enumerate(ex.boards):
        hosts.setdefault(cb.host, []).append(i)
    cols = list(hosts.values())
    if ex.cluster.topology != "switch" or len(cols) < 2 or len({len(h) for h in cols}) != 1 or len(cols[0]) < 2:
        return out
    out.append(tuple(h[s] for s in range(len(cols[0])) for h in cols))
    return list(dict.fromkeys(out))


def cut_link(ex, A: tuple[int, ...], B: tuple[int, ...]) -> tuple[float, float]:
    """(effective bandwidth, latency) of the cut from replicas A to replicas B with only its own
    transfers on the links: Explorer.link's pieces and per-link sharing (the forward pieces
    A[i mod r1] -> B[i mod r2], i < max(r1, r2), each r1 / max(r1, r2) of a sender's bytes,
    and in training the gradients coming back), for the sending replica's bytes."""
    key = ("dpcut", A, B, ex.train)
    if key not in ex._links:
        r1, r2 = len(A), len(B)
        npc = max(r1, r2)
        share = r1 / npc
        names = [cb.name for cb in ex.boards]
        fwd = [ex.hop(names[A[i % r1]], names[B[i % r2]]) for i in range(npc)]
        bwd = [ex.hop(names[B[i % r2]], names[A[i % r1]]) for i in range(npc)] if ex.train else []
        load: dict = {}
        for ids, _bw, _lat in fwd + bwd:
            for x in ids:
                load[x] = load.get(x, 0) + 1
        bw, lat = math.inf, 0.0
        links = ex.cluster.links
        for ids, _bw, plat in fwd:
            lat = max(lat, plat)
            for x in ids:
                bw = min(bw, links[x[0]].bandwidth_Bps / load[x] / share)
        ex._links[key] = (bw, lat)
    return ex._links[key]


def _line(ex, a, b, btype: str, beta: int) -> tuple[np.ndarray, np.ndarray]:
    """(line bytes, framing latency) per cut position of a transfer from board a to board b of
    ``beta`` samples per replica (Explorer.framed of Explorer's cut bytes), cached per route
    bandwidth and transport clock."""
    _ids, bw, _lat = ex.hop(a.name, b.name)
    clk = link_clock(a.board, b.board)
    key = ("dpline", btype, beta, bw, clk)
    if key not in ex._links:
        pb = ex.prof_bytes.get(btype)
        payload = pb["cut"] * beta if pb is not None else ex.cut_bytes_of(beta)
        ex._links[key] = link_transfer(payload, ex.bpe_of_fmt(ex.req.fmt), beta, bw, clk)
    return ex._links[key]


def block_types(ex, order) -> dict:
    """Board type of every block (b, r) of ``order`` whose boards share one (else absent)."""
    key = ("dptypes", order)
    if key not in ex._links:
        out = {}
        N = len(order)
        for b in range(N):
            t = ex.boards[order[b]].board.name
            for r in range(1, N - b + 1):
                if ex.boards[order[b + r - 1]].board.name != t:
                    break
                out[(b, r)] = t
        ex._links[key] = out
    return ex._links[key]


def dp_ends(ex) -> np.ndarray:
    """Last layer of every unit the DP cuts between: each layer up to DP_LAYERS layers; beyond,
    DP_LAYERS runs of consecutive layers of about equal compute (on the first board type, one
    sample), as the hierarchical proposals do (Explorer.hier_layouts). The layouts found are
    then solved layer by layer (Explorer.solve_config), so only the DP's own ranges are coarse."""
    key = ("dpends",)
    if key not in ex._links:
        if ex.n <= DP_LAYERS:
            ends = np.arange(ex.n)
        else:
            sm = ex.stage_model(ex.boards[0].board.name, 1, False, "1f1b")
            PT = sm.PF + (sm.PB if ex.train else 0.0)
            q = np.searchsorted(PT[1:], PT[-1] * np.arange(1, DP_LAYERS) / DP_LAYERS)
            ends = np.unique(np.append(np.minimum(q, ex.n - 1), ex.n - 1))
        ex._links[key] = ends
    return ex._links[key]


def layout_problem(ex, order: tuple[int, ...], schedule: str, m: int, recompute: bool,
                   tmax: float = math.inf) -> tuple[ldp.LayoutProblem, dict, float, np.ndarray] | None:
    """The layout DP's problem on ``order`` for one (schedule, m, recomputation) over the units
    of :func:`dp_ends`, the blocks' boards ({(b, r): sorted board indices}), a floor of a
    layout's sum of stage times (every layer at its fastest kind) and the units' last layers;
    None when no block fits."""
    N, n = len(order), ex.n
    ends = dp_ends(ex)
    nb = len(ends)
    starts = np.concatenate(([0], ends[:-1] + 1))
    bmb = ex.G // m
    R = min(N, bmb) if ex.req.replication else 1
    types = block_types(ex, order)
    beta = [0] + [-(-bmb // r) for r in range(1, R + 1)]
    kinds: dict = {}
    kind = np.full((N + 1, R + 1), -1, dtype=int)
    for (b, r), t in types.items():
        if r <= R:
            kind[b, r] = kinds.setdefault((t, beta[r]), len(kinds))
    if not kinds:
        return None
    klist = list(kinds)
    kmax = min(nb, N)
    stash = [ex.stash_of(schedule, k, m) for k in range(1, kmax + 1)]
    sms = [ex.stage_model(t, bt, recompute, schedule) for t, bt in klist]
    nk = len(klist)
    jj = np.arange(nb)[:, None]
    ii = jj - np.arange(nb)[None, :]
    valid = ii >= 0
    ic = np.where(valid, ii, 0)
    first, last = starts[ic], np.broadcast_to(ends[jj], ic.shape)
    rgs = [sm.ranges(first, last) for sm in sms]

    binds = [False]   # some range does not fit memory at the most stashes (recomputation may help)

    def tables(st: int) -> np.ndarray:
        out = np.full((nk + 1, nb, nb), math.inf)
        for q, sm in enumerate(sms):
            r = sm.cost_of(rgs[q], float(st), 1)
            ok = np.broadcast_to(r["feasible"], ic.shape)
            if st == stash[-1] and (valid & ~ok).any():
                binds[0] = True
            out[q] = np.where(valid & ok, np.broadcast_to(r["time_s"], ic.shape), math.inf)
        if math.isfinite(tmax):
            out[out > tmax] = math.inf
        return out

    # tables by distinct stash count; stage count k uses stash[k-1]; K: tables equal from K on
    by_st = {stash[0]: tables(stash[0])}
    if stash[-1] != stash[0]:
        by_st[stash[-1]] = tables(stash[-1])
    if stash[-1] == stash[0] or np.array_equal(by_st[stash[0]], by_st[stash[-1]]):
        K = 1
    else:
        for st in sorted(set(stash)):
            if st not in by_st:
                by_st[st] = tables(st)
        K = kmax
        while K > 1 and np.array_equal(by_st[stash[K - 2]], by_st[stash[K - 1]]):
            K -= 1
    # the band: the longest unit range that fits anywhere (the fewest stashes fit the most)
    fin = np.isfinite(by_st[stash[0]][:nk]).any(axis=(0, 1))
    if not fin.any():
        return None
    L = int(np.nonzero(fin)[0][-1]) + 1
    T = [by_st[stash[k]][:, :, :L] for k in range(K)]
    kind = np.where(kind < 0, nk, kind)
    blocks = {(b, r): tuple(sorted(order[b:b + r])) for (b, r) in types if r <= R}
    PW = ring_bw = ring_lat = None
    if ex.train and R > 1:
        PW = np.stack([sm.PW[np.append(starts, n)] for sm in sms])
        ring_bw = np.full((N + 1, R + 1), math.inf)
        ring_lat = np.zeros((N + 1, R + 1))
        for (b, r), bl in blocks.items():
            if r > 1:
                ring_bw[b, r], ring_lat[b, r] = ex.ring([ex.boards[x] for x in bl])
    C = np.full((N + 1, R + 1, R + 1, nb), math.inf)
    O = np.full((N + 1, R + 1, R + 1, nb), math.inf)
    ways = 2 if ex.train else 1
    cut_at = ends[:-1]
    for b in range(1, N):
        for r1 in range(1, min(R, b) + 1):
            ta = types.get((b - r1, r1))
            if ta is None:
                continue
            A = blocks[(b - r1, r1)]
            for r2 in range(1, min(R, N - b) + 1):
                if (b, r2) not in blocks:
                    continue
                B = blocks[(b, r2)]
                bw, lat = cut_link(ex, A, B)
                line, extra = _line(ex, ex.boards[A[0]], ex.boards[B[0]], ta, beta[r1])
                occ = line[cut_at] / bw
                O[b, r1, r2, :nb - 1] = occ
                C[b, r1, r2, :nb - 1] = ways * (occ + lat + extra[cut_at])
    if ex.req.whole_blocks:
        oc = np.append(np.asarray(ex.open_cuts)[cut_at], False)
        C[..., oc] = math.inf
        O[..., oc] = math.inf
    prob = ldp.LayoutProblem(nb, N, R, ex.jm_of(schedule, m), kind, T, C, O, PW, ring_bw, ring_lat,
                             ex.train and schedule == "pipedream")
    per = None
    for sm in sms:
        t = np.diff(sm.PF) + (np.diff(sm.PB) if ex.train else 0.0)
        per = t if per is None else np.minimum(per, t)
    prob.memory_binds = binds[0]
    return prob, blocks, float(per.sum()), ends


def dp_schedules(ex) -> list[str]:
    """Schedules the DP runs for: under auto 1F1B (with v = 1, J depends on the schedule only
    through memory, and 1F1B stashes the least: its layouts serve GPipe and eager-1F1B, whose
    configurations are then solved with their own memory), else the one asked for;
    interleaved has plain shapes only."""
    if not ex.train:
        return ["gpipe"]
    out = []
    for s in ex.schedules():
        if s == "interleaved":
            continue
        out.append("1f1b" if ex.req.schedule == "auto" else s)
    return list(dict.fromkeys(out))


def dp_layouts(ex) -> list[tuple[tuple[tuple[int, ...], ...], list[tuple[int, int]], float]]:
    """(groups, layer ranges, J) of the layout DP's optimum for every order x schedule x
    micro-batch count x recomputation (asynchronous PipeDream: also the best layout of every
    first stage's replica count), each DP bounded by DP_SLACK (DP_SLACK_ASYNC) over the best J
    so far: a (schedule, m, recomputation) whose floor (:func:`j_floor`) passes it is skipped,
    a DP whose own bound passes it returns nothing."""
    out = []
    rcs = (False, True) if ex.train else (False,)
    for sched in dp_schedules(ex):
        best = math.inf
        slack = DP_SLACK_ASYNC if ex.train and sched == "pipedream" else DP_SLACK
        # the largest counts first: their J (smallest bubbles) tends to be the least, which
        # then bounds the other DPs (solve returns None once its bound passes jmax)
        for m in sorted(ex.m_candidates(1, 1, sched), reverse=True):
            for rc in rcs:
                jmax = best * (1 + slack)
                if j_floor(ex, sched, m, rc) >= jmax:
                    continue
                for order in dp_orders(ex):
                    jmax = best * (1 + slack)
                    tmax = jmax / ex.jm_of(sched, m) if math.isfinite(jmax) else math.inf
                    if rc and ("dpfits", sched, m, order) in ex._links:
                        # every range fits without recomputation: recomputing only adds the
                        # forward to the backward, so no layout's J gets lower
                        continue
                    got = layout_problem(ex, order, sched, m, rc, tmax)
                    if got is None:
                        continue
                    prob, blocks, floor, ends = got
                    if not rc and not prob.memory_binds:
                        ex._links[("dpfits", sched, m, order)] = True
                    sol = ldp.solve(prob, floor, jmax)
                    if sol is None:
                        continue
                    best = min(best, sol.objective)
                    starts = np.concatenate(([0], ends[:-1] + 1))
                    # asynchronous PipeDream's J is furthest from its replay (rings queued on the
                    # links beside the transfers): its DPs offer the best layout of every first
                    # stage's replica count too; the synchronous ones their optimum only
                    alts = sol.others if prob.per_mb else []
                    for J, st in [(sol.objective, sol.stages)] + alts:
                        groups = tuple(blocks[(b, r)] for _a, _z, b, r in st)
                        out.append((groups, [(int(starts[a]), int(ends[z])) for a, z, _b, _r in st], J, slack, best))
    return [(g, b, J) for g, b, J, sl, _b in out if J <= min(x[4] for x in out if x[3] == sl) * (1 + sl)]


def j_floor(ex, schedule: str, m: int, recompute: bool) -> float:
    """A floor of J of every layout at (schedule, m, recomputation) on the boards' one board
    type set: the sum of the stages' times is at least every layer's fastest compute at the
    fewest samples a replica can have (ceil(micro-batch / boards)), and the slowest stage at
    least U x micro-batch / N (each stage computes beta_s >= micro-batch / r_s samples at no
    less than the per-sample rate of Explorer.rate_floor, so sum_s r_s T_s >= micro-batch x U
    and sum_s r_s <= N)."""
    bmb = ex.G // m
    types = {cb.board.name for cb in ex.boards}
    beta = -(-bmb // min(ex.N, bmb)) if ex.req.replication else bmb
    per = None
    for t in types:
        sm = ex.stage_model(t, beta, recompute, schedule)
        x = np.diff(sm.PF) + (np.diff(sm.PB) if ex.train else 0.0)
        per = x if per is None else np.minimum(per, x)
    return float(per.sum()) + (ex.jm_of(schedule, m) - 1) * ex.rate_floor(types, recompute) * bmb / ex.N
