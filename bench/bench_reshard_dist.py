"""Benchmark: resharding executed between OS processes over torch.distributed gloo.

For every suite case and every Alpa case: the best plan and the naive baseline (p2p/first)
each run between one process per device (``planner.reshard.run.run_resharding``), bit-exact
checked, timed (median of --repeat runs), beside the model's time for the same transfers on
the gloo transport measured on this machine at the start.

Usage: python bench/bench_reshard_dist.py [--div 4] [--repeat 3] [--only NAME ...]
       [--out bench/results/reshard_dist.json]       (needs the [torch] extra)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bapipe.planner.reshard import parse_layout  # noqa: E402
from bapipe.planner.reshard.layout import parse_mesh  # noqa: E402
from bapipe.planner.reshard.run import run_resharding  # noqa: E402
from bapipe.planner.reshard.suite import ALPA_CASES, SUITE, case_network, run_case  # noqa: E402
from bapipe.planner.reshard.transport import measure_transport  # noqa: E402


def _row(case, shape, tr, repeat):
    res = run_case(case, shape=shape)
    net = case_network(case)
    ex = run_resharding(res, shape, case.dtype, parse_mesh(case.src_mesh), parse_layout(case.src),
                        parse_mesh(case.dst_mesh), parse_layout(case.dst), net.src_devices, net.dst_devices,
                        repeat=repeat, transport=tr)
    return {"case": case.name, "shape": list(shape), "src": f"{case.src_mesh} {case.src}",
            "dst": f"{case.dst_mesh} {case.dst}", "network": net.name,
            "delivered_bytes": sum(t.nbytes * len(t.receivers) for t in res.tasks), **ex}


def main(argv=None) -> int:
    """Measure the transport, run every case, print a table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--div", type=int, default=2, help="divide every dimension of the suite's shapes by this")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "reshard_dist.json"))
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    tr = measure_transport("gloo", reps=20, pairs=2)
    print(f"gloo on this machine: latency {tr.latency_s * 1e6:.0f} us (best {tr.latency_best_s * 1e6:.0f} us), "
          f"one pair {tr.pair_Bps / 1e9:.2f} GB/s (median rounds {tr.pair_median_Bps / 1e9:.2f}), "
          f"{tr.pairs} pairs at once {tr.aggregate_Bps / 1e9:.2f} GB/s; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    rows = []
    cases = [(c, tuple(max(1, d // args.div) for d in c.shape)) for c in SUITE] + [(c, c.shape) for c in ALPA_CASES]
    for case, shape in cases:
        if args.only and case.name not in args.only:
            continue
        rows.append(_row(case, shape, tr, args.repeat))
        r = rows[-1]
        print(f"{r['case']:<27} {'x'.join(map(str, shape)):>12} {r['ranks']:>3} {r['executed']:<14} "
              f"{str(r['bit_exact'] and r['naive_bit_exact']):>5} {str(r['bytes_match_plan']):>5} "
              f"{r['measured_s'] * 1e3:>9.2f} {r['model_s'] * 1e3:>9.2f} {r['copy_bound_s'] * 1e3:>9.2f} "
              f"{r['naive_measured_s'] * 1e3:>9.2f} {r['naive_model_s'] * 1e3:>9.2f} "
              f"{r['naive_measured_s'] / r['measured_s']:>6.2f} {r['naive_model_s'] / r['model_s']:>6.2f}",
              flush=True)
    print("columns: case, shape, processes, executed plan, bit-exact (both plans), bytes as planned, "
          "measured ms, model ms, copy bound ms, p2p/first measured ms, model ms, speedup measured, model")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "reshard_dist", "div": args.div, "repeat": args.repeat,
                               "transport": tr.to_dict(), "wall_s": time.perf_counter() - t_start,
                               "cases": rows}, indent=1) + "\n")
    print(f"wrote {out} ({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
