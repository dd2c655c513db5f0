"""The planner's search space (issue 19): schedules honoured, idle boards, per-stage replicas."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bapipe.schedules import SCHEDULES
from bapipe.spec import load_model
from fpga_models.cluster import load_cluster
from planner.cli_plan import parse_partition
from planner.pipeline import replay
from planner.planning import make_plan
from planner.search import Request


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bapipe.cli", *args], capture_output=True, text=True)


def _plan(model, cluster, **kw):
    return make_plan(load_model(model), load_cluster(cluster), model, cluster, Request(**kw))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_schedule_asked_for_is_the_schedule_planned(schedule):
    out = _plan("tiny-mlp", "4xU250-ring", schedule=schedule, global_batch=32)
    assert out.plan.schedule == schedule
    assert out.best.config.schedule == schedule


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager-1f1b", "2bw"])
def test_one_stage_partition_keeps_its_schedule(schedule, tmp_path):
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--partition", "0-6", "--schedule", schedule, "--json",
             "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schedule"] == schedule


def test_gpipe_one_stage_stashes_every_microbatch():
    """GPipe's gradient accumulation on one board runs all m forwards first: m stashes."""
    g = _plan("tiny-mlp", "4xU250-ring", schedule="gpipe", microbatches=8, partition=parse_partition("0-6", 7))
    o = _plan("tiny-mlp", "4xU250-ring", schedule="1f1b", microbatches=8, partition=parse_partition("0-6", 7))
    assert g.plan.stages[0].stashes == 8 and o.plan.stages[0].stashes == 1


def test_partition_with_interleaved_is_interleaved(tmp_path):
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--partition", "0-1,2-3,4-5,6", "--schedule", "interleaved",
             "--json", "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schedule"] == "interleaved" and d["chunks"] == 2
    assert [s["device"] for s in d["stages"]] == [0, 1, 0, 1]
    assert [s["boards"] for s in d["stages"]] == [["fpga0"], ["fpga1"], ["fpga0"], ["fpga1"]]


def test_partition_interleaved_odd_ranges_is_one_line(tmp_path):
    r = _cli("plan", "tiny-mlp", "4xU250-ring", "--partition", "0-1,2-3,4-6", "--schedule", "interleaved",
             "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--partition" in r.stderr and "even" in r.stderr


def test_fewer_boards_when_faster():
    """Issue 19: tiny-mlp on 4xU250-ring, GPipe, 8 micro-batches: one board (1.44 us) beats
    four pipelined ones (4.0 us, dominated by the links); the headline is the faster plan."""
    out = _plan("tiny-mlp", "4xU250-ring", schedule="gpipe", microbatches=8, global_batch=32)
    assert out.plan.schedule == "gpipe"
    assert out.best.boards_used == 1 and len(out.plan.stages) == 1
    assert out.best.iteration_s == pytest.approx(1.44e-6, rel=1e-9)
    assert out.baselines["equal_split"]["iteration_time_s"] == pytest.approx(4.0e-6, rel=2e-3)
    assert out.baselines["fewer_boards"]["boards"] == 1
    # never slower than any plan on all four boards
    four = _plan("tiny-mlp", "4xU250-ring", schedule="gpipe", microbatches=8, global_batch=32,
                 partition=parse_partition("0-1,2-3,4-5,6", 7))
    assert out.best.iteration_s < four.best.iteration_s


def test_fewer_boards_baseline_is_reported():
    out = _plan("vgg16", "4xU250-ring")
    fb = out.baselines["fewer_boards"]
    assert "iteration_time_s" in fb and fb["boards"] < 4
    assert out.best.iteration_s <= fb["iteration_time_s"]


@pytest.mark.parametrize("occ", [0.0, 0.5, 1.0, 1.5])
def test_1f1b_round_trip_cycle(occ):
    """Why 1F1B can be priced above GPipe for the same partition: adjacent 1F1B stages differ
    by one warm-up forward, so F_d -> link -> F_d+1, B_d+1 -> link -> B_d is a cycle holding
    two micro-batches: period >= (T_d + T_d+1 + 2 occ) / 2. GPipe has no such cycle (all
    forwards first): its period is max(F, occ) + max(B, occ). Two stages, F = 1, B = 2."""
    m = 32
    per = lambda s: (replay(s, 2, m, [1, 1], [2, 2], [occ], [0.0]).iteration_s  # noqa: E731
                     - replay(s, 2, m // 2, [1, 1], [2, 2], [occ], [0.0]).iteration_s) / (m // 2)
    assert per("1f1b") == pytest.approx(max(3.0, (3 + 3 + 2 * occ) / 2))
    # GPipe's forward and backward phases are throttled separately
    assert per("gpipe") == pytest.approx(max(1.0, occ) + max(2.0, occ))
    # eager-1F1B's two extra warm-up forwards put three micro-batches on the cycle
    assert per("eager-1f1b") == pytest.approx(max(3.0, (3 + 3 + 2 * occ) / 3))
