"""Pipeline timing, stash counts, and `bapipe plan` end to end."""
import json

import pytest

from bapipe.plan import load_plan
from bapipe.schedules import SCHEDULES, stash_count, stash_walk
from bapipe.models import load_model
from bapipe.fpga_models.cluster import load_cluster
from bapipe.errors import SpecError
from bapipe.planner.cli_plan import parse_partition
from bapipe.planner.pipeline import closed_form_bubble, flowshop_time, replay, ring_allreduce_s
from bapipe.planner.planning import equal_bounds, summary
from bapipe.planner.search import Request, stashes_at
from tolerances import PLAN_DIGITS, f64_sum
import cli_fork
from planned import cached_plan


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager-1f1b", "2bw"])
@pytest.mark.parametrize("p,m", [(2, 1), (4, 4), (4, 16), (8, 3)])
def test_balanced_bubble_closed_form(schedule, p, m):
    f, b = 1.0, 2.0
    r = replay(schedule, p, m, [f] * p, [b] * p, [0.0] * (p - 1), [0.0] * (p - 1))
    # the replay's end time is a chain of at most 2 m p additions of op durations, one
    # rounding each; the bubble is a quotient of two such sums
    ops = 2 * m * p
    assert r.iteration_s == pytest.approx((m + p - 1) * (f + b), rel=f64_sum(ops), abs=0)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=f64_sum(2 * ops + 1), abs=0)
    # the same quotient, rounded once on each side
    assert closed_form_bubble(p, m) == pytest.approx((p - 1) / (m + p - 1), rel=f64_sum(2), abs=0)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4)])
def test_interleaved_bubble(p, m, v):
    # per-chunk times f/v, b/v: T = (m + (p-1)/v) (f + b); bubble/ideal = (p-1)/(v m)
    f, b = 1.0, 2.0
    V = p * v
    r = replay("interleaved", p, m, [f / v] * V, [b / v] * V, [0.0] * (V - 1), [0.0] * (V - 1), v=v)
    ideal = m * (f + b)
    # the end time chains at most 2 m V additions (one rounding each); subtracting the ideal
    # keeps that absolute error, which the division by the ideal scales
    ops = 2 * m * V
    assert (r.iteration_s - ideal) / ideal == pytest.approx((p - 1) / (v * m), rel=0,
                                                            abs=f64_sum(ops) * r.iteration_s / ideal)
    assert r.bubble_fraction == pytest.approx(closed_form_bubble(p, m, v), rel=f64_sum(2 * ops + 4), abs=0)


def test_gpipe_replay_is_the_flow_shop_time():
    f, b = [1.0, 3.0, 2.0], [2.0, 1.0, 5.0]
    m = 6
    r = replay("gpipe", 3, m, f, b, [0.0, 0.0], [0.0, 0.0])
    # both sides chain at most 2 (m + 3) additions of the op times
    assert r.iteration_s == pytest.approx(flowshop_time(f, m) + flowshop_time(b[::-1], m), rel=f64_sum(4 * (m + 3)),
                                          abs=0)


def test_link_latency_and_bandwidth():
    # 2 stages, 1 micro-batch: F0, send, F1, B1, send back, B0
    r = replay("1f1b", 2, 1, [1.0, 1.0], [2.0, 2.0], [0.25], [0.5])
    # six ops and two link hops (latency + occupancy each): 8 additions
    assert r.iteration_s == pytest.approx(1 + 0.75 + 1 + 2 + 0.75 + 2, rel=f64_sum(8), abs=0)
    # all-reduce after the last backward of each device
    r2 = replay("1f1b", 2, 1, [1.0, 1.0], [2.0, 2.0], [0.25], [0.5], allreduce=[0.1, 10.0])
    assert r2.iteration_s == pytest.approx(1 + 0.75 + 1 + 2 + 10.0, rel=f64_sum(8), abs=0)


def test_eager_beats_1f1b_with_link_latency():
    p, m = 4, 16
    lat = [0.8] * (p - 1)
    t1 = replay("1f1b", p, m, [1.0] * p, [2.0] * p, [0.1] * (p - 1), lat).iteration_s
    te = replay("eager-1f1b", p, m, [1.0] * p, [2.0] * p, [0.1] * (p - 1), lat).iteration_s
    assert te < t1
    assert stash_count("eager-1f1b", p, 0, m) > stash_count("1f1b", p, 0, m)


