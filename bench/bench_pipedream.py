"""BaPipe's planner against PipeDream's plans, all priced by BaPipe's own model (issue 35).

For PipeDream's published V100 profiles (tests/fixtures/pipedream: VGG-16, ResNet-50,
GNMT-8) on two clusters of 4 hosts x 4 V100 (the built-in 16xV100; PipeDream's Cluster-A,
examples/pipedream/cluster-a.yaml), at global batch 128 and 2048 and schedule auto and
pipedream: `bapipe plan`'s time per sample against, priced by the same model through
`--partition A-B@boards` (its best micro-batch count and recomputation):

- ``released``: the plan of PipeDream's released optimizer (msr-fiddle/pipedream,
  optimizer/optimizer_graph_hierarchical.py, run by planner.peer_released on the same
  profile; found by --pipedream DIR or $BAPIPE_PIPEDREAM, the row is left out without one);
- ``shipped``: the configurations PipeDream ships for 16 GPUs
  (runtime/image_classification/models/*/gpus=16/hybrid_conf.json): VGG-16 15-1 (ranks 0-14
  run the convolutions, layers 0-32 here, nodes 2-34; rank 15 the classifier), ResNet-50
  8-4-4 with ranks {0,1,4,5,8,9,12,13}, {2,6,10,14}, {3,7,11,15} (two boards of every host,
  then one, then one) cut after the shipped stage files' 66 and 51 operations (layers 0-65,
  66-116, 117-175 here). Ranks are host-major (rank 4h + s is board s of host h).
- ``relabelled``: `bapipe plan` on the same cluster with its boards renamed and listed in a
  shuffled order, hosts shuffled (the plan's time must not move).

"peer / ours" >= 1: ours at least as fast. Usage: python bench/bench_pipedream.py
[--pipedream DIR] [--models vgg16,resnet50,gnmt8] [--clusters 16xV100,cluster-a]
[--batches 128,2048] [--schedules auto,pipedream] [--markdown] [-o bench/results/pipedream.json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer import CASES, CLUSTERS, FIXTURES, load_case  # noqa: E402
from bapipe.fpga_models.cluster import load_cluster  # noqa: E402
from bapipe.planner.peer_pipedream import RELEASED, cluster_levels  # noqa: E402
from bapipe.planner.peer_released import (boards_of_plan, find_optimizer, parse_output, plan_of,  # noqa: E402
                                          run_optimizer, stage_ids, stage_ranges)
from bapipe.planner.planning import make_plan  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402

BATCHES = (128, 2048)
SCHEDULES = ("auto", "pipedream")
#: shipped 16-GPU configurations: per stage (first layer, last layer, host-major ranks)
SHIPPED = {
    "vgg16": [(0, 32, tuple(range(15))), (33, 39, (15,))],
    "resnet50": [(0, 65, (0, 1, 4, 5, 8, 9, 12, 13)), (66, 116, (2, 6, 10, 14)), (117, 175, (3, 7, 11, 15))],
}


def host_major(cluster) -> list[str]:
    """Board names host-major (rank 4h + s is board s of host h)."""
    return [b for h in cluster.hosts for b in h.boards]


def relabelled(cluster, path: Path, seed: int = 1) -> Path:
    """A cluster YAML of the same hardware: boards renamed r0.., listed shuffled, hosts shuffled."""
    rng = random.Random(seed)
    d = cluster.to_dict()
    hosts = [list(h.boards) for h in cluster.hosts]
    names = [b for h in hosts for b in h]
    new = {b: f"r{k}" for k, b in enumerate(rng.sample(names, len(names)))}
    rng.shuffle(hosts)
    listing = rng.sample(names, len(names))
    typ = cluster.boards[0].board.name
    lines = [f"name: {cluster.name}-relabelled", "topology: switch", "boards:"]
    lines += [f"- {{name: {new[b]}, type: {typ}}}" for b in listing]
    lines.append("hosts:")
    for k, h in enumerate(hosts):
        src = next(x for x in cluster.hosts if x.boards[0] == h[0])
        lines += [f"- name: h{k}", f"  boards: [{', '.join(new[b] for b in h)}]",
                  f"  pcie_bw: {src.pcie_bw_Bps!r}", f"  pcie_latency: {src.pcie_latency_s!r}"]
    p = d.get("link", {})
    lines.append(f"link: {{bandwidth: {p['bandwidth']!r}, latency: {p['latency']!r}, kind: {p['kind']}}}")
    lines.append(f"switch: {{name: {d['switch']['name']}, attach: hosts}}")
    hl = d["host_link"]
    lines.append(f"host_link: {{bandwidth: {hl['bandwidth']!r}, latency: {hl['latency']!r}, kind: {hl['kind']}}}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def released_spec(name: str, cname: str, root: Path, tmp: Path):
    """The released optimizer's plan as --partition stages (first, last, replicas, boards)."""
    cluster = load_cluster(CLUSTERS[cname])
    names = [b.name for b in cluster.boards]
    levels, cols = cluster_levels(cluster)
    units = levels[0].units
    text, graph = run_optimizer(root, FIXTURES / CASES[name][0] / "graph.txt", levels, tmp / f"{name}-{cname}",
                                RELEASED)
    printed = parse_output(text)
    model = load_case(name, tmp, graph)[0]
    top = plan_of(printed, stage_ranges(model, stage_ids(graph.read_text(encoding="utf-8"))))
    return [(f, l, len(b), tuple(names[cols[x // units][x % units]] for x in b))
            for f, l, b in boards_of_plan(top, units)]


def shipped_spec(name: str, cluster):
    """A shipped configuration as --partition stages, or None."""
    if name not in SHIPPED:
        return None
    hm = host_major(cluster)
    return [(f, l, len(ranks), tuple(hm[k] for k in ranks)) for f, l, ranks in SHIPPED[name]]


def price(model, cluster, mp, cname, meas, G, sched, spec):
    """(seconds per sample, plan text, CPU s) of `bapipe plan` (spec None) or a --partition."""
    t0 = time.process_time()
    out = make_plan(model, cluster, str(mp), cname, Request(schedule=sched, measured=meas, global_batch=G,
                                                            partition=spec))
    st = out.plan.stages
    text = ",".join(f"{s.first}-{s.last}x{len(s.boards)}" for s in st) + f" {out.plan.schedule} m={out.plan.microbatches}"
    return out.best.iteration_s / G, text, time.process_time() - t0


def run_case(name: str, cname: str, root: Path | None, tmp: Path, batches, schedules) -> list[dict]:
    """Every (batch, schedule) row of one model on one cluster."""
    cluster = load_cluster(CLUSTERS[cname])
    model, _prof, meas, mp, _pp = load_case(name, tmp)
    rel_path = relabelled(cluster, tmp / f"{cname}-relabelled.yaml")
    rel = load_cluster(str(rel_path))
    peers = {}
    if root is not None:
        peers["released"] = released_spec(name, cname, root, tmp)
    if shipped_spec(name, cluster) is not None:
        peers["shipped"] = shipped_spec(name, cluster)
    rows = []
    for G in batches:
        for sched in schedules:
            ours, otext, ocpu = price(model, cluster, mp, cname, meas, G, sched, None)
            rl, rtext, _c = price(model, rel, mp, str(rel_path), meas, G, sched, None)
            row = {"model": name, "cluster": cname, "G": G, "schedule": sched, "ours_s": ours, "our_plan": otext,
                   "cpu_s": ocpu, "relabelled_s": rl, "relabelled_plan": rtext, "peers": {}}
            for kind, spec in peers.items():
                ps, ptext, _c = price(model, cluster, mp, cname, meas, G, sched, spec)
                row["peers"][kind] = {"s": ps, "plan": ptext, "peer_over_ours": ps / ours}
            rows.append(row)
            print(f"{name} {cname} G={G} {sched}: ours {ours * 1e3:.4f} ms/sample ({otext}, {ocpu:.1f} s)"
                  + "".join(f"; {k} {v['s'] * 1e3:.4f} ({v['peer_over_ours']:.3f}x)" for k, v in row["peers"].items())
                  + f"; relabelled {rl * 1e3:.4f}", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    """The BENCHMARKS.md table: ms/sample, ratio peer / ours."""
    head = ["model", "cluster", "G", "schedule", "ours (ms/sample)", "our plan", "released optimizer's plan",
            "shipped plan", "relabelled cluster", "plan CPU s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["cluster"], str(r["G"]), r["schedule"], f"{r['ours_s'] * 1e3:.4f}", r["our_plan"]]
        for k in ("released", "shipped"):
            p = r["peers"].get(k)
            cells.append(f"{p['s'] * 1e3:.4f} ({p['peer_over_ours']:.3f}x) {p['plan']}" if p else "-")
        cells.append(f"{r['relabelled_s'] * 1e3:.4f}" + ("" if r["relabelled_s"] == r["ours_s"] else " (moved)"))
        cells.append(f"{r['cpu_s']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipedream", default=None, help="msr-fiddle/pipedream checkout (default: $BAPIPE_PIPEDREAM)")
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--markdown", action="store_true", help="print the BENCHMARKS.md table")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "pipedream.json"))
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    for opt, got, allowed in (("--models", models, CASES), ("--clusters", clusters, CLUSTERS)):
        bad = [m for m in got if m not in allowed]
        if bad:
            print(f"bench/bench_pipedream.py: {opt}: expected some of {', '.join(allowed)}, got {bad[0]!r}",
                  file=sys.stderr)
            return 2
    root = find_optimizer(args.pipedream)
    if root is None:
        print("bench/bench_pipedream.py: PipeDream's optimizer not found (--pipedream or BAPIPE_PIPEDREAM): "
              "the released optimizer's plans are left out", file=sys.stderr)
    batches = tuple(int(b) for b in args.batches.split(","))
    scheds = tuple(s.strip() for s in args.schedules.split(",") if s.strip())
    t0 = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for m in models for c in clusters for r in run_case(m, c, root, Path(tmp), batches, scheds)]
    losses = [(r["model"], r["cluster"], r["G"], r["schedule"], k) for r in rows for k, p in r["peers"].items()
              if p["peer_over_ours"] < 1]
    moved = [(r["model"], r["cluster"], r["G"], r["schedule"]) for r in rows if r["relabelled_s"] != r["ours_s"]]
    out = {"pipedream": str(root) if root else None, "rows": rows, "losses": losses, "relabel_moved": moved,
           "cpu_s": time.process_time() - t0}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(markdown(rows) if args.markdown else json.dumps(out, sort_keys=True))
    print(f"{len(rows)} rows, {sum(len(r['peers']) for r in rows)} peer plans, {len(losses)} faster than ours, "
          f"{len(moved)} moved by relabelling, {out['cpu_s']:.1f} s CPU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
