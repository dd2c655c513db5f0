"""BaPipe's search under PipeDream's cost formula (`bapipe plan --cost-model pipedream`).

The space is every flat plan on a cluster of H hosts x G boards: contiguous stages, each on
any non-empty set of boards, no board in two stages, boards left idle allowed. It holds the
peer's space (planner.peer_pipedream.solve: whole hosts per top-level stage, the same
count on each of them) and plans the peer's DP cannot express: a stage's replicas split
unevenly over hosts, a stage on part of a host while the next spans that host and others,
stages of one host block sharing hosts with the next block.

The objective is ``peer_pipedream.flat_price`` of the plan, exactly: per stage
``stage_time(C, W, n, g, h)`` (n boards, at most g on one host, h hosts), per cut 2 a / B_1
when both stages are balanced on the same hosts and 2 a / B_2 otherwise; a plan costs its
largest term. The price depends on a stage's boards only through its count on each host, and
hosts of a level are interchangeable, so the DP below is exact over the space:

    state  = the multiset over hosts of (boards still free, host in the previous stage's
             balanced host set)    (no marks after an unbalanced stage: its cut is at B_2)
    V[state][k] = least largest term of a plan covering layers 0..k-1 that leaves ``state``

A step places the next stage (layers k..k'-1) with counts c_x <= free_x on each host; every
step uses at least one board, so states are final in order of decreasing free boards.
``bound`` (e.g. the peer's own plan priced) only drops partial plans already above it, so
the result is the exact optimum whenever that optimum is <= bound; ``search`` widens it by
BOUND_SLACK, since the DP sums prefix differences where ``price`` sums directly (a plan
priced at the bound may come out a few ulps above it here).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .peer_pipedream import INF, Level, PeerInput, PeerStage, _allreduce

#: relative widening of a given bound (float sums in another order differ by ulps, far below this)
BOUND_SLACK = 1e-9

State = tuple[tuple[int, int], ...]   # sorted (free boards, marked) per host


@dataclass(frozen=True)
class Step:
    """One stage's placement on a state: counts per host class of that state."""

    counts: tuple[tuple[tuple[int, int], tuple[int, ...]], ...]   # ((free, mark), counts on those hosts)
    n: int
    g: int
    h: int
    same: bool        # balanced on exactly the previous stage's marked hosts: its cut is at B_1
    nxt: State


def _steps(state: State) -> list[Step]:
    """Every placement of one stage on ``state`` (hosts of one class taken as a multiset)."""
    classes: dict[tuple[int, int], int] = {}
    for hc in state:
        classes[hc] = classes.get(hc, 0) + 1
    keys = sorted(classes)
    marked = sum(classes[k] for k in keys if k[1])
    choice = [list(itertools.combinations_with_replacement(range(k[0] + 1), classes[k])) for k in keys]
    out = []
    for combo in itertools.product(*choice):
        cs = [c for cc in combo for c in cc]
        used = [c for c in cs if c]
        if not used:
            continue
        g, h = max(used), len(used)
        balanced = min(used) == g
        on_marked = sum(1 for k, cc in zip(keys, combo) for c in cc if c and k[1])
        same = balanced and marked > 0 and on_marked == marked == h
        nxt = tuple(sorted((k[0] - c, int(balanced and c > 0)) for k, cc in zip(keys, combo) for c in cc))
        out.append(Step(tuple(zip(keys, combo)), sum(used), g, h, same, nxt))
    return out


