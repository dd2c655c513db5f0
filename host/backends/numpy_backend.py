"""The numpy backend: each stage runs its layers' real forward and backward in numpy."""
from __future__ import annotations

from ..program import Quant, StageProgram


def check(options: dict) -> None:
    """Numpy is always available."""


def make_stage(model, first: int, last: int, quant: Quant | None, options: dict) -> StageProgram:
    """A stage program over layers first..last."""
    return StageProgram(model, first, last, quant)
