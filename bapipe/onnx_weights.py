"""The weights of an imported ONNX model, in the layers' own layout.

``load_onnx_weights(path)`` imports the file (``onnx_import``) with its initializers loaded
(external data too) and reads, for every layer, the tensors the importer recorded as that
layer's weights (``_Importer.wsrc``): conv and dense weights and biases, batch-norm scale,
shift and running statistics, layer-norm gamma and beta, embedding tables with the position
and token-type rows the graph adds, learned tensors (ViT's class token and positions) and
LSTM matrices. The layout is the float host's (``host.layers_np``): dense ``W`` is
(in, units), conv ``W`` (out, in/groups, kh, kw), norms ``gamma``/``beta``; non-trained
buffers (running statistics, epsilons, LSTM initial states) go to ``state``.

``notes`` says, one line each, where the layer list does not compute the file's function
(a causal or input mask the layers do not apply, an op imported as the activation it
approximates, an opaque layer, ...). ``host.infer_np.forward_model`` refuses to run a model
with notes: its output would not be the file's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import SpecError
from .spec import Model

#: weights that are trained (the rest of a layer's arrays are state)
TRAINED = {"conv2d": ("W", "b"), "dense": ("W", "b"), "batchnorm": ("gamma", "beta"),
           "layernorm": ("gamma", "beta"), "embedding": ("table", "positions", "token_types"), "add_param": ("p",),
           "concat_param": ("p",), "lstm": ("W", "R", "B")}


@dataclass
class OnnxWeights:
    """An imported model with its weights from the file."""

    model: Model
    params: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    state: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def weight_count(self) -> int:
        """Elements of the trained arrays read from the file (tied layers once)."""
        return sum(a.size for l in self.model.layers if not l.tied_to
                   for k, a in self.params.get(l.name, {}).items() if k in TRAINED.get(l.type, ()))


def load_onnx_weights(path: str, opaque=None) -> OnnxWeights:
    """Import ``path`` and read every layer's weights from its initializers."""
    import onnx

    from .onnx_import import import_with_sources, load_onnx

    load_onnx(path, opaque)    # the same checks and one-line refusals as any import
    proto = onnx.load(str(path), load_external_data=True)
    model, imp = import_with_sources(proto, str(path), opaque)
    out = OnnxWeights(model)
    names = {l.name for l in model.layers}
    out.notes = [f"layer '{k}': {v}" if k in names else v for k, v in imp.notes.items()
                 if k in names or k == "graph output"]
    for layer in model.layers:
        src = imp.wsrc.get(layer.name, {})
        arrays = {k: _resolve(imp, path, layer.name, k, r) for k, r in src.items() if k != "adds"}
        if "adds" in src:   # what the graph adds to an embedding's lookup, summed per position
            arrays["extra"] = sum(_resolve(imp, path, layer.name, "adds", r).reshape(-1, layer.out_shape[-1])
                                  for r in src["adds"])
        p, s = _layout(layer, arrays, path)
        out.params[layer.name], out.state[layer.name] = p, s
    return out


def _resolve(imp, path: str, layer: str, key: str, recipe: tuple) -> np.ndarray:
    """One recorded weight as a float32 array."""
    kind = recipe[0]
    if kind == "zeros":
        return np.zeros(recipe[1], np.float32)
    if kind == "ones":
        return np.ones(recipe[1], np.float32)
    if kind == "value":
        return np.float32(recipe[1])
    if kind == "cat":   # several tensors on one axis ("rows": each as a (rows, dim) table)
        how = recipe[2]
        parts = [_resolve(imp, path, layer, key, ("t", t, "rows" if how == "rows" else None)) for t in recipe[1]]
        return np.concatenate(parts, axis=0 if how == "rows" else how)
    _, t, how = recipe
    v = imp.value_any(t)
    if v is None:
        raise SpecError(path, None, f"layers.{layer}.{key}",
                        f"tensor '{t}' has no value in the file (computed by a node too large to fold, "
                        "or external data that is missing)")
    v = np.asarray(v, dtype=np.float32)
    if how == "T":
        v = v.T
    elif how == "flat":
        v = v.reshape(-1)
    elif how == "neg":
        v = -v
    elif how == "rows":   # a table stored with leading unit axes ([1, rows, dim])
        v = v.reshape(-1, v.shape[-1])
    elif how == "scalar":
        v = np.float32(v.reshape(-1)[0])
    return v


def _layout(layer, a: dict[str, np.ndarray], path: str) -> tuple[dict, dict]:
    """Split into trained params and state, shaped as host.layers_np reads them."""
    t = layer.type
    trained = TRAINED.get(t, ())
    params = {k: v for k, v in a.items() if k in trained}
    state = {k: v for k, v in a.items() if k not in trained}
    if t == "add_param":
        params["p"] = params["p"].reshape(layer.attr["param_shape"])
    if t == "concat_param":   # (size, rest of a sample): the batch axis (1) of the file's tensor dropped
        params["p"] = params["p"].reshape((layer.attr["size"],) + tuple(layer.out_shape[1:]))
    optional = {"b"} if not layer.attr.get("bias", True) else set()
    optional |= {"positions", "token_types"} if t == "embedding" else set()
    missing = [k for k in trained if k not in params and k not in optional]
    if missing and t in TRAINED:
        raise SpecError(path, None, f"layers.{layer.name}", f"no tensor in the file for its {', '.join(missing)}")
    return params, state
