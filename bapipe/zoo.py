"""The model zoo, built in code from architecture parameters.

Each builder returns a model document (the same YAML form users write) which goes through
the same validation as a user's file. Published parameter counts and their sources are in
docs/models.md and pinned by tests/test_zoo.py.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

from .spec import Model, parse_model


class _Seq:
    """Small helper to append layers, chaining each to the previous unless told."""

    def __init__(self):
        self.layers: list[dict] = []

    def add(self, name: str, type_: str, inputs: list[str] | None = None, **attrs) -> str:
        d = {"name": name, "type": type_}
        if inputs is not None:
            d["inputs"] = inputs
        d.update(attrs)
        self.layers.append(d)
        return name


def vgg16() -> dict:
    """VGG-16 (Simonyan & Zisserman 2015, config D) on 224x224 RGB, 1000 classes."""
    s = _Seq()
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    conv, pool = 0, 0
    for v in cfg:
        if v == "M":
            pool += 1
            s.add(f"pool{pool}", "maxpool", kernel=2, stride=2)
        else:
            conv += 1
            s.add(f"conv{conv}", "conv2d", out_channels=v, kernel=3, padding=1)
            s.add(f"relu{conv}", "relu")
    s.add("flatten", "flatten")
    for i, units in ((6, 4096), (7, 4096)):
        s.add(f"fc{i}", "dense", units=units)
        s.add(f"relu_fc{i}", "relu")
    s.add("fc8", "dense", units=1000)
    return {"name": "vgg16", "description": "VGG-16, 224x224, 1000 classes", "input": [3, 224, 224],
            "layers": s.layers}


def resnet50() -> dict:
    """ResNet-50 v1.5 (torchvision): stride 2 on the 3x3 conv of each first bottleneck."""
    s = _Seq()
    s.add("conv1", "conv2d", out_channels=64, kernel=7, stride=2, padding=3, bias=False)
    s.add("bn1", "batchnorm")
    s.add("relu1", "relu")
    x = s.add("pool1", "maxpool", kernel=3, stride=2, padding=1)
    cin = 64
    for stage, (width, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), start=2):
        for b in range(blocks):
            p = f"res{stage}{chr(ord('a') + b)}"
            st = stride if b == 0 else 1
            s.add(f"{p}_conv1", "conv2d", [x], out_channels=width, kernel=1, bias=False)
            s.add(f"{p}_bn1", "batchnorm")
            s.add(f"{p}_relu1", "relu")
            s.add(f"{p}_conv2", "conv2d", out_channels=width, kernel=3, stride=st, padding=1, bias=False)
            s.add(f"{p}_bn2", "batchnorm")
            s.add(f"{p}_relu2", "relu")
            s.add(f"{p}_conv3", "conv2d", out_channels=4 * width, kernel=1, bias=False)
            main = s.add(f"{p}_bn3", "batchnorm")
            skip = x
            if b == 0 and (st != 1 or cin != 4 * width):
                s.add(f"{p}_down", "conv2d", [x], out_channels=4 * width, kernel=1, stride=st, bias=False)
                skip = s.add(f"{p}_down_bn", "batchnorm")
            s.add(f"{p}_add", "add", [main, skip])
            x = s.add(f"{p}_relu", "relu")
            cin = 4 * width
    s.add("avgpool", "globalavgpool")
    s.add("fc", "dense", units=1000)
    return {"name": "resnet50", "description": "ResNet-50 v1.5, 224x224, 1000 classes", "input": [3, 224, 224],
            "layers": s.layers}


def gnmt8(seq: int = 50, vocab: int = 32320, hidden: int = 1024) -> dict:
    """GNMT-8 as in PipeDream and MLPerf's rnn_translator: 4 encoder + 4 decoder LSTM layers.

    Encoder: bidirectional first layer, residual adds from layer 3. Decoder: the first LSTM
    feeds normalised Bahdanau attention; every later LSTM reads [previous, context], with
    residual adds from the third. Embeddings are shared between encoder and decoder.
    """
    s = _Seq()
    h = hidden
    s.add("enc_embed", "embedding", ["src"], vocab=vocab, dim=h)
    s.add("enc_lstm0", "lstm", hidden=h, bidirectional=True)
    s.add("enc_lstm1", "lstm", hidden=h)
    x = s.add("enc_lstm2", "lstm", hidden=h)
    s.add("enc_res2", "add", [x, "enc_lstm1"])
    x = s.add("enc_lstm3", "lstm", hidden=h)
    enc = s.add("enc_res3", "add", [x, "enc_res2"])
    s.add("dec_embed", "embedding", ["tgt"], vocab=vocab, dim=h, tied_to="enc_embed")
    q = s.add("dec_lstm0", "lstm", hidden=h)
    ctx = s.add("attention", "additive_attention", [q, enc], units=h)
    x = s.add("dec_lstm1", "lstm", [q, ctx], hidden=h)
    y = s.add("dec_lstm2", "lstm", [x, ctx], hidden=h)
    x = s.add("dec_res2", "add", [y, x])
    y = s.add("dec_lstm3", "lstm", [x, ctx], hidden=h)
    s.add("dec_res3", "add", [y, x])
    s.add("classifier", "dense", units=vocab)
    return {"name": "gnmt8", "description": f"GNMT-8 (PipeDream/MLPerf), vocab {vocab}, hidden {h}, seq {seq}",
            "inputs": [{"name": "src", "shape": [seq], "dtype": "int"}, {"name": "tgt", "shape": [seq], "dtype": "int"}],
            "layers": s.layers}


def _transformer_blocks(s: _Seq, x: str, n: int, d: int, heads: int, ffn: int, causal: bool, pre_ln: bool) -> str:
    for i in range(n):
        p = f"h{i}"
        if pre_ln:  # GPT-2/3: x + attn(ln(x)), x + mlp(ln(x))
            s.add(f"{p}_ln1", "layernorm", [x])
            a = s.add(f"{p}_attn", "attention", heads=heads, causal=causal)
            x = s.add(f"{p}_add1", "add", [a, x])
            s.add(f"{p}_ln2", "layernorm")
            s.add(f"{p}_fc1", "dense", units=ffn)
            s.add(f"{p}_gelu", "gelu")
            m = s.add(f"{p}_fc2", "dense", units=d)
            x = s.add(f"{p}_add2", "add", [m, x])
        else:  # BERT: ln(x + attn(x)), ln(x + mlp(x))
            a = s.add(f"{p}_attn", "attention", [x], heads=heads, causal=causal)
            s.add(f"{p}_add1", "add", [a, x])
            x = s.add(f"{p}_ln1", "layernorm")
            s.add(f"{p}_fc1", "dense", units=ffn)
            s.add(f"{p}_gelu", "gelu")
            m = s.add(f"{p}_fc2", "dense", units=d)
            s.add(f"{p}_add2", "add", [m, x])
            x = s.add(f"{p}_ln2", "layernorm")
    return x


def bert(name: str, layers: int, d: int, heads: int, seq: int = 512, vocab: int = 30522) -> dict:
    """BERT encoder with pooler (Devlin et al. 2019; HF BertModel), learned positions, 2 token types."""
    s = _Seq()
    s.add("embed", "embedding", vocab=vocab, dim=d, positions=512, token_types=2)
    x = s.add("embed_ln", "layernorm")
    x = _transformer_blocks(s, x, layers, d, heads, 4 * d, causal=False, pre_ln=False)
    s.add("pool_take", "take", [x], index=0)
    s.add("pooler", "dense", units=d)
    s.add("pool_tanh", "tanh")
    return {"name": name, "description": f"BERT encoder, {layers} layers, d={d}, seq {seq}",
            "inputs": [{"name": "tokens", "shape": [seq], "dtype": "int"}], "layers": s.layers}


def gpt(name: str, layers: int, d: int, heads: int, seq: int, ctx: int | None = None, vocab: int = 50257) -> dict:
    """GPT-2/GPT-3 decoder: pre-LN blocks, learned positions, LM head tied to the token embedding."""
    s = _Seq()
    s.add("embed", "embedding", vocab=vocab, dim=d, positions=ctx or seq)
    x = _transformer_blocks(s, "embed", layers, d, heads, 4 * d, causal=True, pre_ln=True)
    s.add("ln_f", "layernorm", [x])
    s.add("lm_head", "dense", units=vocab, bias=False, tied_to="embed")
    return {"name": name, "description": f"GPT decoder, {layers} layers, d={d}, {heads} heads, seq {seq}",
            "inputs": [{"name": "tokens", "shape": [seq], "dtype": "int"}], "layers": s.layers}


def tiny_mlp() -> dict:
    """A small MLP for 8x8 digits (64 features, 10 classes): tests and demos."""
    s = _Seq()
    for i, u in enumerate((64, 64, 32)):
        s.add(f"fc{i + 1}", "dense", units=u)
        s.add(f"relu{i + 1}", "relu")
    s.add("fc4", "dense", units=10)
    return {"name": "tiny-mlp", "description": "MLP 64-64-64-32-10 for 8x8 digits", "input": [64],
            "layers": s.layers}


def tiny_cnn() -> dict:
    """A small CNN on 1x8x8 digits: three conv stages and a classifier."""
    s = _Seq()
    s.add("conv1", "conv2d", out_channels=8, kernel=3, padding=1)
    s.add("relu1", "relu")
    s.add("conv2", "conv2d", out_channels=8, kernel=3, padding=1)
    s.add("relu2", "relu")
    s.add("pool1", "maxpool", kernel=2)
    s.add("conv3", "conv2d", out_channels=16, kernel=3, padding=1)
    s.add("relu3", "relu")
    s.add("pool2", "avgpool", kernel=2)
    s.add("flatten", "flatten")
    s.add("fc", "dense", units=10)
    return {"name": "tiny-cnn", "description": "CNN for 1x8x8 digits", "input": [1, 8, 8], "layers": s.layers}


ZOO: dict[str, Callable[[], dict]] = {
    "vgg16": vgg16,
    "resnet50": resnet50,
    "gnmt8": gnmt8,
    "bert-large": lambda: bert("bert-large", 24, 1024, 16),
    "gpt2": lambda: gpt("gpt2", 12, 768, 12, seq=1024),
    "gpt2-medium": lambda: gpt("gpt2-medium", 24, 1024, 16, seq=1024),
    "gpt2-large": lambda: gpt("gpt2-large", 36, 1280, 20, seq=1024),
    "gpt2-xl": lambda: gpt("gpt2-xl", 48, 1600, 25, seq=1024),
    "gpt3-175b": lambda: gpt("gpt3-175b", 96, 12288, 96, seq=2048),
    "tiny-mlp": tiny_mlp,
    "tiny-cnn": tiny_cnn,
}


@lru_cache(maxsize=None)
def get(name: str) -> Model:
    """Build (once) and validate a zoo model."""
    return parse_model(ZOO[name](), f"<zoo:{name}>", "zoo")
