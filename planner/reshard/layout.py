"""Meshes, layouts and the tile each device holds.

A *mesh* is an n-d array of devices, written ``"2x4"`` (2 groups x 4 boards; axis 0
indexes groups, e.g. hosts). Devices are numbered row-major over the mesh.

A *layout* has one symbol per tensor dimension: ``R`` (not split) or ``S<axes>`` (split
over those mesh axes, the first axis most significant), e.g. ``S0RR``, ``RS01R``, ``RRR``.
Each mesh axis splits at most one tensor dimension; mesh axes no dimension uses replicate.
A dimension of length L split n ways is cut into contiguous near-equal chunks with
``numpy.array_split`` semantics: the first ``L % n`` chunks get ``L // n + 1`` elements,
the rest ``L // n`` (chunks may be empty when n > L).

YAML form of a layout: a list with one item per dimension, each ``R``, ``S01`` or a list
of mesh axes (``[]`` = replicated), e.g. ``[S0, R, [1]]``.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from math import prod
from typing import Any

from bapipe.errors import SpecError
from bapipe.numformats import NUMBER_FORMATS

MAX_DEVICES = 4096
MAX_MESH_AXES = 10  # axes are written as single digits

#: the plan's number formats (bapipe.numformats, the one table) and the other tensor dtypes
#: a resharding request may name
DTYPE_BYTES = {**{n: f.bytes for n, f in NUMBER_FORMATS.items()},
               "uint8": 1, "fixed8": 1, "int16": 2, "float16": 2, "bfloat16": 2, "int32": 4, "fixed32": 4,
               "float32": 4, "int64": 8, "fp64": 8, "float64": 8}

_SYMBOL = re.compile(r"R|S\d+")


def dtype_bytes(dtype: str, field: str = "dtype") -> int:
    """Bytes per element of a dtype name (int8 ... fp64, fixed16, bf16)."""
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise SpecError(None, None, field, f"unknown dtype {dtype!r}; expected one of "
                                           f"{', '.join(DTYPE_BYTES)}") from None


def parse_shape(text: Any, field: str = "shape") -> tuple[int, ...]:
    """``"1024,1024,512"`` (or a sequence of ints) -> a tuple of positive ints."""
    parts = str(text).split(",") if isinstance(text, str) else list(text)
    try:
        shape = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        raise SpecError(None, None, field, f"expected comma-separated positive integers, got {text!r}") from None
    if not shape or any(s <= 0 for s in shape):
        raise SpecError(None, None, field, f"expected comma-separated positive integers, got {text!r}")
    return shape


def parse_mesh(text: Any, field: str = "mesh") -> tuple[int, ...]:
    """``"2x4"`` / ``"8"`` / ``(2, 4)`` -> a tuple of positive ints (at most 4096 devices)."""
    if isinstance(text, str):
        parts = text.lower().split("x")
    elif isinstance(text, int):
        parts = [text]
    else:
        parts = list(text)
    try:
        shape = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        raise SpecError(None, None, field, f"expected a mesh like 2x4 (groups x boards), got {text!r}") from None
    if not shape or any(s <= 0 for s in shape) or len(shape) > MAX_MESH_AXES:
        raise SpecError(None, None, field, f"expected a mesh like 2x4 with 1..{MAX_MESH_AXES} positive axes, "
                                           f"got {text!r}")
    if prod(shape) > MAX_DEVICES:
        raise SpecError(None, None, field, f"expected at most {MAX_DEVICES} devices, got {prod(shape)}")
    return shape


def mesh_str(mesh: tuple[int, ...]) -> str:
    """The compact form of a mesh shape, e.g. ``2x4``."""
    return "x".join(str(m) for m in mesh)


@dataclass(frozen=True)
class Layout:
    """Per tensor dimension, the mesh axes it is split over (empty = replicated)."""

    dims: tuple[tuple[int, ...], ...]

    def __str__(self) -> str:
        return "".join("R" if not ax else "S" + "".join(map(str, ax)) for ax in self.dims)

    def to_yaml(self) -> list[str]:
        """The YAML form: one ``R`` / ``S01`` item per dimension."""
        return ["R" if not ax else "S" + "".join(map(str, ax)) for ax in self.dims]

    def parts(self, mesh: tuple[int, ...]) -> tuple[int, ...]:
        """How many chunks each tensor dimension is cut into on ``mesh``."""
        return tuple(prod(mesh[a] for a in ax) for ax in self.dims)


def parse_layout(text: Any, rank: int | None = None, mesh: tuple[int, ...] | None = None,
                 field: str = "layout") -> Layout:
    """Parse ``"S0RR"`` or the YAML list form; validate against the tensor rank and mesh."""
    dims: list[tuple[int, ...]] = []
    if isinstance(text, str):
        s = text.strip().upper()
        symbols = _SYMBOL.findall(s)
        if not s or "".join(symbols) != s:
            raise SpecError(None, None, field, f"expected one R or S<mesh axes> per tensor dimension "
                                               f"(e.g. S0RR, RS01R), got {text!r}")
        for sym in symbols:
            dims.append(() if sym == "R" else tuple(int(c) for c in sym[1:]))
    elif isinstance(text, (list, tuple)):
        for item in text:
            if isinstance(item, (list, tuple)) and all(isinstance(a, int) and not isinstance(a, bool) and a >= 0
                                                       for a in item):
                dims.append(tuple(item))
            elif isinstance(item, str) and re.fullmatch(r"R|S\d+", item.strip().upper()):
                sym = item.strip().upper()
                dims.append(() if sym == "R" else tuple(int(c) for c in sym[1:]))
            else:
                raise SpecError(None, None, field, f"expected R, S<axes> or a list of mesh axes per dimension, "
                                                   f"got {item!r}")
    else:
        raise SpecError(None, None, field, f"expected a layout string like S0RR or a list, got {text!r}")
    layout = Layout(tuple(dims))
    if rank is not None and len(dims) != rank:
        raise SpecError(None, None, field, f"layout {layout} has {len(dims)} symbols; expected one per tensor "
                                           f"dimension ({rank})")
    used = [a for ax in dims for a in ax]
    if len(used) != len(set(used)):
        raise SpecError(None, None, field, f"layout {layout} uses a mesh axis twice; expected each mesh axis "
                                           "at most once")
    if mesh is not None and any(a >= len(mesh) for a in used):
        raise SpecError(None, None, field, f"layout {layout} names mesh axis {max(used)}; the mesh "
                                           f"{mesh_str(mesh)} has axes 0..{len(mesh) - 1}")
    return layout


def chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``numpy.array_split`` boundaries of ``range(length)`` into ``parts`` chunks."""
    q, r = divmod(length, parts)
    out, start = [], 0
    for i in range(parts):
        size = q + (1 if i < r else 0)
        out.append((start, start + size))
        start += size
    return out


