"""A matrix-vector unit's weights in the layouts the hardware reads, computed when read.

The Design keeps each layer's weights once, in model layout (``codegen.design.context
.make_weights``, the narrowest integer type). The MVU matrix W (MH x MW, columns in the
stream's order) and the banked ROM layout ``w[nf*SF + sf][p][s] = W[nf*PE + p][sf*SIMD + s]``
are rearrangements of it, so they are not stored: :class:`MvuMatrix` and :class:`Banked`
compute them on demand (``np.asarray`` of either gives the int64 array, as the Design held
before), a block of rows at a time (:meth:`Banked.blocks`, what the weight image writer
streams to disk) or element by element (:meth:`Banked.take`). VGG-16's fc6 alone holds
103 M weights: one int64 copy of it is 822 MB, and the Design used to hold several.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

#: elements a streamed block holds at most (8 MB of int64)
BLOCK_ELEMENTS = 1 << 20


def flatten_perm(c: int, h: int, w: int) -> np.ndarray:
    """perm[j] = model (CHW) index of the element that is j-th on the HWC stream."""
    return np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)


@dataclass(frozen=True, eq=False)
class MvuMatrix:
    """W (MH x MW) of a dense or conv2d layer, columns in the order its input streams in.

    ``model``: the layer's weights in model layout (dense (MH, MW), conv2d OIHW); ``hwc``: a
    dense layer reading a flattened (C, H, W) image, whose columns arrive in HWC order
    (column j is model column ``flatten_perm(c, h, w)[j]``); None keeps the model's order.
    A conv2d's column is (ky*KW + kx)*C + c (``fpga_models.fixedpoint.conv_weight_matrix``).
    """

    model: np.ndarray
    hwc: tuple[int, int, int] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        m = self.model
        return (int(m.shape[0]), int(m.size // m.shape[0]) if m.shape[0] else 0)

    @property
    def size(self) -> int:
        return int(self.model.size)

    ndim = 2
    dtype = np.dtype(np.int64)

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1-1 of W as int64."""
        m = np.asarray(self.model[r0:r1], dtype=np.int64)
        if m.ndim == 4:   # OIHW -> (O, KH*KW*C)
            return m.transpose(0, 2, 3, 1).reshape(r1 - r0, -1)
        if self.hwc is not None:
            return m[:, flatten_perm(*self.hwc)]
        return m

    def cols_of(self, cols: np.ndarray) -> np.ndarray:
        """Flat model-layout column index (within a row) of W's columns ``cols``."""
        cols = np.asarray(cols, dtype=np.int64)
        if self.model.ndim == 4:
            _, c, kh, kw = self.model.shape
            tap, ch = np.divmod(cols, c)
            return ch * kh * kw + tap   # (c, ky, kx) flat with ky*KW + kx = tap
        if self.hwc is not None:
            return flatten_perm(*self.hwc)[cols]
        return cols

    def take(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """W[r, c] elementwise (int64), without building W."""
        flat = self.model.reshape(self.model.shape[0], -1)
        return np.asarray(flat[np.asarray(r, dtype=np.int64), self.cols_of(c)], dtype=np.int64)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.rows(0, self.shape[0])
        return a if dtype is None else a.astype(dtype, copy=False)

    def __getitem__(self, key) -> np.ndarray:
        return np.asarray(self)[key]

    def tolist(self) -> list:
        return np.asarray(self).tolist()


@dataclass(frozen=True, eq=False)
class Banked:
    """An MVU's weight ROM, ``(NF*SF, PE, SIMD)``: word ``nf*SF + sf`` holds W[nf*PE + p][sf*SIMD + s]
    at [p][s] (the layout of the HLS engine kernel's array, the RTL MVU's memory and the
    stage's weight image)."""

    matrix: MvuMatrix
    pe: int
    simd: int

    @property
    def nf(self) -> int:
        return self.matrix.shape[0] // self.pe

    @property
    def sf(self) -> int:
        return self.matrix.shape[1] // self.simd

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.nf * self.sf, self.pe, self.simd)

    @property
    def size(self) -> int:
        return self.matrix.size

    ndim = 3
    dtype = np.dtype(np.int64)

    def blocks(self, max_elements: int = BLOCK_ELEMENTS) -> Iterator[np.ndarray]:
        """The array in order as consecutive flat int64 blocks of whole row folds (PE rows of W)."""
        fold = self.pe * self.matrix.shape[1]
        step = max(1, max_elements // max(1, fold))
        for f0 in range(0, self.nf, step):
            f1 = min(self.nf, f0 + step)
            w = self.matrix.rows(f0 * self.pe, f1 * self.pe)
            yield w.reshape(f1 - f0, self.pe, self.sf, self.simd).transpose(0, 2, 1, 3).reshape(-1)

    def take(self, flat: np.ndarray) -> np.ndarray:
        """Elements at flat indices ``flat`` of the array (int64), without building it."""
        flat = np.asarray(flat, dtype=np.int64)
        word, lane = np.divmod(flat, self.pe * self.simd)
        nf, sf = np.divmod(word, self.sf)
        p, s = np.divmod(lane, self.simd)
        return self.matrix.take(nf * self.pe + p, sf * self.simd + s)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = np.concatenate(list(self.blocks())) if self.size else np.zeros(0, dtype=np.int64)
        a = a.reshape(self.shape)
        return a if dtype is None else a.astype(dtype, copy=False)


def flat_blocks(values, max_elements: int = BLOCK_ELEMENTS) -> Iterator[np.ndarray]:
    """Any array's values in C order as int64 blocks (a :class:`Banked` one streams its own)."""
    if isinstance(values, Banked):
        yield from values.blocks(max_elements)
        return
    a = np.asarray(values).reshape(-1)
    for i in range(0, a.size, max_elements):
        yield np.asarray(a[i:i + max_elements], dtype=np.int64)


def take_flat(values, flat: np.ndarray) -> np.ndarray:
    """Elements at flat indices of any array (int64); a :class:`Banked` one is not built."""
    if isinstance(values, Banked):
        return values.take(flat)
    if isinstance(values, MvuMatrix):
        return values.take(*np.divmod(np.asarray(flat, dtype=np.int64), max(1, values.shape[1])))
    return np.asarray(np.asarray(values).reshape(-1)[np.asarray(flat, dtype=np.int64)], dtype=np.int64)