def test_stash_closed_forms_match_op_orders():
    for s in SCHEDULES:
        for p in range(1, 6):
            for m in range(1, 13):
                if s == "interleaved" and m % p:
                    continue
                for v in ((2, 3) if s == "interleaved" else (1,)):
                    for d in range(p):
                        assert stashes_at(s, p, d, m, v) == stash_walk(s, p, d, m, v), (s, p, d, m, v)
    assert stash_count("gpipe", 4, 0, 8) == 8
    assert stash_count("1f1b", 4, 1, 8) == 3
    assert stash_count("eager-1f1b", 4, 0, 8) == 7


def test_ring_allreduce():
    # 2 (r-1)/r x bytes / bandwidth + latency terms: four roundings
    assert ring_allreduce_s(8e9, 4, 1e9, 0.0) == pytest.approx(2 * 3 / 4 * 8, rel=f64_sum(4), abs=0)
    assert ring_allreduce_s(8e9, 1, 1e9, 1.0) == 0.0


def _plan(model, cluster="4xU250-ring", **kw):
    return cached_plan(model, cluster, **kw)   # searched once per run (tests/planned.py)


def test_tiny_plans_have_codegen_ready_foldings():
    for name in ("tiny-mlp", "tiny-cnn"):
        out = _plan(name)
        model = load_model(name)
        for st in out.plan.stages:
            for lname, fold in st.folding.items():
                l = model.layers[model.index[lname]]
                if l.type == "dense":
                    mh, mw = l.attr["units"], l.in_shapes[0][-1]
                elif l.type == "conv2d":
                    kh, kw = l.attr["kernel"]
                    mh, mw = l.attr["out_channels"], l.in_shapes[0][0] * kh * kw
                else:
                    continue
                assert mh % fold.pe == 0 and mw % fold.simd == 0, (name, lname, fold)
        assert out.plan.stages[-1].last == len(model.layers) - 1


@pytest.mark.slow  # ~1 s of CPU: make test, not make test-fast (docs/testing.md)
def test_plan_beats_equal_split_and_user_partitions():
    out = _plan("vgg16")
    t = out.best.iteration_s
    # data parallelism (all of vgg16 on each board) and the equal-layer split fit the boards'
    # blocks only folded within a smaller share of the budget (planning.FOLD_SCALES, as the
    # planner folds its own plans when nothing fits, issue 32 item 2): priced so, and slower
    for name in ("equal_split", "data_parallel"):
        assert t < out.baselines[name]["iteration_time_s"], name
    assert out.lower_bound_s < t
    n = 37
    with pytest.raises(SpecError, match="BRAM and URAM"):   # 21-36 on one board: fc6-8 and conv10-13's stores
        _plan("vgg16", partition=parse_partition("0-20,21-36", n))
    for spec in ("0-9,10-19,20-29,30-36", "0-3,4-12,13-30,31-36"):
        user = _plan("vgg16", partition=parse_partition(spec, n))
        if spec in SEARCH_MISS:   # KNOWN DEFECT, pinned so a fix shows: see SEARCH_MISS
            assert (t, user.best.iteration_s) == pytest.approx(SEARCH_MISS[spec], rel=1e-9), spec   # 1e-9: float sums
            continue
        assert t <= user.best.iteration_s + 1e-15, spec
    # what `--schedule eager-1f1b --microbatches 8` finds: before the final plan's schedule sweep
    # and cut moves (Explorer.retune) the default search stopped at the equal-split GPipe baseline
    forced = _plan("vgg16", schedule="eager-1f1b", microbatches=8)
    assert t <= forced.best.iteration_s + 1e-15


#: KNOWN DEFECT: the partition DP is exact for J, not for the replay. With the tiled HLS backward
#: priced (session 15) the final plan replayed 1.1e-5 s above the user partition
#: 0-9,10-19,20-29,30-36; with the kernels' blocks priced (session 17) the plan, 0-9,10-19,20-31,32-36
#: at 1.0608253 s, beats it (1.0609142 s), so no miss is pinned. (plan J, user partition J) in seconds.
SEARCH_MISS: dict = {}


def test_equal_bounds():
    assert equal_bounds(10, 4) == [(0, 2), (3, 5), (6, 7), (8, 9)]


@pytest.mark.slow  # ~1 s of CPU: make test, not make test-fast (docs/testing.md)
def test_inference_and_gpu():
    inf = summary(_plan("vgg16", mode="inference"))
    assert all(s["bwd_s"] == 0 for s in inf["stages"]) and inf["latency_s"] > 0
    gpu = summary(_plan("resnet50", "16xV100"))
    assert gpu["stages"][0]["style"] == "gpu" and gpu["iteration_time_s"] > 0


def _cli(*args):
    return cli_fork.bapipe(*args, timeout=300)   # the console script, forked (tests/cli_fork.py)


