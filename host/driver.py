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
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bapipe.errors import BapipeError, SpecError
from bapipe.plan import Plan, load_plan
from bapipe.fpga_models.plancheck import resolve

from . import diverge
from .data import epoch_order, load_digits
from .optim import DEFAULT_LR_SCHEDULE, LR_SCHEDULES, default_lr, lr_factor
from .pipeline import (Layout, Pipeline, PipelineFailure, TrainingDiverged, _write_log,
                       effective_batch, split_microbatches)


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
    from bapipe.fpga_models import train_fixed as T

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
    if backend == "torch":  # PyTorch processes, torch.distributed.pipelining: host/torch_train.py
        return _train_torch(plan, epochs, lr, seed, precision, log, checkpoint, resume, ray, retries, global_batch,
                            timeout, lr_schedule, max_iterations)
    plan_file = str(plan) if not isinstance(plan, Plan) else "<plan>"
    if not isinstance(plan, Plan):
        plan = load_plan(plan)
        model, _cluster = resolve(plan, plan_file)  # a file: checked in full
    else:
        model, _cluster = resolve(plan)  # built in memory (tests): structural checks
    precision, epochs, hw_train = _check_options(plan, plan_file, backend, epochs, precision, lr, timeout, resume,
                                                 lr_schedule)
    for opt, path in (("--log", log), ("--checkpoint", checkpoint)):
        _check_writable(opt, path)  # refuse before training, not after minutes of it
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
    run = _numpy_run(plan, model, plan_file, precision, lr, seed, global_batch, epochs, lr_schedule)
    if ray:
        from .ray_mode import require_ray

        require_ray()
    start_epoch, start_iter, state0 = 0, 0, None
    if resume:
        start_epoch, start_iter, state0 = _resume(resume, plan, model, seed, epochs)
    # fixed point: the optimizer's rate applies to the batch-summed gradient (docs/training.md)
    opts = dict(backend=backend, backend_options={"build": build}, number_format=run.number_format,
                optimizer=plan.optimizer, lr=run.lr / run.B if run.fixed_tf is not None else run.lr, seed=seed,
                timeout=timeout)
    if ray:
        from .ray_mode import RayPipeline as _P
    else:
        _P = Pipeline
    bar = _Progress(progress, total=max(0, (epochs - start_epoch) * run.iters_per_epoch - start_iter))
    pipe = _P(plan, model, start_method=start_method, faults=faults, **opts)
    try:
        if pipeline_hook:
            pipeline_hook(pipe)
        if state0 is not None:
            pipe.set_state(state0)
        _train_epochs(run, pipe, start_epoch, start_iter, retries, check_grads, max_iterations, checkpoint, bar)
        acc, utilisation = _evaluate(run, pipe)
    except (PipelineFailure, TrainingDiverged, KeyboardInterrupt):  # KeyboardInterrupt: also SIGTERM
        if log:  # the iterations that did run are what a failure is debugged from
            try:
                _write_log(log, run.records)
            except OSError:
                pass  # the failure itself is the message worth printing
        raise
    finally:
        bar.close()
        pipe.close()
    if log:
        try:
            _write_log(log, run.records)
        except OSError as e:
            raise SpecError(str(log), None, "--log", f"cannot write the log: {e.strerror or e}") from None
    return _summary(run, pipe, backend, ray, acc, utilisation)


def _train_torch(plan, epochs, lr, seed, precision, log, checkpoint, resume, ray, retries, global_batch, timeout,
                 lr_schedule, max_iterations) -> dict:
    """``--backend torch``: PyTorch processes (host/torch_train.py); the options it cannot honour
    are refused by name."""
    for name, given in (("--precision", precision not in ("float32", "plan")), ("--log", log), ("--checkpoint", checkpoint),
                        ("--resume", resume), ("--ray", ray), ("--retries", retries)):
        if given:
            raise SpecError(None, None, name, "does not apply to --backend torch")
    from .torch_train import train_torch

    return train_torch(plan, epochs=epochs, lr=lr, seed=seed, global_batch=global_batch, timeout=timeout,
                       lr_schedule=lr_schedule, max_iterations=max_iterations)


