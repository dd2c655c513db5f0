"""PipeDream's planner, written from its paper, as a referee for BaPipe's search.

Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP'19,
section 3.1: a hierarchical dynamic program over the levels of a cluster (GPUs in a server,
servers on a network). At level k with m_k units of bandwidth B_k, A^k(i -> j, m) is the
least time per minibatch of the slowest stage when layers i..j run on m units:

    T^k(i -> j, m)  = (A^{k-1}(i -> j, m_{k-1}) + 4 (m - 1) |w_ij| / (m B_k)) / m
    A^k(i -> j, m)  = min( T^k(i -> j, m),
                           min_{i <= s < j, 1 <= m' < m} max(A^k(i -> s, m - m'),
                                                           2 a_s / B_k,
                                                           T^k(s + 1 -> j, m')) )

with A^0(i -> j, .) the range's measured forward + backward time (one unit = one GPU),
|w_ij| its parameter bytes and a_s the bytes crossing the cut after layer s (activations
one way, gradients back: 2 a_s). The all-reduce term 4 (m - 1) |w| / (m B) and the sum
(not max) of compute and all-reduce are those of the released optimizer
(msr-fiddle/pipedream, optimizer/optimizer_graph_hierarchical.py, read on 2026-11-24; this
is our own code); the released optimizer only counts 2 a_s / B when an activation
compression ratio is given, the paper always does, and so do we. Like its
``--use_fewer_machines`` option, A^k(i -> j, m) may also take A^k(i -> j, m - 1) (units
left idle). The released optimizer divides the all-reduce of a range replicated whole
across servers by the GPUs per server (each GPU its own uplink) and not that of a range
split into stages; we divide neither (a server's GPUs share its uplink).

Layers are taken in one topological order and stages are contiguous ranges of it (every
prefix is a downset of the graph; the peer's antichain states are downsets too). Memory is
not constrained (the released optimizer's default); `bapipe plan` checks its own.

``solve`` returns the peer's plan flattened to BaPipe stages (range, boards) so that
``bapipe plan --partition`` can price it; ``price`` prices any such flat plan with the
peer's formula (per stage: replicas within a host all-reduce at B_1, hosts at B_2, an
uneven split charged its busiest host; cuts at B_1 when both stages are balanced on the
same hosts, B_2 otherwise), so that both planners price both plans; planner.peer_search
minimises ``price`` over every flat plan (`bapipe plan --cost-model pipedream`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = float("inf")


@dataclass(frozen=True)
class PeerInput:
    """Per layer, in topological order, for one minibatch of the profiled batch."""

    compute_s: tuple[float, ...]   # forward + backward seconds
    param_bytes: tuple[float, ...]
    cut_bytes: tuple[float, ...]   # bytes crossing the cut after layer k (k = 0 .. n-2)


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy: units (GPUs of a server, or servers) and their bandwidth."""

    units: int
    bandwidth: float   # bytes/s


@dataclass(frozen=True)
class PeerStage:
    first: int
    last: int
    boards: tuple[int, ...]   # board indices (host h, slot g) -> h * units_1 + g


def cluster_levels(cluster, boards=None) -> tuple[list[Level], list[list[int]]] | None:
    """The two levels of ``boards`` (default: the cluster's, in order) grouped by host, and the
    board indices of each host ([host][slot]); None unless there are >= 2 hosts of equal size.
    B_1 is the bandwidth between two boards of a host, B_2 between two hosts (route bottleneck)."""
    boards = list(cluster.boards if boards is None else boards)
    hosts: dict = {}
    for i, cb in enumerate(boards):
        hosts.setdefault(cb.host, []).append(i)
    cols = list(hosts.values())
    if len(cols) < 2 or len({len(h) for h in cols}) != 1:
        return None
    bw = lambda a, b: cluster.path_bandwidth(boards[a].name, boards[b].name)  # noqa: E731
    g = len(cols[0])
    return [Level(g, bw(cols[0][0], cols[0][1]) if g > 1 else float("inf")),
            Level(len(cols), bw(cols[0][0], cols[1][0]))], cols


def peer_input(model, prof: dict) -> PeerInput:
    """The peer's arrays from a model and a profile {layer: {fwd_s, bwd_s, activation_bytes,
    param_bytes}} at the profiled batch (bapipe.profiles.load_profile). A cut carries the
    activation bytes of every tensor crossing it (model inputs: none, as PipeDream zeroes
    its Input nodes)."""
    names = [l.name for l in model.layers]
    size = {n: float(prof[n]["activation_bytes"]) for n in names}
    comp = tuple(float(prof[n]["fwd_s"] + prof[n]["bwd_s"]) for n in names)
    par = tuple(float(prof[n]["param_bytes"]) for n in names)
    cut = tuple(sum(size.get(t.producer, 0.0) for t in model.cut_tensors(k)) for k in range(len(names) - 1))
    return PeerInput(comp, par, cut)


