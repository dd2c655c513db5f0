"""Imported PyTorch exports equal their source: parameters, MACs and the forward output.

tests/fixtures/onnx/<name>.npz (made by tests/make_onnx_fixtures.py with torch 2.13; the
suite needs no torch) holds a random input, torch's output on it (eval mode) and torch's
own counts. Each export of each family (legacy and dynamo exporters) is imported with its
weights (``bapipe.onnx_weights``) and run over the layer list in float32
(``host.infer_np.forward_model``).

Tolerance: |ours - torch| <= 2^-16 * max |torch| (256 float32 ulps of the output's scale).
Both sides compute in float32 with the same weights but a different summation order
(numpy/BLAS against torch's kernels) and their own exp/tanh/erf (a few ulps each); measured
at most 4e-7 of the output's scale (ViT; GPT 1e-7: 3.8e-6 on 36.9), 38x under the bound. The bound is far below what a semantic slip costs, which
``test_a_wrong_layer_fails_the_tolerance`` shows: a dropped conv bias (93x the bound), tanh
GELU for the exact one (13.5x), or ceil_mode read as a symmetric padding (the importer's old
reading) each miss it by more than 10x.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from bapipe.errors import SpecError  # noqa: E402
from bapipe.host.infer_np import forward_model  # noqa: E402
from bapipe.onnx_weights import load_onnx_weights  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures" / "onnx"
COUNTS = json.loads((FIX / "counts.json").read_text())
FILES = sorted(p.name for p in FIX.glob("*.onnx"))
TOL = 2.0 ** -16

#: parameters the file does not hold (dynamo's default optimizer folds constant-index embedding
#: lookups into the rows read; tests/test_onnx_torch.py FOLDED_TABLES, docs/onnx.md): imported - torch
FOLDED = {"bert.dynamo.onnx": -1088, "bert_mask.dynamo.onnx": -1088, "hf_bert.dynamo.onnx": -64,
          "hf_bert_sdpa.dynamo.onnx": -64, "hf_gpt2.dynamo.onnx": -512, "hf_gpt2_sdpa.dynamo.onnx": -512,
          # the legacy exporter folds each BatchNorm2d into the biased nn.Conv2d before it: the
          # convs' own biases are not in the file (tests/test_onnx_torch.py)
          "convbias_bn.legacy.onnx": -24}


def _io(stem: str):
    d = np.load(FIX / f"{stem}.npz")
    outs = [d[k] for k in sorted(k for k in d.files if k.startswith("out_"))]
    return d, np.concatenate([o.reshape(-1) for o in outs])


def _inputs(model, d) -> dict:
    """The file's inputs as the model reads them: the batch (1) first, then one sample."""
    return {i.name: d[f"in_{i.name}"].reshape((1,) + tuple(i.shape)) for i in model.inputs}


def test_fixtures_are_small_and_every_family_has_its_torch_output():
    files = list(FIX.iterdir())
    assert max(f.stat().st_size for f in files) < 1e6 and sum(f.stat().st_size for f in files) < 10e6
    assert {f.split(".")[0] for f in FILES} == {p.stem for p in FIX.glob("*.npz")} == set(COUNTS)
    for name, rec in COUNTS.items():
        d = np.load(FIX / f"{name}.npz")
        assert (int(d["params"]), int(d["macs"])) == (rec["params"], rec["macs"])


@pytest.mark.parametrize("file", FILES)
def test_import_equals_torch(file):
    stem = file.split(".")[0]
    d, ref = _io(stem)
    w = load_onnx_weights(str(FIX / file))
    m = w.model
    assert m.params == int(d["params"]) + FOLDED.get(file, 0)
    assert w.weight_count() == m.params           # every counted parameter is an array read from the file
    assert m.fwd_macs == int(d["macs"])
    assert w.notes == []
    y = forward_model(m, w.params, w.state, _inputs(m, d), w.notes).reshape(-1)
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= TOL * float(np.abs(ref).max())


def _err(file: str, change) -> float:
    """Max |ours - torch| / scale after ``change(weights)`` edits the imported model."""
    stem = file.split(".")[0]
    d, ref = _io(stem)
    w = load_onnx_weights(str(FIX / file))
    change(w)
    y = forward_model(w.model, w.params, w.state, _inputs(w.model, d), w.notes).reshape(-1)
    return float(np.abs(y - ref).max()) / float(np.abs(ref).max())


def _retype(w, kind: str, **attrs):
    """Rebuild the model with every ``kind`` layer's attributes changed (the weights stay)."""
    from dataclasses import replace
    layers = [replace(l, attrs=tuple(sorted({**l.attr, **attrs}.items()))) if l.type == kind else l
              for l in w.model.layers]
    w.model = replace(w.model, layers=layers)


