"""The training data: the 8x8 handwritten digits shipped beside this module (no download).

``host/digits.csv.gz`` is the UCI test set of Alpaydin and Kaynak (1998), CC BY 4.0, the same
1797 images as scikit-learn's ``load_digits()`` (source, licence and checksum: host/DIGITS.md).

1797 grey-level images of the digits 0-9, pixel values 0..16. We scale them to [0, 1]
and shape them for the model's input: tiny-mlp reads (64,), tiny-cnn reads (1, 8, 8).
The train/test split is a fixed seeded permutation, so every run sees the same sets.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError

TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays (float32 inputs, int64 labels) plus the class count."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int = 10

    @property
    def n_train(self) -> int:
        """Training samples."""
        return len(self.y_train)


def load_digits(input_shape: tuple[int, ...], seed: int = 0, test_fraction: float = TEST_FRACTION) -> Dataset:
    """Digits reshaped to ``input_shape`` (per sample), split into train/test by ``seed``."""
    if int(np.prod(input_shape)) != 64:
        raise SpecError(None, None, "model.input",
                        f"the digits data set has 64 pixels per image; the model reads {list(input_shape)}")
    pixels, labels = digits()
    x = (pixels.astype(np.float32) / np.float32(16.0)).reshape((-1,) + tuple(input_shape))
    y = labels
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    return Dataset(x[train], y[train], x[test], y[test], classes=10)


#: the shipped data file (host/DIGITS.md)
DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")


@lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels (1797, 64) int64 in 0..16, labels (1797,) int64) read from DIGITS_FILE."""
    rows = np.loadtxt(DIGITS_FILE, delimiter=",", dtype=np.int64)
    pixels, labels = rows[:, :64], rows[:, 64]
    pixels.flags.writeable = labels.flags.writeable = False   # cached: shared by every caller
    return pixels, labels


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """Sample order of one epoch: a permutation fixed by (seed, epoch), so replays are exact."""
    return np.random.default_rng([seed, 7919, epoch]).permutation(n)
