"""host.ray_mode: board workers as Ray actors on a local Ray instance.

One Ray session serves the whole module (starting Ray costs seconds); the CLI test runs
first, in its own process, with a Ray instance that ``bapipe run --ray`` starts and stops.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from bapipe.host.driver import PipelineFailure, train  # noqa: E402
from handplan import hand_plan  # noqa: E402
from bapipe.host.ray_mode import init_ray  # noqa: E402
from tolerances import grad_tolerance  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

PLAN = dict(cuts=(1, 3, 5), schedule="1f1b", microbatches=4, microbatch_size=16)


def test_cli_ray_json_is_one_object_equal_to_local(tmp_path):
    """`bapipe run --ray --json`: stdout is one JSON object, numbers equal to local processes, Ray stopped."""
    assert not ray.is_initialized()
    plan_file = tmp_path / "plan.yaml"
    hand_plan("tiny-mlp", **PLAN).save(plan_file)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a fresh local instance
    out = subprocess.run([sys.executable, "-m", "bapipe.cli", "run", str(plan_file), "--backend", "numpy", "--ray",
                          "--epochs", "1", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)  # the whole of stdout: Ray's logs went to stderr
    local = train(str(plan_file), epochs=1)
    assert r["ray"] is True and local["ray"] is False
    for k in ("final_loss", "test_accuracy", "grad_max_rel_err_vs_single_device", "iterations", "history"):
        assert r[k] == local[k], k


def test_workers_placed_by_host_on_a_two_node_cluster(tmp_path):
    """A local 2-node Ray cluster, each node standing for one host of 8xU280-ring (its
    bapipe_board_* resources): `run --ray` puts every board's worker on its host's node, sends
    tensors through the object store, trains exactly as local processes, and says so."""
    from ray.cluster_utils import Cluster

    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.host.ray_mode import node_resources

    assert not ray.is_initialized()
    cl = load_cluster("8xU280-ring")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": node_resources(cl, "host0"), "include_dashboard": False,
        "object_store_memory": 80 << 20})
    try:
        cluster.add_node(num_cpus=1, resources=node_resources(cl, "host1"), object_store_memory=80 << 20)
        cluster.wait_for_nodes()
        plan_file = tmp_path / "plan.yaml"
        # boards fpga0..fpga4: positions 0-2 (position 2 twice) on host0, position 3 on host1
        hand_plan("tiny-mlp", cluster="8xU280-ring", replicas=(1, 1, 2, 1), **PLAN).save(plan_file)
        env = dict(os.environ, RAY_ADDRESS=cluster.address)
        out = subprocess.run([sys.executable, "-m", "bapipe.cli", "run", str(plan_file), "--backend", "numpy",
                              "--ray", "--epochs", "1", "--json"], capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        ray.init(address=cluster.address, log_to_driver=False)
        node_of_host = {}
        for n in ray.nodes():
            for h in ("host0", "host1"):
                if n["Alive"] and f"bapipe_host_{h}" in n["Resources"]:
                    node_of_host[h] = n["NodeID"]
        assert len(set(node_of_host.values())) == 2
        assert r["ray"] and r["ray_placed"] and r["ray_nodes"] == 2 and r["ray_cluster_nodes"] == 2
        got = {(p["board"], p["host"], p["node_id"]) for p in r["ray_placement"]}
        want = {(b, cl.board(b).host, node_of_host[cl.board(b).host]) for b in ("fpga0", "fpga1", "fpga2",
                                                                              "fpga3", "fpga4")}
        assert got == want
        local = train(str(plan_file), epochs=1)
        for k in ("final_loss", "test_accuracy", "iterations", "history"):
            assert r[k] == local[k], k
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def test_actor_messages_carry_object_refs_not_arrays():
    """What an actor call carries: every array replaced by an object-store reference."""
    from bapipe.host.ray_mode import _ActorInbox, _fetch, _ObjectRefs

    store = {}

    class FakeRay:
        def put(self, a):
            store[id(a)] = a
            return id(a)

        def get(self, ref):
            return store[ref]

    sent = []

    class FakeActor:
        class deliver:
            @staticmethod
            def remote(msg):
                sent.append(msg)

    a, g = np.arange(6.0).reshape(2, 3), {"fc1": {"W": np.ones((3, 3))}}
    _ActorInbox(FakeActor(), FakeRay()).put(("act", ("train", 1), 0, 2, -1, {"x": a}))
    _ActorInbox(FakeActor(), FakeRay()).put(("gred", ("train", 1), 0, 1, g))

    def arrays(m):
        if isinstance(m, np.ndarray):
            return 1
        if isinstance(m, (tuple, list)):
            return sum(arrays(x) for x in m)
        return sum(arrays(x) for x in m.values()) if isinstance(m, dict) else 0

    assert [arrays(m) for m in sent] == [0, 0]
    assert isinstance(sent[0][5]["x"], _ObjectRefs)
    back = _fetch(FakeRay(), sent[0])
    assert np.array_equal(back[5]["x"], a) and back[:5] == ("act", ("train", 1), 0, 2, -1)
    assert np.array_equal(_fetch(FakeRay(), sent[1])[4]["fc1"]["W"], g["fc1"]["W"])


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for the in-process tests (its node stands for every host of 4xU250-ring)."""
    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.host.ray_mode import all_resources

    started = init_ray(resources=all_resources(load_cluster("4xU250-ring")))
    yield
    if started:
        ray.shutdown()


