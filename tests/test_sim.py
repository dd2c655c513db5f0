"""The discrete-event simulator against closed forms, the stash formula and its own invariants."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapipe.plan import Plan, Stage
from bapipe.schedules import stash_count
from bapipe.models import load_model
from bapipe.yamlio import loads
from bapipe.fpga_models.cluster import load_cluster, parse_cluster
from bapipe.fpga_models.sim import SimConfig, simulate
from bapipe.fpga_models.trace import trace_events, write_gantt, write_trace
from tolerances import U64, f64_sum
import cli_fork

MODEL = load_model("tiny-mlp")
NO_HOST = SimConfig(host_io=False)


def sim_rel(*results) -> float:
    """Relative error of a time the simulator reports: a float64 sum along a chain of at most
    r.events events, each adding its duration with at most two roundings (the duration's own
    and the sum's), so 2 * events * u (worst case, float64 u = 2**-53)."""
    return 2 * f64_sum(max(r.events for r in results))


def ring(n: int, bw: float = 1e30, lat: float = 1e-30, board: str = "U250"):
    """A ring of n boards; the defaults make links free (latency must be > 0 in a spec)."""
    txt = f"name: t\ntopology: ring\nboards: [{{type: {board}, count: {n}}}]\nlink: {{bandwidth: {bw}, latency: {lat}}}\n"
    return parse_cluster(loads(txt), "t.yaml")


def balanced(schedule: str, p: int, m: int, v: int = 1, tf: float = 1.0, tb: float = 2.0, send: int = 0,
             stash: int = 0, weights: int = 0, replicas: int = 1, mode: str = "train") -> Plan:
    """p*v equal stages; virtual stage k on device k % p as chunk k // p (each chunk is 1/v of the work)."""
    stages = []
    for k in range(p * v):
        boards = [f"fpga{(k % p) * replicas + r}" for r in range(replicas)]
        stages.append(Stage(index=k, layers=[f"l{k}"], first=k, last=k, boards=boards, board_type="U250",
                            replicas=replicas, device=k % p, chunk=k // p, fwd_s=tf / v, bwd_s=tb / v,
                            send_bytes=send, stash_bytes=stash, weight_bytes=weights))
    return Plan(model="tiny-mlp", model_fingerprint="", cluster="t", cluster_fingerprint="", schedule=schedule,
                chunks=v, microbatches=m, stages=stages, mode=mode)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager-1f1b", "2bw"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 32), (8, 8), (8, 64)])
def test_bubble_gpipe_1f1b(schedule, p, m):
    """Balanced stages, free links: idle / total board time = (p-1)/(m+p-1)."""
    r = simulate(balanced(schedule, p, m), MODEL, ring(p), config=NO_HOST)
    expect = (p - 1) / (m + p - 1)
    # 1 - busy / (p x makespan): busy and makespan each within sim_rel, so the fraction within
    # 2 sim_rel absolute (observed: a few ULPs)
    assert r.bubble_fraction == pytest.approx(expect, rel=0, abs=2 * sim_rel(r))
    # integer stage times (1 s, 2 s) and free links (1e-30 s is below half an ULP of any event
    # time >= 1): every event time is an exact small integer
    assert r.iteration_time_s == (m + p - 1) * 3.0


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2), (4, 32, 3)])
def test_bubble_interleaved(p, m, v):
    """Megatron's measure for interleaving: idle / busy = (p-1)/(v m); as a fraction (p-1)/(v m + p - 1)."""
    r = simulate(balanced("interleaved", p, m, v), MODEL, ring(p), config=NO_HOST)
    # stage times 1/v, 2/v are not exact binary fractions for v = 3: both measures are ratios of
    # simulated times, each within sim_rel, so within 2 sim_rel absolute of the closed form
    # (the ratio idle / busy = (1 + ratio) x the fraction's error)
    ratio = (p - 1) / (v * m)
    assert r.bubble_ratio == pytest.approx(ratio, rel=0, abs=2 * sim_rel(r) * (1 + ratio))
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=0, abs=2 * sim_rel(r))


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("eager-1f1b", 1), ("2bw", 1),
                                        ("interleaved", 2), ("interleaved", 3)])
