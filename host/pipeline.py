"""The host's pipeline of board workers: ``Pipeline`` starts one worker process per pipeline
position (``host.workers``), feeds micro-batches and labels, and watches every op the workers
report; a worker that dies, raises or stops making progress for ``timeout`` seconds ends the
run with a ``PipelineFailure`` naming the stage, the op and the micro-batch. Also the batch
rules and the run log every trainer (``host.driver``, ``host.train_hw``, ``host.ray_mode``) shares."""
from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bapipe.errors import BapipeError, SpecError
from bapipe.plan import Plan
from bapipe.schedules import device_ops

from .workers import StageInfo, WorkerSpec, shard_bounds, worker_main

#: global batch used when the plan's does not fit the data set (see docs/host.md)
DEFAULT_GLOBAL_BATCH = 64
POLL_S = 0.05


class _PipeSender:
    """The worker's end of its result pipe, with the ``put`` of a queue."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, msg) -> None:
        """Send one message (blocks only while the driver's pipe buffer is full)."""
        self.conn.send(msg)


class PipelineFailure(BapipeError):
    """A worker died, hung or raised: one line naming the stage and micro-batch."""


class TrainingDiverged(BapipeError):
    """The loss became NaN or infinite: training stops (continuing would only spread NaNs)."""


@dataclass
class Layout:
    """Where the plan's stages run: pipeline depth, chunks, and the worker of every replica.

    Workers are numbered device by device, replica by replica; stage ``s`` replica ``r``
    runs on worker ``stage_workers[s][r]`` (board ``boards[s][r]``).
    """

    p: int
    v: int
    stage_device: list[int]
    stage_chunk: list[int]
    stage_workers: list[list[int]]
    workers: list[tuple[int, int]]      # (device, replica) of each worker
    boards: list[list[str]]             # board of each replica of each stage

    @classmethod
    def of(cls, plan: Plan) -> "Layout":
        """Read the layout from the plan (device, chunk and replicas of its stages)."""
        if not plan.stages:
            raise SpecError(None, None, "stages", "expected at least one stage")
        p = plan.devices
        v = plan.chunks if plan.schedule == "interleaved" else 1
        devs = [s.device for s in plan.stages]
        chunks = [s.chunk for s in plan.stages]
        if sorted(set(devs)) != list(range(p)):
            raise SpecError(None, None, "stages.device", f"expected devices 0..{p - 1}")
        for i, (d, c) in enumerate(zip(devs, chunks)):
            if plan.schedule == "interleaved" and i != c * p + d:
                raise SpecError(None, None, f"stages[{i}].chunk",
                                f"interleaved stage {i} must sit at chunk {i // p}, device {i % p}")
            if plan.schedule != "interleaved" and (c != 0 or d != i):
                raise SpecError(None, None, f"stages[{i}].device", f"expected device {i}, chunk 0")
        if len(plan.stages) != p * v:
            raise SpecError(None, None, "chunks", f"expected {p * v} stages for {p} devices x {v} chunks")
        reps = {}
        for s in plan.stages:
            r = max(1, s.replicas)
            if reps.setdefault(s.device, r) != r:
                raise SpecError(None, None, f"stages[{s.index}].replicas",
                                f"expected {reps[s.device]} like the other chunks of device {s.device}")
        workers = [(d, r) for d in range(p) for r in range(reps[d])]
        wid = {dr: i for i, dr in enumerate(workers)}
        stage_workers = [[wid[(s.device, r)] for r in range(reps[s.device])] for s in plan.stages]
        boards = []
        for s in plan.stages:
            mesh = max(1, int(np.prod(s.mesh))) if s.mesh else 1
            boards.append([s.boards[r * mesh] if r * mesh < len(s.boards) else "?" for r in range(reps[s.device])])
        return cls(p, v, devs, chunks, stage_workers, workers, boards)


class Pipeline:
    """Worker processes for one plan, and the bookkeeping to drive them."""

    def __init__(self, plan: Plan, model, backend: str = "numpy", backend_options: dict | None = None,
                 number_format: str | None = None, optimizer: str = "sgd", lr: float = 0.1, seed: int = 0,
                 timeout: float = 60.0, start_method: str | None = None, faults: dict | None = None):
        self.plan, self.model = plan, model
        self.layout = Layout.of(plan)
        self.n = len(self.layout.workers)
        self.timeout = timeout
        self.ctx = mp.get_context(start_method or ("fork" if sys.platform.startswith("linux") else "spawn"))
        self.backend, self.backend_options = backend, dict(backend_options or {})
        self.number_format, self.optimizer, self.lr, self.seed = number_format, optimizer, lr, seed
        self.busy = [0.0] * len(plan.stages)
        self.procs: list = []
        self.conns: list = []
        self._start(faults or {})

    # ------------------------------------------------------------ processes

    def _spec(self, w: int, fault) -> WorkerSpec:
        lay = self.layout
        d, r = lay.workers[w]
        stages = [StageInfo(s.index, s.first, s.last, s.chunk, list(s.boards))
                  for s in self.plan.stages if s.device == d]
        return WorkerSpec(worker=w, device=d, replica=r, devices=lay.p, chunks=lay.v, schedule=self.plan.schedule,
                          stages=stages, stage_workers=lay.stage_workers, model=self.model,
                          backend=self.backend, backend_options=self.backend_options,
                          number_format=self.number_format, optimizer=self.optimizer, lr=self.lr,
                          seed=self.seed, fault=fault)

    def _start(self, faults: dict) -> None:
        self.inboxes = [self.ctx.Queue() for _ in range(self.n)]
        # one pipe per worker for results: Connection.send is synchronous, so whatever a
        # worker reported before dying is readable (a Queue's feeder thread may lose it)
        pipes = [self.ctx.Pipe(duplex=False) for _ in range(self.n)]
        self.conns = [r for r, _ in pipes]
        self.procs = []
        for w in range(self.n):
            pr = self.ctx.Process(target=worker_main, args=(self._spec(w, faults.get(w)), self.inboxes,
                                                            _PipeSender(pipes[w][1])),
                                  name=f"bapipe-worker-{w}", daemon=True)
            pr.start()
            pipes[w][1].close()  # the child holds the write end; EOF then means the worker is gone
            self.procs.append(pr)
        ready = set()
        self._collect(lambda msg: msg[0] == "ready" and ready.add(msg[1]) is None and len(ready) == self.n,
                      what="start-up", ops=None, key=None)

    def _next_result(self, timeout: float):
        """The next message from any worker, or None after ``timeout``; a closed pipe is a dead worker."""
        from multiprocessing.connection import wait

        for c in wait([c for c in self.conns if c is not None], timeout):
            try:
                return c.recv()
            except (EOFError, OSError):
                w = self.conns.index(c)
                self.conns[w] = None
                self.procs[w].join(1.0)
        return None

    def pids(self) -> list[int]:
        """Process ids of the workers (device by device, replica by replica)."""
        return [p.pid for p in self.procs]

    def close(self) -> None:
        """Stop the workers (politely, then by force) and release the queues."""
        for w, pr in enumerate(self.procs):
            if pr.is_alive():
                try:
                    self.inboxes[w].put(("cmd", "stop"))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 0.5  # idle workers exit at once; a hung one is killed
        for pr in self.procs:
            pr.join(max(0.0, deadline - time.monotonic()))
            if pr.is_alive():
                pr.kill()
                pr.join(1.0)
        for q in self.inboxes:
            q.cancel_join_thread()
            q.close()
        for c in self.conns:
            if c is not None:
                c.close()
        self.procs = []

    def restart(self, state: dict) -> None:
        """Replace every worker with a fresh process holding ``state`` (after a failure)."""
        self.close()
        self._start({})
        self.set_state(state)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ watching

    def _collect(self, on_msg, what: str, ops, key) -> None:
        """Read results until ``on_msg`` returns True; name the culprit on death, error or hang.

        ``ops`` (worker -> op list) and the done counters let a failure message say which
        op of which micro-batch the guilty worker was on.
        """
        self._done = [0] * self.n
        last = time.monotonic()

        def handle(msg) -> bool:
            if msg[0] == "error":
                raise PipelineFailure(self._where(msg[1], ops, what, key) + f" raised {msg[2]}")
            if msg[0] == "op" and ops is not None:
                self._done[msg[1]] += 1
            return bool(on_msg(msg))

        while True:
            msg = self._next_result(POLL_S)
            if msg is not None:
                last = time.monotonic()
                if handle(msg):
                    return
                continue
            for w, pr in enumerate(self.procs):
                if not pr.is_alive():
                    # read what it (and the others) reported before dying, so the op named is exact
                    while (msg := self._next_result(0.2)) is not None:
                        if handle(msg):
                            return
                    why = getattr(pr, "death", None) or f"exit code {pr.exitcode}"  # Ray actors say how
                    raise PipelineFailure(self._where(w, ops, what, key) + f" died ({why})")
            if time.monotonic() - last > self.timeout:
                w = self._stuck(ops)
                raise PipelineFailure(self._where(w, ops, what, key)
                                      + f" hung: no progress for {self.timeout:g} s")

    def _where(self, w: int, ops, what: str, key) -> str:
        """'stage 2 (device 2, board fpga2) during backward of micro-batch 3 (train iteration 5)'."""
        lay = self.layout
        d, r = lay.workers[w]
        stages = [s for s in self.plan.stages if s.device == d]
        op = None
        if ops is not None and self._done[w] < len(ops[w]):
            op = ops[w][self._done[w]]
            stages = [s for s in stages if s.chunk == op.chunk] or stages
        st = stages[0]
        rep = f", replica {r}" if len(lay.stage_workers[st.index]) > 1 else ""
        text = f"stage {st.index} (device {d}{rep}, board {lay.boards[st.index][r]})"
        if op is not None:
            kind = {"F": "forward", "B": "backward", "W": "weight gradient"}[op.kind]
            text += f" during {kind} of micro-batch {op.mb}"
        elif ops is not None:
            text += " during the gradient all-reduce / optimizer step"
        if key is not None:
            text += f" ({key[0]} {'iteration' if key[0] == 'train' else 'pass'} {key[1]})"
        else:
            text += f" ({what})"
        return text

    def _stuck(self, ops) -> int:
        """The worker whose next op has all its inputs delivered but did not finish it."""
        if ops is None:
            return 0
        lay = self.layout
        done = {(w, o.kind, o.mb, o.chunk) for w in range(self.n) for o in ops[w][:self._done[w]]}
        last = len(self.plan.stages) - 1

        def finished(stage: int, kind: str, mb: int) -> bool:
            return all((w, kind, mb, lay.stage_chunk[stage]) in done for w in lay.stage_workers[stage])

        for w in range(self.n):
            if self._done[w] >= len(ops[w]):
                continue
            op = ops[w][self._done[w]]
            s = op.chunk * lay.p + lay.workers[w][0]
            ready = (s == 0 or finished(s - 1, "F", op.mb)) if op.kind == "F" else \
                (s == last or finished(s + 1, "B", op.mb))
            if ready:
                return w
        return min(range(self.n), key=lambda w: self._done[w])

    # ------------------------------------------------------------ iterations

    def _feed(self, key: tuple, xs: list[np.ndarray], ys: list[np.ndarray] | None, scale: float) -> None:
        """Each first-stage replica gets its rows of every micro-batch; each last-stage replica its labels."""
        lay = self.layout
        name = self.model.inputs[0].name
        for mb, x in enumerate(xs):
            for r, (a, b) in enumerate(shard_bounds(len(x), len(lay.stage_workers[0]))):
                self.inboxes[lay.stage_workers[0][r]].put(("act", key, 0, mb, -1, {name: x[a:b]}))
            if ys is not None:
                for r, (a, b) in enumerate(shard_bounds(len(x), len(lay.stage_workers[-1]))):
                    self.inboxes[lay.stage_workers[-1][r]].put(("label", key, mb, ys[mb][a:b], scale))

    def _ops(self, m: int, forward_only: bool = False) -> list:
        lay = self.layout
        by_dev = [device_ops(self.plan.schedule, lay.p, d, m, lay.v, forward_only=forward_only)
                  for d in range(lay.p)]
        return [by_dev[d] for d, _ in lay.workers]

    def train_iteration(self, it: int, xs: list[np.ndarray], ys: list[np.ndarray], scale: float,
                        lr_factor: float = 1.0) -> dict:
        """One synchronous iteration over the micro-batches ``xs``; returns loss and timings.

        ``lr_factor``: the rate schedule's step for this iteration (host.optim.lr_factor).

        Checks that every replica of every stage ran exactly one forward and one backward
        per micro-batch.
        """
        key = ("train", it)
        m = len(xs)
        lay = self.layout
        ops = self._ops(m)
        sizes = [len(x) for x in xs]
        t0 = time.perf_counter()
        self._feed(key, xs, ys, scale)
        for inbox in self.inboxes:
            inbox.put(("cmd", "iter", key, sizes, lr_factor))
        seen: Counter = Counter()
        losses: dict[tuple[int, int], float] = {}
        busy = [0.0] * len(self.plan.stages)
        finished = set()

        def on_msg(msg) -> bool:
            if msg[0] == "op" and msg[2] == key:
                _, w, _, kind, mb, chunk, s, b, loss = msg
                seen[(s, lay.workers[w][1], kind, mb)] += 1
                busy[s] += b / len(lay.stage_workers[s])
                if loss is not None:
                    losses[(mb, w)] = loss
            elif msg[0] == "iter_done" and msg[2] == key:
                finished.add(msg[1])
            return len(finished) == self.n

        self._collect(on_msg, "training", ops, key)
        wall = time.perf_counter() - t0
        expected = Counter({(s, r, k, mb): 1 for s in range(len(self.plan.stages))
                            for r in range(len(lay.stage_workers[s])) for k in "FB" for mb in range(m)})
        if seen != expected:
            bad = sorted(set(seen) ^ set(expected) | {k for k in seen if seen[k] != 1})
            raise PipelineFailure(f"iteration {it}: micro-batch accounting is wrong at (stage, replica, op, "
                                  f"micro-batch) {bad[:4]}")
        for s, b in enumerate(busy):
            self.busy[s] += b
        return {"loss": float(sum(losses[k] for k in sorted(losses))), "wall_s": wall,
                "busy_s": busy, "samples": int(sum(sizes))}

    def predict(self, tag: int, xs: list[np.ndarray]) -> np.ndarray:
        """Logits of the micro-batches ``xs`` through the pipeline (forward only, eval mode)."""
        key = ("eval", tag)
        m = len(xs)
        reps = len(self.layout.stage_workers[-1])
        self._feed(key, xs, None, 1.0)
        for inbox in self.inboxes:
            inbox.put(("cmd", "eval", key, [len(x) for x in xs]))
        logits: dict[tuple[int, int], np.ndarray] = {}
        finished = set()

        def on_msg(msg) -> bool:
            if msg[0] == "logits" and msg[1] == key:
                logits[(msg[2], msg[3])] = msg[4]
            elif msg[0] == "iter_done" and msg[2] == key:
                finished.add(msg[1])
            return len(finished) == self.n and len(logits) == m * reps

        self._collect(on_msg, "evaluation", None, key)
        return np.concatenate([logits[(i, r)] for i in range(m) for r in range(reps)])

    def _gather(self, cmd: str, reply: str) -> dict:
        """Ask every worker; keep replica 0's answer per stage (replicas hold identical state)."""
        for inbox in self.inboxes:
            inbox.put(("cmd", cmd))
        out: dict = {}
        got = set()

        def on_msg(msg) -> bool:
            if msg[0] == reply:
                got.add(msg[1])
                if self.layout.workers[msg[1]][1] == 0:
                    out.update(msg[2])
            return len(got) == self.n

        self._collect(on_msg, cmd.replace("_", " "), None, None)
        return out

    def get_state(self) -> dict:
        """Every stage's weights, buffers and optimizer state: {stage: {...}}."""
        return self._gather("get_state", "state")

    def last_grads(self) -> dict:
        """Every stage's all-reduced weight gradients of the last iteration: {stage: {layer: {name: g}}}."""
        return self._gather("get_grads", "grads")

    def set_state(self, state: dict) -> None:
        """Load ``state`` (as returned by get_state) into every replica."""
        lay = self.layout
        for w, (d, _) in enumerate(lay.workers):
            mine = {s: v for s, v in state.items() if lay.stage_device[s] == d}
            self.inboxes[w].put(("cmd", "set_state", mine))
        got = set()
        self._collect(lambda msg: msg[0] == "state_set" and got.add(msg[1]) is None and len(got) == self.n,
                      "set state", None, None)


# ---------------------------------------------------------------- training


def split_microbatches(idx: np.ndarray, m: int) -> list[np.ndarray]:
    """Cut a batch's sample indices into ``m`` equal micro-batches, in order."""
    return np.split(idx, m)


def effective_batch(plan: Plan, n_train: int, global_batch: int | None = None) -> tuple[int, int]:
    """(global batch, micro-batch size) used for training.

    The plan's own batch fields are used (global_batch = microbatches x microbatch_size),
    unless ``global_batch`` (``bapipe run --global-batch``) asks for another multiple of
    the micro-batch count. A batch the data set cannot fill is refused, never rewritten.
    """
    m = max(1, plan.microbatches)
    reps = max(max(1, s.replicas) for s in plan.stages) if plan.stages else 1
    b = plan.global_batch if global_batch is None else global_batch
    src = "--global-batch" if global_batch is not None else "global_batch"
    if global_batch is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
        raise SpecError(None, None, src, f"expected a positive integer, got {b}")
    if b > n_train:
        raise SpecError(None, None, src, f"expected at most {n_train} (the training set), got {b}; "
                                         + ("pass a smaller one" if global_batch is not None else
                                            "run with --global-batch N (a multiple of the "
                                            f"{m} micro-batches) or plan a smaller batch"))
    if b % m or b < m:
        raise SpecError(None, None, src, f"expected a multiple of the {m} micro-batches, got {b}")
    if b // m < reps:  # every replica needs at least one row of each micro-batch
        raise SpecError(None, None, src, f"expected at least {m * reps} ({m} micro-batches x {reps} "
                                                    f"replicas), got {b}")
    return b, b // m


def _write_log(path: str, records: list[dict]) -> None:
    """Per-iteration log as JSON (a list) or CSV, by extension."""
    import csv
    import json

    p = Path(path)
    if p.suffix == ".csv":
        keys = list(records[0]) if records else ["epoch", "iteration", "loss"]
        with p.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(records)
    else:
        p.write_text(json.dumps(records, indent=1))
