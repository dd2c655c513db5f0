"""Exact optimal contiguous partition of a layer sequence onto pipeline stages.

Stages are boards (or replica groups) in topology order; stage ``d`` may be a different
board type from stage ``d+1``. A problem holds, per stage position ``d``, the band matrix
``T[d][j, k]``: the time per micro-batch of stage ``d`` holding layers ``j-k .. j``
(``inf`` when the range does not fit the board's memory), optionally ``X[d][j, k]``, a cost
added to the objective once but not to the bottleneck (the gradient all-reduce after the
last backward of device 0, which ends the iteration), and per cut the link costs
``C[d][j]`` (full send time of activations + gradients after layer ``j`` from stage ``d``
to ``d+1``: latency plus bytes/bandwidth, both directions) and ``O[d][j]`` (the link's
busy time per micro-batch, one direction: what throttles the steady state).

Objective (Alpa, OSDI'22 eq. 2, generalised to links and interleaving with v chunks):

    J = (sum_d T_d + sum_cuts C) / v + sum_d X_d + (m*v - 1) * max(max_d T_d, max_cuts O)

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
    X: list[np.ndarray | None] | None = None   # per stage: (n, L) extra added to the objective only

    def extra(self, d: int) -> np.ndarray | None:
        """The objective-only extra of stage d (e.g. its share of the final all-reduce), or None."""
        return None if self.X is None else self.X[d]

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
    """(J, bottleneck, sum) of a given partition (inf when a stage does not fit); sum includes v*X."""
    ts = [stage_time(p, d, a, b) for d, (a, b) in enumerate(bounds)]
    xs = [0.0 if p.extra(d) is None or not math.isfinite(ts[d]) else float(p.extra(d)[b, b - a])
          for d, (a, b) in enumerate(bounds)]
    cuts = [(d, b) for d, (_a, b) in enumerate(bounds[:-1])]
    total = sum(ts) + sum(float(p.C[d, j]) for d, j in cuts) + p.v * sum(xs)
    bott = max(ts + [float(p.O[d, j]) for d, j in cuts])
    if not math.isfinite(total):
        return INF, INF, INF
    return total / p.v + (p.m * p.v - 1) * bott, bott, total


def _index(n: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(idx, valid): idx[j, k] = j - k - 1, the last layer of the previous stage (clipped to 0)."""
    idx = np.arange(n)[:, None] - np.arange(L)[None, :] - 1
    valid = idx >= 0
    return np.where(valid, idx, 0), valid


def _first_stage(p: Problem, L: int) -> np.ndarray:
    """T of stage 0 covering layers 0..j (inf beyond the band)."""
    j = np.arange(p.n)
    cur = np.full(p.n, INF)
    ok = j < L
    cur[ok] = p.T[0][j[ok], j[ok]]
    return cur


def _minmax(p: Problem) -> float:
    """Least achievable bottleneck max(T_d, O_cut) over all partitions (vectorised over j and k)."""
    n, L = p.n, p.band
    idx, valid = _index(n, L)
    cur = _first_stage(p, L)
    for d in range(1, p.stages):
        prev = np.maximum(cur, p.O[d - 1])[idx]
        prev[~valid] = INF
        cur = np.maximum(prev, p.T[d]).min(axis=1)
    return float(cur[n - 1])


def _band_under(p: Problem, cap: float) -> int:
    """Longest range length whose stage time can be <= cap on some stage (trims the DP band)."""
    if not math.isfinite(cap):
        return p.band
    ok = np.zeros(p.band, dtype=bool)
    for T in p.T:
        ok |= (T <= cap).any(axis=0)
    idx = np.nonzero(ok)[0]
    return int(idx[-1]) + 1 if len(idx) else 0


def _minsum(p: Problem, cap: float) -> tuple[float, list[tuple[int, int]] | None]:
    """Least sum (stage times + link costs) with every stage and link cost <= cap."""
    n, L, S = p.n, p.band, p.stages
    Lc = max(1, min(L, _band_under(p, cap)))
    idx, valid = _index(n, Lc)
    t0 = _first_stage(p, L)
    x0 = np.zeros(n) if p.extra(0) is None else p.v * np.array([p.extra(0)[j, j] if j < L else 0.0 for j in range(n)])
    cur = np.where(t0 <= cap, t0 + x0, INF)
    args = []
    for d in range(1, S):
        base = np.where(p.O[d - 1] <= cap, cur + p.C[d - 1], INF)[idx]
        base[~valid] = INF
        t = p.T[d][:, :Lc]
        cand = base + t
        if p.extra(d) is not None:
            cand = cand + p.v * p.extra(d)[:, :Lc]
        cand[t > cap] = INF
        arg = cand.argmin(axis=1)          # first (shortest) range on ties
        cur = cand[np.arange(n), arg]
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


def solve(p: Problem, s_floor: float | None = None, jmax: float = INF) -> Solution | None:
    """The exact minimum of J over all partitions into exactly ``p.stages`` non-empty stages.

    Returns None when no partition fits (some stage would exceed its board's memory).
    ``s_floor`` is an optional lower bound on the sum (skips the unconstrained min-sum DP).
    ``jmax``: a search bound; None as soon as no partition can have J below it (every J is
    at least s_floor / v + (m v - 1) B*).
    Cap candidates are searched by bisection: min-sum(cap) is non-increasing in the cap, so
    when two caps give the same least sum no cap between them can do better than the lower.
    """
    if p.stages > p.n:
        return None
    bstar = _minmax(p)
    if not math.isfinite(bstar):
        return None
    mv1 = p.m * p.v - 1
    if s_floor is not None and s_floor / p.v + mv1 * bstar >= jmax:
        return None
    best: Solution | None = None

    def consider(bounds):
        nonlocal best
        if bounds is None:
            return
        J, bott, tot = evaluate(p, bounds)
        if best is None or (J, bott, bounds) < (best.objective, best.bottleneck, best.bounds):
            best = Solution(J, bott, tot, bounds)

    if mv1 == 0:
        s_inf, b_inf = _minsum(p, INF)
        consider(b_inf)
        return best
    s_star, b_star = _minsum(p, bstar)
    consider(b_star)
    if s_floor is None:
        s_floor, b_inf = _minsum(p, INF)
        consider(b_inf)
    hi = bstar + (s_star - s_floor) / p.v / mv1
    vals = [t[np.isfinite(t) & (t > bstar) & (t <= hi)] for t in p.T]
    if p.stages > 1:
        o = p.O.ravel()
        vals.append(o[(o > bstar) & (o <= hi)])
    cands = np.unique(np.concatenate([np.array([bstar])] + vals))
    memo: dict[int, float] = {0: s_star}

    def f(i: int) -> float:
        if i not in memo:
            s, bnd = _minsum(p, float(cands[i]))
            memo[i] = s
            consider(bnd)
        return memo[i]

    stack = [(0, len(cands) - 1)]
    evaluated = 0
    while stack:
        lo, hi_i = stack.pop()
        if hi_i <= lo:
            continue
        # any cap in (lo, hi_i] costs at least f(hi_i)/v + mv1 * cands[lo+1]
        if s_floor / p.v + mv1 * float(cands[lo + 1]) >= best.objective:
            continue
        if evaluated >= MAX_CAPS:
            best.exact = False
            break
        fh = f(hi_i)
        evaluated += 1
        if fh / p.v + mv1 * float(cands[lo + 1]) >= best.objective or fh == f(lo) or hi_i == lo + 1:
            continue
        mid = (lo + hi_i) // 2
        f(mid)
        evaluated += 1
        stack.append((mid, hi_i))
        stack.append((lo, mid))
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
