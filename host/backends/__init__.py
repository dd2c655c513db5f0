"""Stage backends: how one pipeline stage computes its forward and backward.

A backend module exposes ``check(options) -> None`` (raises BackendUnavailable with one
line when its tool or hardware is missing) and ``make_stage(model, first, last, quant,
options)`` returning an object with ``inputs``, ``outputs``, ``is_last``,
``forward(params, x, train, state) -> (outputs, cache)`` and
``backward(cache, grad_out) -> (grad_in, weight_grads)`` (numpy arrays by tensor name).
"""
from __future__ import annotations

import importlib

from bapipe.errors import BapipeError

BACKENDS = ("numpy", "verilator", "xrt")


class BackendUnavailable(BapipeError):
    """A backend cannot run here (tool, build or board missing): one line for the user."""

    exit_code = 2


def get_backend(name: str):
    """The backend module by name."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"bapipe.host.backends.{name}_backend")
