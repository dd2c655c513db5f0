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
from dataclasses import dataclass, replace

import numpy as np

INF = math.inf
MAX_CAPS = 64  # cap candidates evaluated before declaring the answer approximate
LABELS_MAX = 200_000  # labels the exposed-tail branch and bound creates before it stops (inexact)
LABEL_WORK = 100_000  # stages x layers x band above which it is not started (the answer inexact)


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
    G: list[np.ndarray | None] | None = None   # per stage: (n, L) tail exposed after the drain, or None
    W: list[np.ndarray] | None = None          # per stage: (n, L) its backward of one micro-batch (the drain)

    @property
    def tailed(self) -> bool:
        """Does J carry the exposed tail E (some stage has a G table)?"""
        return self.G is not None and any(g is not None for g in self.G)

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


def exposures(p: Problem, bounds: list[tuple[int, int]]) -> list[float | None]:
    """A_s of a partition per stage: G_s - the sum of W over the stages before s (pipeline
    order), None for a stage without a G table."""
    out: list[float | None] = []
    drain = 0.0
    for d, (a, b) in enumerate(bounds):
        out.append(None if p.G is None or p.G[d] is None else float(p.G[d][b, b - a]) - drain)
        if p.W is not None:
            drain += float(p.W[d][b, b - a])
    return out


def exposure(p: Problem, bounds: list[tuple[int, int]]) -> float:
    """E of a partition: max(0, max_s A_s) (:func:`exposures`; 0 without G tables)."""
    if not p.tailed:
        return 0.0
    return max([0.0] + [a for a in exposures(p, bounds) if a is not None])


def evaluate(p: Problem, bounds: list[tuple[int, int]]) -> tuple[float, float, float]:
    """(J, bottleneck, sum) of a given partition (inf when a stage does not fit); sum includes
    v*X, J the exposed tail E (:func:`exposure`)."""
    ts = [stage_time(p, d, a, b) for d, (a, b) in enumerate(bounds)]
    xs = [0.0 if p.extra(d) is None or not math.isfinite(ts[d]) else float(p.extra(d)[b, b - a])
          for d, (a, b) in enumerate(bounds)]
    cuts = [(d, b) for d, (_a, b) in enumerate(bounds[:-1])]
    total = sum(ts) + sum(float(p.C[d, j]) for d, j in cuts) + p.v * sum(xs)
    bott = max(ts + [float(p.O[d, j]) for d, j in cuts])
    if not math.isfinite(total):
        return INF, INF, INF
    return total / p.v + (p.m * p.v - 1) * bott + exposure(p, bounds), bott, total


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

    Returns None when no partition fits or (``jmax``) none can have J below jmax. Without G
    tables: :func:`solve_bare`. With them, J = P + E where P is solve_bare's objective and
    E = max(0, max_k A_k) (:func:`exposures`) is not a sum over stages, but each A_k is: it
    is G_k of stage k minus W of every stage before k. So M_k = min over partitions of
    P + A_k is solve_bare's problem with A_k's terms added to X (:func:`_shifted`), and since
    E >= A_k and E >= 0, every M_k and P* = min P are lower bounds on J*. A partition whose
    J equals one of them is optimal: the optimum of P has E = 0, or the optimum of P + A_k
    has k binding (A_k = E). :func:`_solve_tailed` tries the binding stage of each solution
    found (each k once); when no certificate comes, :func:`_labels` (branch and bound over
    (sum, drain, exposure, bottleneck) labels, pruned by the best J found) finishes exactly,
    or marks the answer inexact past LABELS_MAX labels.
    """
    if p.tailed:
        return _solve_tailed(p, s_floor, jmax)
    return solve_bare(p, s_floor, jmax)


def _shifted(p: Problem, k: int) -> Problem:
    """The problem of min P + A_k: A_k's terms (-W_s for s < k, G_k for s = k) added to X."""
    S = p.stages
    X = []
    for s in range(S):
        x = p.extra(s)
        x = np.zeros_like(p.T[s]) if x is None else x
        if s < k:
            x = x - p.W[s]
        elif s == k:
            x = x + p.G[k]
        X.append(x)
    return Problem(p.n, p.T, p.C, p.O, p.m, p.v, X)


def _binding(p: Problem, bounds) -> tuple[int | None, float, float]:
    """(k, A_k, E): the first stage whose A_k is E (None when E = 0 with no stage at 0 or above)."""
    xs = exposures(p, bounds)
    E = max([0.0] + [a for a in xs if a is not None])
    for k, a in enumerate(xs):
        if a is not None and a >= E:
            return k, a, E
    return None, 0.0, E


def _solve_tailed(p: Problem, s_floor: float | None, jmax: float) -> Solution | None:
    """:func:`solve` with the exposed tail (see there for the argument)."""
    base = solve_bare(replace(p, G=None, W=None), s_floor, jmax)
    if base is None:
        return None
    exact = base.exact
    lb = base.objective if base.exact else -INF

    def sol_of(bounds, ok):
        J, bott, tot = evaluate(p, bounds)
        return Solution(J, bott, tot, bounds, ok)

    best = sol_of(base.bounds, exact)
    k, _, E = _binding(p, base.bounds)
    if k is None:   # E = 0: J = P*, the least P
        return best
    tried: set[int] = set()
    while k is not None and k not in tried:
        tried.add(k)
        sol = solve_bare(_shifted(p, k), None, INF)
        if sol is None:
            break
        exact = exact and sol.exact
        if sol.exact:
            lb = max(lb, sol.objective)
        cand = sol_of(sol.bounds, exact)
        if (cand.objective, cand.bounds) < (best.objective, best.bounds):
            best = cand
        xs = exposures(p, sol.bounds)
        E = max([0.0] + [a for a in xs if a is not None])
        if (sol.exact and xs[k] >= E) or best.objective <= lb:
            # this partition's J is M_k (k binds) or the best J meets a lower bound: no
            # partition has a lower J (best J <= that J)
            best.exact = True
            return best
        if lb >= jmax:
            return None
        k = _binding(p, sol.bounds)[0]
        if k in tried:
            k = _binding(p, best.bounds)[0]
    if p.stages * p.n * p.band > LABEL_WORK:
        # a Python branch and bound over this many (stage, layer, range) steps costs more than
        # the search can pay per configuration (gpt3-175b on 64xU55C: 64 x 771 x 18, 0.6 s to
        # give up at LABELS_MAX): the best J found, marked inexact, lower bound lb
        best.exact = False
        return best
    out = _labels(p, best)
    out.exact = out.exact and exact
    return out


