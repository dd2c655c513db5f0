"""`bapipe run plan.yaml --backend torch`: the plan trained in PyTorch, one CPU process per board.

Processes: pipeline positions x replicas; rank ``r * p + d`` runs position ``d`` of replica
``r`` (its stages: one, or ``chunks`` with the interleaved schedule, stage ``c * p + d`` as
the plan places it). Each replica is a torch.distributed.pipelining pipeline over its own
process group, running the plan's schedule (``gpipe`` -> ScheduleGPipe, ``1f1b`` ->
Schedule1F1B, ``interleaved`` -> ScheduleInterleaved1F1B) over the plan's micro-batches;
replicas of a position form a data-parallel group that averages gradients (all-reduce)
before the optimizer step (SGD with momentum 0.9 or Adam, as planned, PyTorch's own).

Data and arithmetic: the digits set (host/data.py), one global batch per iteration in the
numpy backend's epoch order; micro-batch k of the iteration is rows [k*mbs, (k+1)*mbs) and
replica r takes the r-th equal share of every micro-batch. Each micro-batch's loss is the
mean cross-entropy of its rows; the schedule divides gradients by the micro-batch count
(``scale_grads``) and the replicas average theirs, so the step follows the mean loss over
the global batch.

The reference (``reference_run``) is one process with the whole model, the same weights,
data and split, the same per-(micro-batch, replica) losses accumulated with the same
weights: the pipeline's numbers must equal it up to float32 summation order.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from bapipe import extras
from bapipe.errors import SpecError

from .backends import BackendUnavailable
from .pipeline import PipelineFailure

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}
#: the refusal when torch is missing, worded as every other missing extra's (bapipe.extras)
NEED_TORCH = extras.message("torch", "the torch backend") + " (missing: torch)"


def require_torch():
    """torch, or BackendUnavailable with the one line naming the extra (exit 2)."""
    try:
        import torch
        import torch.distributed  # noqa: F401
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        raise BackendUnavailable(NEED_TORCH) from None
    return torch


def check_plan(plan, plan_file: str) -> tuple[int, int, int]:
    """(positions p, chunks v, replicas R) of a plan the torch backend can run; one line otherwise."""
    if plan.mode != "train":
        raise SpecError(plan_file, None, "mode", "expected a training plan (mode: train)")
    if plan.schedule not in SCHEDULES:
        raise SpecError(plan_file, None, "schedule", f"the torch backend runs {', '.join(SCHEDULES)} "
                                                     f"(torch.distributed.pipelining); the plan has {plan.schedule}")
    p = plan.devices
    v = plan.chunks if plan.schedule == "interleaved" else 1
    if len(plan.stages) != p * v:
        raise SpecError(plan_file, None, "chunks", f"expected {p * v} stages for {p} devices x {v} chunks")
    reps = {max(1, s.replicas) for s in plan.stages}
    for i, s in enumerate(plan.stages):
        if (s.chunk, s.device) != (i // p, i % p):
            raise SpecError(plan_file, None, f"stages[{i}].device", f"expected chunk {i // p}, device {i % p}")
        if s.mesh and int(np.prod(s.mesh)) > 1:
            raise SpecError(plan_file, None, f"stages[{i}].mesh", "the torch backend runs no tensor-parallel mesh "
                                                                  "stages; plan with --mesh 1")
    if len(reps) != 1:
        raise SpecError(plan_file, None, "stages.replicas", f"the torch backend needs one replica count for every "
                                                            f"stage (data-parallel groups); got {sorted(reps)}")
    return p, v, reps.pop()


def batches(n_train: int, B: int, seed: int, epochs: int, max_iterations: int | None):
    """[(epoch, row indices of one global batch)] in the numpy backend's epoch order."""
    from .data import epoch_order

    out = []
    for ep in range(epochs):
        order = epoch_order(n_train, seed, ep)
        for i in range(n_train // B):
            if max_iterations is not None and len(out) >= max_iterations:
                return out
            out.append((ep, order[i * B:(i + 1) * B]))
    return out


def replica_rows(rows: np.ndarray, m: int, R: int, r: int) -> np.ndarray:
    """Replica r's rows of a global batch: its equal share of each of the m micro-batches, in order."""
    mbs = len(rows) // m
    share = mbs // R
    return np.concatenate([rows[k * mbs + r * share: k * mbs + (r + 1) * share] for k in range(m)])


def make_optimizer(torch, params, kind: str, lr: float):
    """PyTorch's SGD (momentum 0.9, the host.optim form) or Adam."""
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _groups(dist, p: int, R: int, rank: int):
    """(this rank's pipeline group, its data-parallel group or None); every rank creates every group."""
    pp = dp = None
    for r in range(R):
        g = dist.new_group(list(range(r * p, (r + 1) * p)))
        if rank // p == r:
            pp = g
    for d in range(p):
        g = dist.new_group(list(range(d, p * R, p))) if R > 1 else None
        if rank % p == d:
            dp = g
    return pp, dp


def rank_main(rank: int, job: dict, conn) -> None:
    """One process: its stages, the schedule over every iteration, the report on ``conn``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as pl
    import torch.nn.functional as F

    from .torch_model import StageModule

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    torch.manual_seed(job["seed"])
    p, v, R, m = job["p"], job["v"], job["R"], job["m"]
    world = p * R
    dist.init_process_group("gloo", store=dist.FileStore(job["store"], world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=job["timeout"]))
    pp, dp = _groups(dist, p, R, rank)
    d, r = rank % p, rank // p
    model, x_all, y_all = job["model"], job["x"], job["y"]
    mods, stages = [], []
    for c in range(v):
        s = job["stages"][c * p + d]
        mod = StageModule(model, s["first"], s["last"], job["seed"])
        mod.train()
        mods.append(mod)
        stages.append(pl.PipelineStage(mod, c * p + d, p * v, torch.device("cpu"), group=pp))
    params = [q for mod in mods for q in mod.parameters()]
    opt = make_optimizer(torch, params, job["optimizer"], job["lr"]) if params else None  # pool-only stages

    def loss_fn(out, target):
        return F.cross_entropy(out, target)

    cls = getattr(pl, SCHEDULES[job["schedule"]])
    sched = cls(stages if job["schedule"] == "interleaved" else stages[0], m, loss_fn=loss_fn)
    first, last = d == 0, d == p - 1  # stage 0 and stage p*v-1 are on these positions
    losses_all, t0s, t1s = [], [], []
    dist.barrier()
    for it, (ep, rows) in enumerate(job["batches"]):
        mine = replica_rows(rows, m, R, r)
        for g in (opt.param_groups if opt else ()):
            g["lr"] = job["lr"] * job["factors"][ep]
        t0s.append(time.perf_counter())
        losses: list = []
        x = torch.from_numpy(x_all[mine]) if first else None
        y = torch.from_numpy(y_all[mine]) if last else None
        args = (x,) if first else ()
        sched.step(*args, target=y, losses=losses if last else None)
        if dp is not None:
            for q in params:  # average over the replicas of this position
                dist.all_reduce(q.grad, group=dp)
                q.grad.div_(R)
        if opt:
            opt.step()
            opt.zero_grad(set_to_none=False)
        t1s.append(time.perf_counter())
        if last:
            losses_all.append([float(l.detach()) for l in losses])
    state = {k: t.detach().numpy().copy() for mod in mods for k, t in _named(mod)}
    dist.barrier()
    dist.destroy_process_group()
    conn.send({"rank": rank, "t0": t0s, "t1": t1s, "losses": losses_all, "state": state})


def _named(mod):
    """(layer name.param, tensor) of a stage's parameters and buffers."""
    for layer, lm in zip(mod.order, mod.mods):
        for k, t in list(lm.named_parameters()) + list(lm.named_buffers()):
            yield f"{layer.name}.{k}", t


def run_ranks(job: dict, world: int, timeout: float) -> list[dict]:
    """Fork the ranks and collect their reports; a rank that dies is named, the others are killed."""
    ctx = mp.get_context("fork")
    tmp = Path(tempfile.mkdtemp(prefix="bapipe-torch-"))
    job = dict(job, store=str(tmp / "store"))
    procs, conns = [], []
    try:
        for rk in range(world):
            a, b = ctx.Pipe(duplex=False)
            pr = ctx.Process(target=_entry, args=(rk, job, b), daemon=True, name=f"torch-rank{rk}")
            pr.start()
            b.close()
            procs.append(pr)
            conns.append(a)
        reports: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        while len(reports) < world:
            for rk, c in enumerate(conns):
                if rk in reports or not c.poll():
                    continue
                try:
                    reports[rk] = c.recv()
                except EOFError:
                    procs[rk].join(5)
                    raise _failure(job, rk, procs[rk]) from None
                if "error" in reports[rk]:
                    raise PipelineFailure(f"{_who(job, rk)} failed: {reports[rk]['error']}")
            if time.monotonic() > deadline:
                silent = [_who(job, rk) for rk in range(world) if rk not in reports]
                raise PipelineFailure(f"no report from {', '.join(silent)} after {timeout:.0f} s (hung)")
            time.sleep(0.005)
        return [reports[rk] for rk in range(world)]
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()
            pr.join(5)
        shutil.rmtree(tmp, ignore_errors=True)


def _who(job: dict, rk: int) -> str:
    p = job["p"]
    return f"rank {rk} (position {rk % p}, replica {rk // p}, board {job['boards'][rk]})"


def _failure(job: dict, rk: int, pr) -> PipelineFailure:
    code = pr.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return PipelineFailure(f"{_who(job, rk)} died ({how}); every rank was stopped")


def _entry(rk: int, job: dict, conn) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rank_main(rk, job, conn)
    except BaseException as e:
        try:
            conn.send({"rank": rk, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
        finally:
            raise SystemExit(1)


def iteration_times(reports: list[dict]) -> list[float]:
    """Per iteration: the first rank's start to the last rank's end (one monotonic clock)."""
    n = len(reports[0]["t0"])
    return [max(rep["t1"][i] for rep in reports) - min(rep["t0"][i] for rep in reports) for i in range(n)]


def reference_run(model, job: dict) -> tuple[list[float], dict]:
    """One process, the whole model: per iteration the mean loss over (micro-batch, replica) pieces,
    and the final weights."""
    import torch
    import torch.nn.functional as F

    from .torch_model import whole_model

    torch.set_num_threads(1)
    mod = whole_model(model, job["seed"])
    mod.train()
    opt = make_optimizer(torch, list(mod.parameters()), job["optimizer"], job["lr"])
    m, R = job["m"], job["R"]
    out = []
    for ep, rows in job["batches"]:
        for g in opt.param_groups:
            g["lr"] = job["lr"] * job["factors"][ep]
        vals = []
        for r in range(R):
            mine = replica_rows(rows, m, R, r).reshape(m, -1)
            for k in range(m):
                x = torch.from_numpy(job["x"][mine[k]])
                loss = F.cross_entropy(mod(x), torch.from_numpy(job["y"][mine[k]]))
                (loss / (m * R)).backward()
                vals.append(float(loss.detach()))
        opt.step()
        opt.zero_grad(set_to_none=False)
        out.append(vals)
    return out, {k: t.detach().numpy().copy() for k, t in _named(mod)}