def _check_options(plan: Plan, plan_file: str, backend: str, epochs, precision: str, lr, timeout, resume,
                   lr_schedule: str) -> tuple[str, int, bool]:
    """The run's options checked against the plan and the backend, one line each: (precision,
    epochs, whether the backend trains on its hardware)."""
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
    return precision, epochs, hw_train


@dataclass
class _Run:
    """One numpy-backend training run: its fixed inputs and what it has recorded so far."""
    plan: Plan
    model: object
    data: object
    B: int                      # global batch
    mbs: int                    # micro-batch size
    m: int                      # micro-batches an iteration
    lr: float
    epochs: int
    lr_schedule: str
    precision: str
    number_format: str | None
    quant: object
    fixed_tf: object            # integer training (fpga_models.train_fixed): fixed16, else None
    seed: int
    history: list = field(default_factory=list)
    records: list = field(default_factory=list)
    ledger: dict = field(default_factory=dict)
    grad_err: float | None = None
    train_wall: float = 0.0
    samples: int = 0
    final_loss: float = float("nan")
    first_loss: float | None = None  # the run's first loss: host/diverge.py measures divergence from it

    @property
    def iters_per_epoch(self) -> int:
        return self.data.n_train // self.B


def _numpy_run(plan: Plan, model, plan_file: str, precision: str, lr, seed: int, global_batch, epochs: int,
               lr_schedule: str) -> _Run:
    """The numpy backend's run: data, batch, rate and arithmetic, refused in one line where the
    plan's model or optimizer cannot train in them."""
    if plan.mode != "train":
        raise SpecError(plan_file, None, "mode", "expected a training plan (mode: train)")
    from .program import StageProgram

    for st in plan.stages:  # unsupported layer types fail here, as one line, before any process starts
        StageProgram(model, st.first, st.last)
    data = load_digits(model.inputs[0].shape, seed)
    B, mbs = effective_batch(plan, data.n_train, global_batch)
    lr = lr if lr is not None else default_lr(plan.optimizer, B, plan.schedule)
    number_format = None if precision == "float32" else plan.number_format
    quant = None
    if number_format is not None:
        from .fixed import make_quant

        quant = make_quant(number_format)
    fixed_tf = getattr(quant, "tf", None)
    if fixed_tf is not None:
        _check_fixed(plan, model, plan_file, fixed_tf, lr / B)
    return _Run(plan, model, data, B, mbs, B // mbs, lr, epochs, lr_schedule, precision, number_format, quant,
                fixed_tf, seed)


def _check_fixed(plan: Plan, model, plan_file: str, fixed_tf, step: float) -> None:
    """Integer training (fpga_models.train_fixed) takes every stage, sgd, and the rate ``step``."""
    from .program import FixedStageProgram

    for st in plan.stages:
        FixedStageProgram(model, st.first, st.last, fixed_tf)
    if plan.optimizer != "sgd":
        raise SpecError(plan_file, None, "optimizer", f"fixed-point training implements sgd (with momentum), "
                                                      f"got {plan.optimizer}; use --precision float32")
    from bapipe.fpga_models import train_fixed as T

    try:   # a rate the integer update cannot represent: refused here, not in a worker mid-run
        T.sgd_constants(step, 0.9, 1, fixed_tf)
    except ValueError as e:
        raise SpecError(None, None, "--lr", str(e)) from None


