"""Residual stages in the training RTL: batchnorm, add, global average pool and the wiring of a
board whose layers form a graph, not a chain (codegen.rtl.train's lowering calls these).

- batchnorm (affine, ``fpga_models.train_fixed``): ``train_batchnorm`` forward and backward,
  ``sgd_update`` owning scale (its MH = C, MW = 1 weights, PE = C: one tile) and shift (its
  biases), ``stash_mem`` (the input x, for dscale = sum dy x);
- add: ``train_add`` forward (a saturating join of two vectors); backward it passes dy on to
  both inputs (a wire);
- a layer whose output two layers of the board read (a residual fork): in backward, before
  its own backward, ``train_add`` sums the two gradients (``train_fixed.add_grads``);
- globalavgpool: ``train_pool`` with one H x W window (``fixedpoint.globalavgpool_fwd`` is the
  average pool of that window; the same reciprocal and rounding).

A board's vectors are registers held until the engine's next start, so with one sample at a time a
skip branch's forward value (and a fork's first gradient) waits in its producer's output register;
when samples stream through a dataflow board, a per-sample buffer (by stash slot) keeps them. Cycles are
``fpga_models.engines``' (``batchnorm_train_cycles``, ``add_train_cycles``, ``pool_train_cycles``).
"""
from __future__ import annotations

from bapipe.fpga_models import engines

from bapipe.codegen.design.dataflow import clog2
from bapipe.codegen.design.unsupported import Unsupported


def stream_layer(l, lanes: int, make):
    """The TrainLayer of a batchnorm, add or globalavgpool layer (``make``: the TrainLayer class)."""
    n_in, n_out = l.in_elems, l.out_elems
    if l.type == "batchnorm":
        s = l.in_shapes[0]
        c = s[0] if len(s) == 3 else s[-1]
        fc, bc = engines.batchnorm_train_cycles(n_out, lanes)
        return make(l.name, "batchnorm", _ident(l.name), n_in, n_out, pe=c, simd=1, lanes=lanes, fwd_cycles=fc,
                    bwd_in_cycles=bc, update_cycles=engines.sgd_update_cycles(c, 1, c, 1), mh=c, mw=1)
    if l.type == "add":
        if len(l.inputs) != 2:
            raise Unsupported(f"layer {l.name}: the training RTL adds two inputs, not {len(l.inputs)}")
        # backward: a one-cycle unit passing dy on to both inputs (the sum is at the fork)
        return make(l.name, "add", _ident(l.name), n_out, n_out, lanes=lanes,
                    fwd_cycles=engines.add_train_cycles(n_out, lanes), bwd_in_cycles=1)
    # globalavgpool: one H x W window
    c, h, w = l.in_shapes[0]
    if h != w:
        raise Unsupported(f"layer {l.name}: the training RTL pools square images only")
    fc, bc = engines.pool_train_cycles(engines.stream_elements(l), lanes)
    return make(l.name, "globalavgpool", _ident(l.name), n_in, n_out, lanes=lanes, fwd_cycles=fc, bwd_in_cycles=bc,
                geom={"c": c, "h": h, "w": w, "k": h, "stride": h, "pad": 0, "oh": 1, "ow": 1})


def wire_graph(model, names: list[str], layers: list, streaming: bool = False) -> None:
    """Set each layer's ``inputs`` (board layer names; "" for the board's input vector) and, for a
    layer whose output two board layers read, ``fork_cycles`` (the backward sum of the two
    gradients, ``engines.add_train_cycles`` at its lanes). Unsupported for graphs a board's one
    input and one output vector cannot carry. (On a ``streaming`` board, dataflow with several
    samples a micro-batch, the board's template keeps each sample's skip value and fork gradients in
    stash-slot buffers: train_batchnorm_board.v.j2, train_add_fork.v.j2.)"""
    inside = set(names)
    readers: dict[str, list[str]] = {n: [] for n in names}
    external = set()
    for n, t in zip(names, layers):
        l = model.layers[model.index[n]]
        srcs = []
        for i in l.inputs:
            if i in inside:
                srcs.append(i)
                readers[i].append(n)
            else:
                external.add(i)
                srcs.append("")
        t.inputs = tuple(srcs)
    if len(external) > 1:
        raise Unsupported(f"layers {names[0]}..{names[-1]}: a training board reads one vector, these read "
                          f"{len(external)} ({', '.join(sorted(external))})")
    first = [n for n, t in zip(names, layers) if "" in t.inputs]
    if first != [names[0]] or layers[0].inputs.count("") != 1:
        raise Unsupported(f"layers {names[0]}..{names[-1]}: only the board's first layer may read its input vector")
    for n, t in zip(names, layers):
        r = readers[n]
        if n == names[-1] and r:
            raise Unsupported(f"layer {n}: the board's output is read inside it too")
        if n != names[-1] and not r:
            raise Unsupported(f"layer {n}: its output leaves the board beside the last layer's")
        if len(r) > 2:
            raise Unsupported(f"layer {n}: read by {len(r)} layers; the training RTL sums two gradients")
        if len(r) == 2:
            if t.kind in ("dense", "conv2d"):
                raise Unsupported(f"layer {n}: a weighted layer read by two layers is not built for training")
            t.fork_cycles = engines.add_train_cycles(t.n_out, max(1, t.lanes))
    del streaming   # streaming boards buffer skip values and fork gradients per sample (train_batchnorm_board)


def unit_graph(b):
    """(producer, readers) of a board's engine units: ``producer(name)`` the unit whose output the
    tensor ``name`` is (through flattens; None: the board's input), ``readers(name)`` the units
    reading it (through flattens), in layer order."""
    eng = [l for l in b.layers if l.kind != "flatten"]
    pos = {l.name: u for u, l in enumerate(eng)}
    lay = {l.name: l for l in b.layers}

    def producer(name: str):
        while name and lay[name].kind == "flatten":
            name = lay[name].inputs[0] if lay[name].inputs else ""
        return pos[name] if name else None

    def readers(name: str) -> list[int]:
        out = []
        for t in b.layers:
            if name in t.inputs:
                out += readers(t.name) if t.kind == "flatten" else [pos[t.name]]
        return out

    return producer, readers


def board_ctx(layers: list, l) -> dict:
    """Template context of one layer's graph wiring: ``xin`` (its input vector), ``x2`` (an add's
    second), ``gsrc`` (its output's gradient), ``fork`` (the fork sum's engine), batchnorm's ``c``."""
    y = {t.name: f"{t.ident}_y" for t in layers}

    def src(name: str) -> str:
        return "fin" if name == "" else y[name]

    def dx_of(reader, name: str) -> str:
        """The gradient ``reader`` sends back to its input ``name`` (an add's ``_dx`` is its dy, to
        both inputs)."""
        return f"{reader.ident}_dx"

    readers = [t for t in layers if l.name in t.inputs]
    d = {"xin": src(l.inputs[0]) if l.inputs else "fin", "fork": None}
    if l.kind == "add":
        d["x2"] = src(l.inputs[1])
    if not readers:
        d["gsrc"] = "gin"
    elif len(readers) == 1:
        d["gsrc"] = dx_of(readers[0], l.name)
    else:
        lanes = max(1, l.lanes)
        d["gsrc"] = f"{l.ident}_fsy"
        d["fork"] = {"a": dx_of(readers[1], l.name), "b": dx_of(readers[0], l.name), "lanes": lanes,
                     "cnt_w": clog2(max(2, -(-l.n_out // lanes)))}
    if l.kind == "batchnorm":
        d["c"] = l.mh
    return d


def _ident(name: str) -> str:
    from bapipe.names import legal
    return legal(name)
