"""Unit tasks: intersect every destination tile with every source tile.

A unit task is one box of the tensor that a set of source devices all hold (any may
send it) and a set of destination devices all need. Tasks of one resharding partition
every destination tile, so delivering each task to its receivers delivers every tile.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .layout import Box, Layout, box_size, chunk_bounds, tile_index


@dataclass(frozen=True)
class UnitTask:
    """One box, the devices holding it and the devices needing it (names)."""

    index: int
    box: Box
    nbytes: int
    holders: tuple[str, ...]
    receivers: tuple[str, ...]  # need it and do not already hold it
    local: tuple[str, ...] = ()  # need it and already hold it (a local copy, no transfer)


def _groups_by_tile(shape, mesh, layout: Layout, devices) -> dict[tuple[int, ...], list[str]]:
    """Tile index -> device names holding that tile, in mesh order."""
    out: dict[tuple[int, ...], list[str]] = {}
    for i, coord in enumerate(itertools.product(*(range(m) for m in mesh))):
        out.setdefault(tile_index(layout, mesh, coord), []).append(devices[i])
    return out


def make_tasks(shape: tuple[int, ...], dtype_bytes: int, src_mesh: tuple[int, ...], src_layout: Layout,
               dst_mesh: tuple[int, ...], dst_layout: Layout, src_devices, dst_devices) -> list[UnitTask]:
    """Unit tasks of a resharding, in a deterministic order (destination tile, then source tile).

    Per dimension the overlapping (source chunk, destination chunk) pairs are found on 1-d
    intervals; a task is one combination of overlaps, so misaligned splits (2-way to
    3-way) give the pieces on both sides of every boundary.
    """
    sparts, dparts = src_layout.parts(src_mesh), dst_layout.parts(dst_mesh)
    sb = [chunk_bounds(L, p) for L, p in zip(shape, sparts)]
    db = [chunk_bounds(L, p) for L, p in zip(shape, dparts)]
    holders = _groups_by_tile(shape, src_mesh, src_layout, list(src_devices))
    needers = _groups_by_tile(shape, dst_mesh, dst_layout, list(dst_devices))
    # per dimension: destination chunk -> [(source chunk, lo, hi)]
    overlap = []
    for d in range(len(shape)):
        per = []
        for (dlo, dhi) in db[d]:
            row = []
            for j, (slo, shi) in enumerate(sb[d]):
                lo, hi = max(dlo, slo), min(dhi, shi)
                if hi > lo:
                    row.append((j, lo, hi))
            per.append(row)
        overlap.append(per)
    tasks: list[UnitTask] = []
    for didx in sorted(needers):
        rows = [overlap[d][i] for d, i in enumerate(didx)]
        for combo in itertools.product(*rows):
            sidx = tuple(c[0] for c in combo)
            box = tuple((c[1], c[2]) for c in combo)
            hold = tuple(holders.get(sidx, ()))
            if not hold:
                continue  # unreachable: every source tile index has a holder
            hs = set(hold)
            need = needers[didx]
            tasks.append(UnitTask(len(tasks), box, box_size(box) * dtype_bytes, hold,
                                  tuple(r for r in need if r not in hs), tuple(r for r in need if r in hs)))
    return tasks
