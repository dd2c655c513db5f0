"""The host driver: runs a plan's schedule over board workers and trains the model.

``Pipeline`` starts one worker process per pipeline position (``host.workers``), feeds
micro-batches and labels, and watches every op the workers report. A worker that dies,
raises or stops making progress for ``timeout`` seconds ends the run with a
``PipelineFailure`` naming the stage, the op and the micro-batch. Optimizer steps happen
in the workers after each iteration's flush, so an iteration either commits on every
stage or (after a failure) is replayed from the last snapshot: ``train(retries=N)``.

``train(plan, backend, epochs)`` is the entry point the CLI and ``make demo`` call.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bapipe.errors import BapipeError, SpecError
from bapipe.plan import Plan, load_plan
from fpga_models.plancheck import resolve
from bapipe.schedules import device_ops

from .data import epoch_order, load_digits
from .optim import DEFAULT_LR_SCHEDULE, LR_SCHEDULES, default_lr, lr_factor
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


def reference_grads(model, params: dict, bufs: dict, x: np.ndarray, y: np.ndarray, scale: float,
                    quant=None, microbatches: int = 1) -> dict:
    """Single-device gradients of the mean loss over the batch: the whole model as one stage.

    With batch-norm (statistics per micro-batch) the reference accumulates over the same
    micro-batches; otherwise it runs the full batch at once. Computed in float64 (from the
    same float32 weights and inputs), so it carries none of the float32 rounding that the
    pipeline's result is checked for.
    """
    from .layers_np import float_type

    f64 = {l: {n: np.asarray(a, np.float64) for n, a in d.items()} for l, d in params.items()}
    b64 = {l: {n: np.asarray(a, np.float64) for n, a in d.items()} for l, d in bufs.items()}
    with float_type(np.float64):
        return _reference_grads(model, f64, b64, np.asarray(x, np.float64), y, scale, quant, microbatches)


def _reference_grads(model, params: dict, bufs: dict, x: np.ndarray, y: np.ndarray, scale: float,
                     quant, microbatches: int) -> dict:
    from .layers_np import softmax_cross_entropy
    from .program import StageProgram

    prog = StageProgram(model, 0, len(model.layers) - 1, quant)
    has_bn = any(l.type == "batchnorm" for l in model.layers)
    parts = np.array_split(np.arange(len(y)), microbatches if has_bn else 1)
    total: dict = {}
    for part in parts:
        out, cache = prog.forward(params, {model.inputs[0].name: x[part]}, True,
                                  {k: dict(v) for k, v in bufs.items()})
        _, dl = softmax_cross_entropy(out[prog.outputs[0]], y[part], scale)
        _, g = prog.backward(cache, {prog.outputs[0]: dl})
        for l, d in g.items():
            for n, a in d.items():
                total.setdefault(l, {})[n] = total[l][n] + a if n in total.get(l, {}) else a
    return total


def fixed_reference_grads(model, master: dict, x: np.ndarray, y: np.ndarray, tf, microbatches: int) -> dict:
    """Single-device weight gradients of fixed-point training (fpga_models.train_fixed): the exact
    integer batch sums a pipeline of any partition, schedule and replication must reproduce."""
    from fpga_models import train_fixed as T

    _, _, info = T.train_step(model, master, {}, T.quantize(x, tf.act), y, T.sgd_constants(1.0, 0.0, 1, tf), tf,
                              microbatches)
    return {l: {n: info["grads"].get(l, {}).get(n, np.zeros_like(a)) for n, a in d.items()}
            for l, d in master.items()}


def grad_rel_err(pipe: dict, ref: dict) -> float:
    """Norm-wise relative error of the pipeline's gradients against the float64 reference:
    max over weight tensors of ||g_pipe - g_ref||_2 / ||g_ref||_2 (0 for an all-zero g_ref
    matched exactly). Norm-wise, so near-zero entries of a tensor do not dominate it."""
    worst = 0.0
    for l, d in ref.items():
        for n, r in d.items():
            diff = float(np.linalg.norm(pipe[l][n].astype(np.float64) - r))
            norm = float(np.linalg.norm(r))
            worst = max(worst, diff / norm if norm else (0.0 if diff == 0 else math.inf))
    return worst


def _merge(state_by_stage: dict, part: str) -> dict:
    out = {}
    for s in sorted(state_by_stage):
        v = state_by_stage[s].get(part)
        if v:
            out.update(v)
    return out


def plan_precision(plan: Plan) -> str:
    """--precision plan: train in the plan's number format (``fixed``), as the hardware does,
    except where the host has no such arithmetic: an fp32 plan, or an adam plan (fixed-point
    training implements sgd with momentum), which train in float32."""
    return "float32" if plan.number_format == "fp32" or plan.optimizer != "sgd" else "fixed"


def train(plan: str | Path | Plan, backend: str = "numpy", epochs: int | None = None, lr: float | None = None, seed: int = 0,
          precision: str = "plan", log: str | None = None, checkpoint: str | None = None,
          resume: str | None = None, ray: bool = False, timeout: float = 60.0, build: str | None = None,
          global_batch: int | None = None, progress: bool = False, check_grads: bool = True,
          retries: int = 0, faults: dict | None = None, start_method: str | None = None,
          max_iterations: int | None = None, pipeline_hook=None, lr_schedule: str = DEFAULT_LR_SCHEDULE) -> dict:
    """Train the plan's model on digits with the plan's schedule; return the run summary.

    ``lr_schedule``: how the rate moves over the epochs (host.optim.lr_factor: ``linear``
    decays it once an epoch, ``constant`` keeps it); every backend applies the same steps.
    ``plan``: a plan.yaml path or a Plan. ``precision``: ``plan`` (:func:`plan_precision`),
    float32, or ``fixed`` to round
    weights and activations to the plan's number format. ``retries``: how many worker
    failures to recover from by restarting the workers from the last snapshot (each epoch
    start) and replaying; 0 stops at the first failure with PipelineFailure.
    ``faults`` ({worker: {"iteration", "op", "mode": die|hang|raise}}; workers are numbered
    device by device, replica by replica) and ``pipeline_hook`` are test hooks.
    The dict has the ``bapipe run --json`` keys plus details (batch, history, utilisation).
    """
    from . import checkpoint as ckpt

    plan_file = str(plan) if not isinstance(plan, Plan) else "<plan>"
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
        model, _cluster = resolve(plan, plan_file)  # a file: checked in full
    else:
        model, _cluster = resolve(plan)  # built in memory (tests): structural checks
    if precision not in ("plan", "float32", "fixed"):
        raise SpecError(None, None, "--precision", "expected plan, float32 or fixed")
    precision = plan_precision(plan) if precision == "plan" else precision
    if lr_schedule not in LR_SCHEDULES:
        raise SpecError(None, None, "--lr-schedule", f"expected one of {', '.join(LR_SCHEDULES)}, got {lr_schedule}")
    hw_train = backend != "numpy" and not resume and plan.mode == "train" and epochs != 0
    if hw_train and not hasattr(_backend_module(backend), "train_iterations"):
        hw_train = False
    if backend != "numpy" and epochs and not hw_train:
        # this backend computes the forward pass only: training epochs cannot be honoured
        raise SpecError(None, None, "--epochs", f"the {backend} backend runs the forward pass only"
                                                f"{' of a checkpoint' if resume else ''}; train with "
                                                "--backend numpy --checkpoint ck.npz, then run it with --resume ck.npz")
    epochs = 5 if epochs is None else epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise SpecError(None, None, "--epochs", f"expected an integer >= 0, got {epochs}")
    if plan.mode == "train" and plan.schedule == "pipedream" and epochs:
        # the workers update once per iteration after an all-reduce; PipeDream's per-micro-batch
        # updates with stashed weight versions are priced by the planner only
        raise SpecError(plan_file, None, "schedule", "expected a schedule the host driver trains (gpipe, 1f1b, "
                                                     "interleaved, eager-1f1b or 2bw); pipedream's per-micro-batch "
                                                     "updates with stashed weight versions are not built (plan with "
                                                     "--schedule 2bw or 1f1b)")
    if lr is not None and not (np.isfinite(lr) and lr > 0):
        raise SpecError(None, None, "--lr", f"expected a positive learning rate, got {lr}")
    if not (timeout > 0 and np.isfinite(timeout)):
        raise SpecError(None, None, "--timeout", f"expected a positive number of seconds, got {timeout}")
    for opt, path in (("--log", log), ("--checkpoint", checkpoint)):
        _check_writable(opt, path)  # refuse before training, not after minutes of it
    number_format = None if precision == "float32" else plan.number_format
    if hw_train:  # the hardware trains in the plan's fixed-point arithmetic: host/train_hw.py
        from .train_hw import train_on_hardware

        if global_batch is not None:
            raise SpecError(plan_file, None, "--global-batch", f"the {backend} backend trains the plan's global batch "
                                                               f"({plan.global_batch}: the hardware is generated for it)")

        return train_on_hardware(plan, model, _cluster, backend, epochs, lr, seed,
                                 {"build": build, "timeout": timeout}, max_iterations, plan_file,
                                 log=log, checkpoint=checkpoint, lr_schedule=lr_schedule)
    if backend != "numpy":  # the RTL and board backends run the plan's forward pass: host/forward.py
        from .forward import run_forward

        return run_forward(plan, model, backend, build=build, seed=seed, plan_file=plan_file,
                           checkpoint=resume, timeout=timeout)
    if plan.mode != "train":
        raise SpecError(plan_file, None, "mode", "expected a training plan (mode: train)")
    from .program import StageProgram

    for st in plan.stages:  # unsupported layer types fail here, as one line, before any process starts
        StageProgram(model, st.first, st.last)
    data = load_digits(model.inputs[0].shape, seed)
    B, mbs = effective_batch(plan, data.n_train, global_batch)
    m = B // mbs
    lr = lr if lr is not None else default_lr(plan.optimizer, B, plan.schedule)
    quant = None
    if number_format is not None:
        from .fixed import make_quant

        quant = make_quant(number_format)
    fixed_tf = getattr(quant, "tf", None)  # integer training (fpga_models.train_fixed): fixed16
    if fixed_tf is not None:
        from .program import FixedStageProgram

        for st in plan.stages:
            FixedStageProgram(model, st.first, st.last, fixed_tf)
        if plan.optimizer != "sgd":
            raise SpecError(plan_file, None, "optimizer", f"fixed-point training implements sgd (with momentum), "
                                                          f"got {plan.optimizer}; use --precision float32")
    iters_per_epoch = data.n_train // B
    if ray:
        from .ray_mode import require_ray

        require_ray()
    start_epoch, start_iter, state0 = 0, 0, None
    if resume:
        start_epoch, start_iter, state0 = ckpt.load(resume, plan, model, seed)
        if epochs and epochs <= start_epoch:  # the loop would train nothing and report success
            raise SpecError(str(resume), None, "--epochs",
                            f"expected more than the {start_epoch} epoch(s) the checkpoint has completed "
                            f"(--epochs counts from the start of training), got {epochs}")
    # fixed point: the optimizer's rate applies to the batch-summed gradient (docs/training.md)
    opts = dict(backend=backend, backend_options={"build": build}, number_format=number_format,
                optimizer=plan.optimizer, lr=lr / B if fixed_tf is not None else lr, seed=seed, timeout=timeout)
    history, records = [], []
    ledger: dict[int, list[np.ndarray]] = {}
    grad_err = None
    train_wall = 0.0
    samples = 0
    final_loss = float("nan")
    bar = _Progress(progress, total=max(0, (epochs - start_epoch) * iters_per_epoch - start_iter))
    if ray:
        from .ray_mode import RayPipeline as _P
    else:
        _P = Pipeline
    pipe = _P(plan, model, start_method=start_method, faults=faults, **opts)
    try:
        if pipeline_hook:
            pipeline_hook(pipe)
        if state0 is not None:
            pipe.set_state(state0)
        gi = start_epoch * iters_per_epoch + start_iter  # global iteration number
        epoch = start_epoch
        while epoch < epochs:
            order = epoch_order(data.n_train, seed, epoch)
            snapshot = (pipe.get_state(), start_iter) if retries else None
            i = start_iter
            ledger[epoch] = []
            epoch_losses = []
            while i < iters_per_epoch:
                if max_iterations is not None and gi >= max_iterations:
                    break
                idx = order[i * B:(i + 1) * B]
                parts = split_microbatches(idx, m)
                xs = [data.x_train[p] for p in parts]
                ys = [data.y_train[p] for p in parts]
                want_check = check_grads and grad_err is None
                if want_check:
                    before = pipe.get_state()
                try:
                    r = pipe.train_iteration(gi, xs, ys, 1.0 / B, lr_factor(lr_schedule, epoch, epochs))
                except PipelineFailure as e:
                    if retries <= 0 or snapshot is None:
                        raise
                    retries -= 1
                    sys.stderr.write(f"bapipe run: {e}; restarting workers and replaying epoch {epoch} "
                                     f"from iteration {snapshot[1]}\n")
                    pipe.restart(snapshot[0])
                    gi -= i - snapshot[1]
                    i = snapshot[1]
                    records = [rec for rec in records if rec["iteration"] < gi]  # replayed ones are re-logged
                    ledger[epoch] = ledger[epoch][:i - start_iter]
                    epoch_losses = epoch_losses[:i - start_iter]
                    continue
                if want_check:
                    pstate = before
                    weights = {s: (v["shadow"] or v["params"]) for s, v in pstate.items()}
                    got = _merge({s: {"g": g} for s, g in pipe.last_grads().items()}, "g")
                    if fixed_tf is not None:  # the exact single-device sums: the pipeline must equal them
                        ref = fixed_reference_grads(model, _merge({s: {"p": w} for s, w in weights.items()}, "p"),
                                                    data.x_train[idx], data.y_train[idx], fixed_tf, m)
                    else:
                        ref = reference_grads(model, _merge({s: {"p": w} for s, w in weights.items()}, "p"),
                                              _merge(pstate, "bufs"), data.x_train[idx], data.y_train[idx], 1.0 / B,
                                              quant, m)
                    grad_err = grad_rel_err(got, ref)
                if not np.isfinite(r["loss"]):
                    raise TrainingDiverged(f"training diverged: loss {r['loss']} at epoch {epoch + 1}, "
                                           f"iteration {i} (lr {lr:g}); lower --lr")
                ledger[epoch].append(idx)
                train_wall += r["wall_s"]
                samples += r["samples"]
                final_loss = r["loss"]
                epoch_losses.append(r["loss"])
                records.append({"epoch": epoch, "iteration": gi, "loss": r["loss"], "wall_s": r["wall_s"],
                                "samples_per_s": r["samples"] / r["wall_s"] if r["wall_s"] else 0.0,
                                **{f"util_stage{s}": (b / r["wall_s"] if r["wall_s"] else 0.0)
                                   for s, b in enumerate(r["busy_s"])}})
                bar.advance(f"epoch {epoch + 1}/{epochs} loss {r['loss']:.4f}")
                i += 1
                gi += 1
            _check_ledger(ledger[epoch], order, start_iter, i, B)
            history.append({"epoch": epoch, "mean_loss": float(np.mean(epoch_losses)) if epoch_losses else None,
                            "iterations": len(epoch_losses)})
            if max_iterations is not None and gi >= max_iterations and i < iters_per_epoch:
                if checkpoint:
                    ckpt.save(checkpoint, plan, pipe.get_state(), epoch, i, seed)
                break
            start_iter = 0
            epoch += 1
            if checkpoint:
                ckpt.save(checkpoint, plan, pipe.get_state(), epoch, 0, seed)
        logits = pipe.predict(0, np.array_split(data.x_test, m))
        acc = float(np.mean(np.argmax(logits.reshape(len(data.y_test), -1), axis=1) == data.y_test))
        utilisation = [b / train_wall if train_wall else 0.0 for b in pipe.busy]
    except (PipelineFailure, TrainingDiverged, KeyboardInterrupt):  # KeyboardInterrupt: also SIGTERM
        if log:  # the iterations that did run are what a failure is debugged from
            try:
                _write_log(log, records)
            except OSError:
                pass  # the failure itself is the message worth printing
        raise
    finally:
        bar.close()
        pipe.close()
    if log:
        try:
            _write_log(log, records)
        except OSError as e:
            raise SpecError(str(log), None, "--log", f"cannot write the log: {e.strerror or e}") from None
    return {
        "backend": backend, "epochs": epochs,
        # mean training loss of the last epoch (None when nothing was trained)
        "final_loss": history[-1]["mean_loss"] if history and history[-1]["mean_loss"] is not None else
        (final_loss if records else None), "test_accuracy": acc,
        "samples_per_s": samples / train_wall if train_wall else 0.0,
        "grad_max_rel_err_vs_single_device": grad_err,
        "schedule": plan.schedule, "stages": len(plan.stages), "devices": plan.devices,
        "workers": len(Layout.of(plan).workers),
        "microbatches": m, "microbatch_size": mbs, "global_batch": B, "plan_global_batch": plan.global_batch,
        "optimizer": plan.optimizer, "lr": lr, "lr_schedule": lr_schedule, "precision": precision,
        "number_format": number_format or "fp32", "iterations": len(records),
        "stage_utilisation": utilisation, "history": history, "test_samples": int(len(data.y_test)),
        "ray": bool(ray),
    }


def _backend_module(name: str):
    """The backend module; an unknown name is one line naming --backend."""
    from .backends import BackendUnavailable, get_backend

    try:
        return get_backend(name)
    except BackendUnavailable as e:
        raise SpecError(None, None, "--backend", str(e)) from None


def _check_ledger(done: list[np.ndarray], order: np.ndarray, start: int, stop: int, B: int) -> None:
    """Every sample of the epoch's committed iterations trained exactly once, in order."""
    got = np.concatenate(done) if done else np.zeros(0, np.int64)
    want = order[start * B:stop * B]
    if len(got) != len(want) or not np.array_equal(got, want):
        raise PipelineFailure("sample accounting failed: a micro-batch was lost or trained twice")


def _check_writable(opt: str, path: str | None) -> None:
    """SpecError unless ``path`` can be created as a file (its folder exists, it is no folder)."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise SpecError(str(p), None, opt, "expected a file path, got a folder")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SpecError(str(p), None, opt, f"expected an existing folder '{parent}' to write into")
    if opt == "--log" and p.suffix not in (".json", ".csv"):
        raise SpecError(str(p), None, opt, "expected a .json or .csv file name")


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


class _Progress:
    """A rich progress bar on stderr (so --json stdout stays clean), or nothing."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled and total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            self.task = self.bar.add_task("training", total=total)
            self.bar.start()

    def advance(self, text: str) -> None:
        """One iteration done."""
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=text)

    def close(self) -> None:
        """Stop drawing."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
