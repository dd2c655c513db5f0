"""The project's one weight generator: deterministic float draws per layer.

Every consumer of initial weights reads these draws: the hardware's fixed-point weights
(``codegen.design.context.make_weights``: ``fixedpoint.quantize`` of the draws, batch norm folded
to scale/shift), the host's float training start (``host.program.init_stage_params``, the
draws as float32) and the fixed-point training masters (``host.program.fixed_master_params``:
the draws rounded to the forward format). So hardware weights = quantize(the draws the
host starts from).

The draws of one layer come from ``np.random.default_rng([seed, position])`` (position: the
layer's index in the model), so a layer gets the same weights however the model is
partitioned; the order and the ranges are:

- dense ``w`` (units, fan_in), conv2d ``w`` (out, in / groups, kh, kw): uniform
  +-sqrt(6 / fan_in), variance 2 / fan_in (He et al. 2015, "Delving Deep into Rectifiers",
  eq. 10: the activations' variance holds through ReLU layers; the same variance as the
  He-normal start the host trained from before this generator);
- then ``b`` (layers with a bias): uniform +-0.1, nonzero so a dropped bias add shows;
- batchnorm: ``gamma`` U(0.5, 1.5), ``beta`` U(-0.5, 0.5), ``mean`` U(-0.5, 0.5), ``var``
  U(0.5, 1.5) (inference folds them to scale/shift; training starts its running
  statistics at mean/var); layernorm: ``gamma``, ``beta`` as batchnorm's.

Layers without weights draw nothing (an empty dict).

A model imported from an ONNX file carries its own weights (the file's initializers,
``bapipe.onnx_weights``): :func:`model_draws` and :func:`model_rounded` give those, in the
draws' layout, instead of the generator's, so the hardware, the host and training start from
the function the user exported.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np

from bapipe.layers import Layer

#: half-width of the bias range
BIAS_RANGE = 0.1


def fan_in(layer: Layer) -> int:
    """Inputs summed into one output of a dense or conv2d layer."""
    if layer.type == "dense":
        return layer.in_shapes[0][-1]
    kh, kw = layer.attr["kernel"]
    return layer.in_shapes[0][0] // layer.attr.get("groups", 1) * kh * kw


def norm_channels(layer: Layer) -> int:
    """Channels of a batchnorm (axis 0 of an image, the last axis otherwise) or layernorm."""
    s = layer.in_shapes[0]
    return s[0] if (layer.type == "batchnorm" and len(s) == 3) else s[-1]


def draw(layer: Layer, rng: np.random.Generator, uniform=None) -> dict[str, np.ndarray]:
    """The float64 draws of one layer from ``rng`` (order and ranges: the module's docstring).
    ``uniform(low, high, shape)``: what draws a dense/conv2d layer's arrays (default
    ``rng.uniform``; :func:`rounded_draws` rounds them a chunk at a time)."""
    t, a = layer.type, layer.attr
    if t in ("dense", "conv2d"):
        uniform = uniform or (lambda low, high, shape: rng.uniform(low, high, size=shape))
        n = fan_in(layer)
        lim = math.sqrt(6.0 / n)
        if t == "dense":
            shape = (a["units"], n)
        else:
            shape = (a["out_channels"], layer.in_shapes[0][0] // a.get("groups", 1)) + tuple(a["kernel"])
        out = {"w": uniform(-lim, lim, shape)}
        if a.get("bias", True):
            out["b"] = uniform(-BIAS_RANGE, BIAS_RANGE, (shape[0],))
        return out
    if t in ("batchnorm", "layernorm"):
        ch = norm_channels(layer)
        out = {"gamma": rng.uniform(0.5, 1.5, ch), "beta": rng.uniform(-0.5, 0.5, ch)}
        if t == "batchnorm":
            out["mean"], out["var"] = rng.uniform(-0.5, 0.5, ch), rng.uniform(0.5, 1.5, ch)
        return out
    return {}


def layer_draws(layer: Layer, seed: int, position: int) -> dict[str, np.ndarray]:
    """The draws of the layer at ``position`` of its model under ``seed``."""
    return draw(layer, np.random.default_rng([seed, position]))


#: draws rounded at a time by :func:`rounded_draws` (8 MB of float64; VGG-16's fc6 draws 103 M)
CHUNK = 1 << 20


def rounded_draws(layer: Layer, seed: int, position: int, fmt) -> dict[str, np.ndarray]:
    """A dense or conv2d layer's draws rounded to the fixed-point format ``fmt``: exactly
    ``fixedpoint.quantize`` of :func:`layer_draws`' arrays, but drawn and rounded a chunk at a
    time (a generator's uniform stream is the same however it is split) into the narrowest
    integer type holding the format, so no float64 copy of a big layer is ever held."""
    from bapipe.fpga_models import fixedpoint as fx

    f = fx.get_fmt(fmt)
    dt = next(d for d in (np.int8, np.int16, np.int32, np.int64)
              if np.iinfo(d).min <= f.qmin and f.qmax <= np.iinfo(d).max)
    rng = np.random.default_rng([seed, position])

    def uniform(low: float, high: float, shape: tuple) -> np.ndarray:
        out = np.empty(shape, dtype=dt)
        flat = out.reshape(-1)
        for i in range(0, flat.size, CHUNK):
            x = rng.uniform(low, high, size=min(CHUNK, flat.size - i))
            # fx.quantize in place: floor(x * 2^F + 0.5) (AP_RND), then saturate; every value is
            # then an integer in range, so the cast to the narrow type is exact
            np.multiply(x, float(1 << f.frac), out=x)
            x += 0.5
            np.floor(x, out=x)
            np.clip(x, f.qmin, f.qmax, out=x)
            flat[i:i + x.size] = x
        return out

    return draw(layer, rng, uniform)


def file_weights(model):
    """The weights a model's file carries (``bapipe.onnx_weights.OnnxWeights`` of an ONNX
    import, read once per file version), None for a zoo or YAML model."""
    src = str(getattr(model, "source", "") or "")
    if not src.endswith(".onnx") or not os.path.isfile(src):
        return None
    st = os.stat(src)
    return _read_file_weights(os.path.abspath(src), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=2)
def _read_file_weights(path: str, _mtime_ns: int, _size: int):
    from bapipe.onnx_weights import load_onnx_weights   # onnx only for an ONNX model

    return load_onnx_weights(path)


def _file_layout(layer: Layer, params: dict, state: dict) -> dict[str, np.ndarray]:
    """A file's arrays of ``layer`` (host layout) in the draws' layout and names."""
    f64 = lambda a: np.asarray(a, dtype=np.float64)   # noqa: E731
    t = layer.type
    if t in ("dense", "conv2d"):
        w = f64(params["W"])
        out = {"w": w.T if t == "dense" else w}   # dense W is (in, units) on the host
        if "b" in params:
            out["b"] = f64(params["b"]).reshape(-1)
        return out
    if t == "batchnorm":
        return {"gamma": f64(params["gamma"]), "beta": f64(params["beta"]), "mean": f64(state["running_mean"]),
                "var": f64(state["running_var"]), "eps": float(state.get("eps", 1e-5))}
    if t == "layernorm":
        return {"gamma": f64(params["gamma"]), "beta": f64(params["beta"])}
    return {}


def model_draws(model, position: int, seed: int) -> dict[str, np.ndarray]:
    """Layer ``position`` of ``model``'s float64 weights in the draws' layout: its file's
    (:func:`file_weights`; a batchnorm also gives its ``eps``) or the generator's
    (:func:`layer_draws` under ``seed``)."""
    layer = model.layers[position]
    fw = file_weights(model)
    if fw is None:
        return layer_draws(layer, seed, position)
    if layer.name not in fw.params and layer.type in ("dense", "conv2d", "batchnorm", "layernorm"):
        from bapipe.errors import SpecError

        raise SpecError(str(model.source), None, f"layers.{layer.name}", "expected its weights in the file")
    return _file_layout(layer, fw.params.get(layer.name, {}), fw.state.get(layer.name, {}))


def model_rounded(model, position: int, seed: int, fmt) -> dict[str, np.ndarray]:
    """A dense or conv2d layer's weights rounded to ``fmt`` (:func:`rounded_draws` for the
    generator's; the file's quantized alike, in the same narrow integer type)."""
    from bapipe.fpga_models import fixedpoint as fx

    if file_weights(model) is None:
        return rounded_draws(model.layers[position], seed, position, fmt)
    f = fx.get_fmt(fmt)
    dt = next(d for d in (np.int8, np.int16, np.int32, np.int64)
              if np.iinfo(d).min <= f.qmin and f.qmax <= np.iinfo(d).max)
    return {k: fx.quantize(v, f).astype(dt) for k, v in model_draws(model, position, seed).items()}
