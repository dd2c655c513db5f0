"""Exact joint search of a partition and per-stage replica counts over a board order.

PipeDream's optimizer (Narayanan et al., SOSP'19, section 3.1) finds, by dynamic
programming over (layer prefix, machines used), how many replicas each stage gets and where
the layers are cut, so that one stage may run on 12 GPUs and the next on 1. This module does
the same for BaPipe's own objective J (planner.partition, docs/planner.md section 5),

    J = sum_s T_s + sum_cuts C + sum_s X_s + (jm - 1) * max(max_s T_s, max_cuts O)

with v = 1, where a stage is a contiguous layer range on a *block* of consecutive boards of
a given board order: block (b, r) is boards order[b .. b+r-1], the stage's r data-parallel
replicas (each computing ceil(micro-batch / r) samples), the blocks of a plan following each
other in pipeline order from board 0, boards left idle at the end. Every figure is given by
the caller per block (planner.search.Explorer.layout_problem builds them from the same
stage models, rings, routes and framing as J of a configuration):

- ``T[k][kind]`` (n x L band, ``T[j, l]`` = time of layers j-l..j; inf when it does not fit
  memory) for a stage with k stages from it to the end of the pipeline (its stash count
  is a function of that k and of m for every schedule, bapipe.schedules.stash_count);
  tables for k >= K are equal (K = 1 when memory never depends on the stash count).
- ``X``: a replicated stage's ring all-reduce, ``ring_allreduce_s(W, r, bw, lat)`` over the
  block's boards, added to the sum, or with ``per_mb`` (asynchronous PipeDream: an
  all-reduce per micro-batch overlapped with compute) folded into the stage time as max(T, X).
- ``C``, ``O`` per cut after layer j between a sender block ending at board b with r1
  replicas and the receiver block (b, r2): full link cost and link busy time.

State (the suffix DP, layers i..n-1 still to place): (i, first board b of the suffix,
replicas r of its first stage, stages k in it, merged at K). The cut between two stages
depends on both blocks, hence r in the state. Like ``partition.solve``, the least J is the
least over caps c of S(c) + (jm - 1) c, S(c) the least sum with every stage and link time at
most c (a min-sum sweep), the caps searched by bisection over the distinct stage and link
times above the least bottleneck B* (a min-max sweep). Exact for J as given; the caller's C
and O price each cut with the link loads of its own transfers (two cuts sharing a link are
not charged for each other here; the configuration the layout becomes is then solved with
the loads of all its cuts). ``brute_force`` enumerates every layout (tests).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from bapipe.fpga_models.collective import ring_steps_array

from .partition import MAX_CAPS

INF = math.inf


@dataclass
class LayoutProblem:
    """Everything the sweep reads (see the module docstring); blocks (b, r) with b + r > N,
    r > R or boards of mixed types have ``kind[b, r] = nk`` (the all-inf row of every T)."""

    n: int                      # layers
    N: int                      # boards in the order
    R: int                      # most replicas a stage may have
    jm: int                     # micro-batches J is computed with (planner.search.Explorer.jm)
    kind: np.ndarray            # (N+1, R+1) int: the stage table of block (b, r)
    T: list[np.ndarray]         # per k = 1..K: (nk + 1, n, L), row nk all inf
    C: np.ndarray               # (N+1, R+1, R+1, n): C[b, r1, r2, j] (j = n-1: unused, inf)
    O: np.ndarray               # the same shape: link busy time per micro-batch
    PW: np.ndarray | None = None    # (nk, n+1) prefix weight bytes of every kind (None: no all-reduce)
    ring_bw: np.ndarray | None = None   # (N+1, R+1) ring bandwidth of block (b, r)
    ring_lat: np.ndarray | None = None  # (N+1, R+1) ring latency per step
    per_mb: bool = False        # all-reduce per micro-batch, overlapped: T -> max(T, X)
    memory_binds: bool = False  # (the caller's note) some range does not fit at the most stashes

    @property
    def K(self) -> int:
        """Stage counts told apart (tables for k >= K are equal)."""
        return len(self.T)

    @property
    def L(self) -> int:
        """Longest layer range represented."""
        return self.T[0].shape[2]


@dataclass
class LayoutSolution:
    """An optimal layout: J, bottleneck, sum, and per stage (first, last, first board, replicas)."""

    objective: float
    bottleneck: float
    total: float
    stages: list[tuple[int, int, int, int]]
    exact: bool = True
    others: list = field(default_factory=list)   # (J, stages): the best under the same cap per first replicas


def _x(p: LayoutProblem, b, r, w):
    """Ring all-reduce seconds of ``w`` weight bytes on block (b, r) (arrays broadcast)."""
    r = np.asarray(r, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        steps = ring_steps_array(r)   # fpga_models.collective: the ring's one home
        x = steps / np.maximum(r, 1) * w / p.ring_bw[b, r.astype(int)] + steps * p.ring_lat[b, r.astype(int)]
    return np.where(r > 1, x, 0.0)


def stage_cost(p: LayoutProblem, k: int, first: int, last: int, b: int, r: int) -> tuple[float, float]:
    """(time in the bottleneck, term of the sum) of one stage: layers first..last on block
    (b, r) with k stages from it to the end of the pipeline."""
    ln = last - first
    if ln < 0 or ln >= p.L or r < 1 or r > p.R or b + r > p.N:
        return INF, INF
    kd = int(p.kind[b, r])
    t = float(p.T[min(k, p.K) - 1][kd, last, ln])
    if not math.isfinite(t):
        return INF, INF
    x = 0.0
    if p.PW is not None and r > 1:
        x = float(_x(p, b, r, p.PW[kd, last + 1] - p.PW[kd, first]))
    if p.per_mb:
        t = max(t, x)
        return t, t
    return t, t + x


def evaluate(p: LayoutProblem, stages: list[tuple[int, int, int, int]]) -> tuple[float, float, float]:
    """(J, bottleneck, sum) of a layout (inf when it breaks a rule: ranges not contiguous from
    layer 0 to n-1, blocks not consecutive from board 0, a stage that does not fit)."""
    S = len(stages)
    if S == 0 or stages[0][0] != 0 or stages[-1][1] != p.n - 1 or stages[0][2] != 0:
        return INF, INF, INF
    total, bott = 0.0, 0.0
    for s, (a, z, b, r) in enumerate(stages):
        if s and (a != stages[s - 1][1] + 1 or b != stages[s - 1][2] + stages[s - 1][3]):
            return INF, INF, INF
        t, term = stage_cost(p, S - s, a, z, b, r)
        if not math.isfinite(term):
            return INF, INF, INF
        total += term
        bott = max(bott, t)
        if s < S - 1:
            b2, r2 = stages[s + 1][2], stages[s + 1][3]
            if r2 > p.R or b2 + r2 > p.N:
                return INF, INF, INF
            c, o = float(p.C[b2, r, r2, z]), float(p.O[b2, r, r2, z])
            if not math.isfinite(c):
                return INF, INF, INF
            total += c
            bott = max(bott, o)
    return total + (p.jm - 1) * bott, bott, total


class _Grid:
    """What every sweep of one problem shares: the blocks that exist (b, r, their end board,
    their table), the tables indexed by a range's first layer (``S[k][q, i, l]``: layers
    i..i+l), the cuts with the cut layer first, and each first layer's all-reduce times."""

    def __init__(self, p: LayoutProblem):
        nk = p.T[0].shape[0] - 1
        bs, rs = np.meshgrid(np.arange(p.N + 1), np.arange(p.R + 1), indexing="ij")
        ok = (bs + rs <= p.N) & (rs >= 1) & (p.kind < nk)
        self.vb, self.vr = bs[ok], rs[ok]
        self.vend = self.vb + self.vr
        self.vkind = p.kind[ok]
        n, L = p.n, p.L
        i = np.arange(n)[:, None]
        ls = np.arange(L)[None, :]
        last = i + ls
        inside = last < n
        lastc = np.where(inside, last, 0)
        self.S = []
        for T in p.T:
            st = T[:, lastc, np.broadcast_to(ls, lastc.shape)]
            st[:, ~inside] = INF
            self.S.append(st)
        self.C = np.ascontiguousarray(np.moveaxis(p.C, 3, 0))   # (n, N+1, R+1, R+1)
        self.O = np.ascontiguousarray(np.moveaxis(p.O, 3, 0))
        self.X = None
        if p.PW is not None:
            self.X = []
            for i0 in range(n):
                Lc = min(L, n - i0)
                w = p.PW[:, i0 + 1:i0 + Lc + 1] - p.PW[:, i0:i0 + 1]       # (nk, Lc)
                self.X.append(_x(p, self.vb[:, None], self.vr[:, None], w[self.vkind]))


