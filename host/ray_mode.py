"""Optional Ray execution: each board worker a Ray actor (as Alpa runs its meshes on Ray).

Ray (>= 2.40) is one of bapipe's dependencies. Each actor runs the same ``host.workers.Worker``
loop as a local worker process. Messaging is built for few round trips, because on a
small machine every blocking Ray call costs about a millisecond:

* inbox: a ``queue.Queue`` inside the actor, filled by the fire-and-forget method
  ``deliver`` (its own one-thread concurrency group, so it runs while ``run`` blocks).
  Workers send activations and gradients to their neighbours' actors directly, so on a
  Ray cluster tensors go board host to board host, not through the driver.
  Ray does not promise the order of calls into a threaded actor; the worker keys every
  data message by (kind, iteration, stage, micro-batch, source) and buffers it, and the
  driver sends a command only after every worker answered the previous one, so order
  does not matter.
* results: a second in-actor queue that the driver long-polls (``drain``), one pending
  poll per actor, so reports come back in batches.

Placement by host: every board worker asks for the custom resource ``bapipe_board_<board>``
(1 unit), which only the Ray node standing for that board's host offers
(``node_resources(cluster, host)``: one unit per board of the host, plus
``bapipe_host_<host>`` = its board count; start a node with ``ray start --resources
'<that JSON>'``). A local instance this module starts is one node offering every board's
resource (one machine standing for every host). A running Ray cluster that offers none of
these resources gets unplaced actors (a warning on stderr, ``ray_placed: false``); one that
offers some but not a board of the plan is refused in one line naming the board and host.
After start-up every actor reports its node, and the driver checks that the node offers
the actor's board (``ray_info``: nodes used, per worker board, host and node).

Tensors between actors travel through Ray's object store: the sender ``ray.put``s every
array of a message and sends only the references (``_ObjectRefs``); the receiver fetches
them with ``ray.get`` (across nodes, Ray's object manager moves them). Actor-call
arguments carry only the message's small fields.

A dead actor (``ray.kill``, a crashed process) shows as a failed ``run`` reference, which
the driver's watchdog turns into the usual one-line ``PipelineFailure`` naming the stage
and micro-batch. ``ray.init`` joins RAY_ADDRESS when set, else starts a quiet local
instance (2 CPUs, no dashboard, loopback only, errors only, worker output not forwarded to stdout)
that ``close`` shuts down again; a session the caller started is left running.
"""
from __future__ import annotations

import logging
import os
import queue
import time
from collections import deque

from .backends import BackendUnavailable
from .pipeline import Pipeline
from .workers import worker_main

#: how long one result poll waits inside an actor before answering "nothing yet"
DRAIN_S = 0.5
BOARD_RESOURCE = "bapipe_board_{}"
HOST_RESOURCE = "bapipe_host_{}"


def node_resources(cluster, host: str) -> dict[str, float]:
    """Custom resources of the Ray node that stands for ``host`` of ``cluster``."""
    boards = [cb.name for cb in cluster.boards if cb.host == host]
    return {HOST_RESOURCE.format(host): float(len(boards)), **{BOARD_RESOURCE.format(b): 1.0 for b in boards}}


def all_resources(cluster) -> dict[str, float]:
    """Every host's resources on one node (a local instance standing for the whole cluster)."""
    out: dict[str, float] = {}
    for h in dict.fromkeys(cb.host for cb in cluster.boards):
        out.update(node_resources(cluster, h))
    return out


def require_ray():
    """The ray module, or one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("--ray needs the 'ray' extra (Ray), which is not installed: "
                                 "pip install 'bapipe[ray]'") from None
    return ray


def init_ray(num_cpus: int | None = None, resources: dict[str, float] | None = None) -> bool:
    """Connect to Ray (RAY_ADDRESS) or start a local instance; True when this call started it.

    The settings make a local start quick and quiet on a small offline machine: no
    dashboard, no usage-stats report, loopback address, a small object store, errors only
    (warnings too with --verbose), and workers' stdout kept out of the driver's (so ``--json`` stays one object).
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network call, no prompt
    address = os.environ.get("RAY_ADDRESS")
    # Ray's own warnings (e.g. "Token authentication is enabled") are for Ray's operators, not
    # for a `bapipe run` user: kept off the terminal unless --verbose (bapipe.verbose) asks
    level = logging.WARNING if logging.getLogger("bapipe").isEnabledFor(logging.INFO) else logging.ERROR
    logging.getLogger("ray").setLevel(level)
    kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level=level,
                  configure_logging=True)
    if not address:
        kwargs.update(num_cpus=num_cpus or min(2, os.cpu_count() or 1), _node_ip_address="127.0.0.1",
                      object_store_memory=128 << 20, resources=dict(resources or {}))
    _errors_to_stderr()
    ray.init(address=address, **kwargs)
    return True


