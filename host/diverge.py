"""When a training run has gone wrong although every number in it is finite.

`bapipe run --lr 1e10` used to finish with exit 0: its loss went from 2.4 to 6e36 in one
iteration and stayed near 1e10, the test accuracy ended at 0.106 (chance for 10 classes),
and only a NaN or an infinity stopped a run. Two rules now stop it (host/driver.py and
host/train_hw.py raise TrainingDiverged with the message, exit 1):

- the loss of an iteration is more than ``LOSS_FACTOR`` times its reference, the larger of
  the run's first loss and 1.0 (a resumed run that starts near 0 does not make a normal
  fluctuation look like divergence); cross-entropy at initialisation is ln(classes), 2.3 for
  10 classes, so the bound is 230 there: a loss that high means every prediction is
  confidently wrong, not a noisy step;
- after at least one whole epoch, the test accuracy is at chance (at most
  ``CHANCE_FACTOR`` / classes) and the last epoch's mean loss did not fall below
  ``STALL_FRACTION`` of the first loss: the run learned nothing (the rate is too high for
  the network to recover, or so low nothing moved). One epoch of tiny-mlp at the default
  rate reaches 0.80 and of tiny-cnn 0.57 (10 classes: chance 0.10), far from the bound.

Both are pure functions returning the message (None when the run is fine).
"""
from __future__ import annotations

LOSS_FACTOR = 100.0
CHANCE_FACTOR = 1.5
STALL_FRACTION = 0.9


def loss_diverged(loss: float, first: float | None, epoch: int, iteration: int, lr: float) -> str | None:
    """The message when ``loss`` is far above the run's first loss ``first``."""
    if first is None:
        return None
    ref = max(first, 1.0)
    if loss > LOSS_FACTOR * ref:
        return (f"training diverged: loss {loss:.4g} at epoch {epoch + 1}, iteration {iteration} is over "
                f"{LOSS_FACTOR:g}x the first iteration's {first:.4g} (lr {lr:g}); lower --lr")
    return None


def learned_nothing(accuracy: float, classes: int, first_loss: float | None, last_loss: float | None,
                    full_epochs: int, lr: float) -> str | None:
    """The message when a run of at least one whole epoch ends at chance with a loss that did not fall."""
    if full_epochs < 1 or classes < 2 or first_loss is None or last_loss is None:
        return None
    chance = 1.0 / classes
    if accuracy <= CHANCE_FACTOR * chance and last_loss >= STALL_FRACTION * first_loss:
        return (f"training did not learn: test accuracy {accuracy:.3f} is chance ({chance:.3f} for {classes} classes) "
                f"after {full_epochs} epoch(s) and the loss did not fall (first {first_loss:.4g}, last epoch "
                f"{last_loss:.4g}; lr {lr:g}); change --lr")
    return None
