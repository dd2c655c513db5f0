"""Our search under the peer's cost formula (planner.peer_search, `--cost-model pipedream`):
exact against exhaustive enumeration of every flat plan, never above PipeDream's DP."""
from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path

import pytest

from bapipe.planner.peer_pipedream import Level, PeerInput, PeerStage, flat_price as price, solve
from bapipe.planner.peer_search import search

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: search vs enumeration vs DP: the same few float sums and quotients taken in a different
#: order (prefix-sum differences vs direct sums): a few ulps of the largest time
REL = 1e-12


def enumerate_flat(inp: PeerInput, levels: list[Level]) -> float:
    """Every flat plan by brute force: every partition into contiguous stages x every map of
    the boards to a stage or to idle (each stage at least one board), priced by ``price``."""
    n, N = len(inp.compute_s), levels[0].units * levels[1].units
    best = math.inf
    for k in range(n):
        for cuts in itertools.combinations(range(n - 1), k):
            bounds = list(zip((0,) + tuple(c + 1 for c in cuts), cuts + (n - 1,)))
            p = len(bounds)
            if p > N:
                continue
            for owner in itertools.product(range(p + 1), repeat=N):   # p: idle
                sets = [tuple(b for b in range(N) if owner[b] == s) for s in range(p)]
                if not all(sets):
                    continue
                best = min(best, price(inp, [PeerStage(a, b, bs) for (a, b), bs in zip(bounds, sets)], levels))
    return best


def random_instance(rng: random.Random, n_max: int, G: int, H: int) -> tuple[PeerInput, list[Level]]:
    n = rng.randint(1, n_max)
    b2 = rng.choice([1e9, 5e9, 1.2e10])
    levels = [Level(G, rng.choice([2.5e10, 5e10]) if G > 1 else math.inf), Level(H, b2)]
    inp = PeerInput(tuple(rng.uniform(0.1, 10) * 1e-3 for _ in range(n)),
                    tuple(rng.choice([0.0, rng.uniform(1, 300) * 1e6]) for _ in range(n)),
                    tuple(rng.uniform(0, 60) * 1e6 for _ in range(n - 1)))
    return inp, levels


def check(inp, levels):
    t, stages = search(inp, levels)
    want = enumerate_flat(inp, levels)
    assert t == pytest.approx(want, rel=REL)
    assert price(inp, stages, levels) == pytest.approx(t, rel=REL)   # the plan returned has that price
    used = [b for s in stages for b in s.boards]
    assert len(used) == len(set(used)) and max(used) < levels[0].units * levels[1].units
    peer_t, peer_stages = solve(inp, levels)
    # the DP now minimises the released formula (planner.peer_pipedream.price), not this one:
    # only its plan, read by this price, bounds the flat search
    assert t <= price(inp, peer_stages, levels) * (1 + REL)
    # a bound at the optimum (priced directly: a few ulps off the DP's sums) still finds it
    tb, _ = search(inp, levels, bound=price(inp, stages, levels))
    assert tb == t
    return t, peer_t


@pytest.mark.parametrize("G,H,n_max,count", [(2, 2, 5, 40), (1, 3, 5, 15), (3, 2, 3, 6), (2, 3, 3, 6)])
def test_peer_search_equals_enumeration(G, H, n_max, count):
    """67 random two-level instances (2 x 2, 3 x 1, 2 x 3 and 3 x 2 boards, up to 5 layers,
    uplink 1-12 GB/s): the search's optimum equals enumeration of every flat plan, the plan
    it returns is priced at it, and it is <= the peer's DP (and the peer's plan priced)."""
    rng = random.Random(1900 + 10 * G + H)
    for _ in range(count):
        check(*random_instance(rng, n_max, G, H))


@pytest.mark.soak
def test_peer_search_equals_enumeration_soak():
    """300 more instances, up to 6 boards and 6 layers."""
    rng = random.Random(19019)
    for _ in range(300):
        G, H = rng.choice([(2, 2), (1, 4), (3, 2), (2, 3), (1, 5)])
        check(*random_instance(rng, 6 if G * H <= 4 else 4, G, H))


