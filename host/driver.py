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
    from . import checkpoint as ckpt

    if backend == "torch":  # PyTorch processes, torch.distributed.pipelining: host/torch_train.py
        for name, given in (("--precision", precision not in ("float32", "plan")), ("--log", log), ("--checkpoint", checkpoint),
                            ("--resume", resume), ("--ray", ray), ("--retries", retries)):
            if given:
                raise SpecError(None, None, name, "does not apply to --backend torch")
        from .torch_train import train_torch

        return train_torch(plan, epochs=epochs, lr=lr, seed=seed, global_batch=global_batch, timeout=timeout,
                           lr_schedule=lr_schedule, max_iterations=max_iterations)
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
        from bapipe.fpga_models import train_fixed as T

        try:   # a rate the integer update cannot represent: refused here, not in a worker mid-run
            T.sgd_constants(lr / B, 0.9, 1, fixed_tf)
        except ValueError as e:
            raise SpecError(None, None, "--lr", str(e)) from None
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
    first_loss = None   # the run's first loss: host/diverge.py measures divergence from it
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
                why = diverge.loss_diverged(r["loss"], first_loss, epoch, i, lr)
                if why:
                    raise TrainingDiverged(why)
                first_loss = r["loss"] if first_loss is None else first_loss
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
        z = logits.reshape(len(data.y_test), -1)
        acc = float(np.mean(np.argmax(z, axis=1) == data.y_test))
        full = sum(1 for h in history if h["iterations"] == iters_per_epoch)
        why = diverge.learned_nothing(acc, z.shape[1], first_loss, history[-1]["mean_loss"] if history else None,
                                      full, lr)
        if why:
            raise TrainingDiverged(why)
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
