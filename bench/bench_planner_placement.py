"""The search's placement gap under our own cost model (issue 19, item 2).

tests/test_planner_bruteforce.py holds the search equal to an enumeration that cuts replica
groups as consecutive blocks of the search's own two board orders (topology and
host-interleaved). This bench enumerates every placement instead: every ordered choice of
disjoint board groups, one per stage (any boards, boards left idle), priced from the same
planner tables (``Explorer.problem`` and the exhaustive partition of
tests/test_planner_bruteforce.py), on the same random hierarchical instances (<= 10 layers,
2-4 hosts, heterogeneous boards, slow uplink), up to MAX_BOARDS boards (the enumeration grows
as N! x 2^N). A ratio above 1 is a plan the search misses.
Usage: python bench/bench_planner_placement.py [--seeds 0:100] [--json out.json]
(default JSON: bench/results/planner_placement.json)
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bapipe.planner.search import Config, Explorer, Request  # noqa: E402
from test_planner_bruteforce import _instance, _least, _vectors  # noqa: E402

MAX_BOARDS = 6
SCHEDULES = ("gpipe", "1f1b", "eager-1f1b", "2bw", "pipedream")


def placements(n_boards: int, vec: tuple[int, ...]):
    """Every ordered tuple of disjoint board groups with the sizes ``vec``."""
    def rec(avail: frozenset, k: int):
        if k == len(vec):
            yield ()
            return
        for g in itertools.combinations(sorted(avail), vec[k]):
            for rest in rec(avail - set(g), k + 1):
                yield (g,) + rest
    yield from rec(frozenset(range(n_boards)), 0)


def best_placement(ex: Explorer, schedule: str, m: int):
    """(least J, its groups) over every placement, partition and recomputation choice."""
    best, arg = math.inf, None
    mb = ex.G // m
    for vec in _vectors(ex.N, min(ex.n, ex.N)):
        if max(vec) > mb or (schedule == "2bw" and m < len(vec)):
            continue
        for groups in placements(ex.N, vec):
            for rc in (False, True):
                c = Config(schedule, 1, 1, len(vec), m, mb, rc, groups=groups)
                if any(ex.stage_type(c, d) is None for d in range(len(vec))):
                    continue
                v = _least(ex.problem(c, L=ex.n))
                if v < best:
                    best, arg = v, groups
    return best, arg


def case(seed: int, limit: int | None = None) -> dict | None:
    """One random instance: the search's objective (``limit``: its placement limit, None the
    default PLACE_WORK patterns x (schedule, m) pairs, 0 only the board orders) against every
    placement's."""
    rng = random.Random(seed)
    model, cluster = _instance(rng)
    schedule = rng.choice(SCHEDULES)
    G = rng.choice([4, 8, 12])
    m = rng.choice([d for d in (1, 2, 4, 6, 8) if G % d == 0])
    ex = Explorer(model, cluster, Request(schedule=schedule, microbatches=m, global_batch=G,
                                          placement_limit=limit))
    if ex.N > MAX_BOARDS:
        return None
    found = ex.explore(ex.configs([schedule], list(range(1, ex.N + 1)), (False, True)))
    got = found[0].objective if found else math.inf
    want, groups = best_placement(ex, schedule, m)
    boards = [f"{cb.name}:{cb.board.name}@{cb.host}" for cb in ex.boards]
    mine = [list(ex.dev_idx(found[0].config, d)) for d in range(found[0].config.p)] if found else None
    return {"seed": seed, "schedule": schedule, "boards": boards, "search_J": got, "every_placement_J": want,
            "ratio": (got / want) if math.isfinite(want) and want > 0 else 1.0, "exact": ex.placement_exact,
            "search_groups": mine, "best_groups": [list(g) for g in groups] if groups else None}


def main() -> int:
    """Print one row per instance and a summary; write JSON when asked."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:100", help="a:b, the instance seeds (default 0:100)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "planner_placement.json"),
                    help="write the rows and summary here (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None,
                    help="the search's placement limit (default PLACE_WORK, patterns x (schedule, m) pairs; "
                         "0: board orders only)")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.seeds.split(":"))
    rows, t0 = [], time.process_time()
    print(f"{'seed':>4} {'schedule':<10} {'N':>2} {'exact':>5} {'search J':>11} {'every placement':>15} {'ratio':>7}  "
          f"search's groups / best groups")
    for seed in range(lo, hi):
        r = case(seed, a.limit)
        if r is None:
            continue
        rows.append(r)
        miss = r['ratio'] > 1 + 1e-9
        print(f"{r['seed']:>4} {r['schedule']:<10} {len(r['boards']):>2} {str(r['exact']):>5} {r['search_J']:>11.5g} "
              f"{r['every_placement_J']:>15.5g} {r['ratio']:>7.4f}  "
              f"{(str(r['search_groups']) + ' / ' + str(r['best_groups'])) if miss else ''}")
    # 1e-9: the two sides sum the same stage times in different orders (f64 rounding, far below)
    missed = [r for r in rows if r["ratio"] > 1 + 1e-9]
    summary = {"instances": len(rows), "search_misses": len(missed), "limit": a.limit,
               "exact_instances": sum(1 for r in rows if r["exact"]),
               "worst_ratio": max((r["ratio"] for r in rows), default=1.0), "cpu_s": time.process_time() - t0}
    print(f"instances {summary['instances']} ({summary['exact_instances']} searched over every placement), the "
          f"search misses a faster placement on {summary['search_misses']}, worst {summary['worst_ratio']:.4f}x, "
          f"{summary['cpu_s']:.1f} s CPU")
    Path(a.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