Box = tuple[tuple[int, int], ...]  # per dimension a half-open [lo, hi)


def tile_index(layout: Layout, mesh: tuple[int, ...], coord: tuple[int, ...]) -> tuple[int, ...]:
    """Which chunk of each dimension the device at mesh ``coord`` holds."""
    idx = []
    for ax in layout.dims:
        k = 0
        for a in ax:  # first listed axis most significant
            k = k * mesh[a] + coord[a]
        idx.append(k)
    return tuple(idx)


def device_tiles(shape: tuple[int, ...], mesh: tuple[int, ...], layout: Layout) -> list[Box]:
    """The box each device holds, devices in row-major mesh order."""
    parts = layout.parts(mesh)
    bounds = [chunk_bounds(L, p) for L, p in zip(shape, parts)]
    out = []
    for coord in itertools.product(*(range(m) for m in mesh)):
        idx = tile_index(layout, mesh, coord)
        out.append(tuple(bounds[d][i] for d, i in enumerate(idx)))
    return out


def box_size(box: Box) -> int:
    """Elements in a box."""
    return prod(max(0, hi - lo) for lo, hi in box)


def intersect(a: Box, b: Box) -> Box | None:
    """The intersection of two boxes, or None when it is empty."""
    out = []
    for (alo, ahi), (blo, bhi) in zip(a, b):
        lo, hi = max(alo, blo), min(ahi, bhi)
        if hi <= lo:
            return None
        out.append((lo, hi))
    return tuple(out)


def contains(outer: Box, inner: Box) -> bool:
    """True when ``inner`` lies inside ``outer``."""
    return all(olo <= ilo and ihi <= ohi for (olo, ohi), (ilo, ihi) in zip(outer, inner))
