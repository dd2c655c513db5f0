"""ONNX files exported by PyTorch 2.13 (tests/fixtures/onnx, made by tests/make_onnx_fixtures.py).

Every file imports; parameters equal torch's own count (sum of p.numel()) and forward MACs
torch's flop counter (math attention path) within 0.5%. The suite does not need torch: the
files and the true counts (counts.json) are committed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

from bapipe.cli import main  # noqa: E402
from bapipe.errors import SpecError  # noqa: E402
from bapipe.onnx_import import import_model_proto, load_onnx, parse_opaque  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures" / "onnx"
COUNTS = json.loads((FIX / "counts.json").read_text())
FILES = sorted(p.name for p in FIX.glob("*.onnx"))

#: parameters the file itself no longer holds: dynamo's optimizer (optimize=True, the default)
#: folds an embedding lookup with constant indices (positions, token types) into the rows it
#: reads, so a table's unread rows (and the token-type table's real size) are gone from the
#: file; the importer says so (test below). Values: imported - true.
FOLDED_TABLES = {
    "bert.dynamo.onnx": -48 * 32 + (16 - 2) * 32,       # 64 positions (16 read), 2 token types (16 rows)
    "bert_mask.dynamo.onnx": -48 * 32 + (16 - 2) * 32,
    "hf_bert.dynamo.onnx": -16 * 32 + (16 - 2) * 32,    # 32 positions (16 read), 2 token types
    "hf_gpt2.dynamo.onnx": -16 * 32,                    # 32 positions (16 read)
    "hf_bert_sdpa.dynamo.onnx": -16 * 32 + (16 - 2) * 32,
    "hf_gpt2_sdpa.dynamo.onnx": -16 * 32,
    # the legacy exporter folds each BatchNorm2d into the nn.Conv2d before it (bias=True, the
    # default) under a generated name: the convs' own biases (8 + 16) are not in the file
    "convbias_bn.legacy.onnx": -(8 + 16),
}


@pytest.fixture
def fresh_notes(monkeypatch):
    """The importer says each note once a process (bapipe.onnx_import._note_once): a test that
    reads one starts with none said, whatever this worker imported before."""
    from bapipe import onnx_import

    monkeypatch.setattr(onnx_import, "_NOTED", set())


def test_folded_tables_are_reported_and_noopt_export_is_exact(capsys, fresh_notes):
    """dynamo's default optimizer stores a constant-index embedding lookup as the rows read
    (bert: 16 of 64 position rows, 16 copies of token-type row 0 for a 2-row table), so the
    file does not hold the tables' sizes: the importer says so on stderr and in the model's
    description. Exported with optimize=False the tables stay and the count is torch's."""
    m = load_onnx(str(FIX / "bert.dynamo.onnx"))
    err = capsys.readouterr().err
    assert "'embedding_1' [1, 16, 32], 'embedding_2' [1, 16, 32]" in err and "optimize=False" in err
    assert len(err.strip().splitlines()) == 1 and "1024 values read" in m.description
    assert m.params == truth("bert")["params"] - 1088
    exact = load_onnx(str(FIX / "bert.dynamo-noopt.onnx"))
    assert capsys.readouterr().err == ""
    assert exact.params == truth("bert")["params"] == 31840
    assert exact.fwd_macs == truth("bert")["macs"]
    load_onnx(str(FIX / "bert.legacy.onnx"))   # the legacy exporter keeps the tables: no note
    assert capsys.readouterr().err == ""


