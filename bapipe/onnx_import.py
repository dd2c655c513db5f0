"""Read an ONNX graph into a Model: op mapping, views, constants and the layer order.

The importer reads initializer dims (and, where a value decides something, in-file
values), folds constant subgraphs with numpy (``onnx_fold``), runs ONNX shape inference
with batch 1 and writes the same model document ``parse_model`` reads, so validation and
per-layer counts are shared with YAML and zoo models.

Mapping (docs/onnx.md has the full table, with the PyTorch exporters' patterns):
- Conv -> conv2d (+ batchnorm when the exporter folded one in); Gemm / MatMul with a
  constant weight -> dense (a following Add of a constant vector becomes its bias);
  MatMul of two activations -> matmul;
- Relu/Gelu/Tanh/Sigmoid/Softmax/Clip, MaxPool/AveragePool (ceil_mode via padding),
  GlobalAveragePool and ReduceMean over H, W, BatchNormalization, LayerNormalization,
  Add/Sum, Mul of activations, Concat, Split/Slice, LSTM (Y and Y_h) -> layers;
  Gather of a constant table -> embedding; Gather of constant indices -> take or slice;
  erf/tanh GELU and SiLU patterns -> one activation layer;
- Reshape/Transpose/Squeeze/Unsqueeze/Identity/Dropout/Cast/Flatten are views: they make
  no layer; a ``reshape`` layer (or ``flatten`` when the target is a vector) is inserted
  only where a consumer reads a view whose shape differs from its producer's;
- an Add/Sub/Mul/Div of an activation and a constant is a bias, a learned tensor
  (positions, counted) or a folded scale/mask; masks (comparisons, Where, integer
  plumbing on inputs) make no layer;
- nodes tagged ``bapipe:{json}`` in their doc_string (written by onnx_export) are
  regrouped into one layer of the tagged type;
- any op type given with ``--opaque OP=fwd_s,bwd_s`` becomes an ``opaque`` layer; any
  other op without a mapping is a one-line SpecError naming the node.
"""
from __future__ import annotations

import heapq
import json

import numpy as np
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecError
from .layers import Layer, build_layer, prod
from .spec import Model, parse_model, to_node
from .yamlio import Fields

TAG = "bapipe:"
VIEW_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Cast", "Flatten"})
ELEMENTWISE = {"Relu": "relu", "Gelu": "gelu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softmax": "softmax",
               # piecewise-linear relatives, costed like the activation they approximate (MobileNetV3, GANs)
               "LeakyRelu": "relu", "HardSigmoid": "sigmoid", "HardSwish": "silu"}
SCALE_OPS = frozenset({"Add", "Sub", "Mul", "Div"})
#: ops whose result is a boolean mask of their inputs: no layer, Where reads them
BOOL_OPS = frozenset({"IsNaN", "IsInf", "Not", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                      "And", "Or", "Xor"})
INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})  # TensorProto uint8..int64, uint32, uint64


@dataclass(frozen=True)
class _Ref:
    """An activation tensor: the layer (or model input) it comes from and its per-sample shape."""

    src: str
    shape: tuple[int, ...]
    batch: int = 0                # axis of the batch dimension in the full ONNX tensor
    view: str | None = None       # name of the last view node that gave it this shape
    full: tuple[int, ...] = ()    # the full ONNX shape (with batch)
    # element order: None keeps the producer's; (pre, perm) reads the producer's elements as the
    # shape ``pre`` with its axes permuted by ``perm`` (Transposes on the way); UNKNOWN: no such pair
    order: tuple | str | None = None
    mult: float = 1.0             # a constant factor folded on the way (attention's 1/sqrt(d))
    pending: tuple[str, ...] = ()  # folded nodes whose effect on the values no layer carries


UNKNOWN = "unknown"


