"""What pricing the all-reduce, the flush and the update as built costs the default training
plans (issue 32): vgg16 and resnet50 on 4xU250-ring (and --whole-blocks).

For each: the planner's default plan now (iteration time, samples/s, and per stage the flush,
all-reduce and update seconds of fpga_models.update), the plan the planner chose before this
pricing (its partition, schedule and micro-batches, recorded below from commit 80ebb95 with
that commit's predicted time) priced again as built, and the old prediction. Prints a table
and writes bench/results/tail.json.
Usage: python bench/bench_tail.py [-o FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bapipe.fpga_models.cluster import load_cluster  # noqa: E402
from bapipe.models import load_model  # noqa: E402
from bapipe.planner.cli_plan import parse_partition  # noqa: E402
from bapipe.planner.planning import make_plan  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402

#: (model, whole blocks) -> (partition, schedule, micro-batches, predicted s) of the default plan
#: at 80ebb95, before the planner priced the tail (`bapipe plan M 4xU250-ring [--whole-blocks]`)
BEFORE = {
    ("vgg16", False): ("0-13x2,14-36x2", "1f1b", 16, 0.774524975686),
    ("vgg16", True): ("0-13x2,14-36x2", "1f1b", 16, 0.774524975686),
    ("resnet50", False): ("0-80x2,81-173x2", "1f1b", 16, 0.217286444818),
    ("resnet50", True): ("0-77x2,78-173x2", "1f1b", 16, 0.23343066451),
}


def _plan(model: str, whole: bool, **kw):
    m = load_model(model)
    if "partition" in kw:
        kw["partition"] = parse_partition(kw["partition"], len(m.layers))
    return make_plan(m, load_cluster("4xU250-ring"), model, "4xU250-ring", Request(whole_blocks=whole, **kw))


def _row(out) -> dict:
    p = out.plan
    return {"iteration_s": out.best.iteration_s, "samples_per_s": p.global_batch / out.best.iteration_s,
            "schedule": p.schedule, "microbatches": p.microbatches,
            "partition": ",".join(f"{s.first}-{s.last}x{s.replicas}" for s in p.stages),
            "stages": [{"layers": [s.first, s.last], "replicas": s.replicas, "flush_s": s.flush_s,
                        "allreduce_s": s.allreduce_s, "update_s": s.update_s} for s in p.stages]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", default=str(ROOT / "bench" / "results" / "tail.json"))
    args = ap.parse_args(argv)
    rows, t0 = [], time.perf_counter()
    for (model, whole), (part, sched, m, before) in BEFORE.items():
        now = _row(_plan(model, whole))
        old = _row(_plan(model, whole, partition=part, schedule=sched, microbatches=m))
        rows.append({"model": model, "whole_blocks": whole, "before_s": before, "default": now, "old_plan": old})
        print(f"{model:<9} {'--whole-blocks' if whole else '':<15} before {before:.4f} s | old plan as built "
              f"{old['iteration_s']:.4f} s ({old['iteration_s'] / before - 1:+.1%}) | new default "
              f"{now['iteration_s']:.4f} s ({now['iteration_s'] / before - 1:+.1%}, {now['schedule']} m={now['microbatches']} "
              f"{now['partition']})")
        for tag, r in (("old plan", old), ("default", now)):
            for s in r["stages"]:
                print(f"    {tag:<9} layers {s['layers'][0]:>3}-{s['layers'][1]:<3} x{s['replicas']}: flush "
                      f"{s['flush_s'] * 1e3:7.2f} ms  all-reduce {s['allreduce_s'] * 1e3:7.2f} ms  update "
                      f"{s['update_s'] * 1e3:7.2f} ms")
    Path(args.o).parent.mkdir(parents=True, exist_ok=True)
    Path(args.o).write_text(json.dumps({"rows": rows, "wall_s": time.perf_counter() - t0}, indent=1) + "\n")
    print(f"wrote {args.o} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
