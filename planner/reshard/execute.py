"""Execute a resharding plan on numpy arrays: the proof that a plan delivers every tile.

Source devices start with their tiles of the global array. Transfers run in start-time
order; a transfer's root must hold its box by then (a source tile, or a box it received
earlier), relays inside a cut-through tree forward what reaches them in that transfer.
Each destination device then assembles its tile only from what it received plus what it
already held; any element left unwritten is an error.
"""
from __future__ import annotations

import numpy as np

from .layout import Box, contains, device_tiles, intersect
from .strategies import Plan

_EPS = 1e-12


class ExecutionError(ValueError):
    """A plan that does not deliver its data (a bug in a strategy, never bad input)."""


def _slices(box: Box, origin: Box | None = None) -> tuple[slice, ...]:
    if origin is None:
        return tuple(slice(lo, hi) for lo, hi in box)
    return tuple(slice(lo - olo, hi - olo) for (lo, hi), (olo, _) in zip(box, origin))


def execute(plan: Plan, array: np.ndarray, src_mesh, src_layout, dst_mesh, dst_layout,
            src_devices, dst_devices) -> dict[str, np.ndarray]:
    """Run ``plan``; return each destination device's assembled tile (checked complete)."""
    shape = array.shape
    have: dict[str, list[tuple[Box, np.ndarray, float]]] = {}
    for dev, box in zip(src_devices, device_tiles(shape, src_mesh, src_layout)):
        have.setdefault(dev, []).append((box, array[_slices(box)], -1.0))

    def fetch(dev: str, box: Box, t: float) -> np.ndarray:
        for hb, data, avail in have.get(dev, ()):
            if avail <= t + _EPS and contains(hb, box):
                return data[_slices(box, hb)]
        raise ExecutionError(f"{dev} sends {box} at t={t:.3e} s before it holds it")

    order = sorted(range(len(plan.transfers)), key=lambda i: (plan.start_s[i], i))
    for i in order:
        tr = plan.transfers[i]
        t0, t1 = plan.start_s[i], plan.finish_s[i]
        for a in tr.after:
            if plan.finish_s[a] > t0 + _EPS:
                raise ExecutionError(f"transfer {i} starts before transfer {a} it waits for ends")
        inflight: dict[str, np.ndarray] = {}
        for a, b in tr.edges:
            data = inflight[a] if a in inflight else fetch(a, tr.box, t0)
            inflight[b] = data.copy()  # a real copy: what b gets is what a had
        for dev, data in inflight.items():
            have.setdefault(dev, []).append((tr.box, data, t1))

    out: dict[str, np.ndarray] = {}
    for dev, box in zip(dst_devices, device_tiles(shape, dst_mesh, dst_layout)):
        tile = np.zeros(tuple(hi - lo for lo, hi in box), dtype=array.dtype)
        filled = np.zeros(tile.shape, dtype=bool)
        for hb, data, _ in have.get(dev, ()):
            cut = intersect(hb, box)
            if cut is None:
                continue
            tile[_slices(cut, box)] = data[_slices(cut, hb)]
            filled[_slices(cut, box)] = True
        if not filled.all():
            raise ExecutionError(f"{dev} is missing {int((~filled).sum())} elements of its tile {box}")
        out[dev] = tile
    return out


def check_delivery(plan: Plan, array: np.ndarray, src_mesh, src_layout, dst_mesh, dst_layout,
                   src_devices, dst_devices) -> None:
    """Raise ExecutionError unless every destination tile equals the global array's slice."""
    tiles = execute(plan, array, src_mesh, src_layout, dst_mesh, dst_layout, src_devices, dst_devices)
    for dev, box in zip(dst_devices, device_tiles(array.shape, dst_mesh, dst_layout)):
        if not np.array_equal(tiles[dev], array[_slices(box)]):
            raise ExecutionError(f"{dev} assembled a wrong tile {box}")