def test_peak_memory_is_stash_formula(schedule, v):
    """Peak memory per board = weights + stash_count x stash bytes (the planner's formula)."""
    p, m = 4, 12
    r = simulate(balanced(schedule, p, m, v, stash=1000, weights=77), MODEL, ring(p), config=NO_HOST)
    for b in r.boards:
        assert b.peak_memory_bytes == 77 * v + 1000 * stash_count(schedule, p, b.device, m, v)


def test_peak_memory_with_link_latency_unchanged():
    """Stash peaks come from the op order, so slow links must not change them."""
    p, m = 4, 8
    r = simulate(balanced("eager-1f1b", p, m, send=10_000, stash=10), MODEL, ring(p, bw=1e5, lat=0.3))
    assert [b.peak_memory_bytes for b in r.boards] == [10 * stash_count("eager-1f1b", p, d, m) for d in range(p)]


@pytest.mark.parametrize("lat", [0.2, 0.5, 1.0])
def test_eager_1f1b_beats_1f1b_with_latency(lat):
    """With link latency eager-1F1B overlaps sends with compute: faster, more memory (Zhuang et al.)."""
    p, m = 4, 16
    cl = ring(p, bw=1e4, lat=lat)
    one = simulate(balanced("1f1b", p, m, send=1000, stash=1), MODEL, cl)
    eager = simulate(balanced("eager-1f1b", p, m, send=1000, stash=1), MODEL, cl)
    # a real effect, not a rounding margin: eager is 10-28% faster here; 3% is the smallest
    # gain the claim is meant to make
    assert eager.iteration_time_s < one.iteration_time_s * 0.97
    assert max(b.peak_memory_bytes for b in eager.boards) > max(b.peak_memory_bytes for b in one.boards)


def test_link_cost_adds_exactly_on_a_chain():
    """GPipe, p=2, m=1: F, send, F, B, send back, B: every wire second shows in the makespan.
    Between FPGAs the wire carries the transport's framed beats (fpga_models.engines.link_transfer):
    500 B = 250 fixed16 elements; 10-element (160-bit) words, 3 a 480-bit beat payload, 25 words
    in 9 beats of 64 B = 576 B on the line (fewer lanes also take 9 beats; 25 lanes, one word a
    beat, 10); the framing registers add 3 cycles at 300 MHz (the last beat holds one word)."""
    bw, lat, nbytes = 1000.0, 0.25, 500
    line, extra = 9 * 64, 3 / 300e6
    r = simulate(balanced("gpipe", 2, 1, send=nbytes), MODEL, ring(2, bw=bw, lat=lat), config=NO_HOST)
    # 3.0, 0.576, 0.25 and 1e-8 summed in event order: a few roundings of 2^-52 relative
    assert r.makespan_s == pytest.approx(2 * 3.0 + 2 * (line / bw + lat + extra), rel=1e-15)
    used = {ln.name: ln for ln in r.links if ln.transfers}
    assert set(used) == {"fpga0->fpga1", "fpga1->fpga0"}
    assert used["fpga0->fpga1"].busy_s == line / bw


def test_multi_iteration_flush_and_2bw():
    """Flush schedules repeat the single-iteration time; 2BW's steady state has no fill or drain."""
    p, m = 4, 8
    # integer stage times on free links: exact integer event times (see test_bubble_gpipe_1f1b),
    # and 3 x 33 / 3, (105 - 9) / 4 divide exactly
    one = simulate(balanced("1f1b", p, m), MODEL, ring(p), iterations=3, config=NO_HOST)
    assert one.iteration_time_s == (m + p - 1) * 3.0
    bw2 = simulate(balanced("2bw", p, m), MODEL, ring(p), iterations=4, config=NO_HOST)
    assert bw2.steady_iteration_s == m * 3.0
    assert bw2.makespan_s == (4 * m + p - 1) * 3.0


