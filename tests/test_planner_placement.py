"""planner.placement: interchangeable boards and the enumeration of every placement (issue 19).

The search's exactness over placement (tests/test_planner_bruteforce.py) rests on two claims
checked here: a permutation of boards inside their classes leaves J unchanged, bit for bit,
and :func:`placements` lists exactly one placement per class pattern.
"""
from __future__ import annotations

import itertools
import random

from bapipe.fpga_models.cluster import builtin_clusters
from bapipe.planner.placement import PLACE_WORK, PLACE_WORK_MAX, board_classes, placements, route_equivariant
from bapipe.planner.search import Config, Explorer, Request
from test_planner_bruteforce import _assignments, _instance, _least


def test_classes_of_switched_hosts_and_rings():
    """Boards of one type in one host behind a switch are interchangeable; a host mixing
    types splits; on a ring (4xU250-ring, hetero-mix) a swap moves the boards' neighbours,
    so no two boards are interchangeable."""
    rng = random.Random(7)
    _model, cl = _instance(rng)
    cls = board_classes(cl, cl.boards)
    for i, a in enumerate(cl.boards):
        for j, b in enumerate(cl.boards):
            same = (a.host, a.board.name) == (b.host, b.board.name)
            assert (cls[i] == cls[j]) == same, (i, j)
    assert len(set(cls)) < len(cls)   # seed 7 has a host of two or more boards
    for name in ("4xU250-ring", "hetero-mix"):
        c = builtin_clusters()[name]
        assert board_classes(c, c.boards) == list(range(len(c.boards))), name
    ring = builtin_clusters()["4xU250-ring"]
    names = [cb.name for cb in ring.boards]
    assert not route_equivariant(ring, names, {"fpga0": "fpga1", "fpga1": "fpga0"})


def _sorted(groups):
    return tuple(tuple(sorted(g)) for g in groups)


def test_class_swaps_keep_objective():
    """For random placements P and random permutations inside classes, the image (groups
    re-sorted by index) has the same least J as P, to the bit, on 12 random instances with
    classes of two or more boards, both recomputation choices."""
    checked = 0
    for seed in range(40):
        rng = random.Random(seed)
        model, cluster = _instance(rng)
        ex = Explorer(model, cluster, Request(schedule="1f1b", microbatches=2, global_batch=8))
        cls = board_classes(cluster, ex.boards)
        if len(set(cls)) == len(cls):
            continue
        pls = list(_assignments(ex, min(ex.n, ex.N), 4))
        for _ in range(6):
            groups = pls[rng.randrange(len(pls))]
            perm = list(range(ex.N))
            for k in set(cls):
                mem = [i for i, c in enumerate(cls) if c == k]
                shuf = mem[:]
                rng.shuffle(shuf)
                for a, b in zip(mem, shuf):
                    perm[a] = b
            image = _sorted([perm[b] for b in g] for g in groups)
            for rc in (False, True):
                a = Config("1f1b", 1, 1, len(groups), 2, 4, rc, groups=groups)
                b = Config("1f1b", 1, 1, len(groups), 2, 4, rc, groups=image)
                assert _least(ex.problem(a, L=ex.n)) == _least(ex.problem(b, L=ex.n)), (seed, groups, image)
        checked += 1
        if checked == 12:
            break
    assert checked == 12


def _pattern(groups, cls):
    return tuple(tuple(cls[b] for b in g) for g in groups)


def test_placements_one_per_pattern():
    """placements() against every assignment of boards (itertools, no symmetry): the same set
    of class patterns, each listed once, with rmax and pmax honoured; None above the limit."""
    cases = [(["A", "A", "B", "B", "B"], [0, 0, 1, 1, 1], 5, 5),
             (["A", "A", "A", "B"], [0, 0, 1, 2], 3, 2),
             (["A"] * 4, [0, 1, 2, 3], 4, 4),
             (["A", "A", "B", "A"], [0, 0, 1, 2], 4, 3)]
    for types, cls, pmax, rmax in cases:
        want = set()
        n = len(types)
        for p in range(1, pmax + 1):
            for assign in itertools.product(range(p + 1), repeat=n):   # position or p = idle
                groups = [tuple(b for b in range(n) if assign[b] == d) for d in range(p)]
                if all(groups) and all(len(g) <= rmax and len({types[b] for b in g}) == 1 for g in groups):
                    want.add(_pattern(groups, cls))
        got = placements(types, cls, pmax, rmax, 10 ** 6)
        pats = [_pattern(g, cls) for g in got]
        assert len(pats) == len(set(pats)), types
        assert set(pats) == want, types
        assert all(g == _sorted(g) for g in got)
        assert placements(types, cls, pmax, rmax, len(want) - 1) is None


def _cli(*args):
    import cli_fork
    return cli_fork.bapipe(*args)   # the console script, forked (tests/cli_fork.py)


def test_cli_reports_placement_exact_and_refuses_a_negative_limit(tmp_path):
    """`bapipe plan --json` says whether every placement was searched (tiny-cnn on 4xU250-ring:
    all of them under the default PLACE_WORK, in 1 s of CPU; tiny-mlp's search takes 3-4 s),
    `--placements 0` keeps
    the board orders; a negative count, one above PLACE_WORK_MAX, or --placements beside
    --partition exits 2 in one line naming the option."""
    import json
    r = _cli("plan", "tiny-cnn", "4xU250-ring", "--json", "-o", str(tmp_path / "a.yaml"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["placement_exact"] is True
    r = _cli("plan", "tiny-cnn", "4xU250-ring", "--placements", "0", "--json", "-o", str(tmp_path / "b.yaml"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["placement_exact"] is False
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--placements", "-1", "-o", str(tmp_path / "c.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--placements" in r.stderr
    # bounded (the patterns are held in memory), and not silently ignored beside --partition
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--placements", str(PLACE_WORK_MAX + 1), "-o", str(tmp_path / "d.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and f"0..{PLACE_WORK_MAX}" in r.stderr
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--partition", "0-2,3-6", "--placements", "10", "-o",
             str(tmp_path / "e.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--placements" in r.stderr
    assert "--partition" in r.stderr and not (tmp_path / "e.yaml").exists()
    # the help reads the constants
    r = _cli("plan", "--help")
    assert f"{PLACE_WORK}" in " ".join(r.stdout.split()) and f"{PLACE_WORK_MAX}" in " ".join(r.stdout.split())