def _sweep(p: LayoutProblem, grid: _Grid, cap: float, minmax: bool, trace: bool = False):
    """One pass over the layers from the last: the least sum (every stage and link time <=
    ``cap``) or, ``minmax``, the least bottleneck; with ``trace`` also the layout reaching
    it (else None; a layout is only needed for the best cap)."""
    n, N, R, K, L = p.n, p.N, p.R, p.K, p.L
    comb = np.maximum if minmax else np.add
    f = np.full((K + 1, n + 1, N + 1, R + 1), INF)   # f[k][i, b, r]: suffix from layer i, k stages
    g = np.full((K + 1, n + 1, N + 1, R + 1), INF)   # g[k][i, b, r1]: after a stage (r1) ending at board b
    g[0, n] = 0.0
    if trace:
        arg_len = np.zeros((K + 1, n, N + 1, R + 1), dtype=np.int32)
        arg_src = np.zeros((K + 1, n, N + 1, R + 1), dtype=np.int8)
        arg_r = np.zeros((K + 1, n + 1, N + 1, R + 1), dtype=np.int32)
    vb, vr, vend, vkind = grid.vb, grid.vr, grid.vend, grid.vkind
    cuts = grid.O if minmax else np.where(grid.O <= cap, grid.C, INF)
    for i in range(n - 1, -1, -1):
        Lc = min(L, n - i)
        nxt = g[:, i + 1:i + Lc + 1][:, :, vend, vr]                  # (K+1, Lc, M)
        x = grid.X[i] if grid.X is not None else None                 # (M, Lc)
        for k in range(1, K + 1):
            t = grid.S[k - 1][vkind, i, :Lc]                          # (M, Lc)
            if x is not None and p.per_mb:
                t = np.maximum(t, x)
            term = t if minmax or x is None or p.per_mb else t + x
            if not minmax:
                term = np.where(t <= cap, term, INF)
            srcs = [k - 1] + ([K] if k == K else [])
            if not trace and len(srcs) > 1:   # no layout to trace: one pass over the better source
                nk_ = np.minimum(nxt[srcs[0]], nxt[srcs[1]])
                f[k, i][vb, vr] = comb(term, nk_.T).min(axis=1)
                continue
            best = None
            for src in srcs:
                val = comb(term, nxt[src].T)                          # (M, Lc)
                v = val.min(axis=1)
                if trace:
                    a = val.argmin(axis=1)
                if best is None:
                    best = v
                    if trace:
                        bl, bsrc = a, np.full(v.shape, src, dtype=np.int8)
                else:
                    if trace:
                        better = v < best
                        bl = np.where(better, a, bl)
                        bsrc = np.where(better, src, bsrc)
                    best = np.minimum(best, v)
            f[k, i][vb, vr] = best
            if trace:
                arg_len[k, i][vb, vr] = bl + 1
                arg_src[k, i][vb, vr] = bsrc
        if i == 0:
            break
        # the cut after layer i-1 from a stage (r1 replicas) ending at board b into f[k][i, b, r2]
        cut = cuts[i - 1]                                              # (N+1, R+1, R+1)
        for k in range(1, K + 1):
            val = comb(cut, f[k, i][:, None, :])
            g[k, i] = val.min(axis=2)
            if trace:
                arg_r[k, i] = val.argmin(axis=2)
    k_best, r_best = np.unravel_index(np.argmin(f[1:, 0, 0, :]), (K, R + 1))
    k, r = int(k_best) + 1, int(r_best)
    value = float(f[k, 0, 0, r])
    if not math.isfinite(value):
        return INF, None
    if not trace:
        return value, None

    def walk(k: int, r: int) -> list:
        stages, i, b = [], 0, 0
        while True:
            ln, src = int(arg_len[k, i, b, r]), int(arg_src[k, i, b, r])
            stages.append((i, i + ln - 1, b, r))
            i, b = i + ln, b + r
            if src == 0 or i >= n:
                return stages
            k, r = src, int(arg_r[src, i, b, r])

    # the least-sum layout, then the least-sum layout of every other first stage's replica count
    # (alternatives for the replay, which J does not rank exactly)
    out = [walk(k, r)]
    for r0 in range(1, R + 1):
        k0 = int(np.argmin(f[1:, 0, 0, r0])) + 1
        if r0 != r and math.isfinite(f[k0, 0, 0, r0]):
            out.append(walk(k0, r0))
    return value, out


