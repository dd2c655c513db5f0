"""One pipeline stage as a program: its layers' forward and backward over named tensors.

A stage runs model layers ``first..last``. It receives every tensor that crosses the cut
before it (the main path and any open skip connection, ``Model.cut_tensors``) and sends
every tensor that crosses the cut after it; a tensor that only passes through is
forwarded, and its gradient flows back the same way. The last stage ends in the loss.
The whole model is the one-stage program ``StageProgram(model, 0, n-1)``: that is the
single-device reference the pipelined gradients are checked against.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bapipe.spec import Model

from . import layers_np as L

Arrays = dict[str, np.ndarray]
Quant = Callable[[np.ndarray], np.ndarray]


def stage_inputs(model: Model, first: int) -> list[str]:
    """Names of the tensors a stage starting at layer ``first`` receives."""
    if first == 0:
        return [i.name for i in model.inputs]
    return [t.producer for t in model.cut_tensors(first - 1)]


def stage_outputs(model: Model, last: int) -> list[str]:
    """Names of the tensors a stage ending at layer ``last`` sends on (the logits for the last stage)."""
    if last == len(model.layers) - 1:
        return [model.layers[-1].name]
    return [t.producer for t in model.cut_tensors(last)]


def init_stage_params(model: Model, first: int, last: int, seed: int) -> tuple[dict[str, Arrays], dict[str, Arrays]]:
    """Initial weights and buffers of layers first..last.

    Each layer draws from its own generator seeded by (seed, position), so a layer starts
    with the same weights however the model is partitioned.
    """
    params, state = {}, {}
    for pos in range(first, last + 1):
        layer = model.layers[pos]
        params[layer.name] = L.init_params(layer, np.random.default_rng([seed, pos]))
        state[layer.name] = L.init_state(layer)
    return params, state


@dataclass
class StageProgram:
    """Forward/backward of a contiguous run of layers over named tensors.

    ``quant`` (fixed-point mode) rounds every weight before use and every layer output
    to the plan's number format; gradients pass straight through the rounding.
    """

    model: Model
    first: int
    last: int
    quant: Quant | None = None
    inputs: list[str] = field(init=False)
    outputs: list[str] = field(init=False)

    def __post_init__(self):
        self.layers = self.model.layers[self.first:self.last + 1]
        self.inputs = stage_inputs(self.model, self.first)
        self.outputs = stage_outputs(self.model, self.last)
        self.is_last = self.last == len(self.model.layers) - 1
        for layer in self.layers:
            if layer.type not in L.SUPPORTED:
                raise L.unsupported(layer)

    def _weights(self, params: dict[str, Arrays]) -> dict[str, Arrays]:
        if self.quant is None:
            return params
        return {k: {n: self.quant(w) for n, w in v.items()} for k, v in params.items()}

    def forward(self, params: dict[str, Arrays], x: Arrays, train: bool, state: dict[str, Arrays]):
        """Outputs (dict by tensor name) and the cache backward needs."""
        env = dict(x)
        w = self._weights(params)
        caches = {}
        for layer in self.layers:
            y, caches[layer.name] = L.forward(layer, w[layer.name], [env[n] for n in layer.inputs],
                                              train, state[layer.name])
            env[layer.name] = self.quant(y) if self.quant is not None else y
        return {n: env[n] for n in self.outputs}, (w, caches, {n: x[n].shape for n in self.inputs})

    def backward(self, cache, grad_out: Arrays) -> tuple[Arrays, dict[str, Arrays]]:
        """Gradients of the stage inputs and of every weight, from the output gradients."""
        w, caches, in_shapes = cache
        genv: Arrays = dict(grad_out)
        grads: dict[str, Arrays] = {}
        for layer in reversed(self.layers):
            dy = genv.pop(layer.name, None)
            if dy is None:  # output read by nobody downstream: no gradient flows
                dy = np.zeros((next(iter(in_shapes.values()))[0],) + layer.out_shape, L.F32)
            dxs, grads[layer.name] = L.backward(layer, w[layer.name], caches[layer.name], dy)
            for name, dx in zip(layer.inputs, dxs):
                genv[name] = genv[name] + dx if name in genv else dx
        dx_in = {n: genv[n] if n in genv else np.zeros(in_shapes[n], L.F32) for n in self.inputs}
        return dx_in, grads


def quantizer(number_format: str) -> Quant:
    """Round-trip through the plan's fixed-point format (fpga_models.fixedpoint)."""
    from .fixed import make_quant

    return make_quant(number_format)
