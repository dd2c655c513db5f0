"""A hypothesis fuzzer over ONNX files (beside tests/test_validation_fuzz.py's plan.yaml one):
truncated bytes, emptied graphs, odd opsets, zero, huge and negative dims, initializers
whose bytes do not match their dims, and hostile names. Each case must end, within a
per-case time limit (hypothesis' deadline), in a Model or a one-line SpecError: no other
exception, no hang. An accepted model's layer names give distinct identifiers and inert
comment text (bapipe.names).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")

from bapipe.errors import SpecError  # noqa: E402
from bapipe.names import legal, name_map, shown  # noqa: E402
from bapipe.onnx_import import import_model_proto, load_onnx  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures" / "onnx"
#: small exports of both exporters: an MLP, a CNN with batch norm and skips, an LSTM
SEEDS = ["mlp.legacy.onnx", "mlp.dynamo.onnx", "resnet.legacy.onnx", "lstm.legacy.onnx"]
#: per-case wall-time limit: an import of these takes tens of milliseconds; a hang fails here
CASE_DEADLINE_MS = 3000
FAST, MANY = 15, 300
_HC = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
_NAMES = st.one_of(st.text(min_size=0, max_size=40),
                   st.sampled_from(["a\nint x; /*", "*/", "\\", '"', "ü名", "x" * 5000, "", " ", "true", "0"]))
_DIMS = st.sampled_from([0, -1, -(2 ** 40), 2 ** 31, 2 ** 40, 2 ** 62, 1, 3])


def _seed(name: str):
    return onnx.load(str(FIX / name), load_external_data=False)


def _outcome(fn) -> object:
    """Run an import: the Model, or the SpecError (which must be one line)."""
    try:
        m = fn()
    except SpecError as e:
        assert "\n" not in str(e) and len(str(e)) < 2000, str(e)[:500]
        return e
    names = [l.name for l in m.layers]
    name_map(names)   # distinct identifiers (raises on a collision)
    for n in names:
        assert len(legal(n)) <= 64 and "\n" not in shown(n)
    return m


def _mutate(model, data) -> None:
    """One random mutation of ``model`` in place."""
    g = model.graph
    kind = data.draw(st.sampled_from(["opset", "dims", "init_bytes", "names", "empty", "drop_node"]))
    if kind == "opset":
        model.opset_import[0].version = data.draw(st.integers(-5, 300))
    elif kind == "dims":
        targets = [t for t in g.initializer if t.dims] + [vi for vi in g.input if vi.type.tensor_type.shape.dim]
        if not targets:   # an earlier mutation emptied them
            return
        t = data.draw(st.sampled_from(targets))
        if hasattr(t, "dims"):
            t.dims[data.draw(st.integers(0, len(t.dims) - 1))] = data.draw(_DIMS)
        else:
            dims = t.type.tensor_type.shape.dim
            dims[data.draw(st.integers(0, len(dims) - 1))].dim_value = max(0, data.draw(_DIMS))
    elif kind == "init_bytes" and g.initializer:
        t = data.draw(st.sampled_from(list(g.initializer)))
        try:   # an earlier mutation may have cut it already
            raw = t.raw_data or onnx.numpy_helper.to_array(t).tobytes()
        except ValueError:
            raw = b""
        cut = data.draw(st.integers(0, max(0, len(raw) - 1)))
        del t.float_data[:]
        t.raw_data = raw[:cut]
    elif kind == "names" and g.node:
        node = data.draw(st.sampled_from(list(g.node)))
        new = data.draw(_NAMES)
        if data.draw(st.booleans()):
            node.name = new
        else:   # rename a tensor where it is made, and (maybe) where it is read
            old = node.output[0]
            node.output[0] = new
            if data.draw(st.booleans()):
                for other in g.node:
                    for i, x in enumerate(other.input):
                        if x == old:
                            other.input[i] = new
                for o in g.output:
                    if o.name == old:
                        o.name = new
    elif kind == "empty":
        what = data.draw(st.sampled_from(["node", "input", "output", "initializer"]))
        del getattr(g, what)[:]
    elif kind == "drop_node" and g.node:
        del g.node[data.draw(st.integers(0, len(g.node) - 1))]


@settings(max_examples=FAST, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(data=st.data())
def test_mutated_onnx_graphs_import_or_refuse_in_one_line(data):
    model = _seed(data.draw(st.sampled_from(SEEDS)))
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(model, data)
    _outcome(lambda: import_model_proto(model, "fuzz.onnx"))


@settings(max_examples=FAST, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(seed=st.sampled_from(SEEDS), frac=st.floats(0.0, 1.0))
def test_truncated_onnx_files_import_or_refuse_in_one_line(tmp_path, seed, frac):
    raw = (FIX / seed).read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(raw[:int(len(raw) * frac)])
    _outcome(lambda: load_onnx(str(p)))


@pytest.mark.slow   # the same properties, many more cases (~1-2 minutes)
@settings(max_examples=MANY, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(data=st.data())
def test_mutated_onnx_graphs_many(data):
    test_mutated_onnx_graphs_import_or_refuse_in_one_line.hypothesis.inner_test(data)