def solve(p: LayoutProblem, s_floor: float | None = None, jmax: float = INF) -> LayoutSolution | None:
    """The least J over every layout (partition x consecutive blocks of replicas); None when
    nothing fits or, given ``jmax``, nothing can be below it.

    J* = min over caps c of S(c) + (jm - 1) c: the optimum's own bottleneck B gives
    S(B) + (jm - 1) B <= J*, and the layout reaching S(c) has J <= S(c) + (jm - 1) c. The caps
    (the distinct stage and link times in [B*, B* + (S(B*) - floor) / (jm - 1)]) are searched
    by bisection as in planner.partition.solve (S is non-increasing in c, so equal values at
    two caps rule out every cap between); the layout is traced at the best cap only."""
    grid = _Grid(p)
    bstar, _st = _sweep(p, grid, INF, True)
    if not math.isfinite(bstar):
        return None
    mv1 = p.jm - 1
    if s_floor is not None and s_floor + mv1 * bstar >= jmax:
        return None
    if mv1 == 0:
        return _traced(p, grid, INF)
    s_star, _st = _sweep(p, grid, bstar, False)
    if not math.isfinite(s_star):   # rounding at the min-max layout's own bottleneck: trace it
        return _traced(p, grid, INF)
    if s_floor is None:
        s_floor = _sweep(p, grid, INF, False)[0]
    hi = bstar + (s_star - s_floor) / mv1
    vals = []
    for T in p.T:
        t = T[np.isfinite(T)]
        vals.append(t[(t > bstar) & (t <= hi)])
    if p.per_mb and grid.X is not None:
        for x in grid.X:
            vals.append(x[(x > bstar) & (x <= hi)])
    o = p.O[np.isfinite(p.O)]
    vals.append(o[(o > bstar) & (o <= hi)])
    cands = np.unique(np.concatenate([np.array([bstar])] + vals))
    memo: dict[int, float] = {0: s_star}
    best = [s_star + mv1 * bstar, 0]   # least S(c) + mv1 c so far, at cap index

    def f(i: int) -> float:
        if i not in memo:
            memo[i] = _sweep(p, grid, float(cands[i]), False)[0]
            if memo[i] + mv1 * float(cands[i]) < best[0]:
                best[:] = [memo[i] + mv1 * float(cands[i]), i]
        return memo[i]

    stack = [(0, len(cands) - 1)]
    evaluated = 0
    exact = True
    while stack:
        lo, hi_i = stack.pop()
        if hi_i <= lo:
            continue
        # any cap in (lo, hi_i] gives at least f(hi_i) + mv1 * cands[lo + 1] >= floor + ...
        if s_floor + mv1 * float(cands[lo + 1]) >= best[0]:
            continue
        if evaluated >= MAX_CAPS:
            exact = False
            break
        fh = f(hi_i)
        evaluated += 1
        if fh + mv1 * float(cands[lo + 1]) >= best[0] or fh == f(lo) or hi_i == lo + 1:
            continue
        mid = (lo + hi_i) // 2
        f(mid)
        evaluated += 1
        stack.append((mid, hi_i))
        stack.append((lo, mid))
    sol = _traced(p, grid, float(cands[best[1]]))
    if sol is not None:
        sol.exact = exact
    return sol


