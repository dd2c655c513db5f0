"""Constant folding of an ONNX graph before shape inference (numpy, via onnx's reference ops).

Exporters leave shape arithmetic in the graph (Shape -> Gather -> Concat -> Expand,
ConstantOfShape, Range -> Where masks, Slice of buffers, Transpose of a tied weight).
With the batch fixed to 1 every such chain is computable, and once it is replaced by its
value, shape inference gives concrete shapes everywhere and the importer sees constants
instead of plumbing. Each folded tensor remembers the initializers it came from
(``origin``), so a Transpose of the embedding table still counts as that table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: ops never evaluated (random values, or ops whose value is not a function of the inputs)
_NO_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                      "Bernoulli", "If", "Loop", "Scan", "SequenceConstruct"})
#: largest tensor worth materialising (elements): bigger ones stay nodes, marked constant later
_MAX_ELEMS = 1 << 24


@dataclass
class Folded:
    """The folded model and what the folding learned."""

    model: object                                   # onnx.ModelProto, folded, batch 1, shapes inferred
    origin: dict[str, frozenset[str]] = field(default_factory=dict)   # tensor -> source initializers
    originals: frozenset[str] = frozenset()         # initializer names of the file (before folding)
    params: frozenset[str] | None = None            # dynamo's PARAMETER targets, when recorded


def _static_dims(vi) -> tuple[int, ...] | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    out = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        out.append(d.dim_value)
    return tuple(out)


def _signature_params(model) -> frozenset[str] | None:
    """PARAMETER targets from the dynamo exporter's graph signature metadata (None if absent)."""
    for p in list(model.metadata_props) + list(getattr(model.graph, "metadata_props", [])):
        if p.key == "pkg.torch.export.ExportedProgram.graph_signature":
            names = set()
            for line in p.value.splitlines():
                if ": PARAMETER target=" in line:
                    names.add(line.split("target=", 1)[1].strip().strip("'\""))
            return frozenset(names)
    return None


def _evaluate(node, values: list, opset: int) -> list | None:
    """Run one node on numpy inputs with onnx's reference implementation (None if it cannot)."""
    from onnx.reference import ReferenceEvaluator

    try:
        ev = ReferenceEvaluator(node, opsets={"": opset})
        names = [i for i in node.input if i]
        return ev.run(None, dict(zip(names, values)))
    except Exception:  # noqa: BLE001 - an op the reference cannot run stays a node
        return None


def light_copy(model, limit: int = 4096):
    """A copy of ``model`` for shape inference: initializers over ``limit`` elements become
    typed graph inputs (inference needs their dims, not their bytes; a 500 MB VGG would
    otherwise be serialised for the C++ inference more than once)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    g = model.graph
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    g2 = m.graph
    g2.name = g.name
    for part in ("node", "input", "output", "value_info"):
        getattr(g2, part).extend(getattr(g, part))
    saved = g.initializer
    listed = {i.name for i in m.graph.input}
    for t in saved:
        n = 1
        for d in t.dims:
            n *= d
        if n <= limit:
            m.graph.initializer.append(t)
        elif t.name not in listed:
            m.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def fold_constants(m, infer) -> Folded:
    """Evaluate every node of ``m`` whose inputs are known constants, in graph order, and
    replace it by its value (``m`` is changed in place); ``infer(m, strict)`` runs shape
    inference (the caller's, with its error handling)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = m
    g = m.graph
    originals = frozenset(t.name for t in g.initializer)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 20)
    origin: dict[str, frozenset[str]] = {t.name: frozenset({t.name}) for t in g.initializer}
    known: dict[str, object] = {}          # values computed here
    stored = {t.name: t for t in g.initializer
              if t.data_location != onnx.TensorProto.EXTERNAL and not any(e.key == "location" for e in t.external_data)}

    def value(name):   # an initializer's array only when a node to fold reads it (weights stay bytes)
        if name not in known:
            known[name] = numpy_helper.to_array(stored[name])
        return known[name]

    shaped = infer(light_copy(m), strict=False)
    dims = {}
    for vi in list(shaped.graph.input) + list(shaped.graph.value_info) + list(shaped.graph.output):
        d = _static_dims(vi)
        if d is not None:
            dims[vi.name] = d
    keep, added = [], []
    copies: set[str] = set()
    folded_any = False
    for n in g.node:
        ins = [i for i in n.input if i]
        vals = None
        if n.domain not in ("", "ai.onnx") or n.op_type in _NO_FOLD or any(a.g.ByteSize() for a in n.attribute):
            vals = None
        elif n.op_type in ("Shape", "Size") and ins and ins[0] in dims:
            d = dims[ins[0]]
            if n.op_type == "Size":
                vals = [np.array(int(np.prod(d)), dtype=np.int64)]
            else:
                start = next((a.i for a in n.attribute if a.name == "start"), 0)
                end = next((a.i for a in n.attribute if a.name == "end"), None)
                vals = [np.array(d[start:end], dtype=np.int64)]
        elif n.op_type == "Constant" or (ins and all(i in known or i in stored for i in ins)):
            vals = _evaluate(n, [value(i) for i in ins], opset)
        if vals is None or any(getattr(v, "size", 0) > _MAX_ELEMS for v in vals):
            keep.append(n)
            continue
        folded_any = True
        if n.op_type in ("Shape", "Size"):
            src = frozenset()
        elif n.op_type == "Identity" and ins[0] in originals:
            # the legacy exporter's de-duplication of equal-valued tensors: a copy, not a shared weight
            src = frozenset(o for o in n.output if o)
            copies.update(src)
        else:
            src = frozenset().union(*(origin.get(i, frozenset()) for i in ins))
        for o, v in zip(n.output, vals):
            if o:
                known[o] = np.asarray(v)
                origin[o] = src
                added.append(o)
    if not folded_any:
        return Folded(m, origin, originals, _signature_params(model))
    originals = originals | copies
    read = {i for n in keep for i in n.input} | {o.name for o in g.output}
    del g.node[:]
    g.node.extend(keep)
    have = {t.name for t in g.initializer}
    for o in added:
        if o in read and o not in have:
            g.initializer.append(numpy_helper.from_array(np.asarray(known[o]), o))
    # graph outputs that became constants stay listed; value_info is re-derived by the caller
    del g.value_info[:]
    return Folded(m, origin, originals, _signature_params(model))