def _allreduce(w, m: int, bw: float):
    """The released optimizer's data-parallel term: 4 (m - 1) |w| / (m B) (as it writes it:
    (4 (m-1) |w|) / (B m))."""
    return (4.0 * (m - 1) * w) / (bw * m)


@dataclass(frozen=True)
class Options:
    """The released optimizer's switches that change its formula.

    ``acr``: ``--activation_compression_ratio``; None (its default) leaves every transfer
    out, a number counts 2 a / (B q) / acr for the activations entering a stage (and, when
    the range does not end the model, leaving it). The paper always counts them: 1.0 here.
    ``fewer``: ``--use_fewer_machines`` (a range may take the value of one unit fewer)."""

    acr: float | None = 1.0
    fewer: bool = False


RELEASED = Options()


def _transfer(a, q: int, bw: float, opts: Options):
    """(2 a) / (B q) / acr: a cut's activations (and gradients back) shared by the q units of
    the stage that receives them (the released optimizer's input/output transfer time)."""
    t = (2.0 * a) / (bw * q)
    return t / opts.acr


def _level(base: np.ndarray, W: np.ndarray, cut: np.ndarray, lv: Level, within: int, opts: Options,
           rows: int | None = None):
    """One level's DP (msr-fiddle/pipedream optimizer_graph_hierarchical.py's recurrence,
    written here from reading it) for every range i..j (``base[i, j]``: the range's value one
    level down, inf outside i <= j), for starts i < ``rows`` (all by default; the top level
    needs i = 0 only). ``within``: boards in one unit of this level (1 for boards, G for
    hosts). A range as one stage on q units (the DP's first candidate):
        (base + AR(q, B) / within) / q
    the last stage of a split (s+1..j on q units after i..s on m - q):
        max(A(i..s, m-q), (base + AR(q, B)) / q, 2 a_s / (B q) / acr, 2 a_j / (B q) / acr if j < n-1)
    (the released code divides the all-reduce by ``within`` only in the first candidate, and
    counts the transfers only with an activation compression ratio).
    Returns A[i, j, m-1] and the choices: kind 0 whole range on m units, 1 fewer units, 2 split
    at split[i, j, m-1] with mp[i, j, m-1] units on the last stage."""
    n, M = base.shape[0], lv.units
    R = n if rows is None else rows
    whole = np.stack([(base + _allreduce(W, q, lv.bandwidth) / within) / q for q in range(1, M + 1)], axis=2)
    last = np.stack([(base + _allreduce(W, q, lv.bandwidth)) / q for q in range(1, M + 1)], axis=2)
    A = whole[:R].copy()
    kind = np.zeros((R, n, M), dtype=np.int8)
    split = np.full((R, n, M), -1, dtype=np.int32)
    mp = np.zeros((R, n, M), dtype=np.int32)
    before = np.arange(n)[None, :] < np.arange(R)[:, None]   # s < i: not a split of i..j
    rr = np.arange(R)
    for j in range(n):
        for m in range(1, M + 1):
            if m > 1 and opts.fewer:
                fewer = A[:, j, m - 2] < A[:, j, m - 1]
                A[fewer, j, m - 1] = A[fewer, j, m - 2]
                kind[fewer, j, m - 1] = 1
            for q in range(1, m if j > 0 else 1):
                cand = np.maximum(A[:, :j, m - q - 1], last[1:j + 1, j, q - 1][None, :])
                if opts.acr is not None:
                    cand = np.maximum(cand, _transfer(cut[:j], q, lv.bandwidth, opts)[None, :])
                    if j < n - 1:
                        cand = np.maximum(cand, _transfer(cut[j], q, lv.bandwidth, opts))
                cand[before[:, :j]] = INF
                s = np.argmin(cand, axis=1)
                best = cand[rr, s]
                better = best < A[:, j, m - 1]
                A[better, j, m - 1] = best[better]
                kind[better, j, m - 1] = 2
                split[better, j, m - 1] = s[better]
                mp[better, j, m - 1] = q
    return A, kind, split, mp