def test_a_wrong_layer_fails_the_tolerance():
    def no_bias(w):
        conv = next(l.name for l in w.model.layers if l.type == "conv2d")
        w.params[conv]["b"] = np.zeros_like(w.params[conv]["b"])

    def tanh_gelu(w):
        _retype(w, "gelu", approximate="tanh")

    def padded_pool(w):   # the importer's old reading of ceil_mode: the symmetric padding of the same size
        from dataclasses import replace

        def pad(l):
            (k, _), (st, _), (p, _) = l.attr["kernel"], l.attr["stride"], l.attr["padding"]
            q = next(q for q in range(p, k) if (l.in_shapes[0][1] + 2 * q - k) // st + 1 == l.out_shape[1])
            return replace(l, attrs=tuple(sorted({**{k: v for k, v in l.attrs if k != "ceil_mode"},
                                                  "padding": (q, q)}.items())))
        w.model = replace(w.model, layers=[pad(l) if l.attr.get("ceil_mode") else l for l in w.model.layers])

    assert _err("squeezenet.legacy.onnx", lambda w: None) <= TOL
    assert _err("squeezenet.legacy.onnx", no_bias) > 10 * TOL
    assert _err("vit.dynamo.onnx", tanh_gelu) > 10 * TOL
    assert _err("squeezenet_ceil.legacy.onnx", padded_pool) > 10 * TOL

    def no_key_mask(w):   # the import before 2026-12-07: the attention mask input was not read
        from dataclasses import replace
        w.model = replace(w.model, layers=[replace(l, attrs=tuple((k, v) for k, v in l.attrs if k != "key_mask"),
                                                   inputs=l.inputs[:2]) if l.attr.get("key_mask") else l
                                           for l in w.model.layers])
    assert _err("hf_bert.legacy.onnx", no_key_mask) > 10 * TOL


def test_masks_are_model_inputs_read_by_the_scores():
    """BERT's attention_mask (1 = attend) and nn.TransformerEncoder's key padding mask (True =
    padded) are read by each attention's score matmul as its key_mask; the fixtures' inputs hide
    the last 5 of 16 and 3 of 10 keys."""
    for file, inp, how in (("bert_mask.legacy.onnx", "attention_mask", "zero"),
                           ("hf_bert_sdpa.dynamo.onnx", "attention_mask", "zero"),
                           ("transformer_encoder_mask.dynamo.onnx", "pad", "nonzero")):
        m = load_onnx_weights(str(FIX / file)).model
        assert inp in [i.name for i in m.inputs]
        masked = [l for l in m.layers if l.type == "matmul" and "key_mask" in l.attr]
        assert len(masked) == 2 and all(l.inputs[2] == inp and l.attr["key_mask"] == how for l in masked)


def test_a_folded_op_no_layer_computes_is_refused_in_one_line():
    """A constant added to the scores that is no mask (here: +1 everywhere) is counted as before
    but noted; the forward refuses the model in one line instead of computing another function."""
    import onnx

    from bapipe.onnx_import import import_with_sources
    proto = onnx.load(str(FIX / "vit.legacy.onnx"))
    sm = next(n for n in proto.graph.node if n.op_type == "Softmax")
    one = onnx.helper.make_tensor("plus_one", onnx.TensorProto.FLOAT, [], [1.0])
    proto.graph.initializer.append(one)
    add = onnx.helper.make_node("Add", [sm.input[0], "plus_one"], ["shifted"], name="shift_scores")
    sm.input[0] = "shifted"
    proto.graph.node.insert(list(proto.graph.node).index(sm), add)
    model, imp = import_with_sources(proto, "shifted.onnx")
    assert model.params == load_onnx_weights(str(FIX / "vit.legacy.onnx")).model.params
    notes = list(imp.notes.values())
    assert len(notes) == 1 and "shift_scores" in notes[0] and "\n" not in notes[0]
    with pytest.raises(SpecError, match="do not compute the file's function") as e:
        forward_model(model, {}, {}, {}, [notes[0]])
    assert "\n" not in str(e.value)


@pytest.mark.slow   # plan + gen of a 28-layer export (gen refuses before writing)
def test_codegen_refuses_what_it_would_build_differently(tmp_path, capsys):
    """ceil_mode pooling with a partial last window has no HLS/RTL kernel: gen says so in one
    line rather than building floor-mode windows (the squeezenet fixture's windows fit)."""
    from bapipe.cli import main

    m = load_onnx_weights(str(FIX / "squeezenet_ceil.legacy.onnx")).model
    assert [l.attr.get("ceil_mode") for l in m.layers if l.type == "maxpool"] == [True, True]
    fit = load_onnx_weights(str(FIX / "squeezenet.legacy.onnx")).model
    assert not any("ceil_mode" in l.attr for l in fit.layers)
    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(FIX / "squeezenet_ceil.legacy.onnx"), "4xU250-ring", "--mode", "inference",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["gen", str(plan), "-o", str(tmp_path / "build"), "--allow-rule-violations"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "ceil_mode pooling" in err and not (tmp_path / "build").exists()


@pytest.mark.parametrize("file", ["gpt.legacy.onnx", "transformer_encoder_mask.dynamo.onnx",
                                  "squeezenet_ceil.legacy.onnx", "lstm_bidir.legacy.onnx"])
def test_export_of_an_import_keeps_what_the_forward_reads(tmp_path, file):
    """bapipe export writes scale, causal, key_mask, ceil_mode, permuting reshapes and slices as
    ONNX nodes that import back to the same layers (a scale to float32: 1 ulp)."""
    from bapipe.onnx_export import export_onnx
    from bapipe.onnx_import import load_onnx

    m = load_onnx(str(FIX / file))
    export_onnx(m, str(tmp_path / "x.onnx"))
    back = load_onnx(str(tmp_path / "x.onnx"))
    assert (back.params, back.fwd_macs, [l.type for l in back.layers]) == (m.params, m.fwd_macs,
                                                                           [l.type for l in m.layers])
    for a, b in zip(m.layers, back.layers):
        assert {k: v for k, v in a.attrs if k != "scale"} == {k: v for k, v in b.attrs if k != "scale"}
        # the scale round-trips through the file's float32: one ulp of float32 (2^-23 relative)
        assert b.attr.get("scale", 1.0) == pytest.approx(a.attr.get("scale", 1.0), rel=2 ** -23)
    assert any("perm" in l.attr or "causal" in l.attr or "key_mask" in l.attr or "ceil_mode" in l.attr
               or l.type == "slice" for l in m.layers)
