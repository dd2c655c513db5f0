"""The numpy backend: each stage runs its layers' real forward and backward in numpy."""
from __future__ import annotations

from ..program import FixedStageProgram, Quant, StageProgram


def check(options: dict) -> None:
    """Numpy is always available."""


def make_stage(model, first: int, last: int, quant: Quant | None, options: dict):
    """A stage program over layers first..last: integer fixed-point training for a
    :class:`host.fixed.FixedTraining` ``quant`` (fixed16), float32 otherwise."""
    from ..fixed import FixedTraining

    if isinstance(quant, FixedTraining):
        return FixedStageProgram(model, first, last, quant.tf)
    return StageProgram(model, first, last, quant)