def test_training_through_ray_equals_local_processes(ray_session, tmp_path):
    """Same seed: identical losses, accuracy, gradient check and final weights (bit for bit)."""
    plan = hand_plan("tiny-mlp", **PLAN)
    a = train(plan, epochs=1, max_iterations=8, ray=True, checkpoint=str(tmp_path / "ray.npz"))
    b = train(plan, epochs=1, max_iterations=8, checkpoint=str(tmp_path / "local.npz"))
    assert ray.is_initialized()  # the module's session is not shut down by a run
    assert a["ray"] and not b["ray"] and a["iterations"] == b["iterations"] == 8
    assert a["final_loss"] == b["final_loss"] and a["test_accuracy"] == b["test_accuracy"]
    assert a["grad_max_rel_err_vs_single_device"] == b["grad_max_rel_err_vs_single_device"] < grad_tolerance("tiny-mlp", 64)
    wa, wb = np.load(tmp_path / "ray.npz"), np.load(tmp_path / "local.npz")
    assert sorted(wa.files) == sorted(wb.files) and len(wa.files) > 4
    for k in wa.files:
        assert np.array_equal(wa[k], wb[k]), k


def test_killed_actor_stops_the_driver_naming_stage_and_microbatch(ray_session):
    """ray.kill of stage 2's actor in the middle of iteration 2 -> one line naming stage 2 and a micro-batch."""
    plan = hand_plan("tiny-mlp", **PLAN)
    seen = {"ops": 0}
    pipes = []

    def hook(pipe):
        pipes.append(pipe)
        real = pipe._next_result

        def spy(timeout):
            msg = real(timeout)
            if msg is not None and msg[0] == "op" and msg[2] == ("train", 2):
                seen["ops"] += 1
                if seen["ops"] == 5:  # some ops of the iteration are done, others not yet
                    ray.kill(pipe.procs[2].actor)
            return msg

        pipe._next_result = spy

    with pytest.raises(PipelineFailure) as e:
        train(plan, epochs=1, ray=True, check_grads=False, pipeline_hook=hook, timeout=20)
    msg = str(e.value)
    assert "\n" not in msg
    assert re.fullmatch(r"stage 2 \(device 2, board \w+\) during (forward|backward) of micro-batch [0-3] "
                        r"\(train iteration 2\) died \(Ray actor killed\)", msg), msg
    assert pipes[0].procs == [] and ray.is_initialized()  # actors released, session kept


def test_cli_dead_actor_is_one_line_exit_1_and_stdout_stays_json(ray_session, tmp_path, capsys, monkeypatch):
    """A crashing actor (the workers' die hook): exit 1, one JSON object on stdout, the culprit on stderr."""
    import time

    import bapipe.host.driver as drv
    from bapipe.cli import main

    plan_file = tmp_path / "plan.yaml"
    hand_plan("tiny-mlp", **PLAN).save(plan_file)
    real = drv.train
    monkeypatch.setattr("bapipe.host.cli_run.train", lambda *a, **k: real(*a, faults={1: {"iteration": 1, "op": 0,
                                                                                   "mode": "die"}}, **k))
    assert main(["run", str(plan_file), "--ray", "--epochs", "1", "--json"]) == 1
    time.sleep(1.0)  # Ray prints its own notice of the death from a background thread
    out, err = capsys.readouterr()
    r = json.loads(out)
    assert r["backend"] == "numpy" and re.fullmatch(
        r"stage 1 \(device 1, board \w+\) during forward of micro-batch 0 \(train iteration 1\) "
        r"died \(Ray actor died\)", r["error"]), r["error"]
    assert "bapipe run: " + r["error"] in err.splitlines()