def _errors_to_stderr() -> None:
    """Route the driver's "(raylet) A worker died ..." notices to stderr.

    Ray's error-listener thread prints them as non-error output, i.e. to stdout, where they
    would break ``--json``'s single object. The thread looks the printer up by module
    name on every message, so wrapping it once is enough; a Ray without it is left alone.
    """
    try:
        from ray._private import worker as rw
    except ImportError:
        return
    orig = getattr(rw, "print_to_stdstream", None)
    if orig is None or getattr(orig, "_bapipe_stderr", False):
        return

    def to_stderr(data, *args, **kwargs):
        return orig({**data, "is_err": True}, *args, **kwargs)

    to_stderr._bapipe_stderr = True
    rw.print_to_stdstream = to_stderr


_ACTOR_CLASS = None


def _actor_class(ray):
    """The BoardWorker actor class (built on first use so importing this module needs no Ray)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is not None:
        return _ACTOR_CLASS

    # num_cpus=0: a board worker mostly waits for its neighbours, and a pipeline needs all
    # its workers alive at once even when there are more boards than CPUs
    @ray.remote(num_cpus=0, concurrency_groups={"inbox": 1, "outbox": 1})
    class BoardWorker:
        """One board worker: the worker loop plus its inbox and result queues."""

        def __init__(self):
            self.inbox: queue.Queue = queue.Queue()
            self.outbox: queue.Queue = queue.Queue()

        @ray.method(concurrency_group="inbox")
        def deliver(self, msg) -> None:
            """Put one message into this worker's inbox (its arrays fetched from the object store)."""
            self.inbox.put(_fetch(ray, msg))

        @ray.method(concurrency_group="inbox")
        def deliver_many(self, msgs: list) -> None:
            """Put several messages into the inbox, in order (the driver's batched feed)."""
            for msg in msgs:
                self.inbox.put(_fetch(ray, msg))

        @ray.method(concurrency_group="outbox")
        def where(self) -> dict:
            """The node this actor runs on: Ray node id and IP address."""
            ctx = ray.get_runtime_context()
            return {"node_id": ctx.get_node_id(), "pid": os.getpid(),
                    "node_ip": ray.util.get_node_ip_address()}

        @ray.method(concurrency_group="outbox")
        def drain(self, timeout: float) -> list:
            """Every result reported since the last drain, waiting up to ``timeout`` for the first."""
            try:
                out = [self.outbox.get(timeout=timeout)]
            except queue.Empty:
                return []
            while True:
                try:
                    out.append(self.outbox.get_nowait())
                except queue.Empty:
                    return out

        @ray.method(concurrency_group="outbox")
        def pid(self) -> int:
            """The actor's process id."""
            return os.getpid()

        def run(self, spec, peers: list) -> None:
            """Serve the worker loop until told to stop (or it fails and reports why)."""
            spec.parent_check = False  # Ray, not the parent process, owns the actor's lifetime
            inboxes = [self.inbox if w == spec.worker else _ActorInbox(h, ray) for w, h in enumerate(peers)]
            worker_main(spec, inboxes, self.outbox)

    _ACTOR_CLASS = BoardWorker
    return BoardWorker


class _ObjectRefs:
    """Arrays of a message, replaced by object-store references (not resolved by Ray on the
    way: they sit inside a plain object, so only the receiver's ``ray.get`` fetches them)."""

    def __init__(self, refs):
        self.refs = refs


def _stash(ray, msg):
    """``msg`` with every numpy array ``ray.put`` into the object store (a reference in its place)."""
    import numpy as np

    if isinstance(msg, np.ndarray):
        return _ObjectRefs(ray.put(msg))
    if isinstance(msg, tuple):
        return tuple(_stash(ray, m) for m in msg)
    if isinstance(msg, list):
        return [_stash(ray, m) for m in msg]
    if isinstance(msg, dict):
        return {k: _stash(ray, v) for k, v in msg.items()}
    return msg


