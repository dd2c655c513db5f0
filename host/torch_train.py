"""`bapipe run --backend torch`: train a plan in PyTorch between processes, check it against one process.

``train_torch`` validates the plan (host/torch_run.check_plan), forks one process per board
(positions x replicas) that run the plan's schedule with torch.distributed.pipelining
(host/torch_run.rank_main), then trains the same model in this process alone
(``reference_run``) and compares: every micro-batch loss of every iteration and every final
weight. The result carries the measured iteration time beside the plan's prediction.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError
from bapipe.plan import Plan, load_plan
from bapipe.fpga_models.plancheck import resolve

from .data import load_digits
from .pipeline import effective_batch
from .optim import DEFAULT_LR_SCHEDULE, LR_SCHEDULES, default_lr, lr_factor
from .torch_run import batches, check_plan, iteration_times, reference_run, require_torch, run_ranks

#: |pipeline - single process| / max(1, |single process|) for every loss and every weight.
#: The two runs add the same float32 terms in other orders (gradient accumulation over
#: micro-batches inside a stage, the all-reduce over replicas, batched against per-piece
#: matmuls); each order change is ~1e-7 relative, and a few iterations of SGD with momentum
#: carry it on. Measured on tiny-cnn and tiny-mlp plans (2-4 processes, <= 12 iterations):
#: at most ~2e-6; 1e-4 leaves room for longer runs, and is far below any real difference
#: (one wrong micro-batch or a missed all-reduce moves the loss by > 1e-2).
TOLERANCE = 1e-4


def _load(plan, plan_file: str):
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
        model, _ = resolve(plan, plan_file)
    else:
        model, _ = resolve(plan)
    return plan, model


def train_torch(plan, epochs: int | None = None, lr: float | None = None, seed: int = 0,
                global_batch: int | None = None, timeout: float = 120.0, lr_schedule: str = DEFAULT_LR_SCHEDULE,
                max_iterations: int | None = None, reference: bool = True) -> dict:
    """Train ``plan`` (a path or Plan) on one process per board; the --json dict of `bapipe run`."""
    plan_file = str(plan) if not isinstance(plan, Plan) else "<plan>"
    plan, model = _load(plan, plan_file)
    p, v, R = check_plan(plan, plan_file)
    require_torch()
    from .torch_model import StageModule

    for st in plan.stages:  # unsupported layers: one line before any process starts
        StageModule(model, st.first, st.last, seed)
    epochs = 5 if epochs is None else epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise SpecError(None, None, "--epochs", f"expected an integer >= 1, got {epochs}")
    if lr_schedule not in LR_SCHEDULES:
        raise SpecError(None, None, "--lr-schedule", f"expected one of {', '.join(LR_SCHEDULES)}")
    if lr is not None and not (np.isfinite(lr) and lr > 0):
        raise SpecError(None, None, "--lr", f"expected a positive learning rate, got {lr}")
    data = load_digits(model.inputs[0].shape, seed)
    B, mbs = effective_batch(plan, data.n_train, global_batch)
    m = B // mbs
    if mbs % R:
        raise SpecError(plan_file, None, "microbatch_size", f"the torch backend splits each micro-batch equally "
                                                            f"over the {R} replicas; {mbs} rows do not divide")
    lr = lr if lr is not None else default_lr(plan.optimizer, B, plan.schedule)
    job = {"p": p, "v": v, "R": R, "m": m, "seed": seed, "model": model, "x": data.x_train, "y": data.y_train,
           "schedule": plan.schedule, "optimizer": plan.optimizer, "lr": lr, "timeout": timeout,
           "factors": [lr_factor(lr_schedule, e, epochs) for e in range(epochs)],
           "batches": batches(data.n_train, B, seed, epochs, max_iterations),
           "stages": [{"first": s.first, "last": s.last} for s in plan.stages],
           "boards": [plan.stages[rk % p].boards[rk // p] if rk // p < len(plan.stages[rk % p].boards) else "?"
                      for rk in range(p * R)]}
    t0 = time.perf_counter()
    reports = run_ranks(job, p * R, timeout)
    wall = time.perf_counter() - t0
    losses = _pipeline_losses(reports, p, R)
    per_epoch = data.n_train // B
    _check_losses([float(np.mean(x)) for x in losses], per_epoch, lr)
    out = _summary(plan, job, reports, losses, wall, B, mbs)
    if reference:
        out.update(_compare(model, job, reports, losses))
    out["test_accuracy"], classes = _accuracy(model, seed, _state(reports, p), data)
    _check_learned(out["history"], out["test_accuracy"], classes, per_epoch, lr)
    return out


def _check_losses(history: list[float], per_epoch: int, lr: float) -> None:
    """Each iteration's mean loss by host/diverge.py's loss rule, as the numpy backend checks
    them (the torch backend reports its losses only once every process has finished: `run
    --backend torch --lr 1e10` ended at loss NaN, accuracy 0.078, exit 0)."""
    from . import diverge
    from .pipeline import TrainingDiverged

    for it, loss in enumerate(history):
        epoch, i = divmod(it, max(per_epoch, 1))
        why = (f"training diverged: loss {loss} at epoch {epoch + 1}, iteration {i} (lr {lr:g}); lower --lr"
               if not np.isfinite(loss) else diverge.loss_diverged(loss, history[0], epoch, i, lr))
        if why:
            raise TrainingDiverged(why)


def _check_learned(history: list[float], accuracy: float, classes: int, per_epoch: int, lr: float) -> None:
    """A run of at least one whole epoch that ends at chance with a loss that did not fall stops
    with one line (host/diverge.py's rule, as the other backends apply it)."""
    from . import diverge
    from .pipeline import TrainingDiverged

    full = len(history) // per_epoch if per_epoch else 0
    last = float(np.mean(history[(full - 1) * per_epoch: full * per_epoch])) if full else None
    why = diverge.learned_nothing(accuracy, classes, history[0] if history else None, last, full, lr)
    if why:
        raise TrainingDiverged(why)


def _pipeline_losses(reports: list[dict], p: int, R: int) -> list[list[float]]:
    """Per iteration, the micro-batch losses of replica 0, then replica 1, ... (the reference's order)."""
    last = [reports[r * p + p - 1]["losses"] for r in range(R)]
    return [[x for r in range(R) for x in last[r][i]] for i in range(len(last[0]))]


def _summary(plan, job, reports, losses, wall, B, mbs) -> dict:
    times = iteration_times(reports)
    steady = times[1:] or times  # the first iteration warms up (allocations, first messages)
    measured = statistics.median(steady)
    predicted = float(plan.predicted.get("iteration_time_s", 0.0) or 0.0)
    return {"backend": "torch", "transport": "gloo", "processes": len(reports), "schedule": plan.schedule,
            "stages": len(plan.stages), "devices": job["p"], "replicas": job["R"], "microbatches": job["m"],
            "microbatch_size": mbs, "global_batch": B, "lr": job["lr"], "iterations": len(times),
            "final_loss": float(np.mean(losses[-1])) if losses else float("nan"),
            "history": [float(np.mean(x)) for x in losses],
            "measured_iteration_s": measured, "measured_iteration_times_s": times,
            "predicted_iteration_s": predicted,
            "measured_over_predicted": measured / predicted if predicted > 0 else None,
            "samples_per_s": B * len(times) / wall if wall > 0 else 0.0}


def _compare(model, job, reports, losses) -> dict:
    """Run the single-process reference; the largest relative loss and weight differences."""
    ref_losses, ref_state = reference_run(model, job)
    loss_err = max(abs(a - b) / max(1.0, abs(b)) for pl_, rl in zip(losses, ref_losses) for a, b in zip(pl_, rl))
    state = _state(reports, job["p"])
    w_err = 0.0
    for k, ref in ref_state.items():
        if "running_" in k:
            continue  # batch-norm running statistics: each replica keeps its own
        w_err = max(w_err, float(np.max(np.abs(state[k] - ref) / np.maximum(1.0, np.abs(ref)))))
    return {"single_process_losses": [float(np.mean(x)) for x in ref_losses], "loss_max_rel_err": loss_err,
            "weight_max_rel_err": w_err, "tolerance": TOLERANCE,
            "matches_single_process": loss_err <= TOLERANCE and w_err <= TOLERANCE}


def _state(reports, p: int) -> dict:
    """Replica 0's weights, every position."""
    out = {}
    for rep in reports[:p]:
        out.update(rep["state"])
    return out


def _accuracy(model, seed: int, state: dict, data) -> tuple[float, int]:
    """Test accuracy of the pipeline's final weights (replica 0), evaluated in this process,
    and the number of classes (the logits' width)."""
    import torch

    from .torch_model import whole_model

    mod = whole_model(model, seed)
    with torch.no_grad():
        for layer, lm in zip(mod.order, mod.mods):
            for k, t in list(lm.named_parameters()) + list(lm.named_buffers()):
                t.copy_(torch.from_numpy(state[f"{layer.name}.{k}"]))
        mod.eval()
        logits = mod(torch.from_numpy(data.x_test))
    pred = logits.argmax(dim=1).numpy()
    return float((pred == data.y_test).mean()), int(logits.shape[1])