def _refine(a: tuple, b: tuple) -> tuple[list[int], list[list[int]], list[list[int]]] | None:
    """The common refinement of two shapes of the same elements: axes R such that each axis of
    ``a`` and of ``b`` is a run of consecutive R axes (unit axes get no R axis), with the runs;
    None when the shapes cut the elements at incompatible places."""
    def bounds(shape):
        out, p = [], 1
        for d in shape:
            p *= d
            out.append(p)
        return out
    ba, bb = bounds(a), bounds(b)
    cuts = sorted(set(ba) | set(bb) | {1})
    if any(y % x for x, y in zip(cuts, cuts[1:])):
        return None
    sizes = [y // x for x, y in zip(cuts, cuts[1:])]

    def runs(shape, bs):
        out, prev = [], 1
        for d, p in zip(shape, bs):
            out.append(list(range(cuts.index(prev), cuts.index(p))) if d != 1 else [])
            prev = p
        return out
    return sizes, runs(a, ba), runs(b, bb)


def _canon(pre: tuple, perm: tuple) -> tuple[tuple, tuple]:
    """(pre, perm) without unit axes and with axes that stay neighbours merged: one form per order."""
    keep = [i for i, d in enumerate(pre) if d != 1]
    perm = [keep.index(p) for p in perm if p in keep]
    pre = [pre[i] for i in keep]
    groups: list[list[int]] = []
    for p in perm:
        if groups and groups[-1][-1] + 1 == p:
            groups[-1].append(p)
        else:
            groups.append([p])
    starts = sorted(g[0] for g in groups)
    new_pre = [prod([pre[i] for i in next(g for g in groups if g[0] == s0)]) for s0 in starts]
    return tuple(new_pre), tuple(starts.index(g[0]) for g in groups)


def _is_identity(order) -> bool:
    if order is None:
        return True
    if order == UNKNOWN:
        return False
    return list(_canon(*order)[1]) in ([], [0])


def _transpose_order(order, cur: tuple, perm: list[int]):
    """The order after Transpose(perm) of a tensor of full shape ``cur`` read in ``order``."""
    if order == UNKNOWN:
        return UNKNOWN
    pre, p0 = order if order is not None else (cur, tuple(range(len(cur))))
    tshape = tuple(pre[i] for i in p0)
    r = _refine(tshape, cur)
    if r is None:
        return UNKNOWN
    sizes, runs_t, runs_c = r
    inv = {p: i for i, p in enumerate(p0)}
    refined_pre, where = [], {}
    for j in range(len(pre)):            # pre axis j is T axis inv[j], split into R axes
        for k in runs_t[inv[j]]:
            where[k] = len(refined_pre)
            refined_pre.append(sizes[k])
    new_perm = [where[k] for a in perm for k in runs_c[a]]
    return tuple(refined_pre), tuple(new_perm)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            import onnx
            return onnx.helper.get_attribute_value(a)
    return default


def _batch_after_reshape(before: tuple, b: int, after: tuple) -> int:
    """Where a Reshape puts the batch axis (size 1): the unit axis with the same number of
    elements before it, or -1 when the reshape merged it away (or it had none)."""
    if b < 0:
        return after.index(1) if 1 in after else -1
    pre = prod(before[:b])
    for p, d in enumerate(after):
        if d == 1 and prod(after[:p]) == pre:
            return p
    return -1


def _squeezed(shape: tuple) -> tuple:
    """A shape without its unit axes (shapes equal up to unit axes describe the same data)."""
    return tuple(d for d in shape if d != 1)


def _first_unit(shape: tuple) -> int:
    return shape.index(1) if 1 in shape else -1


def _meta(node, key: str) -> str | None:
    """A node's metadata property (the dynamo exporter records rewrites and the FX node there)."""
    for p in getattr(node, "metadata_props", ()):
        if p.key == key:
            return p.value
    return None


def _fx_param(node) -> str | None:
    """The first parameter (``%p_...``) of the FX node dynamo exported this node from, or None."""
    import re

    fx = _meta(node, "pkg.torch.onnx.fx_node") if node is not None else None
    m = re.search(r"%(p_\w+)", fx or "")
    return m.group(1) if m else None


def _dropped_bias(node) -> bool:
    """dynamo's optimizer removed this node's all-zero bias (a parameter all the same)."""
    return "RemoveOptionalBias" in (_meta(node, "pkg.onnxscript.rewriter.rule_name") or "")


def _fused_bn(node, op: str = "Conv") -> bool:
    """dynamo's optimizer folded a BatchNormalization into this Conv or Gemm (eval mode)."""
    return f"FuseBatchNormInto{op}" in (_meta(node, "pkg.onnxscript.rewriter.rule_name") or "")


def _fused_own_bias(node, op: str = "Conv") -> bool:
    """dynamo folded a BatchNormalization into this Conv (Gemm) and it had a bias of its own:
    FuseBatchNormInto{Conv,Gemm} names the fused bias after the layer's bias parameter
    (``c.bias``) when there was one, and ``<weight>_bias`` (``c.weight_bias``) when there was none."""
    b = node.input[2] if len(node.input) > 2 else ""
    return _fused_bn(node, op) and bool(b) and b != node.input[1] + "_bias"


def _folded_bn_weights(node, channels: int) -> dict:
    """The batchnorm a folded Conv/Gemm gives back: the file holds W' = W * s and
    b' = (b - mean) * s + beta, so gamma 1, beta b', mean 0, var 1, eps 0 (dynamo drops an
    all-zero b')."""
    has_b = len(node.input) > 2 and bool(node.input[2])
    return {"gamma": ("ones", channels), "beta": ("t", node.input[2], None) if has_b else ("zeros", channels),
            "running_mean": ("zeros", channels), "running_var": ("ones", channels), "eps": ("value", 0.0)}


def _str(v):
    return v.decode() if isinstance(v, bytes) else v


class _Importer:
    """One pass over a shape-inferred graph, producing layer dicts in topological order."""

    def __init__(self, model, file: str, opaque: dict[str, tuple[float, float]] | None, folded=None):
        self.file = file
        self.fold_origin: dict[str, frozenset[str]] = dict(folded.origin) if folded is not None else {}
        self.originals: frozenset[str] = folded.originals if folded is not None else frozenset(
            t.name for t in model.graph.initializer)
        self.sig_params = folded.params if folded is not None else None
        # the graph with every initializer (inference ran on a copy without the big ones' bytes)
        self.full_graph = folded.model.graph if folded is not None else model.graph
        self.masks: set[str] = set()          # boolean/mask tensors derived from activations (no layer)
        self.folded_tables: list[tuple[str, tuple]] = []   # dynamo-folded lookups counted as rows read
        self.folded_convs: list[str] = []   # legacy Conv+BatchNorm folds: a conv's own bias is not in the file
        self.ln_parts: dict[str, str] = {}    # layernorm made from a decomposed pattern -> its input
        self.weight_hash: dict[tuple, str] = {}   # value fingerprint of a layer's weight -> that layer
        self.opaque = dict(opaque or {})
        self.g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 20)
        # exporters' default graph names say nothing about the model: use the file's name then
        generic = {"", "main_graph", "torch_jit", "torch-jit-export", "tf2onnx", "graph", "g"}
        self.name = Path(file).stem if self.g.name in generic else self.g.name
        self.description = model.doc_string or f"imported from {Path(file).name}"
        self.dims: dict[str, tuple] = {}
        self.int_tensors: set[str] = set()
        self.index_tensors: set[str] = set()   # int or bool tensors: ids, indices, masks
        self.const: set[str] = set()
        self.origin: dict[str, frozenset[str]] = {}   # constant -> initializers it derives from
        self.owner: dict[str, str] = {}               # initializer -> first layer using it
        self.weight_owner: dict[str, str] = {}        # initializer -> first layer using it as its weight
        self.order: dict[str, int] = {}               # layer name -> position
        self.fx_param: dict[str, str | None] = {}     # layer -> the PyTorch parameter dynamo says it reads
        self.env: dict[str, _Ref] = {}
        self.layers: list[dict] = []
        self.built: dict[str, Layer] = {}
        self.names: set[str] = set()
        self.consumers: dict[str, int] = {}
        # what the float forward needs (bapipe.onnx_weights): per layer, where each weight comes from
        # (("t", tensor, how) | ("zeros", n) | ("ones", n) | ("value", float)), and why the layers would
        # not compute the file's function (layer or node -> one line)
        self.wsrc: dict[str, dict[str, tuple]] = {}
        self.notes: dict[str, str] = {}
        self._stash: list[str] = []
        self.erf_gelu: set[str] = set()       # gelu layers made from an Erf (x (1 + erf) completes them)

    # -- errors and shapes ---------------------------------------------------------------
    def err(self, node, expected: str) -> SpecError:
        """A one-line SpecError naming the node and its op type."""
        where = f"node '{node.name or node.output[0]}' ({node.op_type})" if node is not None else None
        return SpecError(self.file, None, where, expected)

    def full_shape(self, t: str, node=None) -> tuple[int, ...]:
        """The inferred full shape (batch included) of tensor ``t``; symbolic dims are an error."""
        if t not in self.dims:
            raise self.err(node, f"shape inference gave no shape for tensor '{t}'; export with static shapes")
        d = self.dims[t]
        if any(not isinstance(x, int) or x < 0 for x in d):
            raise self.err(node, f"tensor '{t}' has a symbolic shape {list(d)}; export with static shapes")
        return d

    # -- setup ---------------------------------------------------------------------------
    def read_shapes(self, inferred) -> None:
        """Collect inferred shapes, int dtypes, initializers and how often each tensor is read."""
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                continue
            self.dims[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                       for d in tt.shape.dim)
            if tt.elem_type in INT_TYPES:
                self.int_tensors.add(vi.name)
            if tt.elem_type in INT_TYPES or tt.elem_type == 9:   # 9: bool
                self.index_tensors.add(vi.name)
        self.init_type: dict[str, int] = {}
        full = self.full_graph
        self.inits = {t.name: t for t in full.initializer}
        for t in full.initializer:
            self.dims[t.name] = tuple(t.dims)
            self.const.add(t.name)
            self.init_type[t.name] = t.data_type
            self.origin[t.name] = self.fold_origin.get(t.name, frozenset({t.name}))
        for n in g.node:
            for o in n.output:
                self.consumers.setdefault(o, 0)
            for i in n.input:
                self.consumers[i] = self.consumers.get(i, 0) + 1
        for o in g.output:
            self.consumers[o.name] = self.consumers.get(o.name, 0) + 1

    def mark_constants(self) -> None:
        """Constant plumbing: nodes whose inputs are all constants (or shapes of tensors)."""
        for n in self.g.node:
            ins = [i for i in n.input if i]
            if n.op_type in ("Constant", "Shape", "Size") or (ins and all(i in self.const for i in ins)) \
                    or (not ins and n.op_type in ("ConstantOfShape", "RandomNormal", "RandomUniform")):
                for o in n.output:
                    self.const.add(o)
                    self.origin[o] = frozenset().union(*(self.origin.get(i, frozenset()) for i in ins)) \
                        if n.op_type not in ("Shape", "Size") else frozenset()

    # -- units and order -----------------------------------------------------------------
    def units(self) -> list[tuple[str | None, list]]:
        """Tagged groups and single nodes in topological order (ties: first ONNX position)."""
        groups: dict[str, list] = {}
        tags: dict[str, dict] = {}
        keys: list[tuple] = []      # (first index, key)
        unit_of: dict[int, str] = {}
        for i, n in enumerate(self.g.node):
            if all(o in self.const for o in n.output if o):
                continue
            doc = n.doc_string or ""
            if doc.startswith(TAG):
                try:
                    tag = json.loads(doc[len(TAG):])
                    lname = str(tag["layer"])
                except (ValueError, KeyError, TypeError):
                    raise self.err(n, "malformed bapipe tag in doc_string (expected bapipe:{\"layer\":..., "
                                      "\"type\":..., \"attrs\":{...}})") from None
                key = "tag:" + lname
                tags.setdefault(key, tag)
            else:
                key = f"node:{i}"
            if key not in groups:
                groups[key] = []
                keys.append((i, key))
            groups[key].append(n)
            unit_of[i] = key
        produced: dict[str, str] = {}
        for key, nodes in groups.items():
            for n in nodes:
                for o in n.output:
                    if o:
                        produced[o] = key
        deps: dict[str, set[str]] = {k: set() for k in groups}
        for key, nodes in groups.items():
            for n in nodes:
                for t in n.input:
                    if t in produced and produced[t] != key:
                        deps[key].add(produced[t])
        # keep only units the graph output depends on
        live: set[str] = set()
        stack = [produced[o.name] for o in self.g.output if o.name in produced]
        while stack:
            k = stack.pop()
            if k not in live:
                live.add(k)
                stack.extend(deps[k])
        self.live_reads = {i for k in live for n in groups[k] for i in n.input if i} | {o.name for o in self.g.output}
        first = {k: i for i, k in keys}
        users: dict[str, list[str]] = {k: [] for k in groups}
        indeg = {k: 0 for k in live}
        for k in live:
            for d in deps[k]:
                users[d].append(k)
                indeg[k] += 1
        heap = [(first[k], k) for k in live if indeg[k] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, k = heapq.heappop(heap)
            order.append(k)
            for u in users[k]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(heap, (first[u], u))
        if len(order) != len(live):
            raise SpecError(self.file, None, "graph", "the graph has a cycle")
        return [(tags.get(k), groups[k]) for k in order]

    # -- layers --------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        """A unique layer name from ``base``."""
        name = base or "layer"
        k = 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def src_shape(self, src: str) -> tuple[int, ...]:
        """Per-sample output shape of a layer or model input."""
        return self.built[src].out_shape if src in self.built else self.input_shapes[src]

    def use(self, t: str, node, absorb: bool = False) -> str:
        """The layer/input name to read tensor ``t`` from, inserting a reshape for a changed view
        (with the element order of any Transpose on the way). A factor or other folded operation
        on the way that the reader does not take in (``absorb``) is noted: the layers would not
        compute the file's function."""
        if t not in self.env:
            raise self.err(node, f"input '{t}' is not an activation the importer knows (constant or missing)")
        ref = self.env[t]
        have = self.src_shape(ref.src)
        if ref.order == UNKNOWN:
            self.note(node, f"the element order of '{t}' (Transposes between reshapes) has no reshape/permute form")
        ident = _is_identity(ref.order)
        if not (ref.shape == have and ident):
            if prod(ref.shape) != prod(have):
                raise self.err(node, f"tensor '{t}' has shape {list(ref.shape)} per sample but its producer "
                                     f"'{ref.src}' gives {list(have)}")
            base = ref.view or f"{ref.src}_view"
            if ident and len(ref.shape) == 1:
                name = self.add_layer(None, base, "flatten", [ref.src], {})
            else:
                attrs = {"shape": list(ref.shape)}
                if not ident and ref.order != UNKNOWN:
                    pre, perm = _canon(*ref.order)
                    attrs.update(pre=list(pre), perm=list(perm))
                name = self.add_layer(None, base, "reshape", [ref.src], attrs)
            ref = _Ref(name, ref.shape, ref.batch, None, ref.full, None, ref.mult, ref.pending)
            self.env[t] = ref
        if not absorb and (ref.mult != 1.0 or ref.pending):
            what = f"folded {', '.join(ref.pending)}" if ref.pending else f"a factor {ref.mult:g}"
            self.note(node, f"'{t}' carries {what} that no layer computes")
        return ref.src

    def note(self, node, why: str) -> None:
        """Remember why the layers about to be made would not compute the file's function."""
        where = f"node '{node.name or node.output[0]}' ({node.op_type})" if node is not None else "graph output"
        self._stash.append(f"{where}: {why}")

    def add_layer(self, node, base: str, type_: str, inputs: list[str], attrs: dict,
                  tied_to: str | None = None) -> str:
        """Append a layer document (validated at once) and return its name."""
        name = self.fresh(base)
        d = {"name": name, "type": type_, "inputs": list(inputs), **attrs}
        if tied_to:
            d["tied_to"] = tied_to
        self.built[name] = self.probe(node, d)
        self.order[name] = len(self.layers)
        self.layers.append(d)
        if self._stash:
            self.notes[name] = "; ".join(dict.fromkeys(self._stash))
            self._stash.clear()
        return name

    def probe(self, node, d: dict) -> Layer:
        """Build the layer now (shared validation), so later views know its real shape."""
        f = Fields(to_node(d, self.file, f"layers[{len(self.layers)}]"))
        f.str("name"), f.str("type"), f.raw("inputs")
        try:
            return build_layer(f, d["name"], tuple(d["inputs"]), [self.src_shape(s) for s in d["inputs"]],
                               d["type"], d.get("tied_to"))
        except SpecError as e:
            raise self.err(node, f"as a {d['type']} layer: {e.field}: {e.expected}") from None


    def emit(self, node, out: str, type_: str, inputs: list[str], attrs: dict, consts: list[str] = (),
             base: str | None = None, weight: str | None = None, like: str | None = None,
             weights: dict | None = None) -> str:
        """Add a layer for ``node`` writing tensor ``out`` and bind ``out`` to it.

        ``weight`` is the layer's main weight tensor: only it can make the layer tied to an
        earlier one (biases and norm parameters never do: exporters merge equal ones).
        ``like`` is the input whose batch axis the output keeps.
        """
        tied = self.tie_of(weight, node) if weight else None
        name = self.add_layer(node, base or node.name or f"{node.op_type.lower()}_{len(self.layers)}",
                              type_, inputs, attrs, tied)
        if weight:
            self.claim(weight, name)
            self.fx_param[name] = _fx_param(node)
        if weights:
            self.wsrc[name] = dict(weights)
        for c in consts:
            for o in self.origin.get(c, frozenset()) if c else ():
                self.owner.setdefault(o, name)
        self.bind(node, out, name, like)
        return name

    def value(self, t: str):
        """The numpy value of an in-file initializer, or None (external data, not an initializer)."""
        init = self.inits.get(t)
        if init is None or init.data_location == 1 or any(e.key == "location" for e in init.external_data):
            return None
        from onnx import numpy_helper
        return numpy_helper.to_array(init)

    def value_any(self, t: str):
        """The numpy value of a constant (initializer or Constant node), or None."""
        v = self.value(t)
        if v is not None:
            return v
        import onnx
        for n in self.full_graph.node:
            if n.op_type == "Constant" and n.output[0] == t:
                a = _attr(n, "value")
                if a is not None:
                    return onnx.numpy_helper.to_array(a)
                for k in ("value_float", "value_floats", "value_int", "value_ints"):
                    a = _attr(n, k)
                    if a is not None:
                        import numpy as np
                        return np.asarray(a)
        return None

    def _weight_keys(self, t: str) -> list[tuple]:
        """Fingerprints of a 2-D weight's values and of its transpose (a tie the exporter folded)."""
        v = self.value(t)
        if v is None or v.ndim != 2 or v.size < 2 or (v == v.flat[0]).all():
            return []   # constant-valued tensors (zeros at init) say nothing about sharing
        import hashlib
        import numpy as np
        return [(v.shape, hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()),
                (v.T.shape, hashlib.sha1(np.ascontiguousarray(v.T).tobytes()).hexdigest())]

    def tie_of(self, weight: str, node=None) -> str | None:
        """The earlier layer whose weight this one reuses: the same initializer (directly or through
        constant ops such as Transpose), or the same values transposed (the exporter folded it)."""
        owners = [self.weight_owner[o] for o in sorted(self.origin.get(weight, ())) if o in self.weight_owner]
        mine = _fx_param(node)
        if mine is not None:   # dynamo names the PyTorch parameter: merged equal tensors are not ties
            owners = [o for o in owners if self.fx_param.get(o) in (None, mine)]
        if owners:
            return min(owners, key=lambda n: self.order[n])
        dims = self.dims.get(weight, ())
        if not any(k[0] == tuple(reversed(dims)) for k in self.weight_hash):
            return None   # no embedding table of the transposed shape: nothing to compare (and no hashing)
        keys = self._weight_keys(weight)
        # only a transposed copy of an embedding table is a tie by value (an LM head whose Transpose the
        # exporter folded); equal values in the same orientation are copies (nn.TransformerEncoder clones)
        return self.weight_hash.get(keys[1]) if len(keys) > 1 else None

    def claim(self, weight: str, name: str) -> None:
        """Record ``name`` as the first user of ``weight`` (for later ties)."""
        for o in self.origin.get(weight, ()):
            self.weight_owner.setdefault(o, name)
            self.owner.setdefault(o, name)
        if self.built[name].type == "embedding":   # the only layer a weight can be tied to by value
            for k in self._weight_keys(weight)[:1]:
                self.weight_hash.setdefault(k, name)



    def bind(self, node, out: str, name: str, like: str | None = None) -> None:
        """Record the ONNX output of a layer; its ONNX shape may be a view of the layer's.

        The batch axis of the output is found, not assumed: it is where the input ``like``
        had it (sequence-first layouts keep it on axis 1), else axis 0, else any unit axis
        whose removal gives the layer's shape; a tensor whose batch axis a Reshape merged
        away (batch 1) keeps its full shape.
        """
        full = self.full_shape(out, node)
        have = self.built[name].out_shape
        b = self.env[like].batch if like in self.env else 0
        order = [x for x in dict.fromkeys([b, 0] + list(range(len(full)))) if 0 <= x < len(full) and full[x] == 1]
        for nb in order:
            if full[:nb] + full[nb + 1:] == have:
                self.env[out] = _Ref(name, have, nb, None, full)
                return
        if full == have:
            self.env[out] = _Ref(name, have, -1, None, full)
            return
        if prod(full) != prod(have):
            raise self.err(node, f"ONNX says the output is {list(full)}, the {self.built[name].type} "
                                 f"layer gives {list(have)} per sample")
        nb = order[0] if order else -1
        shape = full[:nb] + full[nb + 1:] if nb >= 0 else full
        self.env[out] = _Ref(name, shape, nb, None, full)

    # -- ops -----------------------------------------------------------------------------
    def acts(self, node) -> list[str]:
        """The node's non-constant inputs."""
        return [i for i in node.input if i and i not in self.const]

    def window(self, node, kernel, in_hw) -> dict:
        """kernel/stride/padding attributes of a Conv or pooling node."""
        if any(d != 1 for d in (_attr(node, "dilations") or [1])):
            raise self.err(node, "dilations other than 1 are not supported")
        strides = list(_attr(node, "strides") or [1] * len(kernel))
        auto = _str(_attr(node, "auto_pad", "NOTSET"))
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = []
            for k, s, h in zip(kernel, strides, in_hw):
                total = max((-(-h // s) - 1) * s + k - h, 0)
                if total % 2:
                    raise self.err(node, "asymmetric SAME padding is not supported")
                pads.append(total // 2)
        else:
            p = list(_attr(node, "pads") or [0] * 2 * len(kernel))
            if auto == "VALID":
                p = [0] * 2 * len(kernel)
            if p[: len(kernel)] != p[len(kernel):]:
                raise self.err(node, f"asymmetric pads {p} are not supported")
            pads = p[: len(kernel)]
        if len(kernel) != 2:
            raise self.err(node, f"only 2-D windows are supported, got kernel {list(kernel)}")
        return {"kernel": list(kernel), "stride": strides, "padding": pads}

    def check_arity(self, node) -> None:
        """Input and output counts allowed by the op's ONNX schema (when the op is a standard one)."""
        import onnx

        try:
            sch = onnx.defs.get_schema(node.op_type, self.opset, node.domain or "")
        except Exception:  # noqa: BLE001 - unknown op: the mapping decides (error or opaque)
            return
        n_in = len(node.input)
        if n_in < sch.min_input or n_in > sch.max_input or len(node.output) < sch.min_output:
            raise self.err(node, f"{node.op_type} takes {sch.min_input}..{sch.max_input} inputs, got {n_in}")


    def op(self, node) -> None:
        """Map one untagged node to a layer, a view, a fold or an error."""
        t = node.op_type
        acts = self.acts(node)
        out = node.output[0]
        if not acts:
            return
        if t in self.opaque:   # the user's cost wins over any mapping (and over a refusal)
            return self.unsupported(node, acts)
        if t in VIEW_OPS:
            return self.view(node)
        if all(a in self.masks for a in acts) or t in BOOL_OPS:
            return self.mask(node, acts)
        if not (t == "Gather" and node.input[0] in self.const) and all(o in self.index_tensors for o in node.output if o):
            return self.mask(node, acts)   # integer/boolean plumbing on inputs (mask indexing): no layer
        if t in ELEMENTWISE:
            if t == "Softmax":
                axis = _attr(node, "axis", -1)
                rank = len(self.full_shape(acts[0], node))
                if axis not in (-1, rank - 1):
                    raise self.err(node, f"Softmax over axis {axis} (not the last) is not supported")
            attrs = {}
            if t == "Gelu" and _str(_attr(node, "approximate", "none")) != "tanh":
                attrs["approximate"] = "none"
            if t == "LeakyRelu":
                attrs["negative_slope"] = float(_attr(node, "alpha", 0.01))
            elif t == "HardSigmoid":
                attrs.update(alpha=float(_attr(node, "alpha", 0.2)), beta=float(_attr(node, "beta", 0.5)))
            elif t == "HardSwish":
                attrs["hard"] = True
            return self.emit(node, out, ELEMENTWISE[t], [self.use(acts[0], node)], attrs, like=acts[0])
        if t == "Clip":   # ReLU6 and friends: a clamp with its bounds (a missing bound is open)
            return self.emit(node, out, "clip", [self.use(acts[0], node)], self.clip_bounds(node), like=acts[0])
        if t == "Conv":
            return self.conv(node)
        if t in ("MaxPool", "AveragePool"):
            x = acts[0]
            attrs = self.window(node, _attr(node, "kernel_shape"), self.full_shape(x, node)[2:])
            if _attr(node, "ceil_mode", 0):
                attrs["ceil_mode"] = True   # the layer keeps it only where a partial window exists
            if t == "AveragePool" and any(attrs["padding"]) and not _attr(node, "count_include_pad", 0):
                self.note(node, "an average over the window without its padding (count_include_pad=0): "
                                "the avgpool layer divides by the whole window")
            return self.emit(node, out, "maxpool" if t == "MaxPool" else "avgpool", [self.use(x, node)], attrs,
                             like=x)
        if t == "GlobalAveragePool":
            return self.emit(node, out, "globalavgpool", [self.use(acts[0], node)], {}, like=acts[0])
        if t == "ReduceMean":
            return self.reduce_mean(node, acts[0])
        if t == "BatchNormalization":
            if _attr(node, "training_mode", 0):
                self.note(node, "training_mode=1 (batch statistics): the batchnorm layer reads running ones")
            w = {k: ("t", i, None) for k, i in zip(("gamma", "beta", "running_mean", "running_var"), node.input[1:5])}
            return self.emit(node, out, "batchnorm", [self.use(node.input[0], node)], {}, node.input[1:3],
                             like=node.input[0], weights={**w, "eps": ("value", float(_attr(node, "epsilon", 1e-5)))})
        if t == "LayerNormalization":
            rank = len(self.full_shape(node.input[0], node))
            if _attr(node, "axis", -1) not in (-1, rank - 1):
                raise self.err(node, "LayerNormalization over more than the last axis is not supported")
            d = self.full_shape(node.input[0], node)[-1]
            w = {"gamma": ("t", node.input[1], None),
                 "beta": ("t", node.input[2], None) if len(node.input) > 2 and node.input[2] else ("zeros", d),
                 "eps": ("value", float(_attr(node, "epsilon", 1e-5)))}
            return self.emit(node, out, "layernorm", [self.use(node.input[0], node)], {}, node.input[1:3],
                             like=node.input[0], weights=w)
        if t in ("Gemm", "MatMul"):
            return self.linear(node, acts)
        if t == "Pow" and node.input[0] in self.env and node.input[1] in self.const:
            # x**3 inside tanh-GELU, (x - mean)**2 of a decomposed layernorm: part of one layer
            return self.alias(node, node.input[0], folded=self.env[node.input[0]].src not in self.ln_parts)
        if t in SCALE_OPS and len(acts) == 1:
            return self.scale(node, acts[0])
        if t in ("Sqrt", "Reciprocal") and self.env[acts[0]].src in self.ln_parts:
            return self.alias(node, acts[0])   # the standard deviation of a decomposed layernorm
        if t == "Erf":  # PyTorch's exact GELU below opset 20: x * 0.5 * (1 + erf(x / sqrt 2))
            ref = self.env[acts[0]]
            if abs(ref.mult - 2 ** -0.5) > 1e-6 or ref.pending:
                self.note(node, "an Erf whose input is not x / sqrt(2): not a GELU")
            name = self.emit(node, out, "gelu", [self.use(acts[0], node, absorb=True)], {"approximate": "none"},
                             like=acts[0])
            self.erf_gelu.add(name)
            return name
        if t in ("Mul", "Add", "Sum", "Sub", "Div") and len(acts) >= 2:
            return self.binary(node, acts)
        if t == "Where":
            return self.where(node, acts)
        if t == "Concat":
            return self.concat(node, acts)
        if t == "Split":
            return self.split(node, acts[0])
        if t == "Slice":
            return self.slice(node, acts[0])
        if t == "LSTM":
            return self.lstm(node)
        if t == "Gather":
            return self.gather(node, acts)
        return self.unsupported(node, acts)

    def clip_bounds(self, node) -> dict:
        """Clip's min and max: constant inputs 1 and 2 (opset >= 11) or attributes (older)."""
        out = {}
        for k, key in ((1, "min"), (2, "max")):
            if len(node.input) > k and node.input[k]:
                v = self.const_value(node.input[k], node)
                if len(v) != 1:
                    raise self.err(node, f"Clip's {key} must be one number, got {len(v)}")
                out[key] = float(v[0])
            elif _attr(node, key) is not None:
                out[key] = float(_attr(node, key))
        return out

    def alias(self, node, x: str, mult: float | None = None, pending: tuple | None = None,
              folded: bool = False) -> None:
        """The node's output is the input's data for costing (an elementwise part folded away).
        ``mult``/``pending`` replace the input's factor and unaccounted nodes; ``folded`` adds
        this node to the unaccounted ones (its effect on the values is in no layer)."""
        ref = self.env[x]
        full = self.full_shape(node.output[0], node)
        mult = ref.mult if mult is None else mult
        pending = ref.pending if pending is None else pending
        if folded:
            pending = pending + (node.name or node.output[0],)
        if full == ref.full:
            self.env[node.output[0]] = _Ref(ref.src, ref.shape, ref.batch, ref.view, ref.full, ref.order, mult,
                                            pending)
        else:   # a broadcast (x * scale of another shape): keep the batch axis where it was
            nb = ref.batch if 0 <= ref.batch < len(full) and full[ref.batch] == 1 else _first_unit(full)
            order = ref.order if ref.order is None or prod(full) == prod(ref.full) else UNKNOWN
            self.env[node.output[0]] = _Ref(ref.src, full[:nb] + full[nb + 1:] if nb >= 0 else full, nb,
                                            ref.view, full, order, mult, pending)

    def mask(self, node, acts) -> None:
        """Comparisons, IsNaN, Not, ...: a boolean mask of activations, no layer (Where reads it)."""
        self.alias(node, acts[0])
        for o in node.output:
            self.masks.add(o)

    def where(self, node, acts) -> None:
        """Where(cond, a, b): a mask applied to one activation (causal mask, NaN guard)."""
        data = [i for i in node.input[1:] if i in self.env and i not in self.masks]
        if not data:   # a mask turned into numbers (a padding mask into -inf/0): still a mask
            return self.mask(node, acts)
        srcs = {self.env[i].src for i in data}
        if len(srcs) != 1:
            raise self.err(node, "Where must select between one activation and constants")
        if not self.where_keeps(node, data[0]) and self.causal_matmul(node, data[0]):
            return self.alias(node, data[0])
        cond, pos = node.input[0], list(node.input).index(data[0])
        other = self.value_any(node.input[3 - pos])
        if cond in self.masks and other is not None and np.all(other <= -1e30) \
                and self.key_mask(node, data[0], cond, keep_side=(pos == 1)):
            return self.alias(node, data[0])
        self.alias(node, data[0], folded=not self.where_keeps(node, data[0]))

    def _scores(self, x: str):
        """The matmul layer whose own output ``x`` is (scores a mask may be put on), or None."""
        ref = self.env[x]
        lay = self.built.get(ref.src)
        if lay is None or lay.type != "matmul" or ref.view is not None or ref.order is not None \
                or ref.mult != 1.0 or ref.pending or self.consumers.get(x, 0) != 1:
            return None
        return lay

    def mask_values(self, t: str, inp: str, value) -> "np.ndarray | None":
        """The value of mask tensor ``t`` when model input ``inp`` is ``value`` (the file's own
        nodes from ``inp`` to ``t``, run by onnx's reference evaluator), or None."""
        import onnx
        from onnx.reference import ReferenceEvaluator

        producer = {o: n for n in self.full_graph.node for o in n.output if o}
        need, stack, seen = [], [t], set()
        while stack:
            u = stack.pop()
            if u in seen or u == inp or u not in producer:
                continue
            seen.add(u)
            n = producer[u]
            need.append(n)
            stack.extend(i for i in n.input if i)
        order = {id(n): k for k, n in enumerate(self.full_graph.node)}
        nodes = sorted({id(n): n for n in need}.values(), key=lambda n: order[id(n)])
        vi = next(i for i in self.g.input if i.name == inp)
        reads = {i for n in nodes for i in n.input}
        inits = [x for x in self.full_graph.initializer if x.name in reads]
        g = onnx.helper.make_graph(nodes, "mask", [vi], [onnx.helper.make_empty_tensor_value_info(t)], inits)
        m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", self.opset)])
        try:
            return np.asarray(ReferenceEvaluator(m).run(None, {inp: value})[0])
        except Exception:  # noqa: BLE001 - a chain the reference cannot run: not a recognised mask
            return None

    def key_mask(self, node, x: str, m: str, keep_side=None) -> bool:
        """A mask computed from a model input (BERT's attention_mask, nn.MultiheadAttention's key
        padding mask) on a matmul's scores: when it is, per key position, 0 for one input value
        and at most -1e30 (-inf, finfo.min) for the other, the matmul reads that input as its
        ``key_mask`` (keys whose input is 0, or nonzero, are masked out, as softmax then gives
        them exactly 0). ``keep_side`` (a Where's condition): the condition's value keeps x."""
        lay = self._scores(x)
        ref = self.env.get(m)
        if lay is None or ref is None or ref.src not in self.input_shapes or len(lay.inputs) != 2:
            return False
        inp = ref.src
        full = self.full_shape(inp, node)
        sk = lay.out_shape[-1]
        if prod(full) != sk:
            return False
        dtype = onnx_np_type(next(i for i in self.g.input if i.name == inp).type.tensor_type.elem_type)
        alt = (np.arange(sk) % 2).astype(dtype).reshape(full)
        vals = [self.mask_values(m, inp, v) for v in (np.ones(full, dtype), np.zeros(full, dtype), alt)]
        if any(v is None for v in vals):
            return False
        if keep_side is None:   # additive: 0 keeps, <= -1e30 masks
            kept = [np.broadcast_to(v == 0, v.shape) for v in vals]
            if not all(np.all((v == 0) | (v <= -1e30)) for v in vals):
                return False
        else:
            kept = [np.asarray(v).astype(bool) == keep_side for v in vals]
        try:
            per_key = [np.broadcast_to(k, np.broadcast_shapes(k.shape, (sk,))).reshape(-1, sk) for k in kept]
        except ValueError:
            return False
        if not all((p == p[0]).all() for p in per_key):
            return False   # the mask differs between rows: not a mask over keys
        ones, zeros, mixed = (p[0] for p in per_key)
        if ones.all() and not zeros.any() and (mixed == (np.arange(sk) % 2 == 1)).all():
            how = "zero"        # keys whose input is 0 are masked (attention_mask: 1 = attend)
        elif zeros.all() and not ones.any() and (mixed == (np.arange(sk) % 2 == 0)).all():
            how = "nonzero"     # keys whose input is nonzero / True are masked (key_padding_mask)
        else:
            return False
        d = self.layers[self.order[self.env[x].src]]
        d["inputs"] = list(d["inputs"]) + [inp]
        d["key_mask"] = how
        self.built[d["name"]] = self.probe(node, d)
        return True

    def causal_matmul(self, node, x: str, additive=None) -> bool:
        """Where(constant mask, scores, -inf) keeping exactly the lower triangle of a matmul's
        output (GPT-2's causal mask buffer), or ``additive``: a constant added to the scores that
        is 0 on the lower triangle and at most -1e30 above it (Hugging Face's finfo.min mask:
        softmax gives those entries exactly 0, as for -inf). The matmul becomes ``causal`` (its
        upper triangle is -inf, as the zoo's attention layer's); True when it did."""
        ref = self.env[x]
        lay = self.built.get(ref.src)
        if lay is None or lay.type != "matmul" or ref.view is not None \
                or ref.order is not None or ref.mult != 1.0 or ref.pending or self.consumers.get(x, 0) != 1:
            return False
        if additive is not None:
            a = np.asarray(additive, dtype=np.float64)
            if a.size < 2 or not np.all((a == 0) | (a <= -1e30)):
                return False
            keep = a == 0
        else:
            cond = node.input[0]
            if cond not in self.const:
                return False
            v = self.value_any(cond)
            other = self.value_any(node.input[2 if list(node.input).index(x) == 1 else 1])
            if v is None or other is None or not np.all(np.isneginf(other)):
                return False
            keep = v.astype(bool) if list(node.input).index(x) == 1 else ~v.astype(bool)
        sq, sk = lay.out_shape[-2:]
        try:
            keep = np.broadcast_to(keep, ref.full).reshape(-1, sq, sk)
        except ValueError:
            return False
        if not (keep == np.tril(np.ones((sq, sk), bool), sk - sq)).all():
            return False
        d = self.layers[self.order[ref.src]]
        d["causal"] = True
        self.built[ref.src] = self.probe(node, d)
        return True

    def where_keeps(self, node, x: str) -> bool:
        """Whether Where(cond, ...) passes the activation ``x`` through unchanged: a constant
        condition that selects it everywhere, or a condition computed from an activation (the
        NaN guard dynamo puts after a softmax). A causal mask or a mask read from a model input
        changes the values (the layers do not compute it)."""
        cond = node.input[0]
        if cond in self.const:
            v = self.value_any(cond)
            pos = list(node.input).index(x)
            return v is not None and bool(v.all() if pos == 1 else not v.any())
        ref = self.env.get(cond)
        return ref is not None and cond in self.masks and ref.src not in self.input_shapes

    def _is_mask(self, x: str, out_full: tuple) -> bool:
        """An operand that is a mask: boolean-derived, or read from a model input and broadcast."""
        ref = self.env[x]
        return x in self.masks or (ref.src in self.input_shapes and prod(ref.full) < prod(out_full))

    def binary(self, node, acts) -> None:
        """Add/Mul/Sub/Div of activations: residual add, gating product, or a folded pattern."""
        t = node.op_type
        out = node.output[0]
        full = self.full_shape(out, node)
        if len(acts) != len([i for i in node.input if i]):
            live = [a for a in acts if not self._is_mask(a, full)]
            if t in ("Add", "Sum") and len(live) > 1:
                raise self.err(node, "Sum of activations and constants is not supported")
        real = [a for a in acts if not self._is_mask(a, full)]
        if not real:
            return self.mask(node, acts)
        if len(real) == 1:   # attention mask added (or multiplied) onto the scores: no layer
            masks = [a for a in acts if a not in real]
            if t == "Add" and len(masks) == 1 and self.key_mask(node, real[0], masks[0]):
                return self.alias(node, real[0])
            return self.alias(node, real[0], folded=True)
        refs = [self.env[a] for a in real]
        lns = [a for a in real if self.env[a].src in self.ln_parts]
        if len(real) == 2 and lns:   # x - mean(x) of a decomposed layernorm: the layernorm's work
            other = real[1] if real[0] == lns[0] else real[0]
            if self.env[other].src in (self.ln_parts[self.env[lns[0]].src], self.env[lns[0]].src):
                return self.alias(node, lns[0])
        if len({r.src for r in refs}) == 1:   # x + 0.044715 x^3, x * x: parts of one activation
            return self.alias(node, real[0], folded=True)
        if t == "Mul" and len(real) == 2 and self.gated(node, real):
            return None
        if t in ("Sub", "Div"):
            raise self.err(node, f"{t} of two activations is not supported")
        if t == "Mul":
            return self.emit(node, out, "mul", [self.use(a, node) for a in real], {},
                             like=max(real, key=lambda a: prod(self.env[a].full)))
        shapes = {_squeezed(r.shape) for r in refs}
        if len(shapes) > 1:
            raise self.err(node, f"broadcasting Add of shapes {sorted(map(list, (r.shape for r in refs)))} "
                                 "is not supported")
        names = [self.use(a, node) for a in real]
        first = self.src_shape(names[0])
        names = [n if self.src_shape(n) == first else self.add_layer(None, f"{n}_view", "reshape", [n],
                                                                      {"shape": list(first)}) for n in names]
        return self.emit(node, out, "add", names, {}, like=real[0])

    def gated(self, node, acts) -> bool:
        """x * act(x): SiLU (sigmoid), tanh-GELU (tanh becomes gelu) and erf-GELU are one layer."""
        a, b = (self.env[x] for x in acts)
        for g, x in ((a, b), (b, a)):
            lay = self.built.get(g.src)
            if lay is None or lay.type not in ("gelu", "sigmoid", "tanh") or lay.inputs[0] != x.src \
                    or (lay.type == "gelu" and g.src not in self.erf_gelu) or "alpha" in lay.attr:
                continue   # a Gelu node's GELU or a hard sigmoid is whole already: not a pattern's part
            if lay.type in ("tanh", "sigmoid"):   # tanh: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), GPT-2's GELU
                d = self.layers[self.order[g.src]]     # sigmoid: x * sigmoid(x), SiLU
                d["type"] = "gelu" if lay.type == "tanh" else "silu"
                self.built[g.src] = self.probe(node, d)
                self.notes.pop(g.src, None)   # the tanh's folded input is the GELU's own polynomial
            # x (1 + erf(x/sqrt 2)) and x (1 + tanh(...)) are twice the GELU: the exporter's 0.5 (before
            # or after this product) brings the factor back to 1; x * sigmoid(x) is the SiLU itself
            k = 1.0 if lay.type == "sigmoid" else 2.0
            self.alias(node, acts[0] if g is a else acts[1], mult=k * x.mult, pending=x.pending)
            return True
        return False

    def conv(self, node) -> None:
        """Conv -> conv2d; a BatchNormalization the exporter folded into it comes back as a layer."""
        x, w = node.input[0], node.input[1]
        out = node.output[0]
        wd = self.full_shape(w, node)
        if len(wd) != 4:
            raise self.err(node, f"only 2-D Conv is supported (weight {list(wd)})")
        bias = len(node.input) > 2 and bool(node.input[2])
        bn = self.folded_bn(node)
        own = bool(bn) and _fused_own_bias(node)   # its own bias: folded into the batchnorm's beta
        if bn or _dropped_bias(node):
            bias = own or not bn
        if bn and not _fused_bn(node):
            self.folded_convs.append(node.name or bn)   # legacy: the file cannot say whether it had one
        attrs = {"out_channels": wd[0], "groups": _attr(node, "group", 1), "bias": bias,
                 **self.window(node, _attr(node, "kernel_shape") or wd[2:], self.full_shape(x, node)[2:])}
        w = {"W": ("t", w, None)}
        if bn:   # the file holds W' = W * s and b' = (b - mean) * s + beta: the conv keeps W', the batchnorm b'
            bw = _folded_bn_weights(node, wd[0])
            if own:   # (b - mean) * s + beta is all in beta: the conv's own bias starts at 0, same function
                w["b"] = ("zeros", wd[0])
        elif bias:
            w["b"] = ("t", node.input[2], None) if len(node.input) > 2 and node.input[2] else ("zeros", wd[0])
        name = self.emit(node, out, "conv2d", [self.use(x, node)], attrs, node.input[1:], like=x, weights=w)
        if bn:
            self.emit(node, out, "batchnorm", [name], {}, base=bn, like=out, weights=bw)

    def folded_bn(self, node) -> str | None:
        """Name for the batchnorm an exporter folded into this Conv (eval mode), or None.

        dynamo marks the Conv with its FuseBatchNormIntoConv rewrite; the legacy exporter
        gives the folded weight a generated name (``onnx::Conv_N``) instead of the
        parameter's, which only its BatchNorm folding does to a Conv weight.
        """
        rules = _meta(node, "pkg.onnxscript.rewriter.rule_name") or ""
        base = node.name or f"conv_{len(self.layers)}"
        if "FuseBatchNormIntoConv" in rules:
            return base + "_bn"
        w = node.input[1]
        srcs = self.origin.get(w, frozenset({w})) or frozenset({w})
        if len(node.input) > 2 and node.input[2] and all(o.startswith("onnx::Conv_") for o in srcs):
            return base.removesuffix("/Conv") + "/bn" if base.endswith("/Conv") else base + "_bn"
        return None

    def reduce_mean(self, node, x: str) -> None:
        """ReduceMean over H and W (AdaptiveAvgPool2d(1), dynamo's form) -> globalavgpool."""
        ref = self.env[x]
        axes = _attr(node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = self.const_value(node.input[1], node)
        rank = len(ref.full)
        if axes is not None and [int(a) % rank for a in axes] == [rank - 1] and _attr(node, "keepdims", 1):
            return self.decomposed_layernorm(node, x)
        if axes is None or rank != 4 or ref.batch != 0 or sorted(int(a) % rank for a in axes) != [2, 3]:
            raise self.err(node, "only ReduceMean over H and W of an NCHW tensor is mapped (globalavgpool); "
                                 "give its cost with --opaque ReduceMean=FWD_S,BWD_S")
        self.emit(node, node.output[0], "globalavgpool", [self.use(x, node)], {}, like=x)

    def decomposed_layernorm(self, node, x: str) -> None:
        """LayerNorm below opset 17: ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul
        gamma, Add beta. The first mean becomes a layernorm layer; every later piece of the
        pattern (and gamma, beta: its 2d parameters) folds into it."""
        ref = self.env[x]
        full = self.full_shape(node.output[0], node)
        if ref.src in self.ln_parts:       # the variance: a mean of (x - mean)^2
            self.env[node.output[0]] = _Ref(ref.src, ref.shape[:-1] + (1,), ref.batch, None, full)
            return
        name = self.add_layer(node, node.name or f"layernorm_{len(self.layers)}", "layernorm", [self.use(x, node)],
                              {})
        self.ln_parts[name] = ref.src
        self.env[node.output[0]] = _Ref(name, ref.shape[:-1] + (1,), ref.batch, None, full)

    def concat(self, node, acts) -> None:
        """Concat of activations; a constant parameter in front of them is a class token."""
        out = node.output[0]
        rank = len(self.full_shape(out, node))
        axis = _attr(node, "axis") % rank
        b = self.env[acts[0]].batch
        if axis == b:
            raise self.err(node, "Concat along the batch axis is not supported")
        pa = axis - (0 <= b < axis) if b >= 0 else axis
        consts = [i for i in node.input if i and i not in self.env]
        if consts:
            if len(acts) != 1 or pa != 0:
                raise self.err(node, "Concat of constants is supported only as one learned block on the "
                                     "first axis after the batch (a class token)")
            size = sum(self.full_shape(c, node)[axis] for c in consts)
            if list(node.input).index(acts[0]) != len(node.input) - 1:
                self.note(node, "learned rows after the activation: concat_param puts them in front")
            return self.emit(node, out, "concat_param", [self.use(acts[0], node)], {"size": size}, consts,
                             like=acts[0], weights={"p": ("cat", tuple(consts), axis)})
        return self.emit(node, out, "concat", [self.use(a, node) for a in acts], {"axis": pa}, like=acts[0])

    def _per_sample_axis(self, node, x: str, axis: int) -> int:
        ref = self.env[x]
        axis %= len(ref.full)
        if axis == ref.batch:
            raise self.err(node, "slicing the batch axis is not supported")
        return axis - (0 <= ref.batch < axis)

    def split(self, node, x: str) -> None:
        """Split of an activation (GPT-2's fused QKV): one slice layer per output that is read."""
        ref = self.env[x]
        axis = _attr(node, "axis", 0) % len(ref.full)
        pa = self._per_sample_axis(node, x, axis)
        sizes = [self.full_shape(o, node)[axis] for o in node.output]
        src = self.use(x, node)
        start = 0
        for o, n in zip(node.output, sizes):
            if o and o in self.live_reads:
                name = self.add_layer(node, f"{node.name or 'split'}_{len(self.layers)}" if not node.name
                                      else f"{node.name}_{start}", "slice", [src],
                                      {"axis": pa, "start": start, "end": start + n})
                self.bind(node, o, name, like=x)
            start += n

    def slice(self, node, x: str) -> None:
        """Slice of an activation with constant bounds: a view when it keeps everything, else a slice."""
        ref = self.env[x]
        full = self.full_shape(node.output[0], node)
        if full == ref.full:
            return self.alias(node, x)
        starts = self.const_value(node.input[1], node)
        axes = self.const_value(node.input[3], node) if len(node.input) > 3 and node.input[3] \
            else list(range(len(starts)))
        steps = self.const_value(node.input[4], node) if len(node.input) > 4 and node.input[4] else [1] * len(starts)
        changed = [(int(a) % len(ref.full), int(s), int(st)) for a, s, st in zip(axes, starts, steps)
                   if full[int(a) % len(ref.full)] != ref.full[int(a) % len(ref.full)]]
        if len(changed) != 1 or changed[0][2] != 1:
            raise self.err(node, "only a step-1 Slice of one axis of an activation is mapped")
        axis, start, _ = changed[0]
        dim = ref.full[axis]
        start = max(0, min(dim, start + dim if start < 0 else start))
        pa = self._per_sample_axis(node, x, axis)
        name = self.add_layer(node, node.name or f"slice_{len(self.layers)}", "slice", [self.use(x, node)],
                              {"axis": pa, "start": start, "end": start + full[axis]})
        self.bind(node, node.output[0], name, like=x)




    def unsupported(self, node, acts) -> None:
        """An op with no mapping: an opaque layer when its cost was given, else a SpecError."""
        t = node.op_type
        if t not in self.opaque:
            raise self.err(node, f"unsupported op type '{t}' (give its cost with --opaque {t}=FWD_S,BWD_S)")
        if len(node.output) > 1 and any(o in self.live_reads for o in node.output[1:] if o):
            raise self.err(node, f"an opaque op may feed only its first output onward (give {t} a mapping or "
                                 "export without reading its other outputs)")
        fwd, bwd = self.opaque[t]
        self.note(node, "an opaque layer (--opaque): a cost, no computation")
        consts = [i for i in node.input if i and i in self.const]
        # trainable tensors only: Clip's bounds, ReduceMean's axes, shapes are not parameters
        srcs = sorted({o for c in consts for o in self.origin.get(c, ()) if self.is_param(o) and o not in self.owner})
        params = sum(prod(self.dims.get(o, ())) for o in srcs)
        shape = list(self.full_shape(node.output[0], node)[1:])
        if not shape:
            raise self.err(node, "an opaque op must produce a tensor of rank >= 2 (with batch)")
        name = self.add_layer(node, node.name or f"{t.lower()}_{len(self.layers)}", "opaque",
                              [self.use(a, node) for a in dict.fromkeys(a for a in acts if a in self.env)],
                              {"shape": shape, "fwd_s": float(fwd), "bwd_s": float(bwd), "params": int(params)})
        for o in srcs:
            self.owner.setdefault(o, name)
        full = self.full_shape(node.output[0], node)
        self.env[node.output[0]] = _Ref(name, full[1:], 0, None, full)

    def view(self, node) -> None:
        """Reshape-like nodes: the output aliases the input's producer with a new shape.

        The batch axis (size 1) is followed through the view. A Reshape that merges it into
        another axis ([1,S,E] -> [S,E], [S,1,H*D] -> [S,H,D]) leaves a tensor without a batch
        axis (batch -1): its per-sample shape is its full shape, which is exact at batch 1.
        A later view that brings back a unit axis gives the batch its place again.
        """
        x = node.input[0]
        if x not in self.env:
            raise self.err(node, f"input '{x}' is not an activation")
        ref = self.env[x]
        out = node.output[0]
        full = self.full_shape(out, node)
        t = node.op_type
        b = ref.batch
        if t == "Transpose":
            perm = list(_attr(node, "perm") or reversed(range(len(ref.full))))
            nb = perm.index(b) if b >= 0 else -1
        elif t == "Squeeze":
            axes = self._axes(node, len(ref.full))
            nb = -1 if b < 0 or b in axes else b - sum(a < b for a in axes)
        elif t == "Unsqueeze":
            axes = self._axes(node, len(full))
            if b < 0:
                nb = axes[0]
            else:
                kept = [i for i in range(len(full)) if i not in axes]
                nb = kept[b]
        elif t == "Flatten":
            axis = _attr(node, "axis", 1) % max(len(ref.full), 1)
            nb = 0 if b == 0 and axis == 1 else (0 if full[0] == 1 else -1)
        elif t == "Reshape":
            nb = _batch_after_reshape(ref.full, b, full)
        else:  # Identity, Dropout, Cast
            nb = b
        shape = full[:nb] + full[nb + 1:] if nb >= 0 else full
        order = _transpose_order(ref.order, ref.full, perm) if t == "Transpose" else ref.order
        self.env[out] = _Ref(ref.src, shape, nb, node.name or ref.view, full, order, ref.mult, ref.pending)
        if x in self.masks:
            self.masks.add(out)

    def prune(self, last: str) -> None:
        """Drop layers nothing reads that hold no weights and do no MACs: pieces of a mask
        computed from an input (HF BERT's attention mask), which no layer consumes."""
        while True:
            used = {i for l in self.layers for i in l["inputs"]} | {last}
            dead = {l["name"] for l in self.layers if l["name"] not in used and not self.built[l["name"]].params
                    and not self.built[l["name"]].fwd_macs}
            if not dead:
                return
            self.layers = [l for l in self.layers if l["name"] not in dead]

    def _axes(self, node, rank: int) -> list[int]:
        axes = _attr(node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = self.const_value(node.input[1], node)
        if axes is None:
            raise self.err(node, "Squeeze without explicit axes is not supported")
        return sorted(int(a) % rank for a in axes)

    def const_value(self, t: str, node):
        """Value of a small constant (Constant node or initializer)."""
        import onnx
        for n in self.g.node:
            if n.op_type == "Constant" and n.output[0] == t:
                v = _attr(n, "value")
                if v is not None:
                    return onnx.numpy_helper.to_array(v).reshape(-1).tolist()
                for k in ("value_ints", "value_int"):
                    v = _attr(n, k)
                    if v is not None:
                        return list(v) if isinstance(v, (list, tuple)) else [v]
        init = self.inits.get(t)
        if init is not None and init.data_location != onnx.TensorProto.EXTERNAL:
            return onnx.numpy_helper.to_array(init).reshape(-1).tolist()
        raise self.err(node, f"'{t}' must be a constant computable without running the graph")


    def scale(self, node, x: str) -> None:
        """Activation (+-*/) constant: a bias of the layer before it, a learned tensor (positions,
        counted), or a folded scale/mask (its elementwise cost ignored)."""
        ref = self.env.get(x)
        if ref is None:
            raise self.err(node, f"input '{x}' is not an activation")
        c = next(i for i in node.input if i and i != x)
        last = self.layers[-1] if self.layers else None
        cdims = self.dims.get(c, ())
        if (node.op_type == "Add" and last is not None and ref.src == last["name"]
                and last["type"] == "dense" and not last.get("bias") and self.consumers.get(x, 0) == 1
                and prod(cdims) == last["units"] and ref.shape == self.built[last["name"]].out_shape):
            last["bias"] = True   # MatMul + Add(bias): PyTorch's form of a Linear on sequences
            self.built[last["name"]] = self.probe(node, last)
            self.wsrc.setdefault(last["name"], {})["b"] = ("t", c, "flat")
            for o in self.origin.get(c, ()):
                self.owner.setdefault(o, last["name"])
            self.env[node.output[0]] = ref
            return
        params = [o for o in sorted(self.origin.get(c, ())) if self.is_param(o) and o not in self.owner]
        if ref.src in self.ln_parts and node.op_type in ("Mul", "Add"):
            for o in params:   # gamma and beta: already counted by the layernorm layer (2d)
                self.owner.setdefault(o, ref.src)
            w = self.wsrc.setdefault(ref.src, {})
            n = prod(self.dims.get(c, ()))
            if n == 1 and node.op_type == "Add" and "gamma" not in w:
                w["eps"] = ("t", c, "scalar")          # the variance's epsilon
            elif node.op_type == "Mul":
                w["gamma"] = ("t", c, "flat")
            else:
                w["beta"] = ("t", c, "flat")
            return self.alias(node, x)
        lay = self.built.get(ref.src)
        if not params and node.op_type == "Add" and lay is not None and lay.type == "embedding" \
                and self.init_type.get(c) in (1, 10, 11, 16) and self.dims.get(c, (0,))[-1] == lay.out_shape[-1] \
                and c not in self.owner and not self.origin.get(c, frozenset()) & set(self.owner):
            params = [c]   # a position table the exporter already looked up (folded Gather): its rows
            if self.sig_params is not None:   # dynamo: the table itself is not in the file
                self.folded_tables.append((c, tuple(self.dims.get(c, ()))))
        if params and node.op_type in ("Add", "Sub"):
            return self.param_add(node, x, c, params)
        self.fold_const(node, x, c)

    def fold_const(self, node, x: str, c: str) -> None:
        """x (+-*/) a constant that is no parameter: a scalar factor travels with the tensor (a
        matmul takes it in: attention's 1/sqrt(d)); adding 0 or multiplying by 1 changes nothing;
        anything else is a folded operation no layer computes (noted where it is read)."""
        ref = self.env[x]
        op = node.op_type
        first = node.input[0] == c
        v = self.value_any(c)
        if v is not None and v.dtype.kind not in "biuf":
            v = None   # not a number: nothing to fold
        if v is not None and v.size == 1 and op in ("Mul", "Div") and not (op == "Div" and first) \
                and float(v.ravel()[0]) != 0:
            f = float(v.ravel()[0]) if op == "Mul" else 1.0 / float(v.ravel()[0])
            lay = self.built.get(ref.src)
            if lay is not None and lay.type == "matmul" and ref.view is None and ref.order is None \
                    and ref.mult == 1.0 and not ref.pending and self.consumers.get(x, 0) == 1:
                d = self.layers[self.order[ref.src]]   # (q k^T) * scale: the matmul's own factor
                d["scale"] = float(d.get("scale", 1.0) * f)
                self.built[ref.src] = self.probe(node, d)
                return self.alias(node, x)
            return self.alias(node, x, mult=ref.mult * f)
        if op == "Add" and v is not None and self.causal_matmul(node, x, additive=v):
            return self.alias(node, x)
        try:
            same = v is not None and tuple(np.broadcast_shapes(v.shape, ref.full)) == tuple(ref.full)
        except ValueError:
            same = False
        noop = same and not (first and op in ("Sub", "Div")) and (
            (op in ("Add", "Sub") and not v.any()) or (op in ("Mul", "Div") and bool((v == 1).all())))
        self.alias(node, x, folded=not noop)

    def is_param(self, t: str) -> bool:
        """A trainable tensor of the file: a float initializer with more than one element that the
        exporter did not make up (and, when dynamo recorded them, one of the PARAMETERs)."""
        if t not in self.originals or t not in self.inits:
            return False
        if self.init_type.get(t) not in (1, 10, 11, 16) or prod(self.dims.get(t, ())) < 2:
            return False
        if self.sig_params is not None:
            return t in self.sig_params
        return not t.startswith("onnx::")

    def param_add(self, node, x: str, c: str, params: list[str]) -> None:
        """x + a learned tensor: position / token-type tables on an embedding, else add_param."""
        ref = self.env[x]
        lay = self.built.get(ref.src)
        tables = [(prod(self.dims[p]) // self.dims[p][-1], self.dims[p][-1]) if len(self.dims[p]) > 2
                  and lay is not None and lay.type == "embedding" else self.dims[p] for p in params]
        if lay is not None and lay.type == "embedding" and ref.shape == lay.out_shape \
                and all(len(d) == 2 and d[1] == lay.out_shape[-1] for d in tables):
            d = self.layers[self.order[ref.src]]
            w = self.wsrc.setdefault(ref.src, {})
            for (rows, _), p in zip(tables, params):
                if not d.get("positions") and rows >= lay.out_shape[0]:
                    d["positions"] = rows
                    w["positions"] = ("t", p, "rows")
                else:
                    d["token_types"] = d.get("token_types", 0) + rows
                    prev = w.get("token_types", ("cat", (), 0))[1]
                    w["token_types"] = ("cat", prev + (p,), "rows")
            self.built[ref.src] = self.probe(node, d)
            for p in params:
                self.owner.setdefault(p, ref.src)
            # the forward adds what the graph adds (rows already looked up, or a slice of the table)
            self.wsrc.setdefault(ref.src, {}).setdefault("adds", []).append(
                ("t", c, "neg" if node.op_type == "Sub" else None))
            return self.alias(node, x)
        shape = list(tables[0]) if len(tables) == 1 else list(self.full_shape(c, node))
        if node.input[0] == c and node.op_type == "Sub":
            self.note(node, "a learned tensor minus the activation: add_param adds the activation")
        name = self.add_layer(node, node.name or f"add_param_{len(self.layers)}", "add_param", [self.use(x, node)],
                              {"param_shape": shape})
        self.wsrc[name] = {"p": ("t", c, "neg" if node.op_type == "Sub" else None)}
        for p in params:
            self.owner.setdefault(p, name)
        self.bind(node, node.output[0], name, like=x)


    def linear(self, node, acts) -> None:
        """Gemm/MatMul: dense with a constant weight, matmul between two activations."""
        t = node.op_type
        a, b = node.input[0], node.input[1]
        out = node.output[0]
        if a not in self.env:
            raise self.err(node, "the first input must be an activation")
        if t == "Gemm" and _attr(node, "transA", 0):
            raise self.err(node, "Gemm with transA=1 is not supported")
        if b in self.const:
            wd = self.full_shape(b, node)
            if len(wd) != 2:
                raise self.err(node, f"a {t} weight must be 2-D, got {list(wd)}")
            trans = t == "Gemm" and _attr(node, "transB", 0)
            units = wd[0] if trans else wd[1]
            bias = t == "Gemm" and len(node.input) > 2 and bool(node.input[2])
            bias = bias or _dropped_bias(node)
            consts = [b] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else [])
            if t == "Gemm" and (_attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0):
                self.note(node, "Gemm with alpha or beta other than 1")
            w = {"W": ("t", b, "T" if trans else None)}   # the dense layer's W is (in, units)
            if _fused_bn(node, "Gemm"):   # dynamo folded a BatchNorm1d in: it comes back as a layer
                own = _fused_own_bias(node, "Gemm")
                if own:   # its own bias starts at 0: (b - mean) * s + beta is all in beta, same function
                    w["b"] = ("zeros", units)
                name = self.emit(node, out, "dense", [self.use(a, node)], {"units": units, "bias": own}, consts,
                                 weight=b, like=a, weights=w)
                self.emit(node, out, "batchnorm", [name], {}, base=f"{node.name or name}_bn", like=out,
                          weights=_folded_bn_weights(node, units))
                return
            if bias:
                w["b"] = ("t", node.input[2], "flat") if len(consts) > 1 else ("zeros", units)
            self.emit(node, out, "dense", [self.use(a, node)], {"units": units, "bias": bias}, consts, weight=b,
                      like=a, weights=w)
            return
        if b not in self.env:
            raise self.err(node, f"input '{b}' is neither a constant nor an activation")
        tb = bool(t == "Gemm" and _attr(node, "transB", 0))
        ra = self.env[a]
        aname = self.use(a, node, absorb=True)   # resolve in input order so inserted views come out in that order
        rb = self.env[b]
        src_b = self.src_shape(rb.src)
        swapped = src_b[:-2] + (src_b[-1], src_b[-2]) if len(src_b) >= 2 else None
        if not tb and rb.shape == swapped and rb.shape != src_b and rb.order not in (None, UNKNOWN) \
                and _canon(*rb.order) == _canon(src_b, tuple(range(len(src_b) - 2)) + (len(src_b) - 1, len(src_b) - 2)):
            tb = True  # MatMul(a, Transpose(b)) on the last two axes: read b directly
            bname = rb.src
        else:
            bname = self.use(b, node, absorb=True)
        for r, name in ((ra, a), (rb, b)):
            if r.pending:
                self.note(node, f"'{name}' carries folded {', '.join(r.pending)} that no layer computes")
        scale = ra.mult * rb.mult
        sa, sb = self.src_shape(aname), self.src_shape(bname)
        if len(sa) != len(sb) and _squeezed(sa[:-2]) == _squeezed(sb[:-2]):
            # one side lost its unit batch axis in a reshape: give both the longer rank
            tgt, n = (sa, bname) if len(sa) > len(sb) else (sb, aname)
            other = self.src_shape(n)
            want = tgt[:-2] + other[-2:]
            v = self.add_layer(None, f"{n}_view", "reshape", [n], {"shape": list(want)})
            aname, bname = (aname, v) if n == bname else (v, bname)
        self.emit(node, out, "matmul", [aname, bname],
                  {"transpose_b": tb, **({"scale": scale} if scale != 1.0 else {})}, like=a)


    def lstm(self, node) -> None:
        """ONNX LSTM -> lstm layer; Y keeps its [S, dirs, N, h] view of the layer's (S, dirs*h);
        Y_h (h_n) is the last step's output, a take layer (the reverse direction's final state
        sits at step 0: same size, so the counts and shapes hold)."""
        x = node.input[0]
        ref = self.env.get(x)
        if ref is None:
            raise self.err(node, "X must be an activation")
        layout = _attr(node, "layout", 0)
        if ref.batch != (0 if layout else 1):
            raise self.err(node, f"X has its batch on axis {ref.batch}, LSTM layout={layout} expects "
                                 f"{0 if layout else 1}")
        for extra in node.input[4:]:
            if extra and extra not in self.const:
                raise self.err(node, "sequence_lens and initial states must be constants")
        if len(node.output) > 2 and node.output[2] and node.output[2] in self.live_reads:
            raise self.err(node, "reading Y_c (the cell state) is not supported (only Y and Y_h)")
        direction = _str(_attr(node, "direction", "forward"))
        h = _attr(node, "hidden_size") or self.full_shape(node.input[2], node)[-1]
        attrs = {"hidden": int(h), "bidirectional": direction == "bidirectional"}
        name = self.add_layer(node, node.name or f"lstm_{len(self.layers)}", "lstm", [self.use(x, node)], attrs)
        self.wsrc[name] = {"W": ("t", node.input[1], None), "R": ("t", node.input[2], None),
                           "B": ("t", node.input[3], None) if len(node.input) > 3 and node.input[3]
                           else ("zeros", 8 * int(h) * (2 if attrs["bidirectional"] else 1))}
        for k, i in (("h0", 5), ("c0", 6)):
            if len(node.input) > i and node.input[i]:
                self.wsrc[name][k] = ("t", node.input[i], None)
        if len(node.input) > 4 and node.input[4]:
            self.wsrc[name]["seq_lens"] = ("t", node.input[4], None)
        odd = [k for k in ("activations", "clip", "input_forget") if _attr(node, k) not in (None, 0, [])]
        if odd and _attr(node, "activations") not in (None, [b"Sigmoid", b"Tanh", b"Tanh"] * (1 + attrs["bidirectional"])):
            self.note(node, f"LSTM with {', '.join(odd)}: the lstm layer has sigmoid/tanh gates, no clip or coupling")
        for o in frozenset().union(*(self.origin.get(c, frozenset()) for c in node.input[1:4] if c)):
            self.owner.setdefault(o, name)
        y = node.output[0]
        if y and self.dims.get(y):
            full = self.full_shape(y, node)
            nb = 1 if layout else 2
            shape = full[:nb] + full[nb + 1:]
            if prod(shape) != prod(self.built[name].out_shape):
                raise self.err(node, f"Y {list(full)} does not match the lstm layer "
                                     f"{list(self.built[name].out_shape)}")
            self.env[y] = _Ref(name, shape, nb, node.name or None, full)
        if len(node.output) > 1 and node.output[1] in self.live_reads:
            steps = self.built[name].out_shape[0]
            base = f"{node.name or name}_h_n"
            hn = self.add_layer(node, base, "take", [name], {"index": steps - 1})
            if attrs["bidirectional"]:   # the reverse direction ends at step 0: [fwd at S-1, rev at 0]
                hr = self.add_layer(node, f"{base}_rev", "take", [name], {"index": 0})
                h_ = int(h)
                f = self.add_layer(node, f"{base}_fwd_half", "slice", [hn], {"axis": 0, "start": 0, "end": h_})
                r = self.add_layer(node, f"{base}_rev_half", "slice", [hr], {"axis": 0, "start": h_, "end": 2 * h_})
                hn = self.add_layer(node, f"{base}_cat", "concat", [f, r], {"axis": 0})
            full = self.full_shape(node.output[1], node)          # [dirs, N, h] (layout 0) or [N, dirs, h]
            nb = 0 if layout else 1
            self.env[node.output[1]] = _Ref(hn, full[:nb] + full[nb + 1:], nb, None, full)


    def gather(self, node, acts) -> None:
        """Gather: embedding (constant table), take (scalar index on the first axis), or a slice."""
        data, idx = node.input[0], node.input[1]
        out = node.output[0]
        axis = _attr(node, "axis", 0)
        if data in self.const and idx in self.env:
            wd = self.full_shape(data, node)
            if len(wd) != 2 or axis != 0:
                raise self.err(node, "an embedding Gather needs a 2-D table and axis=0")
            if idx not in self.index_tensors:   # ONNX's Gather takes int32/int64 indices only
                raise self.err(node, f"an embedding Gather needs integer indices (int32 or int64); '{idx}' is float")
            self.emit(node, out, "embedding", [self.use(idx, node)], {"vocab": wd[0], "dim": wd[1]}, [data],
                      weight=data, like=idx, weights={"table": ("t", data, None)})
            return
        if data in self.env and idx in self.const:
            ref = self.env[data]
            iv = [int(i) for i in self.const_value(idx, node)]
            rank = len(ref.full)
            ax = axis % rank
            pa = self._per_sample_axis(node, data, ax)
            dim = ref.full[ax]
            iv = [i % dim for i in iv]
            scalar = len(self.full_shape(idx, node)) == 0
            if scalar and pa == 0 and len(ref.shape) >= 2:
                self.emit(node, out, "take", [self.use(data, node)], {"index": iv[0]}, like=data)
                return
            if iv != list(range(iv[0], iv[0] + len(iv))):
                raise self.err(node, "a Gather of an activation needs a contiguous run of constant indices")
            name = self.add_layer(node, node.name or f"gather_{len(self.layers)}", "slice", [self.use(data, node)],
                                  {"axis": pa, "start": iv[0], "end": iv[0] + len(iv)})
            self.bind(node, out, name, like=data)
            return
        return self.unsupported(node, acts)

    def group(self, tag: dict, nodes: list) -> None:
        """A tagged subgraph (composite layer) regrouped into one layer."""
        inside = {o for n in nodes for o in n.output}
        ins, consts = [], []
        for n in nodes:
            for i in n.input:
                if not i or i in inside:
                    continue
                if i in self.const:
                    consts.append(i)
                elif i not in ins:
                    ins.append(i)
        members = {id(n) for n in nodes}
        read_outside = {i for m in self.g.node if id(m) not in members for i in m.input}
        read_outside |= {x.name for x in self.g.output}
        outs = list(dict.fromkeys(o for n in nodes for o in n.output if o and o in read_outside))
        if len(outs) != 1:
            raise self.err(nodes[0], f"tagged layer '{tag.get('layer')}' must have exactly one output, got {outs}")
        attrs = tag.get("attrs") or {}
        if not isinstance(attrs, dict) or not isinstance(tag.get("type"), str):
            raise self.err(nodes[0], "malformed bapipe tag: 'type' must be a string and 'attrs' a mapping")
        tied = tag.get("tied_to")
        name = self.add_layer(nodes[0], str(tag["layer"]), tag["type"], [self.use(i, nodes[0]) for i in ins],
                              dict(attrs), tied if isinstance(tied, str) and tied in self.built else None)
        for o in frozenset().union(*(self.origin.get(c, frozenset()) for c in consts)):
            self.owner.setdefault(o, name)
            self.weight_owner.setdefault(o, name)   # our own exporter's tags: sharing there is a real tie
        self.bind(nodes[0], outs[0], name, ins[0] if ins else None)

    # -- driver --------------------------------------------------------------------------
    def run(self) -> dict:
        """The model document: inputs and layers in topological order."""
        inits = set(self.inits)
        inputs = []
        self.input_shapes: dict[str, tuple] = {}
        for vi in self.g.input:
            if vi.name in inits:
                continue
            full = self.full_shape(vi.name)
            if len(full) < 2:
                raise SpecError(self.file, None, f"input '{vi.name}'",
                                f"expected a batch axis and at least one more, got {list(full)}")
            # [S, 1, F] with a static S > 1: PyTorch's sequence-first layout (nn.LSTM, nn.Transformer*)
            # exported at batch 1; anything else is batch-first
            b = 1 if len(full) == 3 and full[0] > 1 and full[1] == 1 else 0
            shape = full[:b] + full[b + 1:]
            self.names.add(vi.name)
            self.input_shapes[vi.name] = shape
            self.env[vi.name] = _Ref(vi.name, shape, b, None, full)
            inputs.append({"name": vi.name, "shape": list(shape),
                           "dtype": "int" if vi.name in self.int_tensors else "float"})
        for tag, nodes in self.units():
            try:
                if tag is not None:
                    self.group(tag, nodes)
                else:
                    self.check_arity(nodes[0])
                    try:
                        self.op(nodes[0])
                    except SpecError as e:
                        t = nodes[0].op_type
                        if "--opaque" in e.expected or not e.field.startswith("node "):
                            raise
                        # every refusal says what would make it work: a mapping, or the user's cost
                        raise SpecError(e.file, e.line, e.field, f"{e.expected} (or give its cost with "
                                                                 f"--opaque {t}=FWD_S,BWD_S)") from None
            except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
                # a graph shape inference accepted but this importer cannot read: name the node, not a traceback
                raise self.err(nodes[0], f"malformed or unsupported use of {nodes[0].op_type} "
                                         f"({type(e).__name__}: {e})"[:300]) from None
        outs = [o.name for o in self.g.output if o.name in self.env and o.name not in self.masks]
        if not outs:
            raise SpecError(self.file, None, "graph.output",
                            f"output '{self.g.output[0].name}' does not depend on any input")
        lasts = list(dict.fromkeys(self.use(o, None) for o in outs))
        if self._stash:
            self.notes["graph output"] = "; ".join(dict.fromkeys(self._stash))
            self._stash.clear()
        if len(lasts) > 1:
            # several results (BERT's sequence and pooled outputs): carried to the end side by side
            flat = [n if len(self.src_shape(n)) == 1 else self.add_layer(None, f"{n}_flat", "flatten", [n], {})
                    for n in lasts]
            lasts = [self.add_layer(None, "outputs", "concat", flat, {"axis": 0})]
        last = lasts[0]
        self.prune(last)
        if not self.layers or last != self.layers[-1]["name"]:
            raise SpecError(self.file, None, "graph.output", f"output '{outs[0]}' is not produced by the last layer")
        used = {i for l in self.layers for i in l["inputs"]}
        inputs = [i for i in inputs if i["name"] in used]
        desc = self.description
        if self.folded_tables:
            desc = f"{desc}; {folded_note(self.folded_tables)}"
        if self.folded_convs:
            desc = f"{desc}; {folded_conv_note(self.folded_convs)}"
        return {"name": self.name, "description": desc, "inputs": inputs, "layers": self.layers}


def onnx_np_type(elem_type: int):
    """The numpy dtype of an ONNX tensor element type."""
    import onnx
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def folded_note(tables: list[tuple[str, tuple]]) -> str:
    """What a dynamo export with its default optimizer lost: an embedding lookup with constant
    indices (positions, token types) is stored as the rows it read, not as the table, so the
    table's size is not in the file and the count holds the rows read instead."""
    what = ", ".join(f"'{n}' {list(d)}" for n, d in tables)
    return (f"the exporter folded constant-index embedding lookups into {what}: the table sizes are not "
            f"in the file, so parameters count the {sum(prod(d) for _n, d in tables)} values read; export with "
            f"torch.onnx.export(..., dynamo=True, optimize=False) for exact counts")


def folded_conv_note(convs: list[str]) -> str:
    """What a legacy export in eval mode loses: it folds each BatchNormalization into the Conv
    before it (W * s, (b - mean) * s + beta), so whether the Conv had a bias of its own (nn.Conv2d's
    default) is not in the file. None is counted (torchvision's convention, bias=False before a
    batch norm); torch counts out_channels more for each that had one. dynamo keeps the name."""
    shown = ", ".join(repr(c) for c in convs[:3]) + (f" and {len(convs) - 3} more" if len(convs) > 3 else "")
    return (f"the exporter folded batch norms into {len(convs)} convolution(s) ({shown}): whether they had a bias "
            f"of their own is not in the file, so none is counted (torch counts out_channels more for each that "
            f"had); export with torch.onnx.export(..., dynamo=True) for exact counts")


def _fix_batch(model) -> None:
    """Give every graph input a batch of 1 so shape inference yields concrete shapes."""
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if dims and not (dims[0].HasField("dim_value") and dims[0].dim_value > 0):
            dims[0].Clear()
            dims[0].dim_value = 1


def _infer(file: str):
    """Shape inference with batch 1; strict failures become one-line SpecErrors."""
    from onnx import shape_inference

    def infer(m, strict: bool = True):
        try:
            return shape_inference.infer_shapes(m, strict_mode=strict, data_prop=True)
        except Exception as e:  # InferenceError, ValidationError: bad or inconsistent graph
            if not strict:
                return m
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecError(file, None, "graph", f"ONNX shape inference failed: {msg[:300]}") from None
    return infer


#: oldest default-domain opset the importer reads (PyTorch's legacy exporter writes 7 and up)
MIN_OPSET = 7


def check_proto(model, file: str) -> None:
    """Refuse, in one line, a ModelProto that is not a model this importer can read at all:
    no graph (an empty or 0-byte file parses as one), no inputs, nodes or outputs, or a
    default-domain opset outside what the installed onnx package defines (an opset 99
    file would be read by opset-23 rules: a silent misreading)."""
    import onnx

    g = model.graph
    inits = {t.name for t in g.initializer}
    if not g.node or not g.output or not [i for i in g.input if i.name not in inits]:
        what = ", ".join(w for w, ok in (("inputs", [i for i in g.input if i.name not in inits]),
                                         ("nodes", g.node), ("outputs", g.output)) if not ok)
        raise SpecError(file, None, "graph", f"expected a graph with inputs, nodes and outputs; it has no {what}")
    for t in g.initializer:
        _check_initializer(t, file)
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and not MIN_OPSET <= o.version <= newest:
            raise SpecError(file, None, "opset_import", f"expected a default-domain opset from {MIN_OPSET} to {newest} "
                                                        f"(onnx {onnx.__version__}), got {o.version}")


#: element types whose stored bytes are whole elements (packed 2/4/6-bit types are not checked)
_BYTE_TYPES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}


def _check_initializer(t, file: str) -> None:
    """An initializer's dims are >= 0 and its inline data holds exactly that many elements
    (a cut file or a hand edit once reached numpy's reshape as a ValueError)."""
    import onnx

    if any(d < 0 for d in t.dims):
        raise SpecError(file, None, "graph.initializer", f"'{t.name}' has a negative dim {list(t.dims)}")
    if t.data_location == onnx.TensorProto.EXTERNAL or t.data_type not in _BYTE_TYPES:
        return
    n = prod(t.dims)
    if t.raw_data:
        got = len(t.raw_data) // _BYTE_TYPES[t.data_type]
        if len(t.raw_data) != n * _BYTE_TYPES[t.data_type]:
            raise SpecError(file, None, "graph.initializer", f"'{t.name}' has dims {list(t.dims)} ({n} elements) "
                                                             f"but {len(t.raw_data)} bytes of data ({got} elements)")
        return
    got = sum(len(f) for f in (t.float_data, t.int32_data, t.int64_data, t.double_data, t.uint64_data))
    if got != n:
        raise SpecError(file, None, "graph.initializer", f"'{t.name}' has dims {list(t.dims)} ({n} elements) "
                                                         f"but holds {got} values")


def import_model_proto(model, file: str = "<onnx>", opaque: dict[str, tuple[float, float]] | None = None) -> Model:
    """Import an in-memory ONNX ModelProto (weights need not be loaded)."""
    return import_with_sources(model, file, opaque)[0]


def import_with_sources(model, file: str = "<onnx>", opaque: dict[str, tuple[float, float]] | None = None):
    """(Model, importer): the importer keeps where each layer's weights are in the (folded)
    graph (``wsrc``) and what the layers do not compute (``notes``); bapipe.onnx_weights reads them."""
    import onnx

    from .onnx_fold import fold_constants, light_copy

    check_proto(model, file)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _fix_batch(m)
    del m.graph.value_info[:]
    infer = _infer(file)
    folded = fold_constants(m, infer)
    inferred = infer(light_copy(folded.model))
    imp = _Importer(inferred, file, opaque, folded)
    imp.read_shapes(inferred)
    imp.mark_constants()
    doc = imp.run()
    model = parse_model(doc, file, file)
    if imp.folded_tables:   # counted, but the user must know the count is not torch's
        _note_once(f"{file}: note: {folded_note(imp.folded_tables)}")
    if imp.folded_convs:    # the count may not be torch's: the user must know why
        _note_once(f"{file}: note: {folded_conv_note(imp.folded_convs)}")
    return model, imp


#: notes already printed by this process: a command reads its model more than once (gen: the
#: plan's check, the weights, the lowering), the user reads each note once
_NOTED: set[str] = set()


def _note_once(line: str) -> None:
    if line not in _NOTED:
        _NOTED.add(line)
        print(line, file=sys.stderr)


def load_onnx(path: str, opaque: dict[str, tuple[float, float]] | None = None) -> Model:
    """Load an .onnx file as a Model; ``opaque`` maps op types to (fwd_s, bwd_s) costs."""
    try:
        import onnx
    except ImportError:  # pragma: no cover
        raise SpecError(path, None, None, "the 'onnx' package is not installed") from None
    p = Path(path)
    if not p.is_file():
        raise SpecError(path, None, None, "expected an ONNX file, got a folder" if p.is_dir() else "file not found")
    if p.stat().st_size == 0:
        raise SpecError(path, None, None, "expected an ONNX model, got an empty file (0 bytes)")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # DecodeError and friends: not an ONNX file
        raise SpecError(path, None, None, f"not a readable ONNX model ({type(e).__name__})") from None
    return import_model_proto(model, path, opaque)


def parse_opaque(items: list[str] | None, file: str = "--opaque") -> dict[str, tuple[float, float]]:
    """Parse ``OP=fwd_s,bwd_s`` options into {op_type: (fwd_s, bwd_s)}."""
    out: dict[str, tuple[float, float]] = {}
    for it in items or []:
        op, eq, rest = it.partition("=")
        parts = rest.split(",")
        try:
            vals = [float(x) for x in parts]
        except ValueError:
            vals = []
        if not eq or not op.strip() or len(vals) != 2 or any(not (v >= 0 and v < float("inf")) for v in vals):
            raise SpecError(file, None, it, "expected OP=FWD_S,BWD_S with two non-negative seconds, e.g. Erf=1e-5,2e-5")
        out[op.strip()] = (vals[0], vals[1])
    return out