def test_allreduce_ring_time():
    """A replicated stage reduces gradients in 2(r-1) ring steps of G/r bytes after its last backward
    (G = the stage's parameters x bytes per element when the plan gives no weight bytes)."""
    p, m, r = 1, 2, 4
    bw, lat = 1e6, 1e-3
    plan = balanced("1f1b", p, m, replicas=r)
    plan.stages[0].first, plan.stages[0].last = 0, len(MODEL.layers) - 1
    plan.stages[0].layers = [l.name for l in MODEL.layers]
    res = simulate(plan, MODEL, ring(r, bw=bw, lat=lat), config=NO_HOST)
    from bapipe.fpga_models.collective import ring_hop_s
    grad = MODEL.params * 2  # fixed16
    compute = m * 3.0       # fwd_s/bwd_s are each replica's time for its share
    # U250s: each step carries a share of the exact 48-bit gradient sums framed by the transport
    # (collective.ring_hop_s at the 300 MHz kernel clock; the training RTL's ring), 3x the
    # fixed16 share's bytes plus framing
    occ, hop_lat = ring_hop_s(grad, 2, r, bw, lat, 300e6)
    assert occ > 3 * grad / r / bw
    expect = compute + 2 * (r - 1) * (occ + hop_lat)
    # 1e-3 s and G/r/bw are not binary fractions: the simulator's chain of events and this
    # closed form (about 4 roundings per ring step) each within sim_rel
    assert res.makespan_s == pytest.approx(expect, rel=2 * sim_rel(res))
    assert len(res.allreduces) == 1


def test_backpressure_stalls_a_fast_sender():
    """A fast stage feeding a slow one with one credit stalls instead of running ahead."""
    plan = balanced("gpipe", 2, 8)
    plan.stages[1].fwd_s = 3.0
    r = simulate(plan, MODEL, ring(2), config=SimConfig(host_io=False, rx_credits=1, tx_slots=1))
    assert r.boards[0].stall_s > 0
    free = simulate(plan, MODEL, ring(2), config=SimConfig(host_io=False, rx_credits=64))
    assert free.boards[0].stall_s == 0
    assert r.makespan_s == free.makespan_s  # the slow stage bounds both (integer times: exact)


def test_inference_forward_only():
    p, m = 4, 8
    r = simulate(balanced("gpipe", p, m, mode="inference"), MODEL, ring(p), config=NO_HOST)
    assert r.iteration_time_s == (m + p - 1) * 1.0  # integer times on free links: exact
    assert all(op[1] == "F" for op in r.ops)


def test_heterogeneous_clocks_report_own_cycles():
    txt = ("name: h\ntopology: chain\nboards: [{type: U250, count: 1}, {type: U280, count: 1}]\n"
           "link: {bandwidth: 1.0e+30, latency: 1.0e-30}\n")
    cl = parse_cluster(loads(txt), "h.yaml")
    r = simulate(balanced("1f1b", 2, 4), MODEL, cl, config=NO_HOST)
    for b in r.boards:
        clock = cl.board(b.name).board.clock_hz
        assert b.to_json()["busy_cycles"] == round(b.busy_s * clock)


@settings(max_examples=25, deadline=None)
@given(schedule=st.sampled_from(["gpipe", "1f1b", "eager-1f1b", "2bw", "interleaved"]),
       p=st.integers(1, 5), k=st.integers(1, 4), v=st.integers(1, 3),
       times=st.lists(st.floats(0.1, 3.0), min_size=10, max_size=10),
       lat=st.sampled_from([1e-30, 0.05, 0.4]), credits=st.integers(2, 4))
