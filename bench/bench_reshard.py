"""Benchmark: the resharding suite. Speedup of each strategy family over naive point-to-point
(first holder, task order) and every result's ratio to the lower bound.

Usage: python bench/bench_reshard.py [--seed N] [--out bench/results/reshard.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bapipe.planner.reshard.suite import SUITE, run_case  # noqa: E402

FAMILIES = ("p2p", "gather", "chain")


def main(argv=None) -> int:
    """Run every suite case; print a table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "reshard.json"))
    args = ap.parse_args(argv)
    rows = []
    for case in SUITE:
        t0 = time.perf_counter()
        res = run_case(case, args.seed)
        wall = time.perf_counter() - t0
        naive = next(p for p in res.plans if p.name == "p2p/first").time_s
        fam = {f: min(p.time_s for p in res.plans if p.name.startswith(f + "/")) for f in FAMILIES}
        rows.append({"case": case.name, "note": case.note, "shape": list(case.shape), "dtype": case.dtype,
                     "src": f"{case.src_mesh} {case.src}", "dst": f"{case.dst_mesh} {case.dst}",
                     "cluster": case.cluster or "default", "tasks": len(res.tasks),
                     "lower_bound_s": res.lower_bound_s, "p2p_first_s": naive, "best": res.strategy,
                     "best_s": res.time_s, "speedup_over_p2p": naive / res.time_s,
                     "ratio_to_bound": res.ratio_to_bound(), "plan_wall_s": wall,
                     "family_best_s": fam,
                     "strategies": {p.name: {"time_s": p.time_s, "ratio_to_bound": res.ratio_to_bound(p)}
                                    for p in res.plans}})
    hdr = (f"{'case':<24} {'src -> dst':<26} {'tasks':>5} {'bound ms':>9} {'p2p ms':>9} {'best ms':>9} "
           f"{'speedup':>7} {'x bound':>7}  best")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['case']:<24} {r['src'] + ' -> ' + r['dst']:<26} {r['tasks']:>5} {r['lower_bound_s'] * 1e3:>9.3f} "
              f"{r['p2p_first_s'] * 1e3:>9.3f} {r['best_s'] * 1e3:>9.3f} {r['speedup_over_p2p']:>7.2f} "
              f"{r['ratio_to_bound']:>7.3f}  {r['best']}")
    worst = max(r["ratio_to_bound"] for r in rows)
    print(f"\n{len(rows)} cases; worst best/bound {worst:.3f}; "
          f"speedup over p2p/first {min(r['speedup_over_p2p'] for r in rows):.2f}x .. "
          f"{max(r['speedup_over_p2p'] for r in rows):.2f}x")
    print("\nper family, time / bound:")
    print(f"{'case':<24} " + " ".join(f"{f:>8}" for f in FAMILIES))
    for r in rows:
        print(f"{r['case']:<24} " + " ".join(f"{r['family_best_s'][f] / r['lower_bound_s']:>8.3f}" for f in FAMILIES))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "reshard", "seed": args.seed, "cases": rows}, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
