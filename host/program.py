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
from bapipe.fpga_models.weights import file_weights, model_draws

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
    """Initial weights and buffers of layers first..last: the project's one generator's
    draws (``fpga_models.weights.layer_draws``, seeded by (seed, position), so a layer
    starts with the same weights however the model is partitioned) as float32; batch-norm
    running statistics start at the drawn mean and variance (what the hardware folds in)."""
    params, state = {}, {}
    for pos in range(first, last + 1):
        layer = model.layers[pos]
        params[layer.name] = initial_params(model, pos, seed)
        state[layer.name] = L.init_state(layer, model_draws(model, pos, seed) if layer.type == "batchnorm" else None)
    return params, state


def initial_params(model: Model, pos: int, seed: int) -> Arrays:
    """Layer ``pos``'s initial float32 weights in host.layers_np's layout: an ONNX model's own
    (its file's, ``fpga_models.weights.file_weights``), else the one generator's draws."""
    layer = model.layers[pos]
    fw = file_weights(model)
    if fw is None or layer.type not in ("dense", "conv2d", "batchnorm", "layernorm"):
        return L.init_params(layer, np.random.default_rng([seed, pos]))
    return {k: np.asarray(v, dtype=L.F32) for k, v in fw.params[layer.name].items()}


def bind_span(prog, supported, refusal) -> None:
    """Set a stage program's ``layers``, ``inputs``, ``outputs`` and ``is_last`` from its
    model and first..last; raise ``refusal(layer)`` for a layer type not in ``supported``."""
    prog.layers = prog.model.layers[prog.first:prog.last + 1]
    prog.inputs = stage_inputs(prog.model, prog.first)
    prog.outputs = stage_outputs(prog.model, prog.last)
    prog.is_last = prog.last == len(prog.model.layers) - 1
    for layer in prog.layers:
        if layer.type not in supported:
            raise refusal(layer)


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
        bind_span(self, L.SUPPORTED, L.unsupported)

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


def fixed_master_params(model: Model, first: int, last: int, seed: int, tf) -> dict[str, Arrays]:
    """Initial master weights (raw, ``tf.master``) of layers first..last for fixed-point training.

    The one generator's float64 draws (``fpga_models.weights.layer_draws``, the ones
    :func:`init_stage_params` starts from), rounded to the forward format and widened exactly
    (``train_fixed.initial_master``), in the hardware's layout and names: dense ``w`` (units,
    in) and ``b``; conv2d ``w`` (O, C, kh, kw) and ``b``; batchnorm ``scale`` (gamma) and
    ``shift`` (beta).
    """
    from bapipe.fpga_models import train_fixed as T

    out = {}
    for pos in range(first, last + 1):
        layer = model.layers[pos]
        d = model_draws(model, pos, seed)
        d.pop("eps", None)   # a constant of the layer, not a weight
        if layer.type == "batchnorm":
            d = {"scale": d["gamma"], "shift": d["beta"]}
        elif layer.type == "layernorm":
            d = {"gamma": d["gamma"], "beta": d["beta"]}
        out[layer.name] = {n: T.initial_master(a, tf) for n, a in d.items()}
    return out


@dataclass
class FixedStageProgram:
    """A stage in the plan's fixed-point training arithmetic (fpga_models.train_fixed, docs/training.md).

    Parameters are raw master weights (int64 arrays, ``tf.master``), activations raw ``tf.act``
    values, gradients raw ``tf.grad`` values, and the weight gradients returned by backward the
    exact integer sums the hardware accumulates; float inputs (the first stage's samples) are
    rounded to ``tf.act`` on entry.
    """

    model: Model
    first: int
    last: int
    tf: object
    inputs: list[str] = field(init=False)
    outputs: list[str] = field(init=False)

    def __post_init__(self):
        from bapipe.errors import SpecError
        from bapipe.fpga_models import train_fixed as T

        bind_span(self, T.SUPPORTED, lambda layer: SpecError(
            None, None, f"layers.{layer.name}.type", f"fixed-point training supports {', '.join(T.SUPPORTED)}; "
                                                     f"'{layer.type}' is not supported (use --precision float32)"))

    def init_params(self, seed: int) -> tuple[dict[str, Arrays], dict[str, Arrays]]:
        """Master weights of this stage's layers and (empty) buffers."""
        return (fixed_master_params(self.model, self.first, self.last, seed, self.tf),
                {l.name: {} for l in self.layers})

    def _raw(self, a: np.ndarray) -> np.ndarray:
        from bapipe.fpga_models import train_fixed as T

        return np.asarray(a, np.int64) if np.issubdtype(np.asarray(a).dtype, np.integer) else \
            T.quantize(a, self.tf.act)

    def forward(self, params: dict[str, Arrays], x: Arrays, train: bool, state: dict[str, Arrays]):
        """Raw outputs by tensor name and the cache backward needs (every forward tensor)."""
        from bapipe.fpga_models import train_fixed as T

        wq = T.forward_weights({l.name: params.get(l.name, {}) for l in self.layers}, self.tf)
        acts = T.layers_fwd(self.layers, {n: self._raw(x[n]) for n in self.inputs}, wq, self.tf)
        return {n: acts[n] for n in self.outputs}, (wq, acts)

    def backward(self, cache, grad_out: Arrays) -> tuple[Arrays, dict[str, Arrays]]:
        """Raw gradients of the stage inputs and the exact weight-gradient sums of this micro-batch."""
        from bapipe.fpga_models import train_fixed as T

        wq, acts = cache
        g, wgrads = T.layers_bwd(self.layers, acts, {n: np.asarray(d, np.int64) for n, d in grad_out.items()},
                                 wq, self.tf)
        dx_in = {n: g[n] if n in g else np.zeros(acts[n].shape, np.int64) for n in self.inputs}
        return dx_in, wgrads


def quantizer(number_format: str) -> Quant:
    """Round-trip through the plan's fixed-point format (fpga_models.fixedpoint)."""
    from .fixed import make_quant

    return make_quant(number_format)