def test_invariants(schedule, p, k, v, times, lat, credits):
    """Random unbalanced plans: ops never overlap on a device, data dependencies hold, time adds up."""
    v = v if schedule == "interleaved" else 1
    m = p * k
    plan = balanced(schedule, p, m, v, send=100)
    for i, s in enumerate(plan.stages):
        s.fwd_s, s.bwd_s = times[i % 10], times[(i + 3) % 10]
    r = simulate(plan, MODEL, ring(max(p, 2), bw=1000.0, lat=lat), config=SimConfig(rx_credits=credits))
    by_dev: dict[int, list] = {}
    end = {}
    for d, kind, mb, chunk, t0, t1 in r.ops:
        by_dev.setdefault(d, []).append((t0, t1))
        end[(kind, mb, chunk * p + d)] = t1
    for spans in by_dev.values():
        spans.sort()
        # ops on one device are ordered by construction (an op starts at the previous op's end
        # or later), so the comparison is exact
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    start = {(kind, mb, chunk * p + d): t0 for d, kind, mb, chunk, t0, t1 in r.ops}
    S = p * v
    lat = lat if p > 1 else 0.0  # chunks on one board talk without a link
    # a transfer of 100 B at 1000 B/s plus lat arrives at end + 0.1 + lat, computed in float64;
    # 0.999 lat leaves the 0.1 s of the transfer as slack for the rounding (lat <= 0.4 s)
    for (kind, mb, s), t0 in start.items():
        if kind == "F" and s > 0:
            assert t0 >= end[("F", mb, s - 1)] + lat * 0.999
        if kind == "B" and s < S - 1:
            assert t0 >= end[("B", mb, s + 1)] + lat * 0.999
        if kind == "B":
            assert t0 >= end[("F", mb, s)]
    for b in r.boards:
        # bubble = max(0, makespan - busy - stall) and the sum back: 4 roundings of the makespan's
        # size, or, when the clip acts (a device never idle), busy's own error sim_rel
        assert b.busy_s + b.bubble_s + b.stall_s == pytest.approx(r.makespan_s, rel=4 * U64 + sim_rel(r))
        # busy is a float64 sum of the device's op durations (each t1 - t0 of event times
        # within sim_rel of the makespan), the expectation a sum of 2v products: sim_rel of the makespan
        want = m * sum(s.fwd_s + s.bwd_s for s in plan.stages if s.device == b.device)
        assert b.busy_s == pytest.approx(want, rel=0, abs=2 * sim_rel(r) * r.makespan_s)
    # a lower bound: device d cannot start before the upstream forwards of micro-batch 0,
    # works m x its own time, and its last backward still has to flow back upstream
    if schedule != "interleaved":
        f = [s.fwd_s for s in plan.stages]
        b = [s.bwd_s for s in plan.stages]
        bound = max(sum(f[:d]) + m * (f[d] + b[d]) + sum(b[:d]) for d in range(p))
        # the bound may be tight (p = 1, no links): the makespan's own rounding, sim_rel
        assert r.makespan_s >= bound * (1 - sim_rel(r))


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("eager-1f1b", 1), ("2bw", 1),
                                        ("interleaved", 2), ("interleaved", 3)])
def test_one_credit_still_finishes(schedule, v):
    """The smallest buffers (one credit, one transmit slot) slow a pipeline down but every schedule
    still completes: in-order channels of a linear pipeline (plus the interleaved wrap-around) leave
    no circular wait. (The engine reports a deadlock as a SpecError should one ever occur.)"""
    p, m = 4, 8
    plan = balanced(schedule, p, m, v, send=100)
    plan.stages[-1].fwd_s = 5.0
    cl = ring(p, bw=1000.0, lat=0.5)
    tight = simulate(plan, MODEL, cl, config=SimConfig(rx_credits=1, tx_slots=1))
    roomy = simulate(plan, MODEL, cl, config=SimConfig(rx_credits=64))
    assert len(tight.ops) == len(roomy.ops) == 2 * m * p * v
    # the two may be equal when the slow last stage bounds both: each within sim_rel
    assert tight.makespan_s >= roomy.makespan_s * (1 - 2 * sim_rel(tight, roomy))


