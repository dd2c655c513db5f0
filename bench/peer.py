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

The check is each planner optimising its own cost model: under the peer's formula, the
peer's DP against our search with that formula (planner.peer_search, `bapipe plan
--cost-model pipedream`: exact over every flat plan); under our model, the peer's plan
(priced through --partition) against our default search. The cross-prices (the peer's
formula on our model's plan, and with the all-reduce overlapped) are for information.
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
from bapipe.models import load_model
from bapipe.fpga_models.cluster import load_cluster  # noqa: E402
from bapipe.planner.peer_pipedream import PeerStage, cluster_levels, peer_input, price, solve  # noqa: E402
from bapipe.planner.peer_search import search as peer_formula_search  # noqa: E402
from bapipe.planner.planning import make_plan  # noqa: E402
from bapipe.planner.search import Request  # noqa: E402

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
    levels, cols = cluster_levels(cluster)
    # the peer's board indices (host-major) are the cluster's order here (4 hosts of gpu4h..gpu4h+3)
    assert [b for h in cols for b in h] == list(range(len(names)))
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
    # our search under the peer's formula (`bapipe plan --cost-model pipedream`): every flat plan
    peer_priced = price(inp, peer_stages, levels)
    t0 = time.process_time()
    pf_s, pf_stages = peer_formula_search(inp, levels, bound=peer_priced)
    t_pf = time.process_time() - t0
    pf_spec = [(s.first, s.last, len(s.boards), tuple(names[b] for b in s.boards)) for s in pf_stages]
    pf_ours = make_plan(model, cluster, str(mp), CLUSTER,
                        Request(schedule="pipedream", measured=meas, global_batch=G, partition=pf_spec))
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
        "cpu_s": {"peer": t_peer, "ours": t_ours, "ours_peer_formula": t_pf},
        # both planners optimising their own model: the peer's DP vs our search with the peer's formula
        "peer_formula_search": {"peer_s": peer_priced, "ours_s": pf_s, "our_plan": shape(pf_stages),
                                "our_boards": [list(s.boards) for s in pf_stages],
                                "ours_under_our_model_s": pf_ours.best.iteration_s * per_mb},
    }
    for k in ("peer_formula", "peer_formula_overlapped", "our_model", "peer_formula_search"):
        row[k]["peer_over_ours"] = row[k]["peer_s"] / row[k]["ours_s"]
    return row


def table(rows: list[dict]) -> str:
    """Both planners each optimising its own cost model (the check), then the cross-prices."""
    lines = ["| model | peer's plan | our plan, peer formula | peer formula: peer / ours (ms) | ratio | "
             "our plan, our model | our model: peer / ours (ms) | ratio | cross: peer formula on our model's plan | "
             "overlapped all-reduce | CPU peer / ours (formula) / ours (model) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pf, po, om, ps = r["peer_formula"], r["peer_formula_overlapped"], r["our_model"], r["peer_formula_search"]
        lines.append(f"| {r['model']} ({r['layers']} layers, batch {r['batch']}) | {r['peer_plan']} | {ps['our_plan']} | "
                     f"{ps['peer_s'] * 1e3:.3f} / {ps['ours_s'] * 1e3:.3f} | {ps['peer_over_ours']:.4f} | "
                     f"{r['our_plan']} (m={r['our_microbatches']}) | "
                     f"{om['peer_s'] * 1e3:.2f} / {om['ours_s'] * 1e3:.2f} | {om['peer_over_ours']:.3f} | "
                     f"{pf['peer_over_ours']:.3f} | {po['peer_over_ours']:.3f} | "
                     f"{r['cpu_s']['peer']:.2f} s / {r['cpu_s']['ours_peer_formula']:.2f} s / {r['cpu_s']['ours']:.1f} s |")
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
