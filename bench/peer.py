"""BaPipe's planner against PipeDream's, both planners pricing both plans.

The peer is PipeDream's optimizer (planner.peer_pipedream: the hierarchical DP of Narayanan
et al. SOSP'19, section 3.1) on PipeDream's published per-layer profiles
(tests/fixtures/pipedream/*/graph.txt, msr-fiddle/pipedream, MIT licence), on 16 GPUs in 4
servers (the built-in 16xV100: 4 V100 a host on NVLink, 50 GB/s, hosts on a 12 GB/s
network). Ours is `bapipe plan MODEL 16xV100 --profile ... --schedule pipedream` (the
schedule the peer plans for: asynchronous, weight stashing, no flush) with a global batch of
16 profiled minibatches (every GPU can hold one minibatch, as in PipeDream).

Every time is per profiled minibatch (vgg16 and resnet50: 128 samples, gnmt: 32
sentences): the peer's formula gives it directly; our model's steady iteration time is
scaled by batch / global batch. "peer/ours" above 1: our plan is faster.
Usage: python bench/peer.py [--json] [--models vgg16,resnet50,gnmt8] [-o bench/results/peer.json]
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
from bapipe.spec import load_model  # noqa: E402
from fpga_models.cluster import load_cluster  # noqa: E402
from planner.peer_pipedream import PeerStage, cluster_levels, peer_input, price, solve  # noqa: E402
from planner.planning import make_plan  # noqa: E402
from planner.search import Request  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "pipedream"
#: model -> (fixture folder, the batch the profile was recorded at: the Input node's bytes /
#: 3x224x224 fp32 = 128 images; GNMT's LSTM state outputs 131072 bytes = 32 x 1024 fp32)
CASES = {"vgg16": ("vgg16", 128), "resnet50": ("resnet50", 128), "gnmt8": ("gnmt", 32)}
CLUSTER = "16xV100"


def load_case(name: str, tmp: Path):
    """(model, profile at the recorded batch, per-sample profile, model path, profile path)."""
    folder, batch = CASES[name]
    mtext, ptext = import_pipedream_graph(str(FIXTURES / folder / "graph.txt"), batch, name=name)
    mp, pp = tmp / f"{name}.model.yaml", tmp / f"{name}.profile.yaml"
    mp.write_text(mtext, encoding="utf-8")
    pp.write_text(ptext, encoding="utf-8")
    model = load_model(str(mp))
    return model, load_profile(str(pp), model), load_profiles(str(pp), model, batch=1, require_batch=True), mp, pp


def flat(stages, names: list[str]) -> list[PeerStage]:
    """plan.yaml stages -> the peer's flat stages (board indices in cluster order)."""
    return [PeerStage(s.first, s.last, tuple(sorted(names.index(b) for b in s.boards))) for s in stages]


def shape(stages: list[PeerStage]) -> str:
    """'0-16x12,17-24x3,25-39x1'."""
    return ",".join(f"{s.first}-{s.last}x{len(s.boards)}" for s in stages)


def run_case(name: str, tmp: Path) -> dict:
    cluster = load_cluster(CLUSTER)
    names = [b.name for b in cluster.boards]
    levels, _cols = cluster_levels(cluster)
    model, prof, meas, mp, _pp = load_case(name, tmp)
    batch = CASES[name][1]
    G = batch * len(names)
    inp = peer_input(model, prof)
    t0 = time.process_time()
    peer_dp, peer_stages = solve(inp, levels)
    t_peer = time.process_time() - t0
    t0 = time.process_time()
    ours = make_plan(model, cluster, str(mp), CLUSTER, Request(schedule="pipedream", measured=meas, global_batch=G))
    t_ours = time.process_time() - t0
    our_stages = flat(ours.plan.stages, names)
    spec = [(s.first, s.last, len(s.boards), tuple(names[b] for b in s.boards)) for s in peer_stages]
    theirs = make_plan(model, cluster, str(mp), CLUSTER,
                       Request(schedule="pipedream", measured=meas, global_batch=G, partition=spec))
    per_mb = batch / G
    row = {
        "model": name, "layers": len(model.layers), "batch": batch, "global_batch": G,
        "peer_plan": shape(peer_stages), "our_plan": shape(our_stages),
        "our_microbatches": ours.plan.microbatches, "peer_microbatches_under_ours": theirs.plan.microbatches,
        "peer_dp_s": peer_dp,
        "peer_formula": {"peer_s": price(inp, peer_stages, levels), "ours_s": price(inp, our_stages, levels)},
        "peer_formula_overlapped": {"peer_s": price(inp, peer_stages, levels, overlap=True),
                                    "ours_s": price(inp, our_stages, levels, overlap=True)},
        "our_model": {"peer_s": theirs.best.iteration_s * per_mb, "ours_s": ours.best.iteration_s * per_mb},
        "cpu_s": {"peer": t_peer, "ours": t_ours},
    }
    for k in ("peer_formula", "peer_formula_overlapped", "our_model"):
        row[k]["peer_over_ours"] = row[k]["peer_s"] / row[k]["ours_s"]
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | peer's plan | our plan | peer formula: peer / ours (ms) | ratio | "
             "peer formula, all-reduce overlapped: ratio | our model: peer / ours (ms) | ratio | CPU peer / ours |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pf, po, om = r["peer_formula"], r["peer_formula_overlapped"], r["our_model"]
        lines.append(f"| {r['model']} ({r['layers']} layers, batch {r['batch']}) | {r['peer_plan']} | {r['our_plan']} "
                     f"(m={r['our_microbatches']}) | {pf['peer_s'] * 1e3:.2f} / {pf['ours_s'] * 1e3:.2f} | "
                     f"{pf['peer_over_ours']:.3f} | {po['peer_over_ours']:.3f} | "
                     f"{om['peer_s'] * 1e3:.2f} / {om['ours_s'] * 1e3:.2f} | {om['peer_over_ours']:.3f} | "
                     f"{r['cpu_s']['peer']:.2f} s / {r['cpu_s']['ours']:.1f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "peer.json"))
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in CASES]
    if bad:
        print(f"bench/peer.py: --models: expected some of {', '.join(CASES)}, got {bad[0]!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_case(m, Path(tmp)) for m in models]
    out = {"cluster": CLUSTER, "rows": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(out, sort_keys=True) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