def _rest_floor(p: Problem) -> list[np.ndarray]:
    """R[s][j]: the least sum (link costs, stage times, v x X) of stages s+1.. covering layers
    j+1..n-1 (inf when they cannot), a bound on what a label at (s, j) still adds."""
    n, L, S = p.n, p.band, p.stages
    R = [np.full(n, INF) for _ in range(S)]
    R[S - 1][n - 1] = 0.0
    j = np.arange(n)
    for s in range(S - 2, -1, -1):
        nxt = np.full(n, INF)
        for k in range(L):
            b = j + 1 + k                 # stage s+1 holds j+1..b
            ok = b < n
            bb = np.where(ok, b, 0)
            t = p.T[s + 1][bb, k]
            x = 0.0 if p.extra(s + 1) is None else p.v * p.extra(s + 1)[bb, k]
            val = np.where(ok, t + x + R[s + 1][bb], INF)
            nxt = np.minimum(nxt, val)
        R[s] = np.where(np.isfinite(nxt), nxt + p.C[s], INF)
    return R


def _labels(p: Problem, best: Solution) -> Solution:
    """Branch and bound over partial partitions, stage by stage: a label at (stage s, last
    layer j) carries its sum K (stage times, link costs, v x X), its drain D (sum of W), its
    exposure so far E and its bottleneck B; J = K / v + (m v - 1) B + E at the end. A label
    is dropped when another at the same (s, j) has K, E, B no larger and D no smaller (every
    continuation then costs it no more: later A_k fall as D grows), or when K plus the least
    remaining sum (:func:`_rest_floor`) cannot beat ``best``. Exact unless more than
    LABELS_MAX labels are made (then ``best`` so far, marked inexact)."""
    n, L, S, v = p.n, p.band, p.stages, p.v
    mv1 = p.m * v - 1
    R = _rest_floor(p)
    ub, ub_bounds = best.objective, best.bounds
    made = 0

    def g_of(s, b, k):
        return None if p.G is None or p.G[s] is None else float(p.G[s][b, k])

    # a label: (K, E, B, D, parent label or None, (a, b))
    layer: dict[int, list] = {}
    for b in range(min(n, L)):
        t = float(p.T[0][b, b])
        if not math.isfinite(t):
            continue
        K = t + (0.0 if p.extra(0) is None else v * float(p.extra(0)[b, b]))
        g = g_of(0, b, b)
        E = max(0.0, g) if g is not None else 0.0
        if (K + R[0][b]) / v + mv1 * t + E < ub:
            layer.setdefault(b, []).append((K, E, t, float(p.W[0][b, b]), None, (0, b)))
    for s in range(1, S):
        nxt: dict[int, list] = {}
        for j, labs in layer.items():
            c, o = float(p.C[s - 1, j]), float(p.O[s - 1, j])
            for b in range(j + 1, min(n, j + 1 + L)):
                k = b - j - 1
                t = float(p.T[s][b, k])
                if not math.isfinite(t) or not math.isfinite(R[s][b]):
                    continue
                x = 0.0 if p.extra(s) is None else v * float(p.extra(s)[b, k])
                g = g_of(s, b, k)
                w = float(p.W[s][b, k])
                for lab in labs:
                    K0, E0, B0, D0 = lab[:4]
                    K = K0 + c + t + x
                    E = max(E0, g - D0) if g is not None else E0
                    B = max(B0, o, t)
                    if (K + R[s][b]) / v + mv1 * B + E >= ub:
                        continue
                    nxt.setdefault(b, []).append((K, E, B, D0 + w, lab, (j + 1, b)))
                    made += 1
                    if made > LABELS_MAX:
                        return Solution(ub, best.bottleneck, best.total, ub_bounds, False)
        layer = {}
        for b, labs in nxt.items():
            labs.sort(key=lambda z: (z[0], z[1], z[2], -z[3]))
            kept: list = []
            for z in labs:
                if not any(y[0] <= z[0] and y[1] <= z[1] and y[2] <= z[2] and y[3] >= z[3] for y in kept):
                    kept.append(z)
            layer[b] = kept
    for lab in layer.get(n - 1, []):
        bounds = []
        z = lab
        while z is not None:
            bounds.append(z[5])
            z = z[4]
        bounds = bounds[::-1]
        if len(bounds) != S:
            continue
        J, bott, tot = evaluate(p, bounds)
        if (J, bounds) < (ub, ub_bounds):
            ub, ub_bounds, best = J, bounds, Solution(J, bott, tot, bounds)
    best = Solution(best.objective, best.bottleneck, best.total, best.bounds, True)
    return best


def solve_bare(p: Problem, s_floor: float | None = None, jmax: float = INF) -> Solution | None:
    """The exact minimum of J over all partitions into exactly ``p.stages`` non-empty stages,
    ignoring G (the exposed tail E, which :func:`solve` adds).

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
