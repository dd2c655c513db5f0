"""The exact partition DP against brute-force enumeration."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapipe.schedules import SCHEDULES
from bapipe.spec import model_from_text
from bapipe.fpga_models.cluster import parse_cluster
from bapipe.yamlio import loads
from bapipe.planner import partition as part
from bapipe.planner.search import Config, Explorer, Request
from tolerances import f64_sum


def _problem(rng, n, S, m, v, with_x, p_inf):
    L = n
    T = []
    for _ in range(S):
        t = rng.uniform(0.1, 10.0, size=(n, L)).round(2)
        t[rng.random((n, L)) < p_inf] = math.inf
        j = np.arange(n)[:, None]
        k = np.arange(L)[None, :]
        t[(j - k) < 0] = math.inf
        T.append(t)
    C = rng.uniform(0, 2.0, size=(max(S - 1, 0), n)).round(2)
    O = (C * rng.uniform(0.2, 1.0, size=C.shape)).round(2)
    X = [rng.uniform(0, 1.0, size=(n, L)).round(2) for _ in range(S)] if with_x else None
    return part.Problem(n, T, C, O, m, v, X)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12), S=st.integers(1, 4), m=st.integers(1, 16),
       v=st.sampled_from([1, 2]), with_x=st.booleans(), p_inf=st.sampled_from([0.0, 0.1, 0.4]))
def test_dp_equals_brute_force(seed, n, S, m, v, with_x, p_inf):
    p = _problem(np.random.default_rng(seed), n, S, m, v, with_x, p_inf)
    got = part.solve(p)
    want = part.brute_force(p)
    if want is None:
        assert got is None
        return
    assert got is not None and got.exact
    # both objectives come from part.evaluate (<= 4 stage + 3 link + 4 extra positive terms:
    # about 14 roundings each); they differ only when the DP's own sums (another order) pick
    # a partition that ties with the enumeration's within rounding: 2 x 14 + 2 x 14 < 64 u.
    # Measured: equal to the bit on 3158 random instances.
    assert got.objective == pytest.approx(want.objective, rel=f64_sum(64), abs=0)
    # the reported partition really has that objective: solve stores evaluate's own value
    assert part.evaluate(p, got.bounds)[0] == got.objective


def _tailed(rng, n, S, m, v, with_x, p_inf, scale):
    """A random problem with tails: G_s on about 3 of 4 stages (``scale`` x the stage times'
    range, so the tail binds at various stages or not at all), W_s (the drain) a share of T_s."""
    p = _problem(rng, n, S, m, v, with_x, p_inf)
    p.G = [rng.uniform(0, 10.0 * scale, size=(n, n)).round(2) if rng.random() < 0.75 else None for _ in range(S)]
    p.W = [np.where(np.isfinite(t), (t * rng.uniform(0.3, 0.7, size=t.shape)).round(2), 0.0) for t in p.T]
    return p


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12), S=st.integers(1, 5), m=st.integers(1, 16),
       v=st.sampled_from([1, 2]), with_x=st.booleans(), p_inf=st.sampled_from([0.0, 0.1, 0.4]),
       scale=st.sampled_from([0.1, 1.0, 4.0]))
def test_dp_with_tails_equals_brute_force(seed, n, S, m, v, with_x, p_inf, scale):
    """J = P + max(0, max_k G_k - sum of W before k): solve (certificates, then labels) against
    every composition, and the label branch and bound alone started from the worst partition."""
    p = _tailed(np.random.default_rng(seed), n, S, m, v, with_x, p_inf, scale)
    got = part.solve(p)
    want = part.brute_force(p)
    if want is None:
        assert got is None
        return
    assert got is not None and got.exact
    # as test_dp_equals_brute_force, plus E: <= 5 G - W differences and one max: < 64 u
    assert got.objective == pytest.approx(want.objective, rel=f64_sum(64), abs=0)
    assert part.evaluate(p, got.bounds)[0] == got.objective
    worst = None
    for cuts in itertools.combinations(range(n - 1), S - 1):
        edges = [-1, *cuts, n - 1]
        bounds = [(edges[d] + 1, edges[d + 1]) for d in range(S)]
        J = part.evaluate(p, bounds)[0]
        if math.isfinite(J) and (worst is None or J > worst.objective):
            worst = part.Solution(J, 0.0, 0.0, bounds)
    lab = part._labels(p, worst)
    assert lab.exact and lab.objective == pytest.approx(want.objective, rel=f64_sum(64), abs=0)


def test_min_max_closed_case():
    # 6 unit layers on 3 identical stages, no links: best bottleneck 2, J = 6 + (m-1) * 2
    n, S, m = 6, 3, 5
    T = []
    for _ in range(S):
        j = np.arange(n)[:, None]
        k = np.arange(n)[None, :]
        T.append(np.where(j - k >= 0, k + 1.0, math.inf))
    p = part.Problem(n, T, np.zeros((S - 1, n)), np.zeros((S - 1, n)), m)
    sol = part.solve(p)
    assert sol.bottleneck == 2.0 and sol.objective == 6 + (m - 1) * 2
    assert sol.bounds == [(0, 1), (2, 3), (4, 5)]


_CLUSTER = """
name: mix3
topology: chain
boards:
  - {type: U250, count: 1}
  - {type: VCU118, count: 2}
"""


def _mlp(widths):
    layers = "\n".join(f"  - {{name: d{i}, type: dense, units: {w}}}" for i, w in enumerate(widths))
    return model_from_text(f"name: rnd\ninput: [{widths[0] * 2}]\nlayers:\n{layers}\n")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.sampled_from([16, 48, 96, 200, 512, 1024]), min_size=3, max_size=9),
       m=st.sampled_from([1, 2, 4, 8]), schedule=st.sampled_from(SCHEDULES), rc=st.booleans())
def test_planner_configs_match_brute_force(widths, m, schedule, rc):
    """Real stage costs (heterogeneous boards, links, stash memory) for every schedule."""
    model = _mlp(widths)
    cluster = parse_cluster(loads(_CLUSTER, "<t>"))
    ex = Explorer(model, cluster, Request(global_batch=8))
    p = 3
    v = 2 if schedule == "interleaved" else 1
    if schedule == "interleaved" and (m % p or p * v > len(widths)):
        return
    c = Config(schedule, v, 1, p, m, 8 // m, rc)
    prob = ex.problem(c, L=ex.n)
    got = part.solve(prob)
    want = part.brute_force(prob)
    assert (got is None) == (want is None)
    if want is not None:
        # the same tables priced by part.evaluate on both sides (see test_dp_equals_brute_force);
        # entries are differences of prefix sums, each off by <= 2 u x the model's time <= 2 u J
        assert got.objective == pytest.approx(want.objective, rel=f64_sum(64), abs=0)
