"""Exact optimal contiguous partition of a layer sequence onto pipeline stages.

Stages are boards (or replica groups) in topology order; stage ``d`` may be a different
board type from stage ``d+1``. A problem holds, per stage position ``d``, the band matrix
``T[d][j, k]``: the time per micro-batch of stage ``d`` holding layers ``j-k .. j``
(``inf`` when the range does not fit the board's memory), and per cut the link costs
``C[d][j]`` (full send time of activations + gradients after layer ``j`` from stage ``d``
to ``d+1``: latency plus bytes/bandwidth, both directions) and ``O[d][j]`` (the link's
busy time per micro-batch, one direction: what throttles the steady state).

Objective (Alpa, OSDI'22 eq. 2, generalised to links and interleaving with v chunks):

    J = (sum_d T_d + sum_cuts C) / v + (m*v - 1) * max(max_d T_d, max_cuts O)

For v = 1 this is ``sum t + (m-1) max t``; for balanced interleaved stages it gives
``(m v + p - 1) t_chunk`` (Narayanan et al. SC'21). ``solve`` finds the exact minimum:
the min-max DP gives the least bottleneck B*; a min-sum DP under a cap gives, for every
candidate cap c >= B*, the least sum; J(c) = sum(c)/v + (mv-1) c is minimised over the
candidate caps (the distinct stage and link costs), stopping once the best possible sum
cannot pay for a larger cap. Both DPs are O(stages * n * L) with L the longest feasible
range (numpy over j).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

INF = math.inf
MAX_CAPS = 64  # cap candidates evaluated before declaring the answer approximate


@dataclass
class Problem:
    """A partition instance (see module docstring)."""

    n: int
    T: list[np.ndarray]   # per stage d: shape (n, L); T[d][j, k] = time of layers j-k..j
    C: np.ndarray         # shape (S-1, n): full link cost of the cut after layer j, stage d -> d+1
    O: np.ndarray         # shape (S-1, n): link busy time per micro-batch
    m: int = 1
    v: int = 1

    @property
    def stages(self) -> int:
        """Number of stages S."""
        return len(self.T)

    @property
    def band(self) -> int:
        """Longest range length L represented."""
        return self.T[0].shape[1]


@dataclass
class Solution:
    """An optimal partition: objective, bottleneck, sum and per-stage (first, last) layers."""

    objective: float
    bottleneck: float
    total: float
    bounds: list[tuple[int, int]]
    exact: bool = True


def stage_time(p: Problem, d: int, first: int, last: int) -> float:
    """T of stage d holding layers first..last (inf outside the band)."""
    k = last - first
    if k >= p.band or k < 0:
        return INF
    return float(p.T[d][last, k])


def evaluate(p: Problem, bounds: list[tuple[int, int]]) -> tuple[float, float, float]:
    """(J, bottleneck, sum) of a given partition (inf when a stage does not fit)."""
    ts = [stage_time(p, d, a, b) for d, (a, b) in enumerate(bounds)]
    cuts = [(d, b) for d, (_a, b) in enumerate(bounds[:-1])]
    total = sum(ts) + sum(float(p.C[d, j]) for d, j in cuts)
    bott = max(ts + [float(p.O[d, j]) for d, j in cuts])
    if not math.isfinite(total):
        return INF, INF, INF
    return total / p.v + (p.m * p.v - 1) * bott, bott, total


def _minmax(p: Problem) -> float:
    """Least achievable bottleneck max(T_d, O_cut) over all partitions."""
    n, L = p.n, p.band
    j = np.arange(n)
    prev = p.T[0][:, :].copy()
    cur = np.full(n, INF)
    ok = j < L
    cur[ok] = prev[j[ok], j[ok]]
    for d in range(1, p.stages):
        nxt = np.full(n, INF)
        Td = p.T[d]
        for k in range(L):
            idx = j - k - 1
            valid = idx >= 0
            if not valid.any():
                break
            ii = idx[valid]
            cand = np.maximum(np.maximum(cur[ii], p.O[d - 1, ii]), Td[valid, k])
            nxt[valid] = np.minimum(nxt[valid], cand)
        cur = nxt
    return float(cur[n - 1])


def _minsum(p: Problem, cap: float) -> tuple[float, list[tuple[int, int]] | None]:
    """Least sum (stage times + link costs) with every stage and link cost <= cap."""
    n, L, S = p.n, p.band, p.stages
    j = np.arange(n)
    cur = np.full(n, INF)
    ok = j < L
    t0 = p.T[0][j[ok], j[ok]]
    cur[ok] = np.where(t0 <= cap, t0, INF)
    args = []
    for d in range(1, S):
        nxt = np.full(n, INF)
        arg = np.full(n, -1, dtype=np.int64)
        Td = p.T[d]
        for k in range(L):
            idx = j - k - 1
            valid = idx >= 0
            if not valid.any():
                break
            ii = idx[valid]
            t = Td[valid, k]
            o = p.O[d - 1, ii]
            cand = cur[ii] + p.C[d - 1, ii] + t
            cand = np.where((t <= cap) & (o <= cap), cand, INF)
            better = cand < nxt[valid]
            vi = np.nonzero(valid)[0][better]
            nxt[vi] = cand[better]
            arg[vi] = k
        cur = nxt
        args.append(arg)
    total = float(cur[n - 1])
    if not math.isfinite(total):
        return INF, None
    bounds = []
    last = n - 1
    for d in range(S - 1, 0, -1):
        k = int(args[d - 1][last])
        bounds.append((last - k, last))
        last = last - k - 1
    bounds.append((0, last))
    return total, bounds[::-1]


def solve(p: Problem) -> Solution | None:
    """The exact minimum of J over all partitions into exactly ``p.stages`` non-empty stages.

    Returns None when no partition fits (some stage would exceed its board's memory).
    """
    if p.stages > p.n:
        return None
    bstar = _minmax(p)
    if not math.isfinite(bstar):
        return None
    mv1 = p.m * p.v - 1
    s_inf, b_inf = _minsum(p, INF)
    best = None

    def consider(bounds):
        nonlocal best
        if bounds is None:
            return
        J, bott, tot = evaluate(p, bounds)
        key = (J, bott, bounds)
        if best is None or key < (best.objective, best.bottleneck, best.bounds):
            best = Solution(J, bott, tot, bounds)

    consider(b_inf)
    if mv1 == 0:
        return best
    # candidate caps: distinct stage/link costs in [B*, B* + (S(B*) - S_inf) v / (mv-1)]
    s_star, b_star = _minsum(p, bstar)
    consider(b_star)
    hi = bstar + (s_star - s_inf) / p.v / mv1
    vals = [t[np.isfinite(t) & (t > bstar) & (t <= hi)] for t in p.T]
    if p.stages > 1:
        o = p.O.ravel()
        vals.append(o[(o > bstar) & (o <= hi)])
    cands = np.unique(np.concatenate(vals)) if vals else np.array([])
    evaluated = 0
    for c in cands:
        if s_inf / p.v + mv1 * c >= best.objective:
            break
        if evaluated >= MAX_CAPS:
            best.exact = False
            break
        _s, bnd = _minsum(p, float(c))
        consider(bnd)
        evaluated += 1
    return best


def brute_force(p: Problem) -> Solution | None:
    """Enumerate every composition of n layers into S stages (tests only: small n)."""
    best = None
    n, S = p.n, p.stages
    for cuts in itertools.combinations(range(n - 1), S - 1):
        edges = [-1, *cuts, n - 1]
        bounds = [(edges[d] + 1, edges[d + 1]) for d in range(S)]
        J, bott, tot = evaluate(p, bounds)
        if not math.isfinite(J):
            continue
        if best is None or J < best.objective:
            best = Solution(J, bott, tot, bounds)
    return best
