"""Board workers: one OS process per board, talking through queues.

A worker is one replica of the stages (model chunks) of one pipeline position: it owns
their weights, optimizer state and activation stash, runs its op order from
``bapipe.schedules.device_ops`` and exchanges tensors with its neighbours directly
(activations to the next stage's workers, gradients to the previous stage's), so the
schedule's concurrency is real: a worker waits only for the messages its next op needs.

Data-parallel replicas of a stage split every micro-batch by rows (``shard_bounds``); a
replica sends each next-stage replica the rows they share, so stages with different
replica counts connect (a batch-axis resharding). After the flush, replicas all-reduce
their gradients (every replica sums all replicas' gradients in replica order, so all
hold bit-identical weights) and step their optimizer.

The driver feeds inputs and labels, sends commands between iterations and reads one
result pipe per worker: every finished op is reported there, which is how it notices a
dead or hung worker and checks that no micro-batch was lost or processed twice.

Inbox messages (tuples):
  ("act", key, stage, mb, src, {tensor: rows})   input rows of ``stage``'s forward from replica ``src``
  ("grad", key, stage, mb, src, {tensor: rows})  gradient rows of ``stage``'s outputs
  ("label", key, mb, labels, scale)              labels of this replica's rows (last stage)
  ("gred", key, stage, src, grads)               a replica's accumulated weight gradients
  ("cmd", name, *args)                           iter | eval | get_state | set_state | get_grads | stop
Results: ("ready", w), ("op", w, key, kind, mb, chunk, stage, busy_s, loss), ("iter_done", w, key, busy_s),
("logits", key, mb, replica, array), ("state", w, dict), ("state_set", w), ("grads", w, dict),
("error", w, text, traceback).
"""
from __future__ import annotations

import os
import queue
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from bapipe.schedules import device_ops

from .layers_np import softmax_cross_entropy
from .optim import Optimizer


def shard_bounds(n: int, replicas: int) -> list[tuple[int, int]]:
    """Row ranges of ``n`` rows split over ``replicas`` (np.array_split's sizes)."""
    q, r = divmod(n, replicas)
    out, a = [], 0
    for i in range(replicas):
        b = a + q + (1 if i < r else 0)
        out.append((a, b))
        a = b
    return out


def overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """Intersection of two row ranges, or None."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


@dataclass
class StageInfo:
    """What a worker needs to know about one of its stages."""

    index: int
    first: int
    last: int
    chunk: int
    boards: list[str]


@dataclass
class WorkerSpec:
    """Everything a worker process is started with (picklable, for spawn)."""

    worker: int                        # index into the inboxes
    device: int                        # pipeline position
    replica: int
    devices: int                       # pipeline depth p
    chunks: int                        # v
    schedule: str
    stages: list[StageInfo]
    stage_workers: list[list[int]]     # worker of every replica of every stage
    model: object                      # bapipe.spec.Model
    backend: str = "numpy"
    backend_options: dict = field(default_factory=dict)
    number_format: str | None = None   # None: float32; else round-trip through this format
    optimizer: str = "sgd"
    lr: float = 0.1
    seed: int = 0
    fault: dict | None = None          # test hook: {"iteration", "op", "mode": die|hang|raise}
    parent_check: bool = True          # exit when the driver process disappears (local processes)


class _Stop(Exception):
    pass


class Worker:
    """The state and loop of one board worker (runs inside its own process)."""

    def __init__(self, spec: WorkerSpec, inboxes, results):
        from .backends import get_backend
        from .program import init_stage_params

        self.spec = spec
        self.inbox = inboxes[spec.worker]
        self.inboxes = inboxes
        self.results = results
        quant = None
        if spec.number_format is not None:
            from .fixed import make_quant

            quant = make_quant(spec.number_format)
        backend = get_backend(spec.backend)
        self.progs, self.params, self.bufs, self.opts, self.shadow = {}, {}, {}, {}, {}
        for st in spec.stages:
            self.progs[st.index] = backend.make_stage(spec.model, st.first, st.last, quant, spec.backend_options)
            # every replica draws the same initial weights (seeded by layer position)
            init = getattr(self.progs[st.index], "init_params", None)  # fixed-point programs: raw master weights
            self.params[st.index], self.bufs[st.index] = (init(spec.seed) if init else
                                                          init_stage_params(spec.model, st.first, st.last, spec.seed))
            self.opts[st.index] = Optimizer(spec.optimizer, spec.lr)
        self.by_chunk = {st.chunk: st.index for st in spec.stages}
        self.pending: dict[tuple, tuple] = {}
        self.last_grads: dict[int, dict] = {}
        self.parent = os.getppid()

    # ------------------------------------------------------------ messaging

    def _get(self):
        """Next inbox message; exits when the driver process is gone (no orphans)."""
        while True:
            try:
                return self.inbox.get(timeout=1.0)
            except Exception as e:  # queue.Empty, or ray.util.queue.Empty under Ray
                if not isinstance(e, queue.Empty) and type(e).__name__ != "Empty":
                    raise
                if self.spec.parent_check and os.getppid() != self.parent:
                    raise _Stop()

    def _recv(self, key: tuple):
        """Block until the data message ``key`` has arrived; buffer others."""
        while key not in self.pending:
            msg = self._get()
            if msg[0] == "cmd":
                if msg[1] == "stop":
                    raise _Stop()
                raise RuntimeError(f"command {msg[1]!r} arrived in the middle of an iteration")
            self.pending[_key(msg)] = msg
        return self.pending.pop(key)

    def _rows(self, s: int, n: int) -> tuple[int, int]:
        return shard_bounds(n, len(self.spec.stage_workers[s]))[self.spec.replica]

    def _recv_rows(self, kind: str, key, s: int, mb: int, n: int, src_stage: int | None) -> dict:
        """Assemble this replica's rows of a tensor dict from the replicas of ``src_stage``."""
        if src_stage is None:  # fed by the driver, already this replica's rows
            return self._recv((kind, key, s, mb, -1))[5]
        mine = self._rows(s, n)
        parts = []
        for k, b in enumerate(shard_bounds(n, len(self.spec.stage_workers[src_stage]))):
            if overlap(mine, b):
                parts.append(self._recv((kind, key, s, mb, k))[5])
        if len(parts) == 1:
            return parts[0]
        return {t: np.concatenate([p[t] for p in parts]) for t in parts[0]}

    def _send_rows(self, kind: str, key, s: int, dst_stage: int, mb: int, n: int, tensors: dict) -> None:
        """Send each replica of ``dst_stage`` the rows of ``tensors`` it shares with this replica."""
        a, b = self._rows(s, n)
        for j, rng in enumerate(shard_bounds(n, len(self.spec.stage_workers[dst_stage]))):
            ov = overlap((a, b), rng)
            if ov:
                part = {t: v[ov[0] - a:ov[1] - a] for t, v in tensors.items()}
                self.inboxes[self.spec.stage_workers[dst_stage][j]].put(
                    (kind, key, dst_stage, mb, self.spec.replica, part))

    # ------------------------------------------------------------ work

    def _weights(self, s: int):
        """2BW computes with the previous weight version (Narayanan et al., ICML'21)."""
        return self.shadow.get(s, self.params[s])

    def _fault(self, key, k: int) -> None:
        f = self.spec.fault
        if f and key == ("train", f["iteration"]) and k == f["op"]:
            if f["mode"] == "die":
                os._exit(17)
            if f["mode"] == "hang":
                time.sleep(3600)
            raise RuntimeError("injected fault")

    def run_iteration(self, key: tuple, sizes: list[int], lr_factor: float = 1.0) -> None:
        """Run this worker's ops of one training iteration, all-reduce, then the optimizer step."""
        sp = self.spec
        m = len(sizes)
        ops = device_ops(sp.schedule, sp.devices, sp.device, m, sp.chunks)
        caches: dict[tuple[int, int], object] = {}
        acc: dict[int, dict] = {}
        busy_total = 0.0
        last_stage = len(sp.stage_workers) - 1
        for k, op in enumerate(ops):
            self._fault(key, k)
            s = self.by_chunk[op.chunk]
            prog = self.progs[s]
            n = sizes[op.mb]
            loss = None
            if op.kind == "F":
                x = self._recv_rows("act", key, s, op.mb, n, s - 1 if s > 0 else None)
                labels = self._recv(("label", key, op.mb)) if prog.is_last else None
                t0 = time.perf_counter()
                out, cache = prog.forward(self._weights(s), x, True, self.bufs[s])
                if prog.is_last:
                    loss, dlogits = softmax_cross_entropy(out[prog.outputs[0]], labels[3], labels[4])
                    caches[(s, op.mb)] = (cache, {prog.outputs[0]: dlogits})
                else:
                    caches[(s, op.mb)] = (cache, None)
                busy = time.perf_counter() - t0
                if s < last_stage:
                    self._send_rows("act", key, s, s + 1, op.mb, n, out)
            else:  # "B": input and weight gradient together
                cache, gout = caches.pop((s, op.mb))
                if gout is None:
                    gout = self._recv_rows("grad", key, s, op.mb, n, s + 1)
                t0 = time.perf_counter()
                gin, grads = prog.backward(cache, gout)
                _accumulate(acc.setdefault(s, {}), grads)
                busy = time.perf_counter() - t0
                if s > 0:
                    self._send_rows("grad", key, s, s - 1, op.mb, n, gin)
            busy_total += busy
            self.results.put(("op", sp.worker, key, op.kind, op.mb, op.chunk, s, busy, loss))
        t0 = time.perf_counter()
        for s in sorted(acc):
            grads = self._allreduce(key, s, acc[s])
            self.last_grads[s] = grads
            if sp.schedule == "2bw":
                # 2BW: the next iteration computes with the weights this one updated from
                old = {l: {n_: w.copy() for n_, w in d.items()} for l, d in self.params[s].items()}
                self.opts[s].step(self.params[s], grads, lr_factor)
                self.shadow[s] = old
            else:
                self.opts[s].step(self.params[s], grads, lr_factor)
        busy_total += time.perf_counter() - t0
        self.results.put(("iter_done", sp.worker, key, busy_total))

    def _allreduce(self, key, s: int, grads: dict) -> dict:
        """Sum of every replica's gradients of stage ``s``, added in replica order."""
        peers = self.spec.stage_workers[s]
        if len(peers) == 1:
            return grads
        for j, w in enumerate(peers):
            if j != self.spec.replica:
                self.inboxes[w].put(("gred", key, s, self.spec.replica, grads))
        total: dict = {}
        for j in range(len(peers)):
            g = grads if j == self.spec.replica else self._recv(("gred", key, s, j))[4]
            _accumulate(total, g)
        return total

    def run_eval(self, key: tuple, sizes: list[int]) -> None:
        """Forward-only pass over the micro-batches; the last stage returns logits."""
        sp = self.spec
        last_stage = len(sp.stage_workers) - 1
        for op in device_ops(sp.schedule, sp.devices, sp.device, len(sizes), sp.chunks, forward_only=True):
            s = self.by_chunk[op.chunk]
            prog = self.progs[s]
            n = sizes[op.mb]
            x = self._recv_rows("act", key, s, op.mb, n, s - 1 if s > 0 else None)
            out, _ = prog.forward(self.params[s], x, False, self.bufs[s])
            if s == last_stage:
                self.results.put(("logits", key, op.mb, sp.replica, out[prog.outputs[0]]))
            else:
                self._send_rows("act", key, s, s + 1, op.mb, n, out)
        self.results.put(("iter_done", sp.worker, key, 0.0))

    def state(self) -> dict:
        """Weights, buffers, optimizer state and 2BW shadow weights of every stage."""
        return {s: {"params": self.params[s], "bufs": self.bufs[s], "opt": self.opts[s].state(),
                    "shadow": self.shadow.get(s)} for s in self.params}

    def load_state(self, st: dict) -> None:
        """Restore what ``state`` returned (or a checkpoint's slice of it)."""
        for s, d in st.items():
            self.params[s] = _copy(d["params"])
            self.bufs[s] = _copy(d["bufs"])
            self.opts[s].load(d["opt"])
            if d.get("shadow") is not None:
                self.shadow[s] = _copy(d["shadow"])
            else:
                self.shadow.pop(s, None)

    def loop(self) -> None:
        """Serve commands until told to stop."""
        w = self.spec.worker
        self.results.put(("ready", w))
        while True:
            msg = self._get()
            if msg[0] != "cmd":
                self.pending[_key(msg)] = msg
                continue
            name = msg[1]
            if name == "stop":
                return
            if name == "iter":
                self.run_iteration(msg[2], msg[3], msg[4] if len(msg) > 4 else 1.0)
            elif name == "eval":
                self.run_eval(msg[2], msg[3])
            elif name == "get_state":
                self.results.put(("state", w, self.state()))
            elif name == "set_state":
                self.load_state(msg[2])
                self.results.put(("state_set", w))
            elif name == "get_grads":
                self.results.put(("grads", w, self.last_grads))


