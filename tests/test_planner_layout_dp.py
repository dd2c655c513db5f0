"""The layout DP (planner.layout_dp, planner.layouts) against enumeration, and the planner's
independence from board names and listing order (issue 35).

The DP minimises J jointly over partitions and per-stage replica counts on consecutive
blocks of a board order; every test here compares it with :func:`layout_dp.brute_force`,
which enumerates every composition of the layers x every replica vector and prices each with
:func:`layout_dp.evaluate`, so the two least values are the same float when the DP is exact.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bapipe.fpga_models.cluster import load_cluster, parse_cluster
from bapipe.planner import layout_dp as ldp
from bapipe.planner.layouts import dp_orders, layout_problem
from bapipe.planner.planning import make_plan
from bapipe.planner.search import Config, Explorer, Request, canonical_order
from bapipe.spec import model_from_text
from bapipe.yamlio import loads
from tolerances import f64_sum

#: two layouts of mathematically equal J (ties: a layer of no time moved across a cut) sum
#: their <= 3 terms a stage (time, all-reduce, cut) of <= 8 stages in different orders, each
#: term a difference of prefix sums (absolute error <= 2 u of the model's time <= 2 u J): as in
#: tests/test_planner_bruteforce.py, < 32 u per side, 64 u between the two
REL = f64_sum(64)


def _random_problem(rng: np.random.Generator) -> ldp.LayoutProblem:
    """A random problem (1-5 layers, 1-5 boards): stage times per (replicas, stage count from
    the end) with ranges that do not fit (inf) more often for longer ranges and more stashes,
    random cut and ring costs, some cuts forbidden."""
    n, N = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    R, K = int(rng.integers(1, N + 1)), int(rng.integers(1, 4))
    kind = np.full((N + 1, R + 1), R)
    for b in range(N + 1):
        for r in range(1, R + 1):
            if b + r <= N and rng.random() > 0.1:   # some blocks mix board types: no table
                kind[b, r] = r - 1
    base = rng.uniform(1, 10, size=(R, n))
    T = []
    for k in range(K):
        t = np.full((R + 1, n, n), math.inf)
        for q in range(R):
            for j in range(n):
                for ln in range(j + 1):
                    if rng.random() > 0.15 * (k + 1) * (ln + 1) / n:
                        t[q, j, ln] = base[q, j - ln:j + 1].sum() / (q + 1) ** 0.7 + rng.uniform(0, 1)
        T.append(t)
    C = rng.uniform(0, 5, size=(N + 1, R + 1, R + 1, n))
    C[..., n - 1] = math.inf
    O = C * rng.uniform(0.1, 0.5, size=C.shape)
    if rng.random() < 0.3:
        O[C > 4.5] = math.inf
        C[C > 4.5] = math.inf
    PW = bw = lat = None
    if rng.random() < 0.7:
        PW = np.concatenate([np.zeros((R, 1)), np.cumsum(rng.uniform(0, 3, size=(R, n)), axis=1)], axis=1)
        bw, lat = rng.uniform(0.5, 2, size=(N + 1, R + 1)), rng.uniform(0, 0.1, size=(N + 1, R + 1))
    return ldp.LayoutProblem(n, N, R, int(rng.choice([1, 2, 4, 16, 64])), kind, T, C, O, PW, bw, lat,
                             bool(rng.random() < 0.4))


@pytest.mark.parametrize("block", range(4))
def test_dp_equals_enumeration_on_random_problems(block):
    """200 random problems (stage counts merged at K = 1..3, per-micro-batch all-reduce or not,
    all-reduce or none, jm 1..64): the DP's least J is the enumeration's, to the bit."""
    checked = 0
    for seed in range(50 * block, 50 * block + 50):
        p = _random_problem(np.random.default_rng(seed))
        got, want = ldp.solve(p), ldp.brute_force(p)
        assert (got is None) == (want is None), seed
        if want is not None:
            assert got.objective == want.objective, (seed, got.stages, want.stages)
            assert ldp.evaluate(p, got.stages)[0] == got.objective
            checked += 1
    assert checked >= 30   # most draws have a layout that fits (measured: 47-50 a block)


def _switched(rng: random.Random, gpu: bool):
    """A random model (6 layers) and a switched cluster of 4-8 boards in 2-4 equal hosts."""
    layers = []
    for i in range(6):
        if i and rng.random() < 0.25:
            layers.append(f"  - {{name: a{i}, type: relu}}")
        else:
            layers.append(f"  - {{name: d{i}, type: dense, units: {rng.choice([64, 256, 1024, 4096])}}}")
    model = model_from_text("name: rnd\ninput: [1024]\nlayers:\n" + "\n".join(layers) + "\n")
    hosts = rng.choice([2, 4]) if gpu else rng.randint(2, 4)
    per = rng.randint(2, 8 // hosts) if 8 // hosts >= 2 else 1
    t = "V100" if gpu else rng.choice(("U250", "U280"))
    hl = []
    for h in range(hosts):
        hl.append(f"  - {{name: host{h}, boards: [{', '.join(f'b{h * per + s}' for s in range(per))}]}}")
    bl = "\n".join(f"  - {{name: b{k}, type: {t}}}" for k in range(hosts * per))
    up = rng.choice([1e9, 5e9, 12e9])
    text = (f"name: rnd\ntopology: switch\nboards:\n{bl}\nhosts:\n" + "\n".join(hl)
            + f"\nlink: {{bandwidth: {up:g}, latency: 1.0e-6}}\nswitch: {{name: sw, attach: hosts}}\n"
            + "host_link: {bandwidth: 5.0e+10, latency: 1.0e-6, kind: network}\n")
    return model, parse_cluster(loads(text, "<rnd>"))


@pytest.mark.parametrize("gpu", [True, False])
def test_dp_equals_enumeration_on_real_instances(gpu):
    """6 layers on 4-8 boards (V100s, or U250/U280 FPGAs with framed links), every board order
    the search cuts blocks from, random schedule, micro-batch count and recomputation: the
    DP's least J over partitions x replica vectors equals the enumeration's, to the bit, on
    the problem the planner builds from its own stage tables, rings and routes."""
    rng = random.Random(7 if gpu else 8)
    done = 0
    for _ in range(12):
        model, cluster = _switched(rng, gpu)
        sched = rng.choice(["1f1b", "gpipe", "eager-1f1b", "pipedream"])
        G = rng.choice([4, 8, 16])
        ex = Explorer(model, cluster, Request(schedule=sched, global_batch=G))
        m = rng.choice(ex.m_candidates(1, 1, sched))
        rc = rng.random() < 0.3
        for order in dp_orders(ex):
            got = layout_problem(ex, order, sched, m, rc)
            if got is None:
                continue
            prob = got[0]
            sol, want = ldp.solve(prob), ldp.brute_force(prob)
            assert (sol is None) == (want is None)
            if want is not None:
                assert sol.objective == pytest.approx(want.objective, rel=REL, abs=0), (sched, m, order)
                assert sol.objective >= want.objective * (1 - REL)
                done += 1
    assert done >= 12


def test_dp_objective_is_the_configurations_J():
    """J of a layout in the DP is J of the configuration it becomes (Explorer.objective with
    its groups and ranges) when it has at most one cut (a cut's own link loads are then every
    cut's), and never above it otherwise (another cut's transfers on a link only add load)."""
    rng = random.Random(3)
    same = 0
    for _ in range(6):
        model, cluster = _switched(rng, True)
        sched = rng.choice(["1f1b", "pipedream"])
        ex = Explorer(model, cluster, Request(schedule=sched, global_batch=8))
        m = rng.choice(ex.m_candidates(1, 1, sched))
        for order in dp_orders(ex):
            prob, blocks, _floor, _ends = layout_problem(ex, order, sched, m, False)
            for st in ldp.layouts(prob.n, prob.N, prob.R):
                J = ldp.evaluate(prob, st)[0]
                groups = tuple(blocks[(b, r)] for _a, _z, b, r in st)
                c = Config(sched, 1, 1, len(st), m, ex.G // m, False, groups=groups)
                Jc = ex.objective(c, [(a, z) for a, z, _b, _r in st])
                if not math.isfinite(J):
                    assert not math.isfinite(Jc)
                    continue
                assert J <= Jc * (1 + 1e-15)   # the two sum the same terms in another order
                if len(st) <= 2:
                    assert J == pytest.approx(Jc, rel=1e-15, abs=0)   # same terms, summation order
                    same += 1
    assert same > 50


def _shuffled(cluster, seed: int):
    """The same hardware as ``cluster`` (a switch of equal hosts): boards renamed, listed in a
    shuffled order, hosts shuffled."""
    rng = random.Random(seed)
    hosts = [list(h.boards) for h in cluster.hosts]
    names = [b for h in hosts for b in h]
    new = {b: f"x{k}" for k, b in enumerate(rng.sample(names, len(names)))}
    rng.shuffle(hosts)
    typ = cluster.boards[0].board.name
    d = cluster.to_dict()
    lk, hl = d["link"], d["host_link"]
    text = (f"name: shuffled\ntopology: switch\nboards:\n"
            + "\n".join(f"  - {{name: {new[b]}, type: {typ}}}" for b in rng.sample(names, len(names)))
            + "\nhosts:\n" + "\n".join(f"  - {{name: h{k}, boards: [{', '.join(new[b] for b in h)}], "
                                       f"pcie_bw: {cluster.hosts[0].pcie_bw_Bps!r}}}" for k, h in enumerate(hosts))
            + f"\nlink: {{bandwidth: {lk['bandwidth']!r}, latency: {lk['latency']!r}}}\n"
            + "switch: {name: sw, attach: hosts}\n"
            + f"host_link: {{bandwidth: {hl['bandwidth']!r}, latency: {hl['latency']!r}, kind: {hl['kind']}}}\n")
    return parse_cluster(loads(text, "<shuffled>"))


def test_canonical_order_is_host_major():
    """A switched cluster listed in any order is searched host by host."""
    cl = _shuffled(load_cluster("16xV100"), 5)
    order = canonical_order(cl, list(cl.boards))
    assert [b.name for b in order] == [b for h in cl.hosts for b in h.boards]
    assert [b.name for b in order] != [b.name for b in cl.boards]   # the listing was shuffled


@pytest.mark.parametrize("schedule", ["auto", "pipedream"])
def test_relabelled_cluster_plans_the_same_time(schedule):
    """vgg16 on 16xV100 and on two relabellings of it (names permuted, boards and hosts listed
    in shuffled orders): the same iteration time, to the bit, and the same replica counts."""
    model = "vgg16"
    base = make_plan(_model(model), load_cluster("16xV100"), model, "16xV100",
                     Request(schedule=schedule, global_batch=64))
    for seed in (1, 2):
        cl = _shuffled(load_cluster("16xV100"), seed)
        got = make_plan(_model(model), cl, model, "shuffled", Request(schedule=schedule, global_batch=64))
        assert got.best.iteration_s == base.best.iteration_s, seed
        assert [len(s.boards) for s in got.plan.stages] == [len(s.boards) for s in base.plan.stages]


def _model(name: str):
    from bapipe.models import load_model
    return load_model(name)


def test_interleaved_chunk_stashes_stop_growing_at_4p():
    """The planner clamps m to 4p for interleaved chunk stash counts (search.chunk_stashes_at):
    the walk of the op order gives the same peak for every m = 4p..12p, p <= 6, v <= 4."""
    from bapipe.planner.search import chunk_stashes_at
    from bapipe.schedules import chunk_stash_count
    for p in range(2, 7):
        for v in (2, 3, 4):
            for k in range(4, 13):
                for d in range(p):
                    for ch in range(v):
                        assert chunk_stashes_at("interleaved", p, d, k * p, v, ch) == \
                            chunk_stash_count("interleaved", p, d, k * p, v, ch), (p, v, k, d, ch)


def _one_host(n_boards: int):
    """n V100s in one host, every pair on its own NVLink (no link carries two board pairs, so
    no two cuts ever share a link: J of the layout DP is J of the configuration)."""
    bl = "\n".join(f"  - {{name: g{k}, type: V100}}" for k in range(n_boards))
    text = (f"name: onehost\ntopology: switch\nboards:\n{bl}\nhosts:\n"
            f"  - {{name: h0, boards: [{', '.join(f'g{k}' for k in range(n_boards))}]}}\n"
            "link: {bandwidth: 1.2e+10, latency: 1.0e-6}\nswitch: {name: sw, attach: hosts}\n"
            "host_link: {bandwidth: 2.5e+10, latency: 1.0e-6, kind: nvlink}\n")
    return parse_cluster(loads(text, "<onehost>"))


@pytest.mark.parametrize("schedule,m", [("1f1b", 2), ("pipedream", 1), ("gpipe", 4)])
def test_planner_least_J_equals_enumeration_on_10_boards(schedule, m):
    """6 dense layers of 256-8192 units on 10 boards (beyond every placement's 8: the search's
    layouts are its plain shapes and the layout DP's), global batch 64: the planner's least J
    equals the least J of every partition x every vector of per-stage replica counts (10
    interchangeable boards: consecutive blocks are every placement up to symmetry) x
    recomputation, each priced as a configuration; the optimum has unequal replica counts
    (2-8, 2-3-2-3, 1-2-1-1-2: no plain shape reaches it)."""
    rng = random.Random(0)
    units = [rng.choice([256, 1024, 4096, 8192]) for _ in range(6)]
    model = model_from_text("name: rnd\ninput: [4096]\nlayers:\n" + "".join(
        f"  - {{name: d{i}, type: dense, units: {u}}}\n" for i, u in enumerate(units)))
    ex = Explorer(model, _one_host(10), Request(schedule=schedule, global_batch=64, microbatches=m))
    found = ex.explore(ex.configs([schedule], list(range(1, 11)), (False, True)))
    best = min(found, key=lambda c: c.objective)
    assert len({len(ex.dev_idx(best.config, d)) for d in range(best.config.p)}) > 1
    want = math.inf
    for rc in (False, True):
        for st in ldp.layouts(ex.n, 10, 10):
            groups = tuple(tuple(range(b, b + r)) for _a, _z, b, r in st)
            c = Config(schedule, 1, 1, len(st), m, 64 // m, rc, groups=groups)
            want = min(want, ex.objective(c, [(a, z) for a, z, _b, _r in st]))
    assert math.isfinite(want)
    assert best.objective == pytest.approx(want, rel=REL, abs=0)
    assert best.objective >= want * (1 - REL)
