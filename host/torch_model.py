"""A plan's model in PyTorch: one nn.Module per layer, one per stage (a run of layers).

Weights start from the project's one generator, exactly as the numpy backend's
(``host.layers_np.init_params`` with ``numpy.random.default_rng([seed, position])``), so a
torch run and a numpy run of the same plan and seed begin from the same numbers.
Semantics follow ``host/layers_np.py``: dense acts on the last axis; pooling pads with
-inf (max) or zeros that count in the mean (avg); batch norm normalises with the batch's
statistics in training (eps 1e-5, running statistics with momentum 0.1 and the unbiased
variance, as PyTorch does) over every axis but the channels (axis 1 of an image, else the
last); gelu is the tanh form unless the layer says ``approximate: none``; pools keep ceil_mode.

A stage module takes the tensors crossing the cut before it (``Model.cut_tensors``: the
main path and every open skip connection, in that order) and returns those crossing the
cut after it (pass-through tensors included), or the model's output on the last stage.

torch is an optional extra; this module imports it at load time, so only the torch
backend (``host/torch_run.py``) imports it, after ``require_torch``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bapipe.errors import SpecError

from . import layers_np as L
from .program import initial_params

#: layer types the torch backend builds
TORCH_LAYERS = ("dense", "conv2d", "maxpool", "avgpool", "globalavgpool", "relu", "tanh", "sigmoid", "gelu",
                "silu", "softmax", "batchnorm", "layernorm", "flatten", "reshape", "add", "concat", "dropout")


class LayerModule(nn.Module):
    """One layer of a bapipe Model; ``forward(*inputs)`` over a leading batch axis."""

    def __init__(self, model, seed: int, position: int):
        super().__init__()
        layer = model.layers[position]
        self.layer, self.kind, a = layer, layer.type, layer.attr
        if self.kind not in TORCH_LAYERS:
            raise SpecError(None, None, f"layers.{layer.name}.type",
                            f"the torch backend builds {', '.join(TORCH_LAYERS)}; '{self.kind}' is not one of them")
        if self.kind == "dropout" and a.get("rate", 0.0) > 0:
            raise SpecError(None, None, f"layers.{layer.name}.rate",
                            "the torch backend runs dropout only at rate 0 (each process would draw its own "
                            "masks, so no single-process run could match it)")
        p = initial_params(model, position, seed) if self.kind in ("dense", "conv2d", "batchnorm", "layernorm") else {}
        for k, v in p.items():
            v = v.T if (self.kind == "dense" and k == "W") else v  # nn.Linear's (out, in)
            # a copy: an ONNX model's weights are read-only views of its file (torch would warn)
            self.register_parameter(k, nn.Parameter(torch.from_numpy(np.array(v, dtype=np.float32, order="C"))))
        if self.kind == "batchnorm":
            ch = int(p["gamma"].shape[0])
            self.register_buffer("running_mean", torch.zeros(ch))
            self.register_buffer("running_var", torch.ones(ch))

    def forward(self, *xs):
        """The layer on a batch (inputs in the layer's input order)."""
        k, a, x = self.kind, self.layer.attr, xs[0]
        if k == "dense":
            return F.linear(x, self.W, getattr(self, "b", None))
        if k == "conv2d":
            return F.conv2d(x, self.W, getattr(self, "b", None), tuple(a["stride"]), tuple(a["padding"]),
                            1, a["groups"])
        if k == "maxpool":
            return F.max_pool2d(x, tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"]),
                                ceil_mode=bool(a.get("ceil_mode")))
        if k == "avgpool":
            return F.avg_pool2d(x, tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"]),
                                ceil_mode=bool(a.get("ceil_mode")), count_include_pad=True)
        if k == "globalavgpool":
            return x.mean(dim=(2, 3))
        if k == "batchnorm":
            return self._batchnorm(x)
        if k == "layernorm":
            return F.layer_norm(x, x.shape[-1:], self.gamma, self.beta, L.LN_EPS)
        if k in ("flatten", "reshape"):
            if "perm" in a:   # an imported Transpose: view as pre, permute, read as shape
                x = x.reshape((x.shape[0],) + tuple(a["pre"])).permute(0, *(p + 1 for p in a["perm"]))
            return x.reshape((x.shape[0],) + tuple(self.layer.out_shape))
        if k == "add":
            out = xs[0]
            for y in xs[1:]:
                out = out + y
            return out
        if k == "concat":
            return torch.cat(xs, dim=a["axis"] + 1)
        if k == "gelu":
            return F.gelu(x, approximate=a.get("approximate", "tanh"))
        if k == "softmax":
            return torch.softmax(x, dim=-1)
        if k == "dropout":
            return x
        if k == "relu" and a.get("negative_slope"):
            return F.leaky_relu(x, a["negative_slope"])
        if k == "sigmoid" and "alpha" in a:
            return torch.clamp(a["alpha"] * x + a["beta"], 0.0, 1.0)
        if k == "silu" and a.get("hard"):
            return F.hardswish(x)
        return {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu}[k](x)

    def _batchnorm(self, x):
        if x.dim() == 4:
            return F.batch_norm(x, self.running_mean, self.running_var, self.gamma, self.beta, self.training,
                                L.BN_MOMENTUM, L.BN_EPS)
        flat = x.reshape(-1, x.shape[-1])  # channels last: statistics over every other axis
        y = F.batch_norm(flat, self.running_mean, self.running_var, self.gamma, self.beta, self.training,
                         L.BN_MOMENTUM, L.BN_EPS)
        return y.reshape(x.shape)


def stage_io(model, first: int, last: int) -> tuple[list[str], list[str]]:
    """(names entering, names leaving) a stage of layers first..last (inclusive)."""
    ins = [i.name for i in model.inputs] if first == 0 else [t.producer for t in model.cut_tensors(first - 1)]
    outs = [model.layers[-1].name] if last == len(model.layers) - 1 else [t.producer
                                                                         for t in model.cut_tensors(last)]
    return ins, outs


class StageModule(nn.Module):
    """Layers first..last of a model: the tensors of the cut before in, of the cut after out."""

    def __init__(self, model, first: int, last: int, seed: int):
        super().__init__()
        self.ins, self.outs = stage_io(model, first, last)
        self.order = [model.layers[i] for i in range(first, last + 1)]
        # ModuleDict keys may not contain dots: index by position
        self.mods = nn.ModuleList([LayerModule(model, seed, i) for i in range(first, last + 1)])

    def forward(self, *xs):
        """Run the stage; one tensor, or a tuple when several cross the next cut."""
        env = dict(zip(self.ins, xs))
        for layer, mod in zip(self.order, self.mods):
            env[layer.name] = mod(*[env[i] for i in layer.inputs])
        out = tuple(env[o] for o in self.outs)
        return out[0] if len(out) == 1 else out


def whole_model(model, seed: int) -> StageModule:
    """The whole model as one module (the single-process reference)."""
    return StageModule(model, 0, len(model.layers) - 1, seed)
