"""Model spec: a validated layer DAG in a fixed topological order, from YAML or the zoo.

The layer list is the order pipelines cut: a cut after position k splits layers[:k+1]
from layers[k+1:]. ``cut_tensors(k)`` lists every tensor crossing that cut: the main path
and every skip connection still open, with its size.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .errors import SpecError
from .layers import LAYER_TYPES, MULTI_INPUT, Layer, Shape, build_layer, prod
from .yamlio import Fields, Node, NodeList, loads


@dataclass(frozen=True)
class ModelInput:
    """A tensor fed from outside (images, token ids)."""

    name: str
    shape: Shape
    dtype: str = "float"  # "float" | "int" (token ids)


@dataclass(frozen=True)
class CutTensor:
    """A tensor that crosses a cut: who produced it and how big it is per sample."""

    producer: str
    shape: Shape

    @property
    def elements(self) -> int:
        """Elements per sample."""
        return prod(self.shape)


@dataclass(frozen=True)
class Model:
    """A DNN as an ordered list of layers (topological order of its DAG)."""

    name: str
    inputs: tuple[ModelInput, ...]
    layers: tuple[Layer, ...]
    source: str = "zoo"
    description: str = ""
    doc: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @cached_property
    def index(self) -> dict[str, int]:
        """Position of each layer by name."""
        return {l.name: i for i, l in enumerate(self.layers)}

    @property
    def params(self) -> int:
        """Trainable parameters (tied weights counted once)."""
        return sum(l.weight_params for l in self.layers)

    @property
    def fwd_macs(self) -> int:
        """Forward MACs per sample."""
        return sum(l.fwd_macs for l in self.layers)

    @property
    def bwd_macs(self) -> int:
        """Backward MACs per sample (input grad + weight grad)."""
        return sum(l.bwd_macs for l in self.layers)

    @cached_property
    def _last_use(self) -> dict[str, int]:
        """For each tensor (layer or model input), the last layer position that reads it."""
        last: dict[str, int] = {}
        for i, l in enumerate(self.layers):
            for src in l.inputs:
                last[src] = i
        return last

    @cached_property
    def _shapes(self) -> dict[str, Shape]:
        d = {i.name: i.shape for i in self.inputs}
        d.update({l.name: l.out_shape for l in self.layers})
        return d

    def cut_tensors(self, k: int) -> list[CutTensor]:
        """Tensors crossing the cut after layer position ``k`` (0 <= k < len(layers)-1).

        A tensor crosses when it was produced at or before ``k`` (or is a model input) and
        some layer after ``k`` reads it: the main path plus every open skip connection.
        """
        if not 0 <= k < len(self.layers) - 1:
            raise IndexError(f"cut {k} outside 0..{len(self.layers) - 2}")
        out = []
        for inp in self.inputs:
            if self._last_use.get(inp.name, -1) > k:
                out.append(CutTensor(inp.name, inp.shape))
        for l in self.layers[: k + 1]:
            if self._last_use.get(l.name, -1) > k:
                out.append(CutTensor(l.name, l.out_shape))
        return out

    def cut_elements(self, k: int) -> int:
        """Elements per sample crossing the cut after position ``k``."""
        return sum(t.elements for t in self.cut_tensors(k))

    @cached_property
    def cut_elements_all(self) -> tuple[int, ...]:
        """``cut_elements(k)`` for every cut, computed in one sweep (O(n + edges))."""
        n = len(self.layers)
        delta = [0] * (n + 1)  # difference array over cut positions
        for inp in self.inputs:
            last = self._last_use.get(inp.name, -1)
            if last > 0:
                delta[0] += prod(inp.shape)
                delta[last] -= prod(inp.shape)
        for i, l in enumerate(self.layers):
            last = self._last_use.get(l.name, -1)
            if last > i:
                delta[i] += l.out_elems
                delta[last] -= l.out_elems
        out, run = [], 0
        for k in range(n - 1):
            run += delta[k]
            out.append(run)
        return tuple(out)

    @property
    def output_shape(self) -> Shape:
        """Shape of the model's output (the last layer's)."""
        return self.layers[-1].out_shape

    def fingerprint(self) -> str:
        """sha256 of the model's layers and shapes (stable across runs)."""
        blob = json.dumps([[i.name, list(i.shape), i.dtype] for i in self.inputs] +
                          [l.to_dict() for l in self.layers], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_doc(self) -> dict:
        """The YAML form (what ``parse_model`` reads)."""
        return self.doc

    def summary(self) -> dict:
        """Name, totals and layer count."""
        return {"name": self.name, "params": self.params, "fwd_macs": self.fwd_macs,
                "bwd_macs": self.bwd_macs, "layers": len(self.layers)}


def to_node(obj: Any, file: str = "<zoo>", path: str = "") -> Any:
    """Wrap plain dicts/lists as Node/NodeList so zoo models go through the same validation."""
    if isinstance(obj, dict):
        n = Node()
        n.file, n.path = file, path
        for k, v in obj.items():
            n[str(k)] = to_node(v, file, f"{path}.{k}" if path else str(k))
        return n
    if isinstance(obj, (list, tuple)):
        lst = NodeList(to_node(v, file, f"{path}[{i}]") for i, v in enumerate(obj))
        lst.file, lst.path = file, path
        return lst
    return obj


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def parse_model(doc: Any, file: str = "<input>", source: str | None = None) -> Model:
    """Validate a model document (mapping) and derive every layer's shapes and counts."""
    if not isinstance(doc, Node):
        doc = to_node(doc, file) if isinstance(doc, (dict, list)) else doc
    if not isinstance(doc, Node):
        raise SpecError(file, None, None, f"expected a mapping with 'name', 'inputs' and 'layers', got {type(doc).__name__ if doc is not None else 'an empty document'}")
    f = Fields(doc, "model")
    name = f.str("name")
    desc = f.str("description", "")
    inputs: list[ModelInput] = []
    if f.has("input") and f.has("inputs"):
        raise f.err("inputs", "give either 'input' (one shape) or 'inputs' (a list), not both")
    if "input" in doc:
        inputs.append(ModelInput("input", f.ints("input")))
    else:
        for i, item in enumerate(f.list("inputs")):
            if not isinstance(item, Node):
                raise SpecError(file, doc.line_of("inputs"), f"inputs[{i}]", "expected a mapping {name, shape, dtype}")
            fi = Fields(item)
            nm = fi.str("name")
            if any(x.name == nm for x in inputs):
                raise fi.err("name", f"duplicate input name '{nm}'")
            inputs.append(ModelInput(nm, fi.ints("shape"), fi.str("dtype", "float", choices=("float", "int"))))
            fi.done()
    layers_node = f.list("layers")
    f.done()

    shapes: dict[str, Shape] = {i.name: i.shape for i in inputs}
    layers: list[Layer] = []
    prev = inputs[0].name
    for i, ln in enumerate(layers_node):
        if not isinstance(ln, Node):
            line = layers_node.lines[i] if i < len(layers_node.lines) else layers_node.line
            raise SpecError(file, line, f"layers[{i}]", "expected a mapping with 'name' and 'type'")
        lf = Fields(ln)
        lname = lf.str("name")
        if lname in shapes:
            raise lf.err("name", f"duplicate name '{lname}' (layer and input names must be unique)")
        ltype = lf.str("type")
        if ltype not in LAYER_TYPES:
            raise lf.err("type", f"unknown layer type '{ltype}'; expected one of {', '.join(sorted(LAYER_TYPES))}")
        if lf.has("inputs"):
            raw = lf.raw("inputs")
            if isinstance(raw, str):
                raw = [raw]
            if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
                raise lf.err("inputs", "expected a list of earlier layer or input names")
            srcs = tuple(raw)
        else:
            srcs = (prev,)
        for s in srcs:
            if s not in shapes:
                raise lf.err("inputs", f"'{s}' is not an earlier layer or a model input (layers must be in topological order)")
        if len(srcs) > 1 and ltype not in MULTI_INPUT:
            raise lf.err("inputs", f"a {ltype} layer takes one input, got {len(srcs)}")
        if ltype == "embedding":   # a lookup by token id: a float input would be rounded to a row silently
            floats = [i.name for i in inputs if i.name in srcs and i.dtype != "int"]
            if floats:
                raise lf.err("inputs", f"an embedding reads token ids: model input '{floats[0]}' has dtype float "
                                       "(declare it with dtype: int)")
        tied = lf.str("tied_to", None) if lf.has("tied_to") else None
        if tied is not None and tied not in {l.name for l in layers}:
            raise lf.err("tied_to", f"'{tied}' is not an earlier layer")
        layer = build_layer(lf, lname, srcs, [shapes[s] for s in srcs], ltype, tied)
        if tied is not None:
            ref = next(l for l in layers if l.name == tied)
            if ref.params < layer.params - (layer.out_shape[-1] if layer.attr.get("bias") else 0) or ref.params == 0:
                raise lf.err("tied_to", f"'{tied}' has too few weights ({ref.params}) to share with this layer")
        shapes[lname] = layer.out_shape
        layers.append(layer)
        prev = lname

    used = {s for l in layers for s in l.inputs}
    for inp in inputs:
        if inp.name not in used:
            raise SpecError(file, doc.line_of("inputs") or doc.line_of("input"), "inputs",
                            f"model input '{inp.name}' is never read by a layer")
    for i, l in enumerate(layers[:-1]):
        if l.name not in used:
            ln = layers_node[i]
            raise ln.error("name", f"the output of layer '{l.name}' is never used (only the last layer may be the model output)")
    return Model(name=name, inputs=tuple(inputs), layers=tuple(layers), source=source or file,
                 description=desc, doc=_plain(doc))


def model_from_text(text: str, file: str = "<input>") -> Model:
    """Parse model YAML text (tests and fuzzing)."""
    return parse_model(loads(text, file), file)
