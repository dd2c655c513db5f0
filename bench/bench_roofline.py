"""Roofline benchmark (issue 34): how close the planner's default training plans come to the
boards' DSP peak, every zoo model on every FPGA cluster built in.

For each pair: planned samples/s (`bapipe plan`'s throughput, the planner's default request),
the DSP roofline (boards x physical DSP x kernel clock x MACs per DSP / training MACs per
sample; fixed16: one MAC per DSP), the fraction reached, the off-chip roofline (global batch
/ the longest DDR-busy time of a pipeline position per iteration) where it binds (below the
DSP roofline), the one limiting resource (planner.roofline.limit), the split of the boards'
time (compute includes fills) and MAC/DSP: MACs a DSP does per cycle while its engines run
(the fraction over the share of board-time spent computing). The definitions are
in docs/planner.md, "What limits a plan". Prints a table and writes
bench/results/roofline.json.
Usage: python bench/bench_roofline.py [--models a,b] [--clusters x,y] [-o FILE]
       python bench/bench_roofline.py --markdown FILE   (the BENCHMARKS.md table of a saved run)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bapipe.errors import SpecError  # noqa: E402
from bapipe.models import load_model  # noqa: E402
from bapipe.zoo import ZOO  # noqa: E402
from bapipe.fpga_models.cluster import builtin_clusters  # noqa: E402
from bapipe.planner.cli_plan import limits  # noqa: E402
from bapipe.planner.planning import make_plan  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402


def fpga_clusters() -> dict:
    """The built-in clusters whose boards are all FPGAs (the DSP roofline counts DSPs)."""
    return {n: c for n, c in builtin_clusters().items() if all(cb.board.kind == "fpga" for cb in c.boards)}


def run_one(model_name: str, cluster_name: str, cluster) -> dict:
    """Plan one pair with the default request; its roofline figures and limit."""
    row = {"model": model_name, "cluster": cluster_name}
    t0 = time.perf_counter()
    try:
        out = make_plan(load_model(model_name), cluster, model_name, cluster_name, Request())
    except SpecError as e:
        row["infeasible"] = str(e)
        return row
    lim = limits(out)
    roof = lim["roofline"]
    T = out.best.iteration_s
    row.update({"wall_s": time.perf_counter() - t0, "schedule": out.plan.schedule,
                "microbatches": out.plan.microbatches, "stages": len(out.plan.stages),
                "iteration_time_s": T, "samples_per_s": roof["throughput_samples_per_s"],
                "macs_per_sample": roof["macs_per_sample"],
                "dsp_roofline": roof["dsp_roofline_samples_per_s"], "fraction": roof["fraction"],
                "offchip_roofline": roof["offchip_roofline_samples_per_s"], "offchip_fraction": roof["offchip_fraction"],
                "bound": roof["bound"], "limit": lim["limit"]["resource"], "limit_part": lim["limit"]["part"],
                "limit_where": lim["limit"]["where"],
                # shares of the whole cluster's time (positions weighted by their boards)
                "split": _cluster_split(lim["breakdown"], T)})
    # MACs a DSP does per cycle while its engines run (compute + fills), over every board of
    # the roofline: the fraction is this times the share of board-time spent computing
    busy = sum((q["compute_s"] + q["fills_s"]) * len(q["boards"]) for q in lim["breakdown"]) / T
    row["mac_per_dsp_busy"] = roof["fraction"] * roof["boards"] / busy if busy and roof["fraction"] else None
    return row


def _cluster_split(positions: list[dict], T: float) -> dict:
    """Each part's share of the boards' time: positions weighted by how many boards they hold."""
    keys = ("compute_s", "fills_s", "offchip_s", "link_s", "allreduce_s", "update_s", "bubble_s")
    n = sum(len(q["boards"]) for q in positions)
    return {k[:-2]: sum(q[k] * len(q["boards"]) for q in positions) / (n * T) for k in keys}


def _num(x, fmt="{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(rows: list[dict]) -> str:
    """The table of a run as BENCHMARKS.md shows it."""
    out = ["| model | cluster | samples/s | DSP roofline | fraction | off-chip roofline (binds) | of it | limit "
           "| compute | off-chip | link | all-reduce | bubble | MAC/DSP busy |",
           "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "infeasible" in r:
            out.append(f"| {r['model']} | {r['cluster']} | does not fit | | | | | | | | | | | |")
            continue
        binds = r["bound"] == "offchip"
        sp = r["split"]
        out.append(f"| {r['model']} | {r['cluster']} | {r['samples_per_s']:.4g} | {r['dsp_roofline']:.4g} "
                   f"| {r['fraction']:.1%} | {format(r['offchip_roofline'], '.4g') if binds else '-'} "
                   f"| {format(r['offchip_fraction'], '.1%') if binds else '-'} | {r['limit']} "
                   f"| {sp['compute'] + sp['fills']:.1%} | {sp['offchip']:.1%} | {sp['link']:.1%} "
                   f"| {sp['allreduce']:.1%} | {sp['bubble']:.1%} | {_num(r.get('mac_per_dsp_busy'), '{:.2f}')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    """Run the sweep, print the table, write the JSON (or print a saved run's markdown)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--clusters", default=",".join(fpga_clusters()))
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "roofline.json"))
    ap.add_argument("--markdown", metavar="FILE", help="print the markdown table of a saved run and stop")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())["rows"]))
        return 0
    clusters = builtin_clusters()
    print(f"{'model':<12} {'cluster':<16} {'samples/s':>10} {'DSP roof':>10} {'fraction':>8} {'DDR roof':>10} "
          f"{'of DDR':>7} {'limit':<10} {'compute':>7} {'off-chip':>8} {'link':>6} {'allred':>6} {'bubble':>6} {'MAC/DSP':>7}")
    rows = []
    t_all = time.perf_counter()
    for mname in args.models.split(","):
        for cname in args.clusters.split(","):
            row = run_one(mname, cname, clusters[cname])
            rows.append(row)
            if "infeasible" in row:
                print(f"{mname:<12} {cname:<16} infeasible: {row['infeasible'][:90]}")
                continue
            binds = row["bound"] == "offchip"
            sp = row["split"]
            print(f"{mname:<12} {cname:<16} {_num(row['samples_per_s']):>10} {_num(row['dsp_roofline']):>10} "
                  f"{row['fraction']:>8.1%} {_num(row['offchip_roofline'] if binds else None):>10} "
                  f"{(format(row['offchip_fraction'], '.1%') if binds else '-'):>7} {row['limit']:<10} "
                  f"{sp['compute'] + sp['fills']:>7.1%} {sp['offchip']:>8.1%} {sp['link']:>6.1%} "
                  f"{sp['allreduce']:>6.1%} {sp['bubble']:>6.1%} {_num(row['mac_per_dsp_busy'], '{:.2f}'):>7}",
                  flush=True)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "wall_s": time.perf_counter() - t_all}, indent=1) + "\n")
    print(f"wrote {out} ({time.perf_counter() - t_all:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
