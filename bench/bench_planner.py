"""Planner benchmark: every zoo model on every built-in cluster.

Prints a table (plan vs data parallel, equal-layer GPipe, best without replication, best on
fewer boards, lower bound; planner wall time and peak Python memory) and writes
bench/results/planner.json. The plan's time is its steady iteration (PipeDream-2BW runs
without a flush; the other schedules' steady and first iterations are equal).
"vs old" divides the plan time recorded before issue 19 (bench/planner_before.json, the
2026-11-22 table to 4 digits) by today's: above 1.00x today's plan is faster.
Usage: python bench/bench_planner.py [--models a,b] [--clusters x,y] [--before FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bapipe.errors import SpecError  # noqa: E402
from bapipe.models import load_model
from bapipe.zoo import ZOO  # noqa: E402
from bapipe.fpga_models.cluster import builtin_clusters  # noqa: E402
from bapipe.planner.planning import make_plan, summary  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402


def run_one(model_name: str, cluster_name: str, cluster, trace: bool = False) -> dict:
    """Plan one pair; wall time, CPU time and (``trace``) peak traced memory of the planner."""
    model = load_model(model_name)
    if trace:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        res = summary(make_plan(model, cluster, model_name, cluster_name, Request()))
        err = None
    except SpecError as e:
        res, err = None, str(e)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
    row = {"model": model_name, "cluster": cluster_name, "wall_s": wall, "cpu_s": cpu, "peak_bytes": peak}
    if res is None:
        row["infeasible"] = err
        return row
    b = res["baselines"]
    row.update({k: res[k] for k in ("iteration_time_s", "throughput_samples_per_s", "schedule", "microbatches",
                                   "replicas", "recompute", "lower_bound_s", "speedup_vs_data_parallel")})
    row["stages"] = len(res["stages"])
    row["boards_used"] = res.get("boards_used", len({x for s in res["stages"] for x in s["boards"]}))
    row["styles"] = sorted({s["style"] for s in res["stages"]})
    for k in ("data_parallel", "equal_split", "no_replication", "fewer_boards"):
        row[k] = b[k].get("iteration_time_s", "infeasible") if k in b else "n/a"
    return row


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def main(argv=None) -> int:
    """Run the sweep, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--clusters", default=",".join(builtin_clusters()))
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "bapipe.planner.json"))
    ap.add_argument("--before", default=str(ROOT / "bench" / "planner_before.json"),
                    help="earlier plan times to compare with ('vs old': old time / new time); '' for none")
    args = ap.parse_args(argv)
    before = json.loads(Path(args.before).read_text())["plans"] if args.before else {}
    clusters = builtin_clusters()
    rows = []
    hdr = (f"{'model':<12} {'cluster':<16} {'plan s':>10} {'sched':<11} {'m':>4} {'r':>11} {'bds':>3} {'vs old':>7} "
           f"{'vs DP':>7} {'vs equal':>8} {'vs norep':>8} {'vs fewer':>8} {'LB/plan':>7} {'wall s':>7} {'cpu s':>6}")
    print(hdr)
    t_all = time.perf_counter()
    for mn in args.models.split(","):
        for cn in args.clusters.split(","):
            r = run_one(mn, cn, clusters[cn])
            rows.append(r)
            if "infeasible" in r:
                print(f"{mn:<12} {cn:<16} infeasible: {r['infeasible'][:90]} ({r['wall_s']:.2f} s)")
                continue
            t = r["iteration_time_s"]
            ratio = lambda k: f"{r[k] / t:.2f}x" if isinstance(r[k], float) else "-"  # noqa: E731
            reps = r["replicas"] if isinstance(r["replicas"], int) else "-".join(map(str, r["replicas"]))
            old = (before.get(f"{mn} {cn}") or {}).get("iteration_time_s")
            r["before_s"] = old
            vs_old = f"{old / t:.2f}x" if old else "-"
            print(f"{mn:<12} {cn:<16} {t:>10.4g} {r['schedule']:<11} {r['microbatches']:>4} {str(reps):>11} "
                  f"{r['boards_used']:>3} {vs_old:>7} {ratio('data_parallel'):>7} {ratio('equal_split'):>8} "
                  f"{ratio('no_replication'):>8} {ratio('fewer_boards'):>8} "
                  f"{r['lower_bound_s'] / t:>7.2f} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f}",
                  flush=True)
    total = time.perf_counter() - t_all
    print(f"sweep: {len(rows)} pairs in {total:.1f} s wall, {sum(r['cpu_s'] for r in rows):.1f} s cpu")
    # the headline case again, with tracemalloc (slows it down) for peak memory
    g = run_one("gpt3-175b", "64xU55C", clusters["64xU55C"], trace=True) if "64xU55C" in clusters else None
    if g is not None:
        print(f"gpt3-175b on 64xU55C: peak traced memory {g['peak_bytes'] / 2**20:.0f} MB "
              f"(wall {g['wall_s']:.2f} s with tracing)")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"rows": rows, "sweep_wall_s": total, "sweep_cpu_s":
                                             sum(r["cpu_s"] for r in rows), "gpt3_64xU55C_traced": g},
                                            indent=1, default=_fmt) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