def _unfold(tabs, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
    """Rebuild one level's stages for range i..j on m units: [(first, last, units)]."""
    A, kind, split, mp = tabs
    out: list[tuple[int, int, int]] = []
    while True:
        k = kind[i, j, m - 1]
        if k == 1:
            m -= 1
        elif k == 2:
            s, q = int(split[i, j, m - 1]), int(mp[i, j, m - 1])
            out.append((s + 1, j, q))
            j, m = s, m - q
        else:
            out.append((i, j, m))
            return out[::-1]


def solve(inp: PeerInput, levels: list[Level], opts: Options = RELEASED) -> tuple[float, list[PeerStage]]:
    """PipeDream's optimum for the whole model on the cluster ``levels`` (innermost first,
    e.g. [Level(4 GPUs, NVLink), Level(4 servers, network)]) under the released optimizer's
    formula (``opts``: its switches): (time per minibatch, stages). Stages are contiguous
    ranges of the layers' order (the released code's states are the downsets its antichain
    walk reaches; on a chain they are these ranges). Boards are numbered host-major: server
    h's GPU g is h * levels[0].units + g."""
    return solve_hier(inp, levels, opts)[:2]


def solve_hier(inp: PeerInput, levels: list[Level], opts: Options = RELEASED):
    """:func:`solve` and the plan as the released optimizer prints it: (time, stages, top)
    where ``top`` lists the top-level stages as (first, last, units, [(first, last, units)
    of the level below]) (two levels)."""
    c = np.asarray(inp.compute_s)
    w = np.asarray(inp.param_bytes)
    n = len(c)
    cs, ws = np.concatenate(([0.0], np.cumsum(c))), np.concatenate(([0.0], np.cumsum(w)))
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    valid = i <= j
    W = np.where(valid, ws[j + 1] - ws[i], 0.0)
    base = np.where(valid, cs[j + 1] - cs[i], INF)
    cut = np.asarray(inp.cut_bytes, dtype=float)
    tabs = []
    within = 1
    for k, lv in enumerate(levels):
        t = _level(base, W, cut, lv, within, opts, rows=1 if k == len(levels) - 1 else None)
        tabs.append(t)
        base = t[0][:, :, lv.units - 1]
        within *= lv.units
    # expand from the top level down: a unit at level k is a block of prod(units below k) boards
    sizes = [1]
    for lv in levels[:-1]:
        sizes.append(sizes[-1] * lv.units)
    stages = [(0, n - 1, [0])]   # (first, last, first boards of the units used at this level)
    top = []
    for k in range(len(levels) - 1, -1, -1):
        nxt = []
        for a, b, starts in stages:
            used = 0
            parts = _unfold(tabs[k], a, b, levels[k].units)
            if k == len(levels) - 1:
                top = [(f, l, q, []) for f, l, q in parts]
            elif k == len(levels) - 2 and top:
                for t_ in top:
                    if t_[0] == a and t_[1] == b:
                        t_[3].extend(parts)
            for f, l, q in parts:
                nxt.append((f, l, [s0 + (used + u) * sizes[k] for s0 in starts for u in range(q)]))
                used += q
        stages = nxt
    time = float(tabs[-1][0][0, n - 1, levels[-1].units - 1])
    return time, [PeerStage(f, l, tuple(sorted(bs))) for f, l, bs in stages], top


def hier_value(inp: PeerInput, levels: list[Level], top, opts: Options = RELEASED) -> float:
    """The released formula's value of one two-level plan, ``top`` as :func:`solve_hier`
    gives it (top-level stages (first, last, hosts, [(first, last, boards a host)])): the
    recurrence evaluated along the plan instead of minimised (what the optimizer prints as
    "Time per stage in pipeline" for its own plan)."""
    c, w = np.asarray(inp.compute_s, float), np.asarray(inp.param_bytes, float)
    n = len(c)
    cut = inp.cut_bytes
    l1, l2 = levels
    G = l1.units

    def chain(parts, lv: Level, within: int, value) -> float:
        """max over a level's stages: the first as a whole range, the others as splits."""
        out = -INF
        for k, (f, l, q) in enumerate(parts):
            v = value(f, l)
            W = float(w[f:l + 1].sum())
            if k == 0:
                out = max(out, (v + _allreduce(W, q, lv.bandwidth) / within) / q)
                continue
            out = max(out, (v + _allreduce(W, q, lv.bandwidth)) / q)
            if opts.acr is not None:
                out = max(out, _transfer(cut[f - 1], q, lv.bandwidth, opts))
                if l < n - 1:
                    out = max(out, _transfer(cut[l], q, lv.bandwidth, opts))
        return out

    inner = {(f, l): parts for f, l, _q, parts in top}
    low = lambda f, l: chain(inner[(f, l)], l1, 1, lambda a, b: float(c[a:b + 1].sum()))  # noqa: E731
    return chain([(f, l, q) for f, l, q, _p in top], l2, G, low)


def stage_time(C: float, W: float, n: int, g: int, h: int, b1: float, b2: float, overlap: bool = False) -> float:
    """The peer's time per minibatch of one stage of compute C and weight bytes W on n boards,
    at most g of them on one host, over h hosts: (C + AR(g, B_1) + g AR(h, B_2)) / n. With
    g on each of h hosts (n = g h) this is the DP's ((C + AR(g, B_1)) / g + AR(h, B_2)) / h;
    an uneven split is charged its busiest host's all-reduces for each of its n minibatches.
    ``overlap``: max(C, AR(g, B_1) + g AR(h, B_2)) / n (a variant, not the peer's formula)."""
    ar = _allreduce(W, g, b1) + g * _allreduce(W, h, b2)
    return (max(C, ar) if overlap else C + ar) / n


def host_counts(boards, units: int) -> dict[int, int]:
    """{host: boards of ``boards`` on it} (board b on host b // units)."""
    hosts: dict[int, int] = {}
    for b in boards:
        hosts[b // units] = hosts.get(b // units, 0) + 1
    return hosts


def hierarchy(stages: list[PeerStage], units: int) -> list:
    """A flat plan read as the released optimizer's two-level plans: runs of consecutive
    stages each spread evenly (the same count on each host) over one same set of hosts are
    one top-level stage of h hosts whose stages take g boards a host; a stage spread unevenly
    is a top-level stage alone, read as its busiest host's count on each of its hosts (the
    formula has no other reading of it; it can only be charged more than its boards'
    share). Returns :func:`hier_value`'s ``top``."""
    top: list = []
    prev = None
    for s in stages:
        hosts = host_counts(s.boards, units)
        g, h = max(hosts.values()), len(hosts)
        even = len(set(hosts.values())) == 1
        key = frozenset(hosts) if even else None
        if key is not None and key == prev:
            f, _l, hh, parts = top[-1]
            top[-1] = (f, s.last, hh, parts + [(s.first, s.last, g)])
        else:
            top.append((s.first, s.last, h, [(s.first, s.last, g)]))
        prev = key
    return top


def price(inp: PeerInput, stages: list[PeerStage], levels: list[Level], opts: Options = RELEASED) -> float:
    """The released optimizer's formula applied to a flat plan (any replica counts and
    boards, host-major board numbers): :func:`hier_value` of the plan read by
    :func:`hierarchy`. On the peer's own plans this is the DP's value (the plan is read back
    as the DP built it)."""
    if len(levels) != 2:
        raise ValueError("price: expected two levels (boards in hosts, hosts on a network)")
    return hier_value(inp, levels, hierarchy(stages, levels[0].units), opts)


def flat_price(inp: PeerInput, stages: list[PeerStage], levels: list[Level], overlap: bool = False) -> float:
    """An earlier per-stage reading of the peer's formula for a flat plan (what
    planner.peer_search minimises exactly) (any replica counts and boards): per stage
    ``stage_time`` (n boards, at most g on a host, h hosts), and 2 a / B for each cut: B_1
    when both stages are balanced (the same count on each of their hosts) on the same hosts,
    so that every host's share of the samples, and hence the traffic, stays inside it; B_2
    otherwise. The plan's time per minibatch is the largest. Two levels (GPUs in servers).
    For the peer's own plan this is its DP value when every server-level stage holds one
    GPU-level stage (else at most that: the DP all-reduces the server stage's weights).
    ``overlap``: see ``stage_time`` (a variant, to show what the sum costs)."""
    if len(levels) != 2:
        raise ValueError("price: expected two levels (boards in hosts, hosts on a network)")
    g_units, b1, b2 = levels[0].units, levels[0].bandwidth, levels[1].bandwidth
    c, w = np.asarray(inp.compute_s), np.asarray(inp.param_bytes)
    worst = 0.0
    prev = None   # the previous stage's hosts when it is balanced
    for k, s in enumerate(stages):
        hosts = host_counts(s.boards, g_units)
        g, h = max(hosts.values()), len(hosts)
        C, Wb = float(c[s.first:s.last + 1].sum()), float(w[s.first:s.last + 1].sum())
        worst = max(worst, stage_time(C, Wb, len(s.boards), g, h, b1, b2, overlap))
        balanced = len(set(hosts.values())) == 1
        if k:
            bw = b1 if balanced and prev == set(hosts) else b2
            worst = max(worst, 2.0 * inp.cut_bytes[s.first - 1] / bw)
        prev = set(hosts) if balanced else None
    return worst
