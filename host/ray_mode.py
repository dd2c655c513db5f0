"""Optional Ray execution: each board worker a Ray actor (as Alpa runs its meshes on Ray).

Install with ``pip install 'bapipe[ray]'``. The actors run the same ``host.workers.Worker``
loop as the local processes; their inboxes and the result queue are
``ray.util.queue.Queue`` actors, so workers on different machines of a Ray cluster talk
directly. ``ray.init(address=...)`` is taken from the RAY_ADDRESS environment variable
(default: a local Ray instance). Everything else (feeding, watching, accounting,
checkpoints) is the local driver's, unchanged.
"""
from __future__ import annotations

import os

from .backends import BackendUnavailable
from .driver import Pipeline
from .workers import worker_main


def require_ray():
    """The ray module, or one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("--ray needs Ray, which is not installed: pip install 'bapipe[ray]'") from None
    return ray


class _ActorHandle:
    """Makes a Ray actor look like a multiprocessing.Process to the driver's watchdog."""

    def __init__(self, ray, actor, done_ref, worker: int):
        self.ray, self.actor, self.done_ref, self.worker = ray, actor, done_ref, worker
        self.pid = None
        self.exitcode = None

    def is_alive(self) -> bool:
        ready, _ = self.ray.wait([self.done_ref], timeout=0)
        if ready:
            try:
                self.ray.get(self.done_ref)
                self.exitcode = 0
            except Exception:  # the actor died (RayActorError) or its loop raised
                self.exitcode = -1
            return False
        return True

    def join(self, timeout=None) -> None:
        self.ray.wait([self.done_ref], timeout=timeout)

    def kill(self) -> None:
        self.ray.kill(self.actor)


class RayPipeline(Pipeline):
    """``Pipeline`` with Ray actors instead of local processes."""

    def _start(self, faults: dict) -> None:
        ray = require_ray()
        from ray.util.queue import Queue

        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)

        @ray.remote(num_cpus=0)
        class BoardWorker:
            def run(self, spec, inboxes, results):
                spec.parent_check = False
                worker_main(spec, inboxes, results)

        self.inboxes = [Queue() for _ in range(self.n)]
        self.results = Queue()
        self.procs = []
        for w in range(self.n):
            actor = BoardWorker.remote()
            ref = actor.run.remote(self._spec(w, faults.get(w)), self.inboxes, self.results)
            self.procs.append(_ActorHandle(ray, actor, ref, w))
        ready = set()
        self._collect(lambda msg: msg[0] == "ready" and ready.add(msg[1]) is None and len(ready) == self.n,
                      what="start-up", ops=None, key=None)

    def _next_result(self, timeout: float):
        """The next message from the shared Ray result queue, or None."""
        try:
            return self.results.get(timeout=timeout)
        except Exception:  # ray.util.queue.Empty
            return None

    def close(self) -> None:
        """Stop the actors and their queues."""
        for w, pr in enumerate(self.procs):
            try:
                self.inboxes[w].put(("cmd", "stop"))
            except Exception:
                pass
        for pr in self.procs:
            pr.join(2.0)
            pr.kill()
        for q in getattr(self, "inboxes", []) + [getattr(self, "results", None)]:
            if q is not None and hasattr(q, "shutdown"):
                q.shutdown()
        self.procs = []
