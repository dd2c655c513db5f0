"""BaPipe's planner against PipeDream's released optimizer, both plans priced both ways.

The peer is msr-fiddle/pipedream's optimizer/optimizer_graph_hierarchical.py itself (MIT
licence, not in this repository): a checkout is found with --pipedream PATH or the
BAPIPE_PIPEDREAM environment variable (the repository root); without one the benchmark says
so on stderr and exits 0 having measured nothing. It runs on PipeDream's published profiles
(tests/fixtures/pipedream: VGG-16 and ResNet-50 at 128 images, GNMT-8 at 32 sentences) with
`-n 4 4 -b B1 B2 --activation_compression_ratio 1` (the activations' transfer counted, as
in the paper) on two clusters of 4 hosts x 4 V100: the built-in 16xV100 (NVLink 50 GB/s in a
host, 12 GB/s between hosts) and PipeDream's Cluster-A (examples/pipedream/cluster-a.yaml:
PCIe 12 GB/s in a server, 10 GbE between servers).

Per (model, cluster): the optimizer's printout is replayed (planner.peer_released: every
printed time recomputed from the imported profile); its plan (read from its -o graph, whose
stages import as contiguous layer ranges) is priced by our model through `--partition
A-B@boards` (schedule auto and pipedream, global batch 128 and 2048) against `bapipe plan`
on the same model; under the peer's formula its printed time is set against our search with
that formula (`--cost-model pipedream`: planner.peer_pipedream.solve and planner.peer_search,
the least by planner.peer_pipedream.price). Times under our model are per sample; under the
formula per profiled minibatch. "peer/ours" >= 1: ours at least as fast.
Usage: python bench/peer.py [--pipedream DIR] [--models vgg16,resnet50,gnmt8]
       [--clusters 16xV100,cluster-a] [--batches 128,2048] [--json] [-o bench/results/peer.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bapipe.profiles import import_pipedream_graph, load_profile, load_profiles  # noqa: E402
from bapipe.models import load_model
from bapipe.fpga_models.cluster import load_cluster  # noqa: E402
from bapipe.planner.peer_pipedream import RELEASED, PeerStage, cluster_levels, peer_input, price, solve  # noqa: E402
from bapipe.planner.peer_released import (boards_of_plan, find_optimizer, parse_output, plan_of, replay,  # noqa: E402
                                   run_optimizer, stage_ids, stage_ranges)
from bapipe.planner.peer_search import search as flat_search  # noqa: E402
from bapipe.planner.planning import make_plan  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "pipedream"
#: model -> (fixture folder, the batch the profile was recorded at: the Input node's bytes /
#: 3x224x224 fp32 = 128 images; GNMT's LSTM state outputs 131072 bytes = 32 x 1024 fp32)
CASES = {"vgg16": ("vgg16", 128), "resnet50": ("resnet50", 128), "gnmt8": ("gnmt", 32)}
CLUSTER = "16xV100"
CLUSTERS = {"16xV100": "16xV100", "cluster-a": str(ROOT / "examples" / "pipedream" / "cluster-a.yaml")}
BATCHES = (128, 2048)


def load_case(name: str, tmp: Path, graph: Path | None = None):
    """(model, profile at the recorded batch, per-sample profile, model path, profile path) of
    a published graph, or of ``graph`` (the optimizer's output of it, stage by stage)."""
    folder, batch = CASES[name]
    mtext, ptext = import_pipedream_graph(str(graph or FIXTURES / folder / "graph.txt"), batch, name=name)
    mp, pp = tmp / f"{name}.model.yaml", tmp / f"{name}.profile.yaml"
    mp.write_text(mtext, encoding="utf-8")
    pp.write_text(ptext, encoding="utf-8")
    model = load_model(str(mp))
    return model, load_profile(str(pp), model), load_profiles(str(pp), model, batch=1, require_batch=True), mp, pp


def shape(stages) -> str:
    """'0-16x12,17-24x3,25-39x1'."""
    return ",".join(f"{s.first}-{s.last}x{len(s.boards)}" for s in stages)


def formula_search(inp, levels):
    """Our search under the peer's formula (`bapipe plan --cost-model pipedream`): the DP over
    every two-level plan on the layer order and the flat-plan search, the least by ``price``."""
    t0 = time.process_time()
    _t, dp = solve(inp, levels)
    _t2, flat = flat_search(inp, levels)
    best = min((dp, flat), key=lambda st: price(inp, st, levels))
    return price(inp, best, levels), best, time.process_time() - t0


def our_model(model, cluster, mp, cname, meas, G, spec, schedule):
    """(seconds per sample, plan text, CPU seconds) of `bapipe plan` (``spec`` None) or of a
    given --partition, under our model."""
    t0 = time.process_time()
    out = make_plan(model, cluster, str(mp), cname, Request(schedule=schedule, measured=meas, global_batch=G,
                                                            partition=spec))
    st = out.plan.stages
    text = ",".join(f"{s.first}-{s.last}x{len(s.boards)}" for s in st) + f" {out.plan.schedule} m={out.plan.microbatches}"
    return out.best.iteration_s / G, text, time.process_time() - t0


def run_case(name: str, cname: str, root: Path, tmp: Path, batches=BATCHES) -> dict:
    """One model on one cluster: the released optimizer, its replay, both plans both ways."""
    cluster = load_cluster(CLUSTERS[cname])
    names = [b.name for b in cluster.boards]
    levels, cols = cluster_levels(cluster)
    units = levels[0].units
    t0 = time.time()
    text, graph = run_optimizer(root, FIXTURES / CASES[name][0] / "graph.txt", levels, tmp / f"{name}-{cname}", RELEASED)
    peer_wall = time.time() - t0
    printed = parse_output(text)
    model, prof, meas, mp, _pp = load_case(name, tmp, graph)
    top = plan_of(printed, stage_ranges(model, stage_ids(graph.read_text(encoding="utf-8"))))
    inp = peer_input(model, prof)
    rows = replay(printed, top, model, prof, inp, levels, RELEASED)
    flat = boards_of_plan(top, units)
    peer_stages = [PeerStage(f, l, b) for f, l, b in flat]
    board = lambda b: names[cols[b // units][b % units]]  # noqa: E731  (host-major index -> board name)
    spec = [(f, l, len(b), tuple(board(x) for x in b)) for f, l, b in flat]
    reimpl, _st = solve(inp, levels)
    ours_f, ours_stages, cpu_f = formula_search(inp, levels)
    row = {"model": name, "cluster": cname, "layers": len(model.layers), "states": printed.states,
           "peer_plan": shape(peer_stages), "peer_printed_s": float(printed.pipeline),
           "replayed": f"{sum(r['ok'] for r in rows)}/{len(rows)}", "replay_misses": [r for r in rows if not r["ok"]],
           "reimpl_s": reimpl, "peer_wall_s": peer_wall,
           "formula": {"peer_s": float(printed.pipeline), "peer_priced_s": price(inp, peer_stages, levels),
                       "ours_s": ours_f, "our_plan": shape(ours_stages), "cpu_s": cpu_f},
           "our_model": {}}
    our_spec = [(s.first, s.last, len(s.boards), tuple(board(x) for x in s.boards)) for s in ours_stages]
    for G in batches:
        for sched in ("auto", "pipedream"):
            ps, ptext, _c = our_model(model, cluster, mp, cname, meas, G, spec, sched)
            os_, otext, oc = our_model(model, cluster, mp, cname, meas, G, None, sched)
            fs, _ft, _c2 = our_model(model, cluster, mp, cname, meas, G, our_spec, sched)
            row["our_model"][f"{G}/{sched}"] = {"peer_s": ps, "peer_plan": ptext, "ours_s": os_, "our_plan": otext,
                                                "cpu_s": oc, "formula_plan_s": fs, "peer_over_ours": ps / os_}
    return row


def table(rows: list[dict]) -> str:
    """One line per (model, cluster): the replay, the formula and our model at each batch."""
    keys = sorted({k for r in rows for k in r["our_model"]}, key=lambda k: (int(k.split("/")[0]), k))
    head = ["model, cluster", "peer's plan", "printed times replayed", "formula (ms/minibatch): peer printed / ours"]
    head += [f"our model G={k.split('/')[0]} {k.split('/')[1]} (us/sample): peer / ours" for k in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        f = r["formula"]
        cells = [f"{r['model']} ({r['layers']} layers), {r['cluster']}", r["peer_plan"], r["replayed"],
                 f"{f['peer_s'] * 1e3:.3f} / {f['ours_s'] * 1e3:.3f} ({f['peer_s'] / f['ours_s']:.3f}x)"]
        for k in keys:
            o = r["our_model"][k]
            cells.append(f"{o['peer_s'] * 1e6:.1f} / {o['ours_s'] * 1e6:.1f} ({o['peer_over_ours']:.3f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipedream", default=None, help="msr-fiddle/pipedream checkout (default: $BAPIPE_PIPEDREAM)")
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "peer.json"))
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    for opt, got, allowed in (("--models", models, CASES), ("--clusters", clusters, CLUSTERS)):
        bad = [m for m in got if m not in allowed]
        if bad:
            print(f"bench/peer.py: {opt}: expected some of {', '.join(allowed)}, got {bad[0]!r}", file=sys.stderr)
            return 2
    root = find_optimizer(args.pipedream)
    if root is None:
        print("bench/peer.py: PipeDream's optimizer not found (set BAPIPE_PIPEDREAM or --pipedream to a checkout "
              "of msr-fiddle/pipedream holding optimizer/optimizer_graph_hierarchical.py); skipped", file=sys.stderr)
        return 0
    batches = tuple(int(b) for b in args.batches.split(","))
    t0 = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_case(m, c, root, Path(tmp), batches) for m in models for c in clusters]
    out = {"pipedream": str(root), "rows": rows, "cpu_s": time.process_time() - t0}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(out, sort_keys=True) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