class PeerSearch:
    """The exact optimum of ``flat_price`` over every flat plan on ``levels`` (two levels)."""

    def __init__(self, inp: PeerInput, levels: list[Level]):
        if len(levels) != 2:
            raise ValueError("PeerSearch: expected two levels (boards in hosts, hosts on a network)")
        self.inp, self.levels = inp, levels
        self.G, self.H = levels[0].units, levels[1].units
        self.b1, self.b2 = levels[0].bandwidth, levels[1].bandwidth
        c, w = np.asarray(inp.compute_s, float), np.asarray(inp.param_bytes, float)
        self.n = n = len(c)
        cs, ws = np.concatenate(([0.0], np.cumsum(c))), np.concatenate(([0.0], np.cumsum(w)))
        k, kk = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        self._valid = kk > k   # stage = layers k .. kk-1
        self._C = np.where(self._valid, cs[kk] - cs[k], 0.0)
        self._W = np.where(self._valid, ws[kk] - ws[k], 0.0)
        a = np.asarray(inp.cut_bytes, float)
        # cut[k]: entering layer k from layer k-1 (k >= 1); k = 0 is no cut
        self._cut = {flag: np.concatenate(([0.0], 2.0 * a / (self.b1 if flag else self.b2))) for flag in (False, True)}
        self._cost: dict[tuple[int, int, int], np.ndarray] = {}

    def cost(self, n: int, g: int, h: int) -> np.ndarray:
        """[k, k']: stage_time of layers k..k'-1 on n boards, g at most a host, h hosts (inf if k' <= k)."""
        key = (n, g, h)
        if key not in self._cost:
            ar = _allreduce(self._W, g, self.b1) + g * _allreduce(self._W, h, self.b2)
            self._cost[key] = np.where(self._valid, (self._C + ar) / n, INF)
        return self._cost[key]

    def solve(self, bound: float = INF) -> tuple[float, list[tuple[int, int, tuple[tuple[int, int], ...]]]]:
        """(least price, stages as (first, last, ((host, boards on it), ...))); (inf, []) when
        nothing is <= ``bound``."""
        n = self.n
        start: State = tuple((self.G, 0) for _ in range(self.H))
        V: dict[State, np.ndarray] = {start: np.full(n + 1, INF)}
        V[start][0] = 0.0
        back: dict[State, tuple[np.ndarray, np.ndarray, list]] = {}
        by_free: dict[int, list[State]] = {self.G * self.H: [start]}
        best, best_state = INF, None
        for free in range(self.G * self.H, -1, -1):
            for st in sorted(by_free.get(free, ())):
                v = V[st]
                if v[n] < best or (v[n] == best and best_state is not None and st < best_state):
                    best, best_state = float(v[n]), st
                rows = np.flatnonzero(v[:n] <= bound)
                if rows.size == 0 or free == 0:
                    continue
                base = {f: np.maximum(v[rows], self._cut[f][rows]) for f in (False, True)}
                for step in _steps(st):
                    m = np.maximum(base[step.same][:, None], self.cost(step.n, step.g, step.h)[rows])
                    arg = np.argmin(m, axis=0)
                    val = m[arg, np.arange(n + 1)]
                    ok = val <= bound
                    if not ok.any():
                        continue
                    nxt = step.nxt
                    if nxt not in V:
                        V[nxt] = np.full(n + 1, INF)
                        back[nxt] = (np.full(n + 1, -1), np.zeros(n + 1, dtype=np.int64), [None] * (n + 1))
                        by_free.setdefault(sum(f for f, _m in nxt), []).append(nxt)
                    better = np.flatnonzero(ok & (val < V[nxt]))
                    if better.size:
                        V[nxt][better] = val[better]
                        prev_k, _ids, src = back[nxt]
                        prev_k[better] = rows[arg[better]]
                        for kk in better:
                            src[kk] = (st, step)
        if best_state is None or best == INF:
            return INF, []
        # walk back: (state, k) <- (prev state, prev k, step)
        path = []
        st, k = best_state, n
        while k > 0:
            prev_k, _ids, src = back[st]
            pst, step = src[k]
            path.append((int(prev_k[k]), k - 1, step))
            st, k = pst, int(prev_k[k])
        path.reverse()
        return best, self._concrete(path)

    def _concrete(self, path) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
        """Replay the steps on numbered hosts: each class's counts go to its lowest-numbered
        hosts in (free, mark) order, so the plan is deterministic."""
        free = [self.G] * self.H
        mark = [0] * self.H
        out = []
        for first, last, step in path:
            take = []
            for (f, mk), counts in step.counts:
                hosts = [x for x in range(self.H) if free[x] == f and mark[x] == mk and x not in {y for y, _c in take}]
                take += list(zip(hosts, counts))
            used = [(x, c) for x, c in take if c]
            balanced = len({c for _x, c in used}) == 1
            for x, c in take:
                free[x] -= c
            for x in range(self.H):
                mark[x] = int(balanced and any(y == x for y, _c in used))
            out.append((first, last, tuple(sorted(used))))
        return out


def boards_of(stages, cols: list[list[int]]) -> list[PeerStage]:
    """Stages with (host, count) lists -> PeerStage with board indices: host x's boards are
    ``cols[x]`` (cluster order), taken in order as the stages use them."""
    nxt = [0] * len(cols)
    out = []
    for first, last, used in stages:
        bs = []
        for x, c in used:
            bs += cols[x][nxt[x]:nxt[x] + c]
            nxt[x] += c
        out.append(PeerStage(first, last, tuple(sorted(bs))))
    return out


def search(inp: PeerInput, levels: list[Level], bound: float = INF) -> tuple[float, list[PeerStage]]:
    """The least ``flat_price`` over every flat plan, and one plan reaching it (boards numbered
    host-major, host x's slot g = x * G + g, as ``flat_price`` reads them)."""
    ps = PeerSearch(inp, levels)
    t, stages = ps.solve(bound * (1 + BOUND_SLACK))
    G = levels[0].units
    return t, boards_of(stages, [[x * G + g for g in range(G)] for x in range(levels[1].units)])