def test_peer_search_beats_the_dp_where_its_space_is_larger():
    """Two hosts of two boards on a slow uplink (1 GB/s), two layers: a heavy first layer
    without weights and a light second one with 200 MB of them. The peer's DP gives each
    top-level stage whole hosts, so its best is layer 0 on host 0's two boards and layer 1 on
    host 1 (cut over the uplink: 2 x 4 MB / 1 GB/s = 8 ms) or everything on one host pair;
    ours puts layer 0 on three boards (2 + 1: uneven over the hosts) and layer 1 alone."""
    inp = PeerInput((30e-3, 4e-3), (0.0, 200e6), (4e6,))
    levels = [Level(2, 50e9), Level(2, 1e9)]
    t, stages = search(inp, levels)
    peer_t, peer_stages = solve(inp, levels)
    assert t == pytest.approx(enumerate_flat(inp, levels), rel=REL)
    # ours: layer 0 on boards 0, 1 (host 0) and 2 (host 1): (30 ms + 0 + 2 x 0) / 3 = 10 ms;
    # layer 1 alone on board 3: 4 ms; cut over the uplink 8 ms
    assert [(s.first, s.last, len(s.boards)) for s in stages] == [(0, 0, 3), (1, 1, 1)]
    assert t == pytest.approx(10e-3, rel=REL)
    assert peer_t == pytest.approx(15e-3, rel=REL)   # 0 on host 0 (30 / 2), 1 on host 1
    assert price(inp, peer_stages, levels) == pytest.approx(15e-3, rel=REL)


#: (ours, the peer's plan priced) in ms per profiled minibatch, 16xV100, printed to 6 digits
PUBLISHED = {"vgg16": (43.3179, 43.4021), "resnet50": (28.5141, 29.5867), "gnmt8": (7.23937, 7.23937)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_peer_search_on_published_profiles(name, tmp_path):
    """PipeDream's published profiles on 16xV100 (4 hosts x 4 V100): our search with the
    peer's formula is never above the peer's DP; strictly below on VGG-16 (the 3-replica
    stage one board on each of 3 hosts, the 12-replica stage 3 boards on every host) and
    ResNet-50 (4 stages: 6-3-3-4), equal on GNMT-8."""
    from peer import CLUSTER, load_case

    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.planner.peer_pipedream import cluster_levels, peer_input

    levels, _ = cluster_levels(load_cluster(CLUSTER))
    model, prof, *_ = load_case(name, tmp_path)
    inp = peer_input(model, prof)
    peer_t, peer_stages = solve(inp, levels)
    peer_priced = price(inp, peer_stages, levels)
    t, stages = search(inp, levels, bound=peer_priced)
    assert t <= peer_priced
    assert price(inp, stages, levels) == pytest.approx(t, rel=REL)
    want_ours, _want_peer = PUBLISHED[name]
    assert t * 1e3 == pytest.approx(want_ours, rel=1e-5)            # 6 printed digits
    if name == "vgg16":
        assert [s.boards for s in stages] == [(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14), (7, 11, 15), (3,)]


@pytest.mark.slow
def test_cost_model_pipedream_cli(tmp_path, capsys):
    """`bapipe plan --cost-model pipedream --json` on GNMT-8's profile: the plan is the
    search's layout, scheduled as PipeDream, priced by our model, with the formula's figures;
    options it cannot honour are refused in one line (exit 2)."""
    import json

    from peer import load_case

    from bapipe.cli import main

    _model, _prof, _meas, mp, pp = load_case("gnmt8", tmp_path)
    out = tmp_path / "p.yaml"
    rc = main(["plan", str(mp), "16xV100", "--profile", str(pp), "--cost-model", "pipedream", "--global-batch", "512",
               "--microbatches", "4",
               "-o", str(out), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    pc = res["pipedream_cost"]
    assert res["cost_model"] == "pipedream" and res["schedule"] == "pipedream"
    assert pc["plan_s"] <= pc["peer_plan_s"] <= pc["peer_dp_s"] * (1 + REL)
    assert pc["plan_s"] * 1e3 == pytest.approx(PUBLISHED["gnmt8"][0], rel=1e-5)
    assert ",".join(f"{s['layers'][0]}-{s['layers'][1]}x{len(s['boards'])}" for s in res["stages"]) == pc["plan"]
    from bapipe.planner.cli_plan import show_plan
    assert f"(--cost-model pipedream): {pc['plan']}, 7.24 ms per profiled minibatch" in show_plan(res)
    for extra, field in ((["--partition", "0-35"], "--partition"), (["--mesh", "4"], "--mesh"),
                         (["--mode", "inference"], "--cost-model")):
        rc = main(["plan", str(mp), "16xV100", "--profile", str(pp), "--cost-model", "pipedream", *extra,
                   "-o", str(tmp_path / "q.yaml")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and field in err, err
    rc = main(["plan", str(mp), "16xV100", "--cost-model", "pipedream", "-o", str(tmp_path / "q.yaml")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "add --profile" in err
    rc = main(["plan", str(mp), "4xU250-ring", "--profile", str(pp), "--cost-model", "pipedream",
               "-o", str(tmp_path / "q.yaml")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "2 hosts" in err