@pytest.mark.slow  # ~1 s of CPU: make test, not make test-fast (docs/testing.md)
def test_gantt_and_trace(tmp_path):
    r = simulate(balanced("1f1b", 4, 8, send=1000, stash=1), MODEL, ring(4, bw=1e4, lat=0.1), iterations=2)
    png = write_gantt(r, tmp_path / "g.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tr = write_trace(r, tmp_path / "t.json")
    doc = json.loads(tr.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 0 and e["cat"] in "FB"]
    assert len(xs) == len(r.ops) == 2 * 2 * 8 * 4
    assert {e["name"] for e in xs} >= {"F0", "B7", "F15"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in doc["traceEvents"] if e["ph"] == "X")
    assert trace_events(r) == doc  # deterministic


def _hand_plan(tmp_path):
    model = load_model("vgg16")
    cl = load_cluster("4xU250-ring")
    cuts = [0, 8, 16, 26, len(model.layers)]
    stages = [Stage(index=k, layers=[l.name for l in model.layers[cuts[k]:cuts[k + 1]]], first=cuts[k],
                    last=cuts[k + 1] - 1, boards=[f"fpga{k}"], board_type="U250", device=k, fwd_s=1e-3, bwd_s=2e-3,
                    send_bytes=2 * model.layers[cuts[k + 1] - 1].out_elems if k < 3 else 0,
                    stash_bytes=10**6, weight_bytes=10**7) for k in range(4)]
    plan = Plan(model="vgg16", model_fingerprint=model.fingerprint(), cluster="4xU250-ring",
                cluster_fingerprint=cl.fingerprint(), schedule="1f1b", microbatches=8, microbatch_size=1,
                global_batch=8, stages=stages, predicted={"iteration_time_s": 0.033})
    path = tmp_path / "plan.yaml"
    plan.save(path)
    return path


def test_cli_json(tmp_path):
    path = _hand_plan(tmp_path)
    out = cli_fork.bapipe("sim", path, "--json", "--iterations", "2", "--gantt", tmp_path / "g.png", "--trace",
                          tmp_path / "t.json", check=True)   # the console script, forked (tests/cli_fork.py)
    doc = json.loads(out.stdout)
    for key in ("iteration_time_s", "throughput_samples_per_s", "bubble_fraction", "boards", "links", "events",
                "wall_s"):
        assert key in doc
    assert set(doc["boards"][0]) >= {"name", "busy", "bubble", "stall", "peak_memory_bytes"}
    assert set(doc["links"][0]) >= {"name", "utilisation"}
    # a range, not a tolerance: 11 x 3 ms of compute is the floor; the cut transfers (2 x 0.42 ms,
    # test_comm_on_critical_path) and PCIe keep it below 0.036 s
    assert 0.033 <= doc["iteration_time_s"] < 0.036
    # throughput is computed as samples / iteration time: the same float64 division, exact
    assert doc["throughput_samples_per_s"] == 8 / doc["iteration_time_s"]
    assert (tmp_path / "g.png").exists() and (tmp_path / "t.json").exists()


def test_cli_bad_plan_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: vgg16\nstages: 3\n")
    out = cli_fork.bapipe("sim", bad)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "bad.yaml" in out.stderr


def test_comm_on_critical_path(tmp_path):
    """VGG-16 on 4 U250s, balanced 3 ms stages: GPipe and eager-1F1B take exactly (m+p-1) t plus one
    forward and one backward trip over every cut (the first inputs are prefetched); 1F1B pays the round trip
    again in its steady state (only p-d micro-batches in flight), which closed forms miss."""
    from bapipe.plan import load_plan
    from bapipe.fpga_models.plancheck import resolve

    plan = load_plan(_hand_plan(tmp_path))
    model, cl = resolve(plan)
    from bapipe.fpga_models.engines import link_transfer

    def trip(k, s):   # the transport's framed line bytes and framing latency (engines.link_transfer)
        a, b = f"fpga{k}", f"fpga{k + 1}"
        bw = cl.path_bandwidth(a, b)
        line, extra = link_transfer(s.send_bytes, 2, plan.microbatch_size, bw, cl.board(a).board.clock_hz)
        return line / bw + cl.path_latency(a, b) + extra
    assert plan.number_format == "fixed16"
    trips = sum(trip(k, s) for k, s in enumerate(plan.stages[:-1]))
    expect = 11 * 3e-3 + 2 * trips
    runs = {}
    for sched in ("gpipe", "eager-1f1b", "1f1b"):
        plan.schedule = sched
        runs[sched] = simulate(plan, model, cl)
    times = {k: r.iteration_time_s for k, r in runs.items()}
    # a closed form of 11 compute steps and 6 trips (a few roundings) against a chain of events
    # (sim_rel): not exact, since the two sum in different orders
    rel = 2 * sim_rel(*runs.values())
    assert times["gpipe"] == pytest.approx(expect, rel=rel)
    assert times["eager-1f1b"] == pytest.approx(expect, rel=rel)
    # a real effect, not a rounding margin: 1F1B pays about 5% more here
    assert times["1f1b"] > expect * 1.03


# --- agreement with the planner -----------------------------------------------------------

def _planned(model_name: str, cluster_name: str, **req):
    pytest.importorskip("bapipe.planner.planning")
    from planned import cached_plan   # searched once per run

    return cached_plan(model_name, cluster_name, **req).plan, load_model(model_name), load_cluster(cluster_name)


AGREE = [
    ("tiny-mlp", "4xU250-ring", {}),
    ("tiny-cnn", "hetero-mix", {}),
    ("tiny-cnn", "8xU280-ring", {"schedule": "gpipe", "replication": False}),
    ("tiny-cnn", "8xU280-ring", {"schedule": "eager-1f1b", "replication": False}),
    pytest.param("gnmt8", "8xU280-ring", {}, marks=pytest.mark.slow),   # planning gnmt8: about 8 s
    ("resnet50", "4xU250-ring", {}),
]


@pytest.mark.parametrize("model_name,cluster_name,req", AGREE)
def test_planner_prediction_within_3_percent(model_name, cluster_name, req):
    """The planner's predicted iteration time and the simulation agree within 3% (issue 4)."""
    plan, model, cl = _planned(model_name, cluster_name, **req)
    r = simulate(plan, model, cl, config=SimConfig(record=False))
    pred = plan.predicted["iteration_time_s"]
    # not a rounding bound: issue 4's acceptance criterion (the planner's closed forms may miss
    # contention and credit stalls the simulator sees by up to 3%)
    assert r.iteration_time_s == pytest.approx(pred, rel=0.03)
    # and the plan's per-board memory is what the simulation's peaks reach (non-interleaved plans):
    # byte counts, integers, so exact
    if plan.schedule != "interleaved" and plan.mode == "train":
        for b in r.boards:
            mine = sum(s.memory_bytes for s in plan.stages if s.device == b.device)
            assert b.peak_memory_bytes == mine


def test_allreduce_per_chunk_matches_planner_and_beats_per_device():
    """tiny-cnn on 4xU250-ring, interleaved with 2 replicas a stage (VGG-16's interleaved plan no longer
    fits the boards' blocks, issue 32). The planner now reduces each chunk after that
    chunk's last backward, as the simulator does by default, so the two agree; reducing a whole device's
    weights after its last backward (``allreduce_per="device"``) cannot be faster."""
    plan, model, cl = _planned("tiny-cnn", "4xU250-ring", schedule="interleaved")
    if not (plan.schedule == "interleaved" and any(s.replicas > 1 for s in plan.stages)):
        pytest.skip(f"the planner now picks {plan.schedule} without replicated chunks")
    pred = plan.predicted["iteration_time_s"]
    per_chunk = simulate(plan, model, cl, config=SimConfig(record=False))
    per_device = simulate(plan, model, cl, config=SimConfig(record=False, allreduce_per="device"))
    # planner and simulator model the same per-chunk reduction; 0.5% is the agreement this test
    # claims (tighter than issue 4's 3%), not a rounding bound
    assert per_chunk.iteration_time_s == pytest.approx(pred, rel=0.005)
    # may be equal (nothing to overlap): each within sim_rel
    assert per_device.iteration_time_s >= per_chunk.iteration_time_s * (1 - 2 * sim_rel(per_chunk, per_device))


def test_host_input_without_prefetch_costs_one_pcie_trip(tmp_path):
    """Without prefetching, the first micro-batch's input crosses PCIe before stage 0 can start."""
    from bapipe.plan import load_plan
    from bapipe.fpga_models.plancheck import resolve

    plan = load_plan(_hand_plan(tmp_path))
    plan.schedule = "gpipe"
    model, cl = resolve(plan)
    host = cl.host_of("fpga0")
    pcie = 3 * 224 * 224 * 2 / host.pcie_bw_Bps + host.pcie_latency_s
    warm = simulate(plan, model, cl)
    cold_r = simulate(plan, model, cl, config=SimConfig(prefetch_input=False))
    pre, cold = warm.iteration_time_s, cold_r.iteration_time_s
    # a difference of two times (each within sim_rel of about 35 ms) against 26 us: the bound
    # is absolute, 2 sim_rel of the larger time, plus the closed form's 3 roundings
    assert cold - pre == pytest.approx(pcie, rel=3 * U64, abs=2 * sim_rel(warm, cold_r) * cold)


def test_allreduce_per_device_waits_for_all_chunks():
    """Interleaved, 2 replicas per device: reducing per chunk overlaps the other chunk's backward."""
    p, m, v, r = 2, 4, 2, 2
    plan = balanced("interleaved", p, m, v, replicas=r, weights=10**6)
    cl = ring(p * r, bw=1e6, lat=1e-3)
    stage = simulate(plan, MODEL, cl, config=NO_HOST)
    dev = simulate(plan, MODEL, cl, config=SimConfig(host_io=False, allreduce_per="device"))
    ring_s = 2 * (r - 1) * (10**6 / r / 1e6 + 1e-3)   # one chunk's ring
    assert dev.makespan_s > stage.makespan_s
    assert len(stage.allreduces) == p * v and len(dev.allreduces) == p
    for _, _, t0, t1 in stage.allreduces:
        # equal when nothing delays the ring; t0, t1 within sim_rel of the makespan
        assert t1 - t0 >= ring_s - 2 * sim_rel(stage) * stage.makespan_s


def test_interleaved_peak_with_unequal_chunks():
    """Chunks with different stash sizes peak at different times: the simulator's peak is the exact
    op-order maximum of sum_c live_c x bytes_c (stash_peak_bytes), not a per-chunk stash count."""
    from bapipe.fpga_models.sim import stash_peak_bytes

    p, m, v = 2, 4, 2
    plan = balanced("interleaved", p, m, v, stash=0)
    sizes = {0: 1000, 1: 10}
    for s in plan.stages:
        s.stash_bytes = sizes[s.chunk]
    r = simulate(plan, MODEL, ring(p), config=NO_HOST)
    for b in r.boards:
        exact = stash_peak_bytes("interleaved", p, b.device, m, v, [1000, 10])
        assert b.peak_memory_bytes == exact
    # device 0 holds 4 micro-batches of chunk 0 at once, more than ceil(stash_count / v) = 3
    assert stash_peak_bytes("interleaved", p, 0, m, v, [1000, 10]) == 4 * 1000 + 10
    assert math.ceil(stash_count("interleaved", p, 0, m, v) / v) == 3


def test_bad_plan_is_a_spec_error():
    from bapipe.errors import SpecError

    with pytest.raises(SpecError, match="multiple of 4"):
        simulate(balanced("interleaved", 4, 6, 2), MODEL, ring(4))
    plan = balanced("1f1b", 2, 4)
    plan.stages[1].device = 5
    with pytest.raises(SpecError, match="pipeline positions"):
        simulate(plan, MODEL, ring(2))


def test_cuts_share_a_switch_downlink():
    """16xV100: hosts of 4 GPUs on a switch. The activations of cut 3 (gpu3 -> gpu4) and the gradients
    of cut 7 (gpu8 -> gpu7) both enter host1 over switch0->host1, so that link carries 2m messages
    and bounds the iteration; a per-cut link model misses it."""
    model = load_model("tiny-mlp")
    cl = load_cluster("16xV100")
    p, m, nbytes = 16, 8, 12_000_000     # 1 ms per message at 12 GB/s
    stages = [Stage(index=k, layers=[f"l{k}"], first=k, last=k, boards=[f"gpu{k}"], board_type="V100", device=k,
                    fwd_s=1e-4, bwd_s=2e-4, send_bytes=nbytes if k < p - 1 else 0) for k in range(p)]
    plan = Plan(model="tiny-mlp", model_fingerprint="", cluster="16xV100", cluster_fingerprint="",
                schedule="1f1b", microbatches=m, stages=stages)
    r = simulate(plan, model, cl, config=NO_HOST)
    down = next(ln for ln in r.links if ln.name == "switch0->host1")
    assert down.transfers == 2 * m
    # busy is a float64 sum of 2m = 16 transfer times of 1 ms (each t1 - t0 of event times
    # within sim_rel of the makespan)
    assert down.busy_s == pytest.approx(2 * m * nbytes / 12e9, rel=0, abs=2 * sim_rel(r) * r.makespan_s)
    assert r.makespan_s >= down.busy_s
    # a link busy the whole run: its sum of transfer times may round above the makespan
    assert all(ln.busy_s <= r.makespan_s * (1 + 2 * sim_rel(r)) for ln in r.links)


def test_auto_credits_cover_the_credit_loop():
    """Default receive buffers cover the bandwidth-delay product: as fast as unbounded ones, while a
    fixed double buffer throttles 0.2 us stages behind 0.5 us links (GPipe runs ahead)."""
    plan = balanced("gpipe", 4, 32, tf=0.2e-6, tb=0.4e-6, send=100)
    cl = ring(4, bw=1.19e10, lat=0.5e-6)
    auto = simulate(plan, MODEL, cl, config=NO_HOST).makespan_s
    unbounded = simulate(plan, MODEL, cl, config=SimConfig(host_io=False, rx_credits=10**6)).makespan_s
    double = simulate(plan, MODEL, cl, config=SimConfig(host_io=False, rx_credits=2)).makespan_s
    # the same events in the same order once no sender waits for a credit: the same float64 sums
    assert auto == unbounded
    # a real effect, not a rounding margin: two credits do not cover the 1 us credit loop of
    # 0.2 us stages (about 1.5x slower here)
    assert double > 1.4 * auto
