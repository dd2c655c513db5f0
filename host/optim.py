"""Optimizers applied per stage after the pipeline flush: SGD with momentum, and Adam.

State lives beside the weights it updates (same nested dict layout: layer -> name ->
array), so a stage's worker owns both and a checkpoint stores both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Nested = dict[str, dict[str, np.ndarray]]

# the defaults every backend shares (csim too): bapipe.training
from bapipe.training import DEFAULT_LR, default_lr  # noqa: E402,F401  (host.optim's names)


#: rate schedules over a run's epochs (docs/training.md "Learning-rate schedule")
LR_SCHEDULES = ("linear", "constant")
DEFAULT_LR_SCHEDULE = "linear"


def lr_factor(schedule: str, epoch: int, epochs: int) -> float:
    """The rate of ``epoch`` (0-based) of ``epochs`` as a fraction of the peak rate.

    ``linear``: (epochs - epoch) / epochs, stepped once an epoch (1, 0.8, ..., 0.2 over five).
    At a constant rate the last iterate of momentum SGD is noisy: tiny-mlp's fixed16 test
    accuracy after 5 epochs at batch 32 spread 0.894..0.967 over 8 seeds (mean 0.946); with
    the linear decay 0.955..0.969 (mean 0.962), >= 0.947 at rates 0.025 and 0.05 too
    (bench/lr_schedule.py, docs/training.md).
    """
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return (epochs - min(epoch, epochs - 1)) / epochs if epochs > 0 else 1.0
    raise ValueError(f"unknown learning-rate schedule {schedule!r}, expected one of {', '.join(LR_SCHEDULES)}")


@dataclass
class Optimizer:
    """SGD with momentum (PyTorch's form: v = mu v + g; w -= lr v) or Adam (Kingma & Ba)."""

    kind: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    step_count: int = 0
    slots: dict[str, Nested] = field(default_factory=dict)

    def step(self, params: Nested, grads: Nested, factor: float = 1.0) -> None:
        """Update ``params`` in place from ``grads`` at rate ``lr * factor`` (a schedule's step).

        Integer params are raw fixed-point master weights (host.fixed.FixedTraining): the
        update is fpga_models.train_fixed.sgd_update, and ``lr`` is then the rate per
        batch-summed gradient (the driver passes lr / global batch; docs/training.md).
        """
        if any(np.issubdtype(w.dtype, np.integer) for d in params.values() for w in d.values()):
            self._step_fixed(params, grads, factor)
            return
        self.step_count += 1
        f32 = np.float32
        for lname, g_layer in grads.items():
            for pname, g in g_layer.items():
                w = params[lname][pname]
                if self.kind == "sgd":
                    v = self._slot("v", lname, pname, w)
                    v *= f32(self.momentum)
                    v += g
                    w -= f32(self.lr * factor) * v
                elif self.kind == "adam":
                    m = self._slot("m", lname, pname, w)
                    s = self._slot("s", lname, pname, w)
                    m *= f32(self.beta1)
                    m += f32(1 - self.beta1) * g
                    s *= f32(self.beta2)
                    s += f32(1 - self.beta2) * g * g
                    mhat = m / f32(1 - self.beta1 ** self.step_count)
                    shat = s / f32(1 - self.beta2 ** self.step_count)
                    w -= (f32(self.lr * factor) * mhat / (np.sqrt(shat) + f32(self.eps))).astype(f32)
                else:
                    raise ValueError(f"unknown optimizer {self.kind!r}")

    def _step_fixed(self, params: Nested, grads: Nested, factor: float = 1.0) -> None:
        """SGD(+momentum) on raw master weights: every parameter steps (a missing gradient is 0)."""
        from bapipe.fpga_models import train_fixed as T

        from .fixed import int_formats

        if self.kind != "sgd":
            raise ValueError(f"fixed-point training implements sgd (with momentum), not {self.kind!r}")
        tf = int_formats()
        c = T.sgd_constants(self.lr, self.momentum, 1, tf, factor)
        self.step_count += 1
        for lname, d in params.items():
            for pname, w in d.items():
                g = grads.get(lname, {}).get(pname)
                v = self._slot("v", lname, pname, w)
                w_new, v_new = T.sgd_update(w, v, np.zeros_like(w) if g is None else g, c, tf)
                w[...] = w_new
                v[...] = v_new

    def _slot(self, slot: str, lname: str, pname: str, like: np.ndarray) -> np.ndarray:
        layer = self.slots.setdefault(slot, {}).setdefault(lname, {})
        if pname not in layer:
            layer[pname] = np.zeros_like(like)
        return layer[pname]

    def state(self) -> dict:
        """Picklable state (for checkpoints and worker restarts)."""
        return {"step_count": self.step_count,
                "slots": {s: {l: {p: a.copy() for p, a in d.items()} for l, d in v.items()}
                          for s, v in self.slots.items()}}

    def load(self, st: dict) -> None:
        """Restore what ``state`` returned."""
        self.step_count = int(st["step_count"])
        self.slots = {s: {l: {p: _keep(a) for p, a in d.items()} for l, d in v.items()}
                      for s, v in st["slots"].items()}


def _keep(a) -> np.ndarray:
    """A copy: raw fixed-point (integer) state stays int64, anything else becomes float32."""
    a = np.asarray(a)
    return np.array(a, np.int64) if np.issubdtype(a.dtype, np.integer) else np.array(a, np.float32)