def _resume(resume: str, plan: Plan, model, seed: int, epochs: int) -> tuple:
    """(start epoch, start iteration, state) of a checkpoint; refused when it has done the epochs."""
    from . import checkpoint as ckpt

    start_epoch, start_iter, state0 = ckpt.load(resume, plan, model, seed)
    if epochs and epochs <= start_epoch:  # the loop would train nothing and report success
        raise SpecError(str(resume), None, "--epochs",
                        f"expected more than the {start_epoch} epoch(s) the checkpoint has completed "
                        f"(--epochs counts from the start of training), got {epochs}")
    return start_epoch, start_iter, state0


def _train_epochs(run: _Run, pipe, start_epoch: int, start_iter: int, retries: int, check_grads: bool,
                  max_iterations: int | None, checkpoint: str | None, bar) -> None:
    """The epochs from (start_epoch, start_iter): iterations, replays after a worker failure
    (from the epoch's snapshot), the sample ledger and checkpoints."""
    from . import checkpoint as ckpt

    ipe = run.iters_per_epoch
    gi = start_epoch * ipe + start_iter  # global iteration number
    epoch = start_epoch
    while epoch < run.epochs:
        order = epoch_order(run.data.n_train, run.seed, epoch)
        snapshot = (pipe.get_state(), start_iter) if retries else None
        i = start_iter
        run.ledger[epoch] = []
        losses: list[float] = []
        while i < ipe and not (max_iterations is not None and gi >= max_iterations):
            idx = order[i * run.B:(i + 1) * run.B]
            try:
                r = _iteration(run, pipe, gi, idx, epoch, check_grads)
            except PipelineFailure as e:
                if retries <= 0 or snapshot is None:
                    raise
                retries -= 1
                sys.stderr.write(f"bapipe run: {e}; restarting workers and replaying epoch {epoch} "
                                 f"from iteration {snapshot[1]}\n")
                pipe.restart(snapshot[0])
                gi -= i - snapshot[1]
                i = snapshot[1]
                run.records = [rec for rec in run.records if rec["iteration"] < gi]  # replayed ones are re-logged
                run.ledger[epoch] = run.ledger[epoch][:i - start_iter]
                losses = losses[:i - start_iter]
                continue
            _record(run, r, idx, epoch, i, gi, losses)
            bar.advance(f"epoch {epoch + 1}/{run.epochs} loss {r['loss']:.4f}")
            i += 1
            gi += 1
        _check_ledger(run.ledger[epoch], order, start_iter, i, run.B)
        run.history.append({"epoch": epoch, "mean_loss": float(np.mean(losses)) if losses else None,
                            "iterations": len(losses)})
        if max_iterations is not None and gi >= max_iterations and i < ipe:
            if checkpoint:
                ckpt.save(checkpoint, run.plan, pipe.get_state(), epoch, i, run.seed)
            return
        start_iter = 0
        epoch += 1
        if checkpoint:
            ckpt.save(checkpoint, run.plan, pipe.get_state(), epoch, 0, run.seed)


def _iteration(run: _Run, pipe, gi: int, idx: np.ndarray, epoch: int, check_grads: bool) -> dict:
    """One training iteration over the samples ``idx``; the first one's gradients are checked
    against the single-device reference (exact sums in fixed point, float64 otherwise)."""
    parts = split_microbatches(idx, run.m)
    xs = [run.data.x_train[p] for p in parts]
    ys = [run.data.y_train[p] for p in parts]
    want_check = check_grads and run.grad_err is None
    before = pipe.get_state() if want_check else None
    r = pipe.train_iteration(gi, xs, ys, 1.0 / run.B, lr_factor(run.lr_schedule, epoch, run.epochs))
    if want_check:
        run.grad_err = _grad_check(run, pipe, before, idx)
    return r


