"""host/digits.csv.gz is the data set host/DIGITS.md says it is (the UCI test set that
scikit-learn ships as load_digits), read without scikit-learn."""
from __future__ import annotations

import hashlib

import numpy as np

from bapipe.host.data import DIGITS_FILE, digits, load_digits


def test_digits_file_is_the_documented_one():
    # sha256 of the file and per-class counts as host/DIGITS.md and the UCI page give them
    # (1797 images: 178 zeros, 182 ones, ... 180 nines)
    assert hashlib.sha256(DIGITS_FILE.read_bytes()).hexdigest() == \
        "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    pixels, labels = digits()
    assert pixels.shape == (1797, 64) and labels.shape == (1797,)
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert pixels.min() == 0 and pixels.max() == 16
    # fingerprint of the pixels, taken from scikit-learn 1.x's load_digits().data when shipped
    assert hashlib.sha256(pixels.astype(np.uint8).tobytes()).hexdigest() == \
        "8f26b2bd9d135c256808f68f14fdabddde6d9c7f869ae419704b051f0f14b3b3"


def test_load_digits_splits_and_scales():
    d = load_digits((1, 8, 8), seed=0)
    assert d.x_train.shape == (1438, 1, 8, 8) and d.x_test.shape == (359, 1, 8, 8)
    assert d.x_train.dtype == np.float32 and float(d.x_train.max()) == 1.0
    assert sorted(np.concatenate([d.y_train, d.y_test]).tolist()) == sorted(digits()[1].tolist())