def _fetch(ray, msg):
    """The inverse of ``_stash``: every reference fetched from the object store."""
    if isinstance(msg, _ObjectRefs):
        return ray.get(msg.refs)
    if isinstance(msg, tuple):
        return tuple(_fetch(ray, m) for m in msg)
    if isinstance(msg, list):
        return [_fetch(ray, m) for m in msg]
    if isinstance(msg, dict):
        return {k: _fetch(ray, v) for k, v in msg.items()}
    return msg


class _ActorInbox:
    """A worker actor's inbox as seen from elsewhere: ``put`` is a fire-and-forget call whose
    arrays go through the object store."""

    def __init__(self, actor, ray):
        self.actor, self.ray = actor, ray

    def put(self, msg) -> None:
        """Deliver ``msg`` (does not wait for the actor)."""
        self.actor.deliver.remote(_stash(self.ray, msg))


class _DriverInbox(_ActorInbox):
    """The driver's view of an inbox: data messages wait and go with the next command.

    The driver always follows an iteration's inputs and labels with a command (``iter``,
    ``eval``), so sending them together in one call saves a Ray call per micro-batch.
    """

    def __init__(self, actor, ray):
        super().__init__(actor, ray)
        self.held: list = []

    def put(self, msg) -> None:
        """Hold a data message; send the held ones and a command in one call."""
        self.held.append(_stash(self.ray, msg))
        if msg[0] == "cmd":
            self.actor.deliver_many.remote(self.held)
            self.held = []


class _ActorHandle:
    """Makes a Ray actor look like a multiprocessing.Process to the driver's watchdog."""

    def __init__(self, ray, actor, done_ref):
        self.ray, self.actor, self.done_ref = ray, actor, done_ref
        self.exitcode = None
        self.death = None
        self._pid = None

    @property
    def pid(self) -> int | None:
        """The actor's process id (asked once), or None if it is gone."""
        if self._pid is None:
            try:
                self._pid = self.ray.get(self.actor.pid.remote(), timeout=10)
            except Exception:
                return None
        return self._pid

    def is_alive(self) -> bool:
        """False once the actor's ``run`` has ended, normally or by the actor dying."""
        ready, _ = self.ray.wait([self.done_ref], timeout=0)
        if not ready:
            return True
        if self.exitcode is None:
            try:
                self.ray.get(self.done_ref)
                self.exitcode = 0
            except Exception as e:  # ActorDiedError / RayActorError: killed or crashed
                self.exitcode = -1
                self.death = "Ray actor killed" if "ray.kill" in str(e) else "Ray actor died"
        return False

    def join(self, timeout=None) -> None:
        """Wait up to ``timeout`` seconds for ``run`` to end."""
        self.ray.wait([self.done_ref], timeout=timeout)

    def kill(self) -> None:
        """End the actor's process."""
        try:
            self.ray.kill(self.actor)
        except Exception:  # already gone
            pass


def _plan_cluster(plan):
    """The plan's cluster (board -> host), or None when it cannot be loaded (then nothing is placed)."""
    from bapipe.fpga_models.cluster import load_cluster

    try:
        return load_cluster(plan.cluster)
    except Exception:  # an in-memory plan naming a cluster file that is gone: run unplaced
        return None


def _placement_possible(ray, cluster, boards: list[str]) -> bool:
    """True when the Ray cluster offers every worker's board resource; False when it offers no
    bapipe resource at all (a session started without them: a warning); else one line naming
    the boards no node offers."""
    import sys

    have = ray.cluster_resources()
    need = [BOARD_RESOURCE.format(b) for b in boards]
    if cluster is not None and all(n in have for n in need):
        return True
    if not any(k.startswith(BOARD_RESOURCE.format("")) for k in have):
        sys.stderr.write("bapipe run --ray: the Ray cluster offers no bapipe_board_* resources; board workers are "
                         "not placed by host (start each node with host.ray_mode.node_resources)\n")
        return False
    missing = sorted({b for b, n in zip(boards, need) if n not in have})
    hosts = sorted({cluster.board(b).host for b in missing}) if cluster is not None else []
    raise BackendUnavailable(f"no Ray node offers the resource of board(s) {', '.join(missing)} (host "
                             f"{', '.join(hosts)}): start that host's node with ray start --resources "
                             f"(host.ray_mode.node_resources)")


