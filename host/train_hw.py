"""Training on generated hardware (``bapipe run --backend verilator --epochs N``).

The hardware trains in the plan's fixed-point arithmetic (fpga_models.train_fixed,
docs/training.md). The host streams the training samples of every iteration into the first
board in the driver's epoch order, answers each logit vector of the last board with its loss
gradient, and reads the master weights the update engines hold after every iteration. Beside
it, the same iterations run in numpy (``train_fixed.train_step``: bit-identical to the numpy
backend's pipelined fixed16 run, tests/test_host_driver.py), and the weights are compared
after every iteration; the summary says per epoch whether they matched.

A backend module trains through ``train_iterations(plan, model, cluster, master, x_q,
labels, dy, iterations, consts, tf, options) -> dict`` with keys ``weights`` (a
master-weight dict per iteration, raw int64, host layout of
:func:`host.program.fixed_master_params`), ``logits`` (raw, every sample in order) and
``iteration_cycles`` (list, cycles each iteration took, or None). ``consts`` is the run's
rate schedule (``train_fixed.SgdSchedule``; ``as_schedule`` also takes one SgdConstants):
iteration k updates with ``consts.at(k)``. ``dy`` are the loss
gradients (``train_fixed.softmax_xent_grad``, raw, every sample in order) of the numpy
run's logits: a backend whose testbench cannot compute them in the loop feeds these, and
the run checks that the hardware's own logits equal the numpy ones bit for bit
(``outputs_match``), so its own logits would have given the same gradients.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from bapipe.errors import SpecError

from .backends import get_backend
from .data import epoch_order, load_digits


def _equal(a: dict, b: dict) -> tuple[bool, str | None]:
    """Whether two master-weight dicts are bit-identical; the first differing tensor otherwise."""
    for l in sorted(set(a) | set(b)):
        for n in sorted(set(a.get(l, {})) | set(b.get(l, {}))):
            x, y = a.get(l, {}).get(n), b.get(l, {}).get(n)
            if x is None or y is None or np.shape(x) != np.shape(y) or not np.array_equal(x, y):
                return False, f"{l}.{n}"
    return True, None


def _check_divergence(losses: list[float], per_epoch: int, lr: float) -> None:
    """The numpy run's losses by host/diverge.py's loss rule (the hardware's weights equal it)."""
    from . import diverge
    from .pipeline import TrainingDiverged

    for it, loss in enumerate(losses):
        why = (f"training diverged: loss {loss} at epoch {it // per_epoch + 1}, iteration {it % per_epoch} "
               f"(lr {lr:g}); lower --lr") if not np.isfinite(loss) else \
            diverge.loss_diverged(loss, losses[0], it // per_epoch, it % per_epoch, lr)
        if why:
            raise TrainingDiverged(why)


def train_on_hardware(plan, model, cluster, backend: str, epochs: int, lr: float | None, seed: int = 0,
                      options: dict | None = None, max_iterations: int | None = None,
                      plan_file: str = "plan.yaml", log: str | None = None, checkpoint: str | None = None,
                      lr_schedule: str = "linear") -> dict:
    """Train ``epochs`` epochs on ``backend``; compare every iteration's weights with numpy.

    The rate follows ``lr_schedule`` (host.optim.lr_factor, stepped once an epoch): the
    backend gets the whole schedule in integer constants (train_fixed.SgdSchedule), the
    hardware's update engines step through it themselves.
    ``log``: per-iteration records (epoch, iteration, loss of the numpy run, weights equal,
    cycles). ``checkpoint``: the hardware's final master weights with the numpy run's
    velocities (the hardware's own when the weights matched) and position, loadable with
    ``--resume`` (forward runs) like a numpy-backend checkpoint.
    """
    from bapipe.fpga_models import train_fixed as T

    run = _setup(plan, model, cluster, backend, epochs, lr, seed, options, max_iterations, plan_file, lr_schedule)
    ref = _numpy_reference(run, model)
    _check_divergence(ref.losses, run.per_epoch, run.lr)   # before the hardware run: a diverging rate wastes minutes there
    all_idx = np.concatenate(run.idx) if run.idx else np.zeros(0, np.int64)
    ref_logits = np.concatenate(ref.logits) if ref.logits else np.zeros((0, model.layers[-1].out_elems), np.int64)
    dy = T.softmax_xent_grad(ref_logits, run.data.y_train[all_idx], run.tf)
    t0 = time.perf_counter()
    got = run.be.train_iterations(plan, model, cluster, run.master0, run.x_q[all_idx], run.data.y_train[all_idx], dy,
                                  run.total, run.consts, run.tf, run.opts)
    hw_s = run.opts.get("sim_s", time.perf_counter() - t0)
    hw = got["weights"]
    if len(hw) != run.total:
        raise SpecError(plan_file, None, "--backend", f"the {backend} run reported {len(hw)} iterations, "
                                                      f"expected {run.total}")
    per_epoch_match, first_bad, same_at = _compare(hw, ref.masters, run.per_epoch, run.total)
    cycles = got.get("iteration_cycles")
    _write_outputs(run, plan, hw, ref, same_at, cycles, log, checkpoint)
    hw_logits = np.asarray(got.get("logits", []), dtype=np.int64).reshape(-1, ref_logits.shape[1])
    outputs_match = hw_logits.shape == ref_logits.shape and bool(np.array_equal(hw_logits, ref_logits))
    final = {l: hw[-1].get(l, d) for l, d in run.master0.items()} if hw else run.master0  # layers without weights keep theirs
    test_acc = _accuracy(run, model, final)
    _check_learned(run, test_acc, int(ref_logits.shape[1]), ref.losses)
    losses, b, consts = ref.losses, run.b, run.consts
    return {
        "backend": backend, "epochs": epochs, "iterations": run.total,
        "final_loss": float(np.mean(losses[-run.per_epoch:])) if losses else None,
        "test_accuracy": test_acc, "numpy_test_accuracy": _accuracy(run, model, ref.masters[-1] if ref.masters
                                                                    else run.master0),
        "weights_match": bool(per_epoch_match) and all(per_epoch_match), "weights_match_per_epoch": per_epoch_match,
        "first_mismatch": first_bad, "outputs_match": outputs_match,
        "samples_per_s": run.total * b / hw_s if hw_s else 0.0, "numpy_s": ref.seconds, "hardware_s": hw_s,
        "iteration_cycles": cycles, "plan_iteration_cycles": got.get("plan_iteration_cycles"),
        "grad_max_rel_err_vs_single_device": None,
        "schedule": plan.schedule, "stages": len(plan.stages), "devices": plan.devices,
        "microbatches": plan.microbatches, "microbatch_size": plan.microbatch_size, "global_batch": b,
        "optimizer": plan.optimizer, "lr": run.lr, "lr_schedule": lr_schedule, "precision": "fixed",
        "number_format": plan.number_format, "test_samples": int(len(run.data.y_test)),
        "sgd_constants": {"mu": consts.steps[0].mu, "lr": [c.lr for c in consts.steps], "lr_period": consts.period,
                          "lr_scale": consts.steps[0].lr_scale, "shift": consts.steps[0].shift},
    }


@dataclass
class _HwRun:
    """What a hardware training run is fixed to before it starts."""
    be: object                  # the backend module
    opts: dict
    tf: object                  # train_fixed formats
    data: object
    b: int                      # global batch
    lr: float
    per_epoch: int
    total: int                  # iterations
    idx: list                   # each iteration's samples
    x_q: np.ndarray             # the quantised training inputs
    consts: object              # train_fixed.SgdSchedule
    master0: dict               # the initial master weights
    seed: int
    microbatches: int


@dataclass
class _Reference:
    """The numpy fixed16 run the hardware must equal: masters per iteration, losses, logits."""
    masters: list
    losses: list
    logits: list
    seconds: float
    velocities: dict            # the optimizer's state after the last iteration


def _setup(plan, model, cluster, backend, epochs, lr, seed, options, max_iterations, plan_file,
           lr_schedule) -> _HwRun:
    """Formats, backend, data, rate and sample order of the run; refused in one line where the
    plan or the hardware cannot train them."""
    from bapipe.fpga_models import train_fixed as T

    from .optim import default_lr, lr_factor
    from .pipeline import effective_batch
    from .program import fixed_master_params

    try:
        tf = T.get_formats(plan.number_format)
    except ValueError as e:
        raise SpecError(plan_file, None, "number_format", str(e)) from None
    if plan.optimizer != "sgd":
        raise SpecError(plan_file, None, "optimizer", f"the hardware trains with sgd (with momentum), "
                                                      f"got {plan.optimizer}")
    be = get_backend(backend)
    opts = dict(options or {})
    opts["plan"] = plan
    opts.setdefault("plan_file", plan_file)
    be.check(opts)
    data = load_digits(model.inputs[0].shape, seed)
    b, _ = effective_batch(plan, data.n_train)
    hw_lr = be.fixed_lr() if hasattr(be, "fixed_lr") else None   # a rate baked into the hardware
    if lr is None:
        lr = hw_lr if hw_lr is not None else default_lr(plan.optimizer, b, plan.schedule)
    elif hw_lr is not None and lr != hw_lr:
        raise SpecError(plan_file, None, "--lr", f"the {backend} backend's training hardware is generated for "
                                                 f"learning rate {hw_lr}, got {lr}")
    per_epoch = data.n_train // b
    total = epochs * per_epoch if max_iterations is None else min(epochs * per_epoch, max_iterations)
    idx = [epoch_order(data.n_train, seed, it // per_epoch)[(it % per_epoch) * b:(it % per_epoch + 1) * b]
           for it in range(total)]
    n_epochs = (total + per_epoch - 1) // per_epoch
    try:
        consts = T.sgd_schedule(lr, 0.9, b, tf, [lr_factor(lr_schedule, e, epochs) for e in range(max(1, n_epochs))],
                                per_epoch)
    except ValueError as e:   # a rate the integer update cannot represent
        raise SpecError(None, None, "--lr", str(e)) from None
    if hasattr(be, "check_training"):   # the hardware for these constants, refused before any work
        be.check_training(plan, model, cluster, dict(opts, sgd=consts))
    master0 = fixed_master_params(model, 0, len(model.layers) - 1, seed, tf)
    return _HwRun(be, opts, tf, data, b, lr, per_epoch, total, idx, T.quantize(data.x_train, tf.act), consts,
                  master0, seed, max(1, plan.microbatches))


def _numpy_reference(run: _HwRun, model) -> _Reference:
    """The same iterations in numpy fixed16 (train_fixed.train_step)."""
    from bapipe.fpga_models import train_fixed as T

    ref, losses, logits = [], [], []
    m, v = run.master0, {}
    t0 = time.perf_counter()
    for it, i in enumerate(run.idx):
        m, v, info = T.train_step(model, m, v, run.x_q[i], run.data.y_train[i], run.consts.at(it), run.tf,
                                  run.microbatches)
        ref.append(m)
        losses.append(info["loss"] / run.b)
        logits.append(info["logits"].reshape(len(i), -1))
    return _Reference(ref, losses, logits, time.perf_counter() - t0, v)


def _compare(hw: list, ref: list, per_epoch: int, total: int) -> tuple[list, dict | None, list]:
    """Per epoch whether every iteration's weights matched, the first mismatch, and per iteration."""
    per_epoch_match, first_bad, same_at = [], None, []
    for e in range((total + per_epoch - 1) // per_epoch):
        ok = True
        for it in range(e * per_epoch, min(total, (e + 1) * per_epoch)):
            same, where = _equal(hw[it], ref[it])
            same_at.append(same)
            if not same:
                ok = False
                first_bad = first_bad or {"iteration": it, "tensor": where}
        per_epoch_match.append(ok)
    return per_epoch_match, first_bad, same_at


def _write_outputs(run: _HwRun, plan, hw: list, ref: _Reference, same_at: list, cycles, log, checkpoint) -> None:
    """The per-iteration log and the checkpoint of the hardware's final weights."""
    if log:
        from .pipeline import _write_log

        _write_log(log, [{"epoch": it // run.per_epoch, "iteration": it, "loss": ref.losses[it],
                          "weights_match": same_at[it], "iteration_cycles": cycles[it] if cycles else None}
                         for it in range(run.total)])
    if checkpoint:
        from . import checkpoint as ckpt

        final_m = {l: hw[-1].get(l, d) for l, d in run.master0.items()} if hw else run.master0
        ckpt.save(checkpoint, plan, {0: {"params": final_m, "bufs": {}, "shadow": None,
                                         "opt": {"step_count": run.total, "slots": {"v": ref.velocities}}}},
                  run.total // run.per_epoch, run.total % run.per_epoch, run.seed)


def _accuracy(run: _HwRun, model, master) -> float:
    """Test accuracy of master weights in the fixed-point forward pass."""
    from bapipe.fpga_models import train_fixed as T

    wq = T.forward_weights(master, run.tf)
    z = T.layers_fwd(model.layers, {model.inputs[0].name: T.quantize(run.data.x_test, run.tf.act)}, wq, run.tf)
    return float(np.mean(np.argmax(z[model.layers[-1].name].reshape(len(run.data.y_test), -1), 1)
                         == run.data.y_test))


def _check_learned(run: _HwRun, test_acc: float, classes: int, losses: list) -> None:
    """A run that learned nothing stops with one line (host/diverge.py)."""
    from . import diverge
    from .pipeline import TrainingDiverged

    why = diverge.learned_nothing(test_acc, classes, losses[0] if losses else None,
                                  float(np.mean(losses[-run.per_epoch:])) if losses else None,
                                  run.total // run.per_epoch, run.lr)
    if why:
        raise TrainingDiverged(why)
