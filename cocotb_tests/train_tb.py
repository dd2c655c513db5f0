"""Helpers shared by the training-engine cocotb tests (test_train_engines, test_train_bn_add)."""
from __future__ import annotations

import numpy as np


def pack(v) -> int:
    """16-bit two's-complement lanes of ``v`` packed into one integer, lane 0 lowest."""
    out = 0
    for k, e in enumerate(np.asarray(v).reshape(-1)):
        out |= (int(e) & 0xFFFF) << (16 * k)
    return out


def unpack(val: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack` for ``n`` signed 16-bit lanes."""
    a = np.array([(val >> (16 * k)) & 0xFFFF for k in range(n)], dtype=np.int64)
    return np.where(a >= 1 << 15, a - (1 << 16), a)


async def run_op(dut, start, done, cycles_out: list) -> None:
    """Pulse ``start`` for one cycle; record the cycles from start to done (inclusive)."""
    from cocotb.triggers import ReadOnly, RisingEdge

    start.value = 1
    n = 1
    await ReadOnly()
    while not int(done.value):
        await RisingEdge(dut.clk)
        start.value = 0
        n += 1
        await ReadOnly()
    await RisingEdge(dut.clk)
    start.value = 0
    await ReadOnly()              # let the last cycle's register writes land
    await RisingEdge(dut.clk)
    cycles_out.append(n)
