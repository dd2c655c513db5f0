"""Layer types: attribute schema, shape inference and per-layer counts.

Counting conventions (docs/models.md):
- a MAC is one multiply-accumulate; fwd_macs counts only those (conv, dense, matmul,
  attention, LSTM), so totals match the published "GMAC" figures of torchvision/ptflops;
- elementwise work (activations, norms, pooling, adds) is counted in ``fwd_ops``;
- backward = input-grad + weight-grad. For a weighted linear map both equal the forward
  MACs; activation x activation products (attention scores) need two input grads and no
  weight grad (Narayanan et al. SC'21 use the same 2x-forward backward rule).
- shapes are per sample, without the batch dimension: images (C, H, W), sequences (S, F).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .yamlio import Fields

Shape = tuple[int, ...]


def prod(shape: Shape) -> int:
    """Number of elements of a shape."""
    return math.prod(shape) if shape else 1


@dataclass(frozen=True)
class Layer:
    """One layer with its shapes and derived counts (per sample)."""

    name: str
    type: str
    inputs: tuple[str, ...]
    in_shapes: tuple[Shape, ...]
    out_shape: Shape
    attrs: tuple[tuple[str, object], ...] = ()
    params: int = 0
    fwd_macs: int = 0
    bwd_in_macs: int = 0
    bwd_w_macs: int = 0
    fwd_ops: int = 0
    tied_to: str | None = None

    @property
    def attr(self) -> dict:
        """Attributes as a dict (kernel, stride, units, ...)."""
        return dict(self.attrs)

    @property
    def in_elems(self) -> int:
        """Input activation elements (all inputs) per sample."""
        return sum(prod(s) for s in self.in_shapes)

    @property
    def out_elems(self) -> int:
        """Output activation elements per sample."""
        return prod(self.out_shape)

    @property
    def bwd_macs(self) -> int:
        """Backward MACs: input grad plus weight grad."""
        return self.bwd_in_macs + self.bwd_w_macs

    @property
    def weight_params(self) -> int:
        """Parameters this layer stores (0 when tied to another layer's weights)."""
        return 0 if self.tied_to else self.params

    def to_dict(self) -> dict:
        """JSON/YAML-friendly record with derived counts."""
        return {
            "name": self.name, "type": self.type, "inputs": list(self.inputs),
            "in_shapes": [list(s) for s in self.in_shapes], "out_shape": list(self.out_shape),
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in self.attrs},
            "params": self.params, "fwd_macs": self.fwd_macs, "bwd_in_macs": self.bwd_in_macs,
            "bwd_w_macs": self.bwd_w_macs, "fwd_ops": self.fwd_ops,
            **({"tied_to": self.tied_to} if self.tied_to else {}),
        }


@dataclass
class _Ctx:
    """What a layer builder gets: its fields, input shapes and an error helper."""

    f: Fields
    in_shapes: list[Shape]
    name: str

    def err(self, key, msg):
        return self.f.err(key, msg)

    def one_input(self, rank: int | tuple[int, ...] | None = None) -> Shape:
        if len(self.in_shapes) != 1:
            raise self.err("inputs", f"expected exactly one input, got {len(self.in_shapes)}")
        s = self.in_shapes[0]
        ranks = (rank,) if isinstance(rank, int) else rank
        if ranks is not None and len(s) not in ranks:
            raise self.err("inputs", f"expected an input of rank {' or '.join(map(str, ranks))}, got shape {list(s)}")
        return s


@dataclass
class _Out:
    shape: Shape
    attrs: dict = field(default_factory=dict)
    params: int = 0
    fwd: int = 0
    bwd_in: int = 0
    bwd_w: int = 0
    ops: int = 0


def _pair(c: _Ctx, key: str, default) -> tuple[int, int]:
    v = c.f.raw(key, default)
    if isinstance(v, tuple):  # the default
        return v
    if isinstance(v, bool) or not (isinstance(v, int) or isinstance(v, list)):
        raise c.err(key, f"expected an integer or a list of 2 integers, got {v!r}")
    if isinstance(v, int):
        v = [v, v]
    if len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise c.err(key, f"expected an integer or a list of 2 integers, got {v!r}")
    return int(v[0]), int(v[1])