def _grad_check(run: _Run, pipe, before: dict, idx: np.ndarray) -> float:
    """The pipeline's last gradients against one device computing the same batch."""
    weights = {s: (v["shadow"] or v["params"]) for s, v in before.items()}
    got = _merge({s: {"g": g} for s, g in pipe.last_grads().items()}, "g")
    master = _merge({s: {"p": w} for s, w in weights.items()}, "p")
    x, y = run.data.x_train[idx], run.data.y_train[idx]
    if run.fixed_tf is not None:  # the exact single-device sums: the pipeline must equal them
        ref = fixed_reference_grads(run.model, master, x, y, run.fixed_tf, run.m)
    else:
        ref = reference_grads(run.model, master, _merge(before, "bufs"), x, y, 1.0 / run.B, run.quant, run.m)
    return grad_rel_err(got, ref)


def _record(run: _Run, r: dict, idx: np.ndarray, epoch: int, i: int, gi: int, losses: list) -> None:
    """An iteration committed: divergence checked (one line), ledger, loss and log record kept."""
    if not np.isfinite(r["loss"]):
        raise TrainingDiverged(f"training diverged: loss {r['loss']} at epoch {epoch + 1}, "
                               f"iteration {i} (lr {run.lr:g}); lower --lr")
    why = diverge.loss_diverged(r["loss"], run.first_loss, epoch, i, run.lr)
    if why:
        raise TrainingDiverged(why)
    run.first_loss = r["loss"] if run.first_loss is None else run.first_loss
    run.ledger[epoch].append(idx)
    run.train_wall += r["wall_s"]
    run.samples += r["samples"]
    run.final_loss = r["loss"]
    losses.append(r["loss"])
    run.records.append({"epoch": epoch, "iteration": gi, "loss": r["loss"], "wall_s": r["wall_s"],
                        "samples_per_s": r["samples"] / r["wall_s"] if r["wall_s"] else 0.0,
                        **{f"util_stage{s}": (b / r["wall_s"] if r["wall_s"] else 0.0)
                           for s, b in enumerate(r["busy_s"])}})


def _evaluate(run: _Run, pipe) -> tuple[float, list[float]]:
    """Test accuracy of the trained pipeline (a run that learned nothing stops here, one line)
    and each stage's utilisation."""
    logits = pipe.predict(0, np.array_split(run.data.x_test, run.m))
    z = logits.reshape(len(run.data.y_test), -1)
    acc = float(np.mean(np.argmax(z, axis=1) == run.data.y_test))
    full = sum(1 for h in run.history if h["iterations"] == run.iters_per_epoch)
    why = diverge.learned_nothing(acc, z.shape[1], run.first_loss,
                                  run.history[-1]["mean_loss"] if run.history else None, full, run.lr)
    if why:
        raise TrainingDiverged(why)
    return acc, [b / run.train_wall if run.train_wall else 0.0 for b in pipe.busy]


def _summary(run: _Run, pipe, backend: str, ray: bool, acc: float, utilisation: list[float]) -> dict:
    """The ``bapipe run --json`` record of a finished run."""
    plan, history = run.plan, run.history
    return {
        "backend": backend, "epochs": run.epochs,
        # mean training loss of the last epoch (None when nothing was trained)
        "final_loss": history[-1]["mean_loss"] if history and history[-1]["mean_loss"] is not None else
        (run.final_loss if run.records else None), "test_accuracy": acc,
        "samples_per_s": run.samples / run.train_wall if run.train_wall else 0.0,
        "grad_max_rel_err_vs_single_device": run.grad_err,
        "schedule": plan.schedule, "stages": len(plan.stages), "devices": plan.devices,
        "workers": len(Layout.of(plan).workers),
        "microbatches": run.m, "microbatch_size": run.mbs, "global_batch": run.B,
        "plan_global_batch": plan.global_batch,
        "optimizer": plan.optimizer, "lr": run.lr, "lr_schedule": run.lr_schedule, "precision": run.precision,
        "number_format": run.number_format or "fp32", "iterations": len(run.records),
        "stage_utilisation": utilisation, "history": history, "test_samples": int(len(run.data.y_test)),
        "ray": bool(ray), **getattr(pipe, "ray_info", {}),  # Ray: nodes and where each worker ran
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
