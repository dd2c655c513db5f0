"""Plan time and J of the planner with the per-iteration tail inside the partition search
(issue 35, session 14): gpt3-175b on 64xU55C, vgg16 and resnet50 on 4xU250-ring.

Each case runs ``bapipe plan MODEL CLUSTER --json -o FILE`` as a child process ``--repeat``
times and keeps the least wall and CPU (user + system of the child) time; the plan file gives
J (``predicted.objective_s``), the replayed steady iteration time, the schedule, m and the
stages. ``--bapipe`` names the console script to time (another tree's, for a before/after).
Prints a table and writes bench/results/plan_exact.json (or ``-o``).
Usage: python bench/bench_plan_exact.py [--bapipe PATH] [--repeat N] [-o FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CASES = [("gpt3-175b", "64xU55C"), ("vgg16", "4xU250-ring"), ("resnet50", "4xU250-ring")]


def run(bapipe: str, model: str, cluster: str) -> dict:
    """One child run: wall and CPU seconds and the plan's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.yaml")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([bapipe, "plan", model, cluster, "--json", "-o", out], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(f"{model} {cluster}: exit {r.returncode}: {r.stderr.strip()}")
        plan = yaml.safe_load(Path(out).read_text())
    pred = plan["predicted"]
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "objective_s": pred["objective_s"], "steady_s": pred["steady_iteration_time_s"],
            "exact_partition": pred.get("exact_partition"), "schedule": plan["schedule"],
            "microbatches": plan["microbatches"],
            "stages": ",".join(f"{s['first']}-{s['last']}x{s['replicas']}" for s in plan["stages"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bapipe", default=str(ROOT / ".venv" / "bin" / "bapipe"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "plan_exact.json"))
    a = ap.parse_args()
    rows = []
    for model, cluster in CASES:
        runs = [run(a.bapipe, model, cluster) for _ in range(a.repeat)]
        row = dict(runs[0], model=model, cluster=cluster, wall_s=min(x["wall_s"] for x in runs),
                   cpu_s=min(x["cpu_s"] for x in runs), load=os.getloadavg()[0])
        rows.append(row)
        print(f"{model:10s} {cluster:12s} wall {row['wall_s']:6.2f} s  cpu {row['cpu_s']:6.2f} s  "
              f"J {row['objective_s']:.6g} s  steady {row['steady_s']:.6g} s  {row['schedule']} m={row['microbatches']} "
              f"{row['stages']}  exact={row['exact_partition']}  load {row['load']:.1f}", flush=True)
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps({"bapipe": a.bapipe, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