def test_cli_contract_and_determinism(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    r = _cli("plan", "tiny-cnn", "4xU250-ring", "-o", str(a), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in ("iteration_time_s", "throughput_samples_per_s", "schedule", "microbatches", "stages", "baselines",
              "lower_bound_s", "speedup_vs_data_parallel"):
        assert k in d
    for s in d["stages"]:
        assert {"layers", "boards", "time_s", "memory_bytes"} <= set(s)
    assert "iteration_time_s" in d["baselines"]["equal_split"]
    assert _cli("plan", "tiny-cnn", "4xU250-ring", "-o", str(b)).returncode == 0
    assert a.read_bytes() == b.read_bytes()
    plan = load_plan(a)
    # plan.yaml keeps 12 significant digits, --json the full float; predicted iteration_time_s
    # is the first iteration (what sim replays), --json's first_iteration_time_s the same
    assert plan.predicted["iteration_time_s"] == pytest.approx(d["first_iteration_time_s"], rel=PLAN_DIGITS, abs=0)
    assert plan.model == "tiny-cnn" and plan.microbatches == d["microbatches"]


def test_cli_infeasible_is_one_line(tmp_path):
    r = _cli("plan", "gpt3-175b", "4xU250-ring", "-o", str(tmp_path / "x.yaml"))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "GB" in r.stderr
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--schedule", "zigzag")
    assert r.returncode == 2 and "--schedule" in r.stderr
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--partition", "0-2,5-6")
    assert r.returncode == 2 and "--partition" in r.stderr


def test_measured_profile_hook(tmp_path):
    prof = tmp_path / "p.yaml"
    names = [l.name for l in load_model("tiny-mlp").layers]
    rows = "\n".join(f"  - {{name: {n}, fwd_us: {10 * (i + 1)}, bwd_us: {20 * (i + 1)}, activation_bytes: 64, "
                     f"param_bytes: 0}}" for i, n in enumerate(names))
    prof.write_text(f"model: tiny-mlp\nbatch: 1\nlayers:\n{rows}\n")
    from bapipe.planner.cli_plan import _measured
    out = _plan("tiny-mlp", measured=_measured(str(prof), load_model("tiny-mlp")), replication=False)
    assert all(st.replicas == 1 for st in out.plan.stages)
    for st in out.plan.stages:
        beta = out.plan.microbatch_size // st.replicas   # samples per replica per micro-batch
        want = sum(10e-6 * (i + 1) for i in range(st.first, st.last + 1)) * beta
        # a prefix-sum difference over at most 7 layers, times beta: f64_sum of 2 x 7 + 1 terms
        # relative to the prefix sum (the larger operand), which is at most 28 x the smallest time
        k = 2 * len(names) + 1
        assert st.fwd_s == pytest.approx(want, rel=f64_sum(k) * 28, abs=0)
        assert st.bwd_s == pytest.approx(2 * want, rel=f64_sum(k) * 28, abs=0)


def test_pareto_set_is_non_dominated():
    from bapipe.planner.pareto import non_dominated, pareto_plans
    pts = [{"iteration_time_s": 1.0, "peak_memory_bytes": 5, "boards": 4},
           {"iteration_time_s": 2.0, "peak_memory_bytes": 3, "boards": 4},
           {"iteration_time_s": 2.5, "peak_memory_bytes": 6, "boards": 4},   # dominated by the first
           {"iteration_time_s": 3.0, "peak_memory_bytes": 9, "boards": 1}]
    assert [p["iteration_time_s"] for p in non_dominated(pts)] == [1.0, 2.0, 3.0]
    front = pareto_plans(load_model("tiny-cnn"), load_cluster("4xU250-ring"), Request(global_batch=32))
    assert front and {p["boards"] for p in front} <= {1, 2, 3, 4}
    for a in front:
        assert not any(b is not a and b["iteration_time_s"] <= a["iteration_time_s"]
                       and b["peak_memory_bytes"] <= a["peak_memory_bytes"] and b["boards"] <= a["boards"]
                       for b in front)


def test_memory_is_fixed_plus_stashes():
    """What a simulator checks its peak memory against: fixed + stashes x per-micro-batch bytes."""
    for model, cluster in (("vgg16", "4xU250-ring"), ("tiny-cnn", "hetero-mix")):
        out = _plan(model, cluster)
        pr = out.plan.predicted
        for st, mb, fixed in zip(out.plan.stages, pr["stash_bytes_per_microbatch"], pr["fixed_bytes"]):
            # integer byte counts: float64 prefix sums of integers below 2**53 are exact (measured 0)
            assert st.memory_bytes == fixed + st.stashes * mb
            assert st.stashes == stashes_at(out.plan.schedule, out.plan.devices, st.device, out.plan.microbatches,
                                            out.plan.chunks) // out.plan.chunks or out.plan.chunks > 1


def test_replay_queues_transfers_sharing_a_link():
    # 3 stages whose two forward cuts both cross directed link "L": the second transfer of a
    # micro-batch waits for the first when they overlap
    up0 = ((("L",), 1.0, 0.0),)
    up1 = ((("L",), 1.0, 0.0),)
    down = ((("D",), 0.0, 0.0),)
    routes = [(up0, down), (up1, down)]
    shared = replay("gpipe", 3, 1, [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0], [0.0, 0.0], routes=routes,
                    forward_only=True)
    # F0 1 s, link 1 s, F1 0 s, link 1 s: whole seconds add exactly
    assert shared.iteration_s == 3.0
    # two micro-batches: the link, busy 2 s per micro-batch, is the bottleneck
    two = replay("gpipe", 3, 2, [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0], [0.0, 0.0], routes=routes,
                 forward_only=True)
    assert two.iteration_s == 5.0


@pytest.mark.slow  # plans every zoo model: ~2.5 s
def test_stage_resources_within_the_capped_budget():
    for model, cluster in (("vgg16", "4xU250-ring"), ("resnet50", "hetero-mix"), ("tiny-cnn", "8xU280-ring")):
        out = _plan(model, cluster)
        cl = load_cluster(cluster)
        for st in out.plan.stages:
            b = cl.board(st.boards[0]).board
            cap = out.plan.utilisation_cap
            assert st.style in ("dataflow", "time-multiplexed")
            assert st.resources["dsp"] <= b.usable_dsp * cap + 1
            assert st.resources["lut"] <= b.usable_lut * cap + 1
            assert st.resources["uram"] <= b.usable_uram * cap + 1
            assert st.resources["bram36"] <= b.usable_bram36 * cap + 2


@pytest.mark.parametrize("model_name", ["resnet50", "examples/models/small-resnet.yaml"])
def test_whole_blocks_never_cuts_inside_a_residual_block(model_name):
    """--whole-blocks: every stage boundary carries exactly one tensor (no open skip), where
    the free optimum of the same 4-stage pipeline (no replication) cuts inside a block."""
    import json
    from bapipe.models import load_model
    from bapipe.planner.search import Explorer

    model = load_model(model_name)
    cluster = load_cluster("4xU250-ring")

    from bapipe.planner.planning import FOLD_SCALES

    def cuts(whole: bool):
        for scale in FOLD_SCALES:   # as the planner: the first folding share whose kernels fit the blocks
            ex = Explorer(model, cluster, Request(replication=False, whole_blocks=whole), fold_scale=scale)
            found = ex.search([c for c in ex.configs(ex.schedules(), [1], (False, True)) if c.p == 4])
            if found and found[0].iteration_s < float("inf"):
                break
        return [len(model.cut_tensors(b)) for _a, b in found[0].bounds[:-1]], found[0].objective

    (whole, obj_whole), (free, obj_free) = cuts(True), cuts(False)
    assert len(whole) == 3 and whole == [1, 1, 1]
    # the free search is the same exact DP without the restriction: never worse (whether
    # its optimum happens to cut inside a block depends on the cost model's figures)
    assert obj_free <= obj_whole
    # the CLI plan (any depth, boards may stay idle) never cuts inside a block either
    r = cli_fork.bapipe("plan", model_name, "4xU250-ring", "--json", "--no-replication", "--whole-blocks", "-o",
                        "/dev/null", check=True)
    stages = json.loads(r.stdout)["stages"]
    assert all(len(model.cut_tensors(s["layers"][1])) == 1 for s in stages[:-1])


def test_lone_ring_equals_the_event_replay(monkeypatch):
    """A single stage's all-reduce ring is computed step by step without events
    (planner.pipeline._lone_ring); it must give the same floats as the event loop."""
    import random

    import bapipe.planner.pipeline as pl

    rng = random.Random(1)
    for _ in range(200):
        r, m = rng.randint(2, 12), rng.randint(1, 9)
        hops = tuple(((("a", y),), rng.choice([0.0, 1e-6, rng.random()]), rng.choice([0.0, rng.random() * 1e-3]))
                     for y in range(r))
        sched = rng.choice(["gpipe", "1f1b", "eager-1f1b"])
        f, b = [rng.random()], [rng.random()]
        fast = replay(sched, 1, m, f, b, [], [], rings=[(hops, 2 * (r - 1))]).iteration_s
        with monkeypatch.context() as mp:
            mp.setattr(pl, "_disjoint", lambda h: False)
            slow = replay(sched, 1, m, f, b, [], [], rings=[(hops, 2 * (r - 1))]).iteration_s
        assert fast == slow   # the same additions in the same order: equal, not close