def _key(msg: tuple) -> tuple:
    if msg[0] == "label":
        return ("label", msg[1], msg[2])
    if msg[0] == "gred":
        return ("gred", msg[1], msg[2], msg[3])
    return (msg[0], msg[1], msg[2], msg[3], msg[4])


def _accumulate(acc: dict, grads: dict) -> None:
    for lname, g in grads.items():
        dst = acc.setdefault(lname, {})
        for pname, a in g.items():
            dst[pname] = dst[pname] + a if pname in dst else _own(a)


def _copy(nested: dict) -> dict:
    return {l: {n: _own(a) for n, a in d.items()} for l, d in nested.items()}


def _own(a) -> np.ndarray:
    """A copy; raw fixed-point (integer) arrays stay int64 (exact sums), others become float32."""
    a = np.asarray(a)
    return np.array(a, np.int64) if np.issubdtype(a.dtype, np.integer) else np.array(a, np.float32)


def _one_blas_thread() -> None:
    """One BLAS thread per worker: a worker is one board, and several workers each spinning a
    full OpenBLAS thread pool on a few cores made small matmuls 10-100x slower."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1)


def worker_main(spec: WorkerSpec, inboxes, results) -> None:
    """Process entry point: build the worker, serve, report any exception as one message."""
    try:
        _one_blas_thread()
        # overflow/NaN in a diverging run is reported once by the driver (TrainingDiverged),
        # not as numpy RuntimeWarnings from every worker
        np.seterr(over="ignore", invalid="ignore", divide="ignore")
        Worker(spec, inboxes, results).loop()
    except _Stop:
        pass
    except BaseException as e:  # reported so the driver can name the stage; then the process ends
        results.put(("error", spec.worker, f"{type(e).__name__}: {e}", traceback.format_exc()))