def _traced(p: LayoutProblem, grid: _Grid, cap: float) -> LayoutSolution | None:
    """The layout of the least sum under ``cap``, with its own J, and in ``others`` the
    least-sum layout under the cap of every other replica count of the first stage."""
    _v, found = _sweep(p, grid, cap, False, trace=True)
    if found is None:
        return None
    J, bott, tot = evaluate(p, found[0])
    if not math.isfinite(J):
        return None
    sol = LayoutSolution(J, bott, tot, found[0])
    for st in found[1:]:
        Jo = evaluate(p, st)[0]
        if math.isfinite(Jo):
            sol.others.append((Jo, st))
    return sol


def layouts(n: int, N: int, R: int):
    """Every layout: compositions of the n layers x replica counts (1..R, blocks from board 0,
    at most N boards in all), as (first, last, first board, replicas) per stage (tests)."""
    for S in range(1, min(n, N) + 1):
        for cuts in itertools.combinations(range(n - 1), S - 1):
            edges = [-1, *cuts, n - 1]
            for reps in itertools.product(range(1, R + 1), repeat=S):
                if sum(reps) > N:
                    continue
                b, out = 0, []
                for s in range(S):
                    out.append((edges[s] + 1, edges[s + 1], b, reps[s]))
                    b += reps[s]
                yield out


def brute_force(p: LayoutProblem) -> LayoutSolution | None:
    """The least J by enumerating :func:`layouts` (tests only: small n and N)."""
    best = None
    for st in layouts(p.n, p.N, p.R):
        J, bott, tot = evaluate(p, st)
        if math.isfinite(J) and (best is None or J < best.objective):
            best = LayoutSolution(J, bott, tot, st)
    return best
