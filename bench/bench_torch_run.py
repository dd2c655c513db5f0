"""Benchmark: plans trained by `bapipe run --backend torch` (one CPU process per board), measured
iteration time beside the plan's prediction, the plan made from a profile measured here.

Steps: `bapipe profile MODEL cpuN.yaml --measure torch` (per-layer times in PyTorch on this
machine, and the cluster of N CPU processes with the gloo transport measured here); then
for each configuration `bapipe plan ... --profile --format fp32` (the planner's own choice,
and forced partitions/schedules) and `bapipe run --backend torch`; the table sets the
measured median iteration time beside the plan's `predicted.iteration_time_s`.

Usage: python bench/bench_torch_run.py [--model tiny-cnn] [--epochs 1] [--out bench/results/torch_run.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAPIPE = [sys.executable, "-m", "bapipe.cli"]

#: (label, extra `bapipe plan` arguments); global batch 32 everywhere
CONFIGS = (
    ("planner's choice", []),
    ("gpipe, 2 stages, m=4", ["--partition", "0-4,5-9", "--schedule", "gpipe", "--microbatches", "4"]),
    ("1f1b, 2 stages, m=4", ["--partition", "0-4,5-9", "--schedule", "1f1b", "--microbatches", "4"]),
    ("1f1b, 4 stages, m=4", ["--partition", "0-2,3-5,6-7,8-9", "--schedule", "1f1b", "--microbatches", "4"]),
    ("data parallel x2, m=1", ["--partition", "0-9x2", "--schedule", "1f1b", "--microbatches", "1"]),
)


def _bapipe(*args) -> dict:
    r = subprocess.run([*BAPIPE, *map(str, args), "--json"], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"bapipe {' '.join(map(str, args))}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def main(argv=None) -> int:
    """Profile, plan each configuration, run it on torch; print the table and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-cnn")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "torch_run.json"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bapipe-torch-bench-"))
    prof, cl = tmp / "profile.yaml", tmp / f"cpu{args.processes}.yaml"
    t0 = time.perf_counter()
    p = _bapipe("profile", args.model, cl, "--measure", "torch", "--processes", args.processes, "--batch", 8,
                "-o", prof)
    print(f"profile: {args.model} at batch 8, gloo {p['transport']['pair_Bps'] / 1e9:.2f} GB/s, "
          f"{p['transport']['latency_s'] * 1e6:.0f} us; load average {os.getloadavg()[0]:.1f}")
    rows = []
    for label, extra in CONFIGS:
        plan = tmp / f"plan{len(rows)}.yaml"
        pl = _bapipe("plan", args.model, cl, "--profile", prof, "--format", "fp32", "--global-batch", 32, *extra,
                     "-o", plan)
        r = _bapipe("run", plan, "--backend", "torch", "--epochs", args.epochs)
        rows.append({"config": label, "plan_schedule": pl.get("schedule"), "processes": r["processes"],
                     "stages": r["stages"], "replicas": r["replicas"], "microbatches": r["microbatches"],
                     "predicted_s": r["predicted_iteration_s"], "measured_s": r["measured_iteration_s"],
                     "ratio": r["measured_over_predicted"], "loss_max_rel_err": r["loss_max_rel_err"],
                     "weight_max_rel_err": r["weight_max_rel_err"], "final_loss": r["final_loss"],
                     "test_accuracy": r["test_accuracy"], "iterations": r["iterations"]})
        x = rows[-1]
        print(f"{label:<24} {x['processes']:>3} proc {x['plan_schedule']:<11} pred {x['predicted_s'] * 1e3:8.2f} ms  "
              f"meas {x['measured_s'] * 1e3:8.2f} ms  x{x['ratio']:.2f}  loss err {x['loss_max_rel_err']:.1e}  "
              f"acc {x['test_accuracy']:.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "torch_run", "model": args.model, "profile": p,
                               "wall_s": time.perf_counter() - t0, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