def pool_out(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    """Output length of a window over ``size`` (padding ``p`` each side). ``ceil`` is PyTorch's
    (and ONNX's) ceil_mode: a last, partial window is kept when it starts inside the input or
    its left padding (so it never starts in the right padding)."""
    span = size + 2 * p - k
    if not ceil:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= size + p else out


def _window(c: _Ctx, shape: Shape, kernel_default=None, stride_default=None, ceil: bool = False) -> tuple:
    C, H, W = shape
    kh, kw = _pair(c, "kernel", kernel_default if kernel_default is not None else ...)
    sh, sw = _pair(c, "stride", stride_default if stride_default is not None else (kh, kw))
    ph, pw = _pair(c, "padding", (0, 0))
    if min(kh, kw, sh, sw) < 1:
        raise c.err("kernel", "kernel and stride must be >= 1")
    if min(ph, pw) < 0:
        raise c.err("padding", "padding must be >= 0")
    if ph >= kh or pw >= kw:
        raise c.err("padding", f"padding must be smaller than the kernel ({kh}x{kw})")
    ho, wo = pool_out(H, kh, sh, ph, ceil), pool_out(W, kw, sw, pw, ceil)
    if ho < 1 or wo < 1 or H + 2 * ph < kh or W + 2 * pw < kw:
        raise c.err("kernel", f"kernel {kh}x{kw} does not fit the {H}x{W} input (padding {ph},{pw})")
    return (kh, kw), (sh, sw), (ph, pw), ho, wo


def _conv2d(c: _Ctx) -> _Out:
    C, H, W = c.one_input(3)
    co = c.f.int("out_channels")
    groups = c.f.int("groups", 1)
    bias = c.f.bool("bias", True)
    (kh, kw), (sh, sw), (ph, pw), ho, wo = _window(c, (C, H, W), stride_default=(1, 1))
    if C % groups or co % groups:
        raise c.err("groups", f"groups={groups} must divide in_channels={C} and out_channels={co}")
    k = (C // groups) * kh * kw
    macs = co * ho * wo * k
    return _Out((co, ho, wo), {"out_channels": co, "kernel": (kh, kw), "stride": (sh, sw), "padding": (ph, pw),
                               "groups": groups, "bias": bias},
                params=co * k + (co if bias else 0), fwd=macs, bwd_in=macs, bwd_w=macs,
                ops=co * ho * wo if bias else 0)


def _dense(c: _Ctx) -> _Out:
    s = c.one_input()
    units = c.f.int("units")
    bias = c.f.bool("bias", True)
    rows = prod(s[:-1])
    macs = rows * s[-1] * units
    return _Out(s[:-1] + (units,), {"units": units, "bias": bias}, params=s[-1] * units + (units if bias else 0),
                fwd=macs, bwd_in=macs, bwd_w=macs, ops=rows * units if bias else 0)


def _matmul(c: _Ctx) -> _Out:
    # key_mask: a third input, one value per key (column of the product): columns whose value is
    # "zero" (BERT's attention_mask) or "nonzero" (a key padding mask) are -inf
    key_mask = c.f.str("key_mask", None, choices=("zero", "nonzero"))
    if len(c.in_shapes) != 2 + bool(key_mask):
        raise c.err("inputs", f"matmul multiplies two activations{' and reads a key mask' if key_mask else ''}: "
                              f"expected {2 + bool(key_mask)} inputs, got {len(c.in_shapes)}")
    tb = c.f.bool("transpose_b", False)
    a, b = c.in_shapes[:2]
    if len(a) < 2 or len(b) < 2:
        raise c.err("inputs", f"matmul inputs must have rank >= 2, got {list(a)} and {list(b)}")
    bk, bn = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    if a[-1] != bk or a[:-2] != b[:-2]:
        raise c.err("inputs", f"shapes {list(a)} and {list(b)} do not multiply (transpose_b={tb})")
    macs = prod(a[:-2]) * a[-2] * a[-1] * bn
    # scale: a constant factor on the product (attention's 1/sqrt(d), folded from the exporter's Mul/Div)
    scale = c.f.num("scale", 1.0, positive=False)
    # causal: the product's entries above the diagonal are -inf (a causal mask folded from the graph)
    causal = c.f.bool("causal", False)
    if key_mask and prod(c.in_shapes[2]) != bn:
        raise c.err("inputs", f"a key mask needs one value per key ({bn}), got shape {list(c.in_shapes[2])}")
    return _Out(a[:-1] + (bn,), {"transpose_b": tb, **({"scale": scale} if scale != 1.0 else {}),
                                 **({"causal": True} if causal else {}), **({"key_mask": key_mask} if key_mask else {})},
                fwd=macs, bwd_in=2 * macs)


def _attention(c: _Ctx) -> _Out:
    """Multi-head attention with Q/K/V/O projections (self, or cross with a second input)."""
    if len(c.in_shapes) not in (1, 2):
        raise c.err("inputs", f"expected 1 input (self-attention) or 2 (query, memory), got {len(c.in_shapes)}")
    q = c.in_shapes[0]
    kv = c.in_shapes[-1]
    if len(q) != 2 or len(kv) != 2:
        raise c.err("inputs", f"expected (sequence, features) inputs, got {[list(s) for s in c.in_shapes]}")
    heads = c.f.int("heads")
    causal = c.f.bool("causal", False)
    bias = c.f.bool("bias", True)
    sq, d = q
    sk, dk = kv
    if dk != d:
        raise c.err("inputs", f"query and memory feature sizes differ ({d} vs {dk})")
    if d % heads:
        raise c.err("heads", f"heads={heads} must divide the model width {d}")
    proj = 2 * sq * d * d + 2 * sk * d * d          # Q and O on the query; K and V on the memory
    scores = 2 * sq * sk * d                          # Q K^T and P V over all heads
    return _Out((sq, d), {"heads": heads, "causal": causal, "bias": bias},
                params=4 * d * d + (4 * d if bias else 0), fwd=proj + scores, bwd_in=proj + 2 * scores,
                bwd_w=proj, ops=3 * heads * sq * sk)  # scale, exp, normalise


def _additive_attention(c: _Ctx) -> _Out:
    """Bahdanau (additive, normalised) attention as in GNMT: context of the query over memory."""
    if len(c.in_shapes) != 2:
        raise c.err("inputs", f"expected 2 inputs (query, memory), got {len(c.in_shapes)}")
    (sq, dq), (sk, dk) = [s if len(s) == 2 else (0, 0) for s in c.in_shapes]
    if not sq or not sk:
        raise c.err("inputs", "expected (sequence, features) inputs")
    units = c.f.int("units")
    proj = sq * dq * units + sk * dk * units
    score = sq * sk * units
    ctx = sq * sk * dk
    # params: W_q, W_k (no bias), score vector v, normalisation bias and scalar (GNMT's normalize=True)
    return _Out((sq, dk), {"units": units}, params=dq * units + dk * units + 2 * units + 1,
                fwd=proj + score + ctx, bwd_in=proj + score + 2 * ctx, bwd_w=proj + score,
                ops=sq * sk * (units + 3))


def _lstm(c: _Ctx) -> _Out:
    if not c.in_shapes or any(len(s) != 2 for s in c.in_shapes):
        raise c.err("inputs", "expected (sequence, features) inputs")
    seqs = {s[0] for s in c.in_shapes}
    if len(seqs) != 1:
        raise c.err("inputs", f"inputs have different sequence lengths {sorted(seqs)}")
    s = seqs.pop()
    f_in = sum(x[1] for x in c.in_shapes)  # several inputs are concatenated on features
    h = c.f.int("hidden")
    bidir = c.f.bool("bidirectional", False)
    dirs = 2 if bidir else 1
    macs = dirs * s * 4 * h * (f_in + h)
    # PyTorch's LSTM keeps two bias vectors (b_ih, b_hh), so published counts include 8h
    return _Out((s, dirs * h), {"hidden": h, "bidirectional": bidir},
                params=dirs * (4 * h * (f_in + h) + 8 * h), fwd=macs, bwd_in=macs, bwd_w=macs,
                ops=dirs * s * h * 10)


def _embedding(c: _Ctx) -> _Out:
    (s,) = c.one_input(1)
    vocab = c.f.int("vocab")
    dim = c.f.int("dim")
    positions = c.f.int("positions", 0, min=0)
    token_types = c.f.int("token_types", 0, min=0)
    if positions and positions < s:
        raise c.err("positions", f"{positions} positions cannot cover a sequence of {s}")
    return _Out((s, dim), {"vocab": vocab, "dim": dim, "positions": positions, "token_types": token_types},
                params=(vocab + positions + token_types) * dim, ops=s * dim * (1 + bool(positions) + bool(token_types)))


def _pool(kind: str) -> Callable[[_Ctx], _Out]:
    def build(c: _Ctx) -> _Out:
        shape = c.one_input(3)
        ceil = c.f.bool("ceil_mode", False)   # PyTorch's ceil_mode (SqueezeNet): a partial last window
        (kh, kw), (sh, sw), (ph, pw), ho, wo = _window(c, shape, ceil=ceil)
        attrs = {"kernel": (kh, kw), "stride": (sh, sw), "padding": (ph, pw)}
        if ceil and (ho, wo) != (pool_out(shape[1], kh, sh, ph, False), pool_out(shape[2], kw, sw, pw, False)):
            attrs["ceil_mode"] = True   # kept only where it changes the output: else it is floor mode
        return _Out((shape[0], ho, wo), attrs, ops=shape[0] * ho * wo * kh * kw)
    return build


def _gelu(c: _Ctx) -> _Out:
    """GELU: ``approximate: tanh`` (the default: GPT-2's form, what the zoo models use) or
    ``none``, the exact x * Phi(x) (PyTorch's nn.GELU() default, ONNX Gelu's default)."""
    s = c.one_input()
    how = c.f.str("approximate", "tanh", choices=("tanh", "none"))
    return _Out(s, {"approximate": how} if how != "tanh" else {}, ops=8 * prod(s))


def _global_pool(c: _Ctx) -> _Out:
    C, H, W = c.one_input(3)
    return _Out((C,), ops=C * H * W)


def _elementwise(ops_per_elem: int) -> Callable[[_Ctx], _Out]:
    def build(c: _Ctx) -> _Out:
        s = c.one_input()
        return _Out(s, ops=ops_per_elem * prod(s))
    return build


def _relu(c: _Ctx) -> _Out:
    """ReLU; ``negative_slope`` > 0 is a leaky ReLU (ONNX LeakyRelu's alpha)."""
    s = c.one_input()
    slope = c.f.num("negative_slope", 0.0, positive=False, min=0.0)
    return _Out(s, {"negative_slope": slope} if slope else {}, ops=prod(s))


def _sigmoid(c: _Ctx) -> _Out:
    """Logistic sigmoid; with ``alpha`` and ``beta`` the hard sigmoid clip(alpha x + beta, 0, 1)
    (ONNX HardSigmoid; PyTorch exports alpha 1/6, beta 1/2), costed as the sigmoid."""
    s = c.one_input()
    attrs = {}
    if c.f.has("alpha") or c.f.has("beta"):
        attrs = {"alpha": c.f.num("alpha"), "beta": c.f.num("beta", positive=False)}
    return _Out(s, attrs, ops=4 * prod(s))


def _silu(c: _Ctx) -> _Out:
    """x * sigmoid(x) (SiLU, Swish; EfficientNet): the sigmoid's 4 ops and a product; ``hard``:
    x * clip(x/6 + 1/2, 0, 1) (ONNX HardSwish, MobileNetV3), costed the same."""
    s = c.one_input()
    hard = c.f.bool("hard", False)
    return _Out(s, {"hard": True} if hard else {}, ops=5 * prod(s))


def _dropout(c: _Ctx) -> _Out:
    """Dropout (Srivastava et al., JMLR 2014): in training each element is kept with
    probability 1 - rate and scaled by 1 / (1 - rate), a mask draw and a product an element
    (2 ops; its backward multiplies the gradient by the same mask); at inference it is the
    identity, which the planner prices at no time (planner.stagecost.stage_model)."""
    s = c.one_input()
    rate = c.f.num("rate", 0.5, positive=False, min=0.0)
    if rate >= 1:
        raise c.err("rate", f"expected a drop probability in [0, 1), got {rate}")
    return _Out(s, {"rate": float(rate)}, ops=2 * prod(s))


def _batchnorm(c: _Ctx) -> _Out:
    s = c.one_input()
    ch = s[0] if len(s) == 3 else s[-1]
    return _Out(s, params=2 * ch, ops=2 * prod(s))  # inference form: scale and shift per channel


def _layernorm(c: _Ctx) -> _Out:
    s = c.one_input()
    return _Out(s, params=2 * s[-1], ops=5 * prod(s))


def _add(c: _Ctx) -> _Out:
    if len(c.in_shapes) < 2:
        raise c.err("inputs", f"add (residual) needs at least 2 inputs, got {len(c.in_shapes)}")
    if len(set(c.in_shapes)) != 1:
        raise c.err("inputs", f"add inputs must have equal shapes, got {[list(s) for s in c.in_shapes]}")
    s = c.in_shapes[0]
    return _Out(s, ops=(len(c.in_shapes) - 1) * prod(s))


def _concat(c: _Ctx) -> _Out:
    if len(c.in_shapes) < 2:
        raise c.err("inputs", "concat needs at least 2 inputs")
    ranks = {len(s) for s in c.in_shapes}
    if len(ranks) != 1:
        raise c.err("inputs", "concat inputs must have the same rank")
    r = ranks.pop()
    axis = c.f.int("axis", r - 1, min=0)
    if axis >= r:
        raise c.err("axis", f"expected an axis < {r}")
    others = {s[:axis] + s[axis + 1:] for s in c.in_shapes}
    if len(others) != 1:
        raise c.err("inputs", f"concat inputs differ outside axis {axis}: {[list(s) for s in c.in_shapes]}")
    s0 = c.in_shapes[0]
    return _Out(s0[:axis] + (sum(s[axis] for s in c.in_shapes),) + s0[axis + 1:], {"axis": axis})


def _flatten(c: _Ctx) -> _Out:
    s = c.one_input()
    return _Out((prod(s),))


def _take(c: _Ctx) -> _Out:
    """Pick one position of the first axis (BERT's pooler reads the first token)."""
    s = c.one_input()
    if len(s) < 2:
        raise c.err("inputs", "take needs an input of rank >= 2")
    idx = c.f.int("index", 0, min=0)
    if idx >= s[0]:
        raise c.err("index", f"expected an index < {s[0]}")
    return _Out(s[1:], {"index": idx})


def _reshape(c: _Ctx) -> _Out:
    """A view to another per-sample shape (ONNX Reshape/Transpose between layers); no work counted."""
    s = c.one_input()
    shape = c.f.ints("shape")
    if prod(shape) != prod(s):
        raise c.err("shape", f"{list(shape)} does not hold the {prod(s)} elements of the input {list(s)}")
    attrs = {"shape": tuple(shape)}
    # an element order other than the input's: view the input as ``pre``, permute its axes by ``perm``
    # (an imported Transpose), then read the result as ``shape``; without them the order is kept
    if c.f.has("perm") or c.f.has("pre"):
        pre, perm = c.f.ints("pre"), c.f.ints("perm", min=0)
        if prod(pre) != prod(s) or sorted(perm) != list(range(len(pre))):
            raise c.err("perm", f"expected a permutation of the {len(pre)} axes of pre {list(pre)} "
                                f"({prod(s)} elements), got {list(perm)}")
        attrs.update(pre=tuple(pre), perm=tuple(perm))
    return _Out(tuple(shape), attrs)


def _opaque(c: _Ctx) -> _Out:
    """An op with no cost model (ONNX --opaque OP=fwd_s,bwd_s): fixed measured times, given shape."""
    if not c.in_shapes:
        raise c.err("inputs", "an opaque layer needs at least one input")
    shape = c.f.ints("shape")
    fwd = c.f.num("fwd_s", positive=False, min=0.0)
    bwd = c.f.num("bwd_s", positive=False, min=0.0)
    params = c.f.int("params", 0, min=0)
    return _Out(tuple(shape), {"shape": tuple(shape), "fwd_s": fwd, "bwd_s": bwd, "params": params}, params=params)


def _mul(c: _Ctx) -> _Out:
    """Elementwise product of activations, broadcasting to the largest (squeeze-excite scaling)."""
    if len(c.in_shapes) < 2:
        raise c.err("inputs", f"mul needs at least 2 inputs, got {len(c.in_shapes)}")
    out = max(c.in_shapes, key=prod)
    for s in c.in_shapes:
        pad = (1,) * (len(out) - len(s)) + tuple(s)
        if len(s) > len(out) or any(a not in (1, b) for a, b in zip(pad, out)):
            raise c.err("inputs", f"mul inputs {[list(x) for x in c.in_shapes]} do not broadcast to {list(out)}")
    return _Out(out, ops=(len(c.in_shapes) - 1) * prod(out))


def _clip(c: _Ctx) -> _Out:
    """Clamp to [min, max] (ONNX Clip; ReLU6 is min 0, max 6); a missing bound is open."""
    s = c.one_input()
    attrs = {}
    for key in ("min", "max"):
        v = c.f.raw(key, None)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise c.err(key, f"expected a number, got {v!r}")
            attrs[key] = float(v)
    if "min" in attrs and "max" in attrs and attrs["min"] > attrs["max"]:
        raise c.err("max", f"expected max >= min ({attrs['min']}), got {attrs['max']}")
    return _Out(s, attrs, ops=prod(s))


def _slice(c: _Ctx) -> _Out:
    """Positions [start, end) of one axis (a Split/Slice of an activation, e.g. GPT-2's fused QKV)."""
    s = c.one_input()
    axis = c.f.int("axis", min=0)
    if axis >= len(s):
        raise c.err("axis", f"expected an axis < {len(s)}")
    start = c.f.int("start", min=0)
    end = c.f.int("end", min=1)
    if not start < end <= s[axis]:
        raise c.err("end", f"expected 0 <= start < end <= {s[axis]}, got {start}..{end}")
    return _Out(s[:axis] + (end - start,) + s[axis + 1:], {"axis": axis, "start": start, "end": end})


def _add_param(c: _Ctx) -> _Out:
    """Add a learned tensor broadcast over the input (ViT's position embedding)."""
    s = c.one_input()
    shape = c.f.ints("param_shape")
    core = tuple(shape)
    while len(core) > len(s) and core[0] == 1:   # leading unit axes (the batch) broadcast away
        core = core[1:]
    if len(core) > len(s) or any(a not in (1, b) for a, b in zip(core, s[len(s) - len(core):])):
        raise c.err("param_shape", f"{list(shape)} does not broadcast onto the input {list(s)}")
    return _Out(s, {"param_shape": tuple(shape)}, params=prod(shape), ops=prod(s))


def _concat_param(c: _Ctx) -> _Out:
    """Prepend ``size`` learned rows on the first axis (ViT's class token)."""
    s = c.one_input()
    size = c.f.int("size", min=1)
    return _Out((s[0] + size,) + s[1:], {"size": size}, params=size * prod(s[1:]))


LAYER_TYPES: dict[str, Callable[[_Ctx], _Out]] = {
    "conv2d": _conv2d,
    "dense": _dense,
    "matmul": _matmul,
    "attention": _attention,
    "additive_attention": _additive_attention,
    "lstm": _lstm,
    "embedding": _embedding,
    "maxpool": _pool("max"),
    "avgpool": _pool("avg"),
    "globalavgpool": _global_pool,
    "relu": _relu,
    "gelu": _gelu,
    "tanh": _elementwise(4),
    "sigmoid": _sigmoid,
    "softmax": _elementwise(3),
    "dropout": _dropout,
    "batchnorm": _batchnorm,
    "layernorm": _layernorm,
    "add": _add,
    "concat": _concat,
    "flatten": _flatten,
    "take": _take,
    "reshape": _reshape,  # added by the ONNX issue: views between imported layers
    "opaque": _opaque,    # added by the ONNX issue: unsupported op with a user-given cost
    # added by issue 20 (ONNX import of PyTorch exports)
    "mul": _mul,
    "slice": _slice,
    "add_param": _add_param,
    "concat_param": _concat_param,
    "silu": _silu,
    "clip": _clip,
}

#: layer types whose weights are trained
WEIGHTED = frozenset({"conv2d", "dense", "attention", "additive_attention", "lstm", "embedding", "batchnorm",
                      "layernorm", "add_param", "concat_param"})
#: layer types that are the identity at inference (no work, no engine time)
TRAIN_ONLY = frozenset({"dropout"})
#: types that take several inputs
MULTI_INPUT = frozenset({"matmul", "attention", "additive_attention", "lstm", "add", "concat", "opaque", "mul"})


def build_layer(f: Fields, name: str, inputs: tuple[str, ...], in_shapes: list[Shape], type_: str,
                tied_to: str | None) -> Layer:
    """Validate one layer's attributes against its input shapes and derive its counts."""
    out = LAYER_TYPES[type_](_Ctx(f, in_shapes, name))
    f.done(allowed_extra=("name", "type", "inputs", "tied_to"))
    if any(d < 1 for d in out.shape):
        raise f.err(None, f"layer '{name}' would produce an empty tensor {list(out.shape)}")
    attrs = tuple(sorted(out.attrs.items()))
    return Layer(name=name, type=type_, inputs=inputs, in_shapes=tuple(in_shapes), out_shape=tuple(out.shape),
                 attrs=attrs, params=out.params, fwd_macs=out.fwd, bwd_in_macs=out.bwd_in, bwd_w_macs=out.bwd_w,
                 fwd_ops=out.ops, tied_to=tied_to)
