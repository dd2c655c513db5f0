"""`bapipe plan --schedule S` labels: over a grid of (model, cluster, schedule, partition or
searched), the plan's schedule is the one asked for, or the command refuses in one line
(SpecError, exit 2); every searched plan reports the "fewer_boards" baseline (a plan or the
reason there is none). Prints one line per case and a summary; exit 1 on any violation.
Usage: python bench/planner_labels.py [--json] [--models a,b] [--clusters x,y]
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
from bapipe.schedules import SCHEDULES  # noqa: E402
from bapipe.models import load_model
from bapipe.fpga_models.cluster import builtin_clusters  # noqa: E402
from bapipe.planner.cli_plan import parse_partition  # noqa: E402
from bapipe.planner.planning import make_plan, summary  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402

MODELS = ("tiny-mlp", "tiny-cnn", "vgg16")
CLUSTERS = ("4xU250-ring", "hetero-mix", "16xV100")


def split(n: int, p: int) -> str:
    """A --partition of n layers into p ranges of near-equal length: '0-2,3-6'."""
    cuts = [round(n * i / p) for i in range(p + 1)]
    return ",".join(f"{a}-{b - 1}" for a, b in zip(cuts, cuts[1:]))


def one_case(model, mname: str, cname: str, cluster, sched: str, partition: str | None) -> dict:
    req = Request(schedule=sched, partition=parse_partition(partition, len(model.layers)) if partition else None)
    row = {"model": mname, "cluster": cname, "schedule": sched, "partition": partition}
    t0 = time.process_time()
    try:
        res = summary(make_plan(model, cluster, mname, cname, req))
    except SpecError as e:
        msg = str(e)
        row.update(refused=msg, ok="\n" not in msg and bool(msg.strip()))
    else:
        row.update(got=res["schedule"], ok=sched in ("auto", res["schedule"]))
        if sched == "auto":
            row["ok"] = res["schedule"] in SCHEDULES and res["schedule"] not in ("2bw", "pipedream")
        if partition is None:
            fb = res["baselines"].get("fewer_boards")
            row["fewer_boards"] = "missing" if fb is None else ("infeasible" if "infeasible" in fb else "plan")
            row["ok"] = row["ok"] and fb is not None
    row["cpu_s"] = time.process_time() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    clusters = builtin_clusters()
    rows = []
    for mname in args.models.split(","):
        model = load_model(mname)
        for cname in args.clusters.split(","):
            for sched in ("auto",) + tuple(SCHEDULES):
                for partition in (None, split(len(model.layers), 2), split(len(model.layers), 4)):
                    r = one_case(model, mname, cname, clusters[cname], sched, partition)
                    rows.append(r)
                    if not args.json:
                        what = f"-> {r['got']}" if "got" in r else f"refused: {r['refused']}"
                        fb = f" fewer_boards {r['fewer_boards']}" if "fewer_boards" in r else ""
                        print(f"{'ok ' if r['ok'] else 'BAD'} {mname:<9} {cname:<12} {sched:<11} "
                              f"{partition or 'searched':<16} {what}{fb} ({r['cpu_s']:.2f} s)", flush=True)
    bad = [r for r in rows if not r["ok"]]
    out = {"cases": len(rows), "violations": len(bad), "refused": sum("refused" in r for r in rows),
           "cpu_s": sum(r["cpu_s"] for r in rows), "rows": rows}
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"{len(rows)} cases, {out['refused']} refused in one line, {len(bad)} violations, "
              f"{out['cpu_s']:.1f} s CPU")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