def test_batch_norms_folded_into_biased_layers(capsys, fresh_notes):
    """Held-back exports of 2026-12-08 imported short: an nn.Conv2d with its own bias before a
    BatchNorm2d lost the conv's bias (dynamo: 3,410 of 3,434; the issue's SqueezeNet/MobileNet
    losses in a new shape), and dynamo's Linear + BatchNorm1d lost the batch norm (1,957 of
    2,021). dynamo names a fused bias after the layer's own bias parameter when it had one
    (``c1.bias``, else ``c1.weight_bias``): both come back exact, the batch norm as a layer.
    The legacy exporter's generated names cannot tell: it counts no conv bias and says so."""
    m = load_onnx(str(FIX / "convbias_bn.dynamo.onnx"))
    assert capsys.readouterr().err == ""
    assert [(l.type, l.attr.get("bias")) for l in m.layers if l.type in ("conv2d", "batchnorm")] == \
        [("conv2d", True), ("batchnorm", None), ("conv2d", True), ("batchnorm", None)]
    assert m.params == truth("convbias_bn")["params"] == 3434
    m = load_onnx(str(FIX / "mlp_bn.dynamo.onnx"))
    assert [l.type for l in m.layers][:3] == ["dense", "batchnorm", "relu"] and m.params == 2021
    m = load_onnx(str(FIX / "convbias_bn.legacy.onnx"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "folded batch norms into 2 convolution(s) ('/c1/Conv', '/c2/Conv')" in err[0]
    assert "dynamo=True" in err[0] and "not in the file" in m.description
    assert m.params == 3434 - 24
    load_onnx(str(FIX / "convbias_bn.legacy.onnx"))   # read again by the same command: said once
    assert capsys.readouterr().err == ""
    load_onnx(str(FIX / "resnet.dynamo.onnx"))   # bias=False convs (torchvision's): exact, nothing to say
    assert capsys.readouterr().err == ""


def truth(file: str) -> dict:
    return COUNTS[file.split(".")[0]]


def test_fixtures_are_small_and_complete():
    # kept in the repository: a few MB (4.9 MB of 45 exports plus bert's unoptimised dynamo one)
    assert sum((FIX / f).stat().st_size for f in FILES) < 5.5e6
    for name, rec in COUNTS.items():
        for exp, status in rec["exports"].items():
            assert ((FIX / f"{name}.{exp}.onnx").exists()) == (status == "ok"), (name, exp)
    assert len(FILES) >= 30


@pytest.mark.parametrize("file", FILES)
def test_torch_export_imports_with_true_counts(file):
    m = load_onnx(str(FIX / file))
    t = truth(file)
    assert m.params == t["params"] + FOLDED_TABLES.get(file, 0)
    assert m.fwd_macs == t["macs"]          # integer counts, exact (the contract allows 0.5%; none is needed)


def _types(file, **kw):
    m = load_onnx(str(FIX / file), **kw)
    return m, [l.type for l in m.layers]


@pytest.mark.parametrize("exp", ["legacy", "dynamo"])
def test_cnn_patterns(exp):
    # dynamo writes AdaptiveAvgPool2d(1) as ReduceMean; both fold BatchNorm into the Conv (restored here)
    m, t = _types(f"resnet.{exp}.onnx")
    assert t.count("globalavgpool") == 1 and t.count("batchnorm") == 6 and t.count("add") == 2
    assert [l.attr["bias"] for l in m.layers if l.type == "conv2d"] == [False] * 6
    # ReLU6 (Clip) is a clip with its bounds; depthwise groups kept
    m, t = _types(f"mobilenet_v2.{exp}.onnx")
    assert t.count("clip") == 8 and max(l.attr["groups"] for l in m.layers if l.type == "conv2d") == 48
    assert {(l.attr["min"], l.attr["max"]) for l in m.layers if l.type == "clip"} == {(0.0, 6.0)}
    # SiLU = x * sigmoid(x) is one silu layer; squeeze-excite's gate is a sigmoid, its scaling a broadcasting mul
    m, t = _types(f"efficientnet.{exp}.onnx")
    assert [l.in_shapes for l in m.layers if l.type == "mul"] == [((8, 1, 1), (8, 16, 16)), ((32, 1, 1), (32, 8, 8)),
                                                                   ((64, 1, 1), (64, 8, 8))]
    assert t.count("silu") == 11 and t.count("sigmoid") == 3 and t.count("globalavgpool") == 4
    gates = {l.name for l in m.layers if l.type == "sigmoid"}
    assert gates == {l.inputs[0] for l in m.layers if l.type == "mul"}   # each sigmoid gates one SE product
    # MaxPool ceil_mode=1: a layer attribute only where a partial last window exists (33x33; at 31x31
    # every window fits and ceil is floor); the padding stays the file's; Fire's Concat
    m, t = _types(f"squeezenet.{exp}.onnx")
    pools = [l for l in m.layers if l.type == "maxpool"]
    assert [l.out_shape for l in pools] == [(16, 7, 7), (16, 3, 3)] and t.count("concat") == 3
    assert not any("ceil_mode" in l.attr for l in pools)
    m, t = _types(f"squeezenet_ceil.{exp}.onnx")
    pools = [l for l in m.layers if l.type == "maxpool"]
    assert [(l.out_shape, l.attr["padding"], l.attr["ceil_mode"]) for l in pools] == \
        [((16, 8, 8), (0, 0), True), ((16, 4, 4), (0, 0), True)]
    # zero biases merged by the legacy exporter / dropped by dynamo are still counted
    m, t = _types(f"vgg.{exp}.onnx")
    assert all(l.attr["bias"] for l in m.layers if l.type in ("conv2d", "dense"))
    assert not any(l.tied_to for l in m.layers)


@pytest.mark.parametrize("exp", ["legacy", "dynamo"])
def test_transformer_patterns(exp):
    # ViT: class token (concat_param, d params), learned positions (add_param), token 0 read by a take
    m, t = _types(f"vit.{exp}.onnx")
    ct = next(l for l in m.layers if l.type == "concat_param")
    pe = next(l for l in m.layers if l.type == "add_param" and l.params > 32)
    assert (ct.out_shape, ct.params, pe.params) == ((17, 32), 32, 17 * 32)
    # nn.MultiheadAttention's packed in_proj: one dense, Q/K/V picked with Gather (take)
    assert t.count("take") == 1 + 3 * 2 and t.count("softmax") == 2 and t.count("matmul") == 4
    if exp == "legacy":   # opset 14: LayerNorm written out (ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add)
        m14, t14 = _types("vit.legacy14.onnx")
        assert t14 == t and m14.params == m.params
    # GPT: fused c_attn split in three slices, tanh-GELU is one gelu layer, LM head tied to wte
    m, t = _types(f"gpt.{exp}.onnx")
    assert t.count("slice") == 6 and t.count("gelu") == 2 and "tanh" not in t
    head = m.layers[-1]
    assert head.type == "dense" and head.tied_to == m.layers[0].name and m.layers[0].attr["positions"] == 16
    # BERT with an attention mask: the mask makes no layer; each score matmul reads the mask input
    m, t = _types(f"bert_mask.{exp}.onnx")
    assert [i.name for i in m.inputs] == ["input_ids", "attention_mask"] and t.count("matmul") == 4
    # two graph outputs (sequence, pooled) are carried side by side to the end
    assert m.layers[-1].type == "concat" and m.output_shape == (16 * 32 + 32,)
    # nn.TransformerEncoder works sequence-first inside: [S, N*H, D] reshapes at batch 1
    for f in (f"transformer_encoder.{exp}.onnx", f"transformer_encoder_bf.{exp}.onnx"):
        m, t = _types(f)
        mm = [l for l in m.layers if l.type == "matmul"]
        assert len(mm) == 4 and mm[0].out_shape == (4, 10, 10) and not any(l.tied_to for l in m.layers)
    # a key padding mask input (bool) makes no layer: the score matmuls read it as their key_mask
    m, t = _types(f"transformer_encoder_mask.{exp}.onnx")
    assert [i.name for i in m.inputs] == ["x", "pad"] and t.count("matmul") == 4


@pytest.mark.parametrize("exp", ["legacy", "dynamo"])
def test_lstm_reading_h_n(exp):
    m, t = _types(f"lstm.{exp}.onnx")
    assert t.count("lstm") == 2 and t[-1] == "dense" and m.output_shape == (5,)
    # a sequence-first graph input [S, 1, F] (nn.LSTM's default layout) at batch 1
    m, t = _types(f"lstm_seqfirst.{exp}.onnx")
    assert m.inputs[0].shape == (10, 12) and t.count("lstm") == 2 and m.output_shape == (5,)
    m, t = _types(f"transformer_encoder_seqfirst.{exp}.onnx")
    assert m.inputs[0].shape == (10, 32) and m.output_shape == (10, 10) and t.count("matmul") == 4
    m, t = _types(f"lstm_bidir.{exp}.onnx")
    assert [l.attr["bidirectional"] for l in m.layers if l.type == "lstm"] == [True, True]


def test_opaque_any_op_even_mapped_and_refused():
    """--opaque OP turns every OP node into an opaque layer, mapped or not; Clip's bounds are no params."""
    base = load_onnx(str(FIX / "mobilenet_v2.legacy.onnx"))
    m = load_onnx(str(FIX / "mobilenet_v2.legacy.onnx"), opaque=parse_opaque(["Clip=1e-6,2e-6"]))
    ops = [l for l in m.layers if l.type == "opaque"]
    assert len(ops) == 8 and all(l.params == 0 for l in ops) and m.params == base.params
    m = load_onnx(str(FIX / "squeezenet_ceil.dynamo.onnx"), opaque=parse_opaque(["MaxPool=1e-6,2e-6"]))
    assert [l.out_shape for l in m.layers if l.type == "opaque"] == [(16, 8, 8), (16, 4, 4)]
    m = load_onnx(str(FIX / "resnet.dynamo.onnx"), opaque=parse_opaque(["ReduceMean=1e-6,1e-6"]))
    assert [l.params for l in m.layers if l.type == "opaque"] == [0]      # its axes are not parameters


def test_refusal_is_one_line_exit_2(tmp_path, capsys):
    proto = onnx.load(str(FIX / "resnet.legacy.onnx"))
    node = next(n for n in proto.graph.node if n.op_type == "Relu")
    node.op_type = "Softplus"
    with pytest.raises(SpecError) as e:
        import_model_proto(proto, "r.onnx")
    msg = str(e.value)
    assert "\n" not in msg and node.name in msg and "'Softplus'" in msg and "--opaque Softplus=" in msg
    path = tmp_path / "r.onnx"
    onnx.save(proto, str(path))
    assert main(["profile", str(path), "4xU250-ring"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Softplus" in err
    m = import_model_proto(proto, "r.onnx", opaque=parse_opaque(["Softplus=1e-6,1e-6"]))
    assert m.params == COUNTS["resnet"]["params"]


@pytest.mark.parametrize("file", ["efficientnet.dynamo.onnx", "vit.legacy.onnx", "gpt.dynamo.onnx",
                                  "bert_mask.legacy.onnx", "lstm_bidir.dynamo.onnx"])
def test_imported_models_plan(file, tmp_path, capsys):
    """The new layer types (mul, slice, add_param, concat_param) and imported names go through the planner."""
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(FIX / file), "4xU250-ring", "-o", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert out.exists() and r["output"] == str(out)
    text = out.read_text()
    assert load_onnx(str(FIX / file)).layers[0].name in text


def test_refused_mapped_op_names_the_opaque_way_out():
    proto = onnx.load(str(FIX / "resnet.legacy.onnx"))
    pool = next(n for n in proto.graph.node if n.op_type == "MaxPool")
    next(a for a in pool.attribute if a.name == "pads").ints[:] = [0, 0, 1, 1]
    with pytest.raises(SpecError) as e:
        import_model_proto(proto, "r.onnx")
    assert str(e.value) == ("r.onnx: node '/maxpool/MaxPool' (MaxPool): asymmetric pads [0, 0, 1, 1] are not "
                            "supported (or give its cost with --opaque MaxPool=FWD_S,BWD_S)")
    m = import_model_proto(proto, "r.onnx", opaque=parse_opaque(["MaxPool=1e-6,1e-6"]))
    assert [l.out_shape for l in m.layers if l.type == "opaque"] == [(8, 8, 8)] and m.params == 6226
