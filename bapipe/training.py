"""Training defaults every backend shares: `bapipe run` (host.optim) and `bapipe csim
--iterations` (codegen.cli_csim) start from the same learning rate for the same plan."""
from __future__ import annotations

#: learning rates measured on digits (tiny-mlp, tiny-cnn; docs/host.md) at the reference batch
DEFAULT_LR = {"sgd": (0.05, 64), "adam": (0.01, 16)}


def default_lr(kind: str, global_batch: int, schedule: str = "1f1b") -> float:
    """The default learning rate: the measured one, scaled by sqrt(batch / reference) below it.

    Small batches with momentum diverged at the large-batch rate in our sweep, so the rate
    shrinks with the square root of the batch (Krizhevsky's rule) and never grows past it.
    """
    lr, ref = DEFAULT_LR[kind]
    if schedule == "2bw":  # one-step-stale gradients with momentum diverged at the full rate
        lr *= 0.4
    return lr * min(1.0, (global_batch / ref) ** 0.5)