def _check_placement(ray, actors, boards: list[str], cluster, placed: bool) -> dict:
    """Ask every actor where it runs; check it is a node offering its board; the ray_info dict."""
    where = ray.get([a.where.remote() for a in actors], timeout=30)
    nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    out = []
    for w, (b, loc) in enumerate(zip(boards, where)):
        res = nodes.get(loc["node_id"], {}).get("Resources", {})
        if placed and BOARD_RESOURCE.format(b) not in res:  # Ray broke its own promise: never silently
            raise RuntimeError(f"worker {w} (board {b}) runs on node {loc['node_id'][:8]}, which does not offer "
                               f"{BOARD_RESOURCE.format(b)}")
        out.append({"worker": w, "board": b, "host": cluster.board(b).host if cluster is not None else None,
                    "node_id": loc["node_id"], "node_ip": loc["node_ip"]})
    return {"ray_nodes": len({p["node_id"] for p in out}), "ray_cluster_nodes": len(nodes),
            "ray_placed": placed, "ray_placement": out}


class RayPipeline(Pipeline):
    """``Pipeline`` with Ray actors instead of local processes."""

    def _start(self, faults: dict) -> None:
        ray = require_ray()
        cluster = _plan_cluster(self.plan)
        if not hasattr(self, "_owns_ray"):
            self._owns_ray = init_ray(resources=all_resources(cluster) if cluster else None)
        self.ray = ray
        cls = _actor_class(ray)
        boards = self._worker_boards()
        placed = _placement_possible(ray, cluster, boards)
        actors = [cls.options(resources={BOARD_RESOURCE.format(b): 1.0}).remote() if placed else cls.remote()
                  for b in boards]
        self.inboxes = [_DriverInbox(a, ray) for a in actors]
        self.procs = [_ActorHandle(ray, a, a.run.remote(self._spec(w, faults.get(w)), actors))
                      for w, a in enumerate(actors)]
        self._polls = [None] * self.n
        self._buf: deque = deque()
        ready = set()
        try:
            self._collect(lambda msg: msg[0] == "ready" and ready.add(msg[1]) is None and len(ready) == self.n,
                          what="start-up", ops=None, key=None)
            self.ray_info = _check_placement(ray, actors, boards, cluster, placed)
        except BaseException:  # train() never sees this pipeline, so release the actors and Ray here
            self.close()
            raise

    def _worker_boards(self) -> list[str]:
        """The board of each worker (device d, replica r): the board of its device's first stage's replica r."""
        lay = self.layout
        first = {}
        for s, d in enumerate(lay.stage_device):
            first.setdefault(d, s)
        return [lay.boards[first[d]][r] for d, r in lay.workers]

    def _next_result(self, timeout: float):
        """The next worker report, or None after ``timeout``: keeps one pending poll per live actor."""
        if self._buf:
            return self._buf.popleft()
        ray = self.ray
        for w, pr in enumerate(self.procs):
            if self._polls[w] is None and pr.exitcode is None:
                self._polls[w] = pr.actor.drain.remote(DRAIN_S)
        pending = [r for r in self._polls if r is not None]
        if not pending:
            time.sleep(timeout)
            return None
        ready, _ = ray.wait(pending, num_returns=1, timeout=timeout)
        if ready:  # take every poll that has answered, not just the first
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        done = {r for r in ready}
        for w, ref in enumerate(self._polls):
            if ref is not None and ref in done:
                self._polls[w] = None
                try:
                    self._buf.extend(ray.get(ref))
                except Exception:  # the actor is gone; is_alive() reports it
                    self.procs[w].is_alive()
        return self._buf.popleft() if self._buf else None

    def _stop_actors(self) -> None:
        for w, pr in enumerate(self.procs):
            if pr.is_alive():
                self.inboxes[w].put(("cmd", "stop"))
        deadline = time.monotonic() + 2.0
        for pr in self.procs:
            pr.join(max(0.0, deadline - time.monotonic()))
            pr.kill()
        self.procs = []
        self._polls = []
        self._buf = deque()

    def restart(self, state: dict) -> None:
        """Replace every actor with a fresh one holding ``state`` (after a failure); Ray stays up."""
        self._stop_actors()
        self._start({})
        self.set_state(state)

    def close(self) -> None:
        """Stop the actors; shut Ray down if this pipeline started it."""
        if self.procs:
            self._stop_actors()
        if getattr(self, "_owns_ray", False):
            self._owns_ray = False
            self.ray.shutdown()
