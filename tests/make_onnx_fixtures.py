"""Regenerate tests/fixtures/onnx/: small PyTorch models exported with both exporters.

Needs torch (and onnx, onnxscript; transformers optional), which the test suite does not:

    python3.11 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch onnx onnxscript numpy [transformers]
    /tmp/torchenv/bin/python tests/make_onnx_fixtures.py

The architectures are small look-alikes of what people train (torchvision's ResNet, VGG,
MobileNetV2, EfficientNet, SqueezeNet, ViT; nn.TransformerEncoder; GPT-2 and BERT blocks;
an LSTM classifier reading h_n), written here because there is no CPU torchvision. Each is
exported with the legacy TorchScript exporter (``<name>.legacy.onnx``) and, where it works,
the dynamo exporter (``<name>.dynamo.onnx``). ``counts.json`` records the truth from torch:
trainable parameters (sum of ``p.numel()``, shared tensors once) and forward MACs from
``torch.utils.flop_counter.FlopCounterMode`` (flops / 2) with the math attention path.
``<name>.npz`` holds a random input (``in_<input name>``, the exported layout), torch's
output on it in eval mode (``out_0``, ``out_1`` ... for several outputs) and the same
``params`` and ``macs``: tests/test_onnx_outputs.py holds the imported layers to them.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent / "fixtures" / "onnx"


# --- CNNs ---------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock (optionally with a strided 1x1 downsample)."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + idt)


class MiniResNet(nn.Module):
    """ResNet stem (7x7/2, maxpool 3/2), two stages of basic blocks, global pool, fc."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class MiniVGG(nn.Module):
    """VGG with torchvision's init: zero biases everywhere (the legacy exporter merges equal ones)."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(2, 2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(True), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(True),
            nn.MaxPool2d(2, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((4, 4))
        self.classifier = nn.Sequential(nn.Linear(16 * 16, 64), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(), nn.Linear(64, classes))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def conv_bn_act(cin, cout, k=3, s=1, groups=1, act=nn.ReLU6):
    """Conv (no bias) + BatchNorm + activation, as torchvision's Conv2dNormActivation."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act(inplace=True))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand 1x1, depthwise 3x3 (ReLU6), project 1x1, skip when shapes allow."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.conv = nn.Sequential(conv_bn_act(cin, hid, 1), conv_bn_act(hid, hid, 3, stride, groups=hid),
                                  nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MiniMobileNetV2(nn.Module):
    """MobileNetV2 shape: stem, inverted residuals, 1x1 head, adaptive_avg_pool2d, dropout + fc."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(conv_bn_act(3, 8, 3, 2), InvertedResidual(8, 8, 1, 1),
                                      InvertedResidual(8, 12, 2, 4), InvertedResidual(12, 12, 1, 4),
                                      conv_bn_act(12, 32, 1))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class SqueezeExcitation(nn.Module):
    """torchvision's SE: avg pool, 1x1 conv, SiLU, 1x1 conv, sigmoid, scale the input."""

    def __init__(self, c, sq):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, sq, 1)
        self.fc2 = nn.Conv2d(sq, c, 1)
        self.act = nn.SiLU()
        self.scale = nn.Sigmoid()

    def forward(self, x):
        s = self.scale(self.fc2(self.act(self.fc1(self.avgpool(x)))))
        return s * x


class MBConv(nn.Module):
    """EfficientNet's MBConv: expand, depthwise, squeeze-excite, project, skip."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(conv_bn_act(cin, hid, 1, act=nn.SiLU),
                                   conv_bn_act(hid, hid, 3, stride, groups=hid, act=nn.SiLU),
                                   SqueezeExcitation(hid, max(1, cin // 4)),
                                   nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res else y


class MiniEfficientNet(nn.Module):
    """EfficientNet shape: SiLU stem, MBConv blocks with SE, 1x1 head, avg pool, fc."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(conv_bn_act(3, 8, 3, 2, act=nn.SiLU), MBConv(8, 8, 1, 1),
                                      MBConv(8, 16, 2, 4), MBConv(16, 16, 1, 4), conv_bn_act(16, 32, 1, act=nn.SiLU))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class SEHard(nn.Module):
    """MobileNetV3's squeeze-excite: avg pool, 1x1 conv, ReLU, 1x1 conv, Hardsigmoid, scale."""

    def __init__(self, c, sq):
        super().__init__()
        self.fc1 = nn.Conv2d(c, sq, 1)
        self.fc2 = nn.Conv2d(sq, c, 1)

    def forward(self, x):
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))
        return s * x


class MiniMobileNetV3(nn.Module):
    """MobileNetV3 shape: Hardswish stem, depthwise block with hard squeeze-excite, 1x1 head,
    pool, a LeakyReLU classifier (GAN discriminators' activation, here to cover LeakyRelu)."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_act(3, 8, 3, 2, act=nn.Hardswish),
            conv_bn_act(8, 16, 1, act=nn.Hardswish), conv_bn_act(16, 16, 3, 2, groups=16, act=nn.Hardswish),
            SEHard(16, 8), nn.Conv2d(16, 12, 1, bias=False), nn.BatchNorm2d(12),
            conv_bn_act(12, 24, 1, act=nn.Hardswish))
        self.classifier = nn.Sequential(nn.Linear(24, 32), nn.LeakyReLU(0.2), nn.Linear(32, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class Fire(nn.Module):
    """SqueezeNet's Fire module: squeeze 1x1, expand 1x1 and 3x3, concatenated on channels."""

    def __init__(self, cin, sq, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, sq, 1)
        self.expand1x1 = nn.Conv2d(sq, e1, 1)
        self.expand3x3 = nn.Conv2d(sq, e3, 3, padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.act(self.squeeze(x))
        return torch.cat([self.act(self.expand1x1(x)), self.act(self.expand3x3(x))], 1)


class MiniSqueezeNet(nn.Module):
    """SqueezeNet 1.1 shape: MaxPool with ceil_mode=True, Fire modules, conv classifier, global pool.

    On a 31x31 image every ceil_mode window fits (ceil and floor agree: the codegen fixture);
    on 33x33 both pools end in a partial window (``squeezenet_ceil``). ``torchvision_init``:
    torchvision's init (kaiming-uniform weights, zero biases, the classifier conv N(0, 0.01))."""

    def __init__(self, classes=10, torchvision_init=False):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, 2), nn.ReLU(True), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      Fire(16, 4, 8, 8), Fire(16, 4, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      Fire(16, 8, 16, 16))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(32, classes, 1), nn.ReLU(True),
                                        nn.AdaptiveAvgPool2d((1, 1)))
        if torchvision_init:
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    if m is self.classifier[1]:
                        nn.init.normal_(m.weight, mean=0.0, std=0.01)
                    else:
                        nn.init.kaiming_uniform_(m.weight)
                    nn.init.constant_(m.bias, 0)

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


class MLP(nn.Module):
    """Two Linear layers with zero biases: equal initializers the legacy exporter merges."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 10)
        for m in (self.fc1, self.fc2, self.fc3):
            nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


# --- sequence models ----------------------------------------------------------------------

class ViTBlock(nn.Module):
    """torchvision's ViT EncoderBlock: pre-LN nn.MultiheadAttention (batch_first) + GELU MLP."""

    def __init__(self, d, heads, mlp):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, d), nn.Dropout(0.0))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class MiniViT(nn.Module):
    """ViT: conv patch embedding, class token concatenated, learned positions, blocks, head on token 0."""

    def __init__(self, image=32, patch=8, d=32, heads=4, layers=2, classes=10):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, patch, patch)
        n = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embedding = nn.Parameter(torch.empty(1, n, d).normal_(std=0.02))
        self.layers = nn.Sequential(*[ViTBlock(d, heads, 2 * d) for _ in range(layers)])
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.conv_proj.out_channels, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


class TorchEncoder(nn.Module):
    """nn.TransformerEncoder, sequence-first (batch_first=False, PyTorch's default), then a head."""

    def __init__(self, d=32, heads=4, layers=2, classes=10, batch_first=False, padding_mask=False, seq_input=False):
        super().__init__()
        self.seq_input = seq_input   # the graph input itself is [S, N, d] (PyTorch's default layout)
        self.batch_first = batch_first
        self.padding_mask = padding_mask
        layer = nn.TransformerEncoderLayer(d, heads, 64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x, pad=None):          # x: [N, S, d]; pad: [N, S] True where padded
        if not self.batch_first and not self.seq_input:
            x = x.transpose(0, 1)  # [S, N, d]
        y = self.encoder(x, src_key_padding_mask=pad) if self.padding_mask else self.encoder(x)
        if not self.batch_first and not self.seq_input:
            y = y.transpose(0, 1)
        return self.head(y)


class NewGELU(nn.Module):
    """GPT-2's tanh GELU written out (Pow, Tanh, Mul)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPTBlock(nn.Module):
    """GPT-2 block: fused c_attn then split, causal mask buffer, tanh-GELU MLP."""

    def __init__(self, d, heads, seq):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.act = NewGELU()
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, s, h, d // h).transpose(1, 2)
        k = k.view(b, s, h, d // h).transpose(1, 2)
        v = v.view(b, s, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = att.masked_fill(self.bias[:, :, :s, :s] == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, s, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))


class MiniGPT(nn.Module):
    """GPT-2: token + learned position embeddings (arange positions), blocks, final LN, tied LM head."""

    def __init__(self, vocab=100, seq=16, d=32, heads=4, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList([GPTBlock(d, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


class BertLayer(nn.Module):
    """BERT layer: separate Q/K/V, additive attention mask, post-LN, erf GELU."""

    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.inter = nn.Linear(d, 4 * d)
        self.output = nn.Linear(4 * d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-12)

    def split(self, x):
        b, s, d = x.shape
        return x.view(b, s, self.h, d // self.h).permute(0, 2, 1, 3)

    def forward(self, x, ext_mask):
        b, s, d = x.shape
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        sc = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.h)
        if ext_mask is not None:
            sc = sc + ext_mask
        ctx = torch.matmul(sc.softmax(-1), v).permute(0, 2, 1, 3).contiguous().view(b, s, d)
        x = self.ln1(self.out(ctx) + x)
        return self.ln2(self.output(F.gelu(self.inter(x))) + x)


class MiniBert(nn.Module):
    """BERT: word + position + token type embeddings, layers, tanh pooler on token 0; two outputs."""

    def __init__(self, vocab=100, seq=16, d=32, heads=4, layers=2, mask=True):
        super().__init__()
        self.mask = mask
        self.word = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(64, d)
        self.tok = nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(d, heads) for _ in range(layers)])
        self.pooler = nn.Linear(d, d)
        self.register_buffer("position_ids", torch.arange(64).unsqueeze(0))
        self.register_buffer("token_type_ids", torch.zeros(1, 64, dtype=torch.long))

    def forward(self, input_ids, attention_mask=None):
        s = input_ids.shape[1]
        x = self.word(input_ids) + self.tok(self.token_type_ids[:, :s]) + self.pos(self.position_ids[:, :s])
        x = self.ln(x)
        ext = None
        if attention_mask is not None:
            ext = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for lay in self.layers:
            x = lay(x, ext)
        return x, torch.tanh(self.pooler(x[:, 0]))


class LSTMClassifier(nn.Module):
    """Two-layer LSTM (batch_first) classifying from the last layer's h_n."""

    def __init__(self, f=12, h=16, classes=5, bidirectional=False, batch_first=True):
        super().__init__()
        self.lstm = nn.LSTM(f, h, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
        self.fc = nn.Linear(h * (2 if bidirectional else 1), classes)

    def forward(self, x):
        _, (h_n, _) = self.lstm(x)
        if self.lstm.bidirectional:
            return self.fc(torch.cat([h_n[-2], h_n[-1]], dim=1))
        return self.fc(h_n[-1])


# --- the catalogue -------------------------------------------------------------------------

def _random_bn(bn) -> None:
    """Running statistics and affine parameters away from their initial 0/1 (a trained net's),
    so the exporters' folding of them into the layer before is visible in the output."""
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)


class ConvBiasBN(nn.Module):
    """A user's CNN: nn.Conv2d with its default bias=True before each BatchNorm2d (torchvision
    uses bias=False there), one grouped; both exporters fold the batch norms into the convs."""

    def __init__(self, classes=10):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, 2, 1, groups=2), nn.BatchNorm2d(16)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, classes)
        _random_bn(self.b1)
        _random_bn(self.b2)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class MLPBatchNorm(nn.Module):
    """Linear -> BatchNorm1d (dynamo folds it into the Gemm), Linear -> LayerNorm -> GELU, dropout."""

    def __init__(self):
        super().__init__()
        self.f1, self.bn = nn.Linear(20, 32), nn.BatchNorm1d(32)
        self.f2, self.ln = nn.Linear(32, 32), nn.LayerNorm(32)
        self.drop, self.f3 = nn.Dropout(0.3), nn.Linear(32, 5)
        _random_bn(self.bn)

    def forward(self, x):
        x = torch.relu(self.bn(self.f1(x)))
        return self.f3(self.drop(F.gelu(self.ln(self.f2(x)))))


def img(c=3, s=32):
    """One random image batch of 1."""
    return (torch.randn(1, c, s, s),)


def tokens(vocab=100, seq=16):
    """One random token-id sequence, batch 1."""
    return (torch.randint(0, vocab, (1, seq)),)


def catalogue():
    """name -> (module factory, example inputs, input names)."""
    mask = (torch.randint(0, 100, (1, 16)), torch.ones(1, 16, dtype=torch.long))
    return {
        "resnet": (MiniResNet, img(), ["x"]),
        "vgg": (MiniVGG, img(), ["x"]),
        "mobilenet_v2": (MiniMobileNetV2, img(), ["x"]),
        "efficientnet": (MiniEfficientNet, img(), ["x"]),
        "mobilenet_v3": (MiniMobileNetV3, img(), ["x"]),
        "squeezenet": (MiniSqueezeNet, img(3, 31), ["x"]),
        "squeezenet_ceil": (lambda: MiniSqueezeNet(torchvision_init=True), img(3, 33), ["x"]),
        "mlp": (MLP, (torch.randn(1, 64),), ["x"]),
        "convbias_bn": (ConvBiasBN, img(3, 16), ["x"]),
        "mlp_bn": (MLPBatchNorm, (torch.randn(1, 20),), ["x"]),
        "vit": (MiniViT, img(), ["x"]),
        "transformer_encoder": (TorchEncoder, (torch.randn(1, 10, 32),), ["x"]),
        "transformer_encoder_bf": (lambda: TorchEncoder(batch_first=True), (torch.randn(1, 10, 32),), ["x"]),
        "transformer_encoder_mask": (lambda: TorchEncoder(batch_first=True, padding_mask=True),
                                     (torch.randn(1, 10, 32), torch.zeros(1, 10, dtype=torch.bool)), ["x", "pad"]),
        "gpt": (MiniGPT, tokens(), ["input_ids"]),
        "bert": (lambda: MiniBert(mask=False), tokens(), ["input_ids"]),
        "bert_mask": (MiniBert, mask, ["input_ids", "attention_mask"]),
        "lstm": (LSTMClassifier, (torch.randn(1, 10, 12),), ["x"]),
        "lstm_bidir": (lambda: LSTMClassifier(bidirectional=True), (torch.randn(1, 10, 12),), ["x"]),
        # sequence-first graph inputs [S, 1, F]: nn.LSTM and nn.TransformerEncoder with their default layout
        "lstm_seqfirst": (lambda: LSTMClassifier(batch_first=False), (torch.randn(10, 1, 12),), ["x"]),
        "transformer_encoder_seqfirst": (lambda: TorchEncoder(seq_input=True), (torch.randn(10, 1, 32),), ["x"]),
    }


def hf_catalogue():
    """Hugging Face GPT-2 and BERT built from small configs (no downloads), when transformers is here."""
    try:
        import transformers as tf
    except ImportError:
        return {}
    def gcfg(attn):
        return tf.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4, attn_implementation=attn)

    def bcfg(attn):
        return tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=32, attn_implementation=attn)

    class HFGPT2(nn.Module):
        """GPT2LMHeadModel returning the logits only (no cache)."""

        def __init__(self, attn="eager"):
            super().__init__()
            self.m = tf.GPT2LMHeadModel(gcfg(attn))

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    class HFBert(nn.Module):
        """BertModel returning (last_hidden_state, pooler_output): two graph outputs."""

        def __init__(self, attn="eager"):
            super().__init__()
            self.m = tf.BertModel(bcfg(attn))

        def forward(self, input_ids, attention_mask):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask)
            return o.last_hidden_state, o.pooler_output

    mask = (torch.randint(0, 100, (1, 16)), torch.ones(1, 16, dtype=torch.long))
    # eager: attention written out; sdpa (the library's default): F.scaled_dot_product_attention
    return {"hf_gpt2": (HFGPT2, tokens(), ["input_ids"]), "hf_bert": (HFBert, mask, ["input_ids", "attention_mask"]),
            "hf_gpt2_sdpa": (lambda: HFGPT2("sdpa"), tokens(), ["input_ids"]),
            "hf_bert_sdpa": (lambda: HFBert("sdpa"), mask, ["input_ids", "attention_mask"])}


def lstm_macs(model, args) -> int:
    """MACs of every nn.LSTM, which FlopCounterMode does not see into on CPU (aten.lstm is one op):
    per layer and direction, each step multiplies [x_t, h] by the four gate matrices."""
    total = 0

    def hook(mod, inp, _out):
        nonlocal total
        s = inp[0].shape[1 if mod.batch_first else 0]
        dirs = 2 if mod.bidirectional else 1
        for layer in range(mod.num_layers):
            f = mod.input_size if layer == 0 else mod.hidden_size * dirs
            total += dirs * s * 4 * mod.hidden_size * (f + mod.hidden_size)

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.LSTM)]
    with torch.no_grad():
        model(*args)
    for h in hs:
        h.remove()
    return total


def true_counts(model, args) -> dict:
    """Trainable parameters (each shared tensor once) and forward MACs from torch's flop counter.

    Gradients stay enabled while counting: under no_grad PyTorch's inference fast paths
    (nn.MultiheadAttention, TransformerEncoderLayer) run fused kernels the counter cannot see.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in model.parameters() if p.requires_grad)   # parameters() dedups ties
    fc = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), fc:
        model(*args)
    extra = lstm_macs(model, args)
    return {"params": int(params), "macs": int(fc.get_total_flops() // 2) + extra,
            **({"lstm_macs_added": extra} if extra else {})}


#: extra legacy exports at an older opset (LayerNorm is decomposed below opset 17)
OLD_OPSETS = {"vit": [14]}
#: extra dynamo exports without the exporter's optimizer (``<name>.dynamo-noopt.onnx``): by default
#: it folds an embedding lookup with constant indices (positions, token types) into the rows read,
#: and the table's size leaves the file; with optimize=False the tables stay and counts are exact
NOOPT = ("bert",)


def export(model, args, names, path: Path, dynamo: bool, opset: int = 17, optimize: bool = True) -> str | None:
    """Export one model; returns an error text instead of raising (dynamo does not export everything)."""
    try:
        torch.onnx.export(model, args, str(path), input_names=names, dynamo=dynamo,
                          **({"optimize": optimize} if dynamo else {"opset_version": opset}))
    except Exception as e:  # noqa: BLE001 - record and go on with the other exporter
        path.unlink(missing_ok=True)
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    data = path.with_name(path.name + ".data")
    if data.exists():   # keep fixtures self-contained
        import onnx
        m = onnx.load(str(path))
        onnx.save(m, str(path), save_as_external_data=False)
        data.unlink()
    return None


def strip_stack_traces(path: Path) -> None:
    """Drop the per-node Python stack traces (a third of an unoptimised export's bytes; the
    importer reads the FX node text and the graph signature, which stay)."""
    import onnx
    m = onnx.load(str(path))
    for n in m.graph.node:
        keep = [(p.key, p.value) for p in n.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del n.metadata_props[:]
        for k, v in keep:
            n.metadata_props.add(key=k, value=v)
    onnx.save(m, str(path))


def masked(names, args) -> tuple:
    """The example inputs with masks that mask something: the exports trace all-ones attention
    masks and all-False padding masks; the saved input hides the last keys (5 of 16, 3 of 10)."""
    out = []
    for n, a in zip(names, args):
        if n == "attention_mask":
            a = a.clone()
            a[:, -5:] = 0
        elif n == "pad":
            a = a.clone()
            a[:, -3:] = True
        out.append(a)
    return tuple(out)


def save_io(model, args, names, path: Path, rec: dict) -> None:
    """The input, torch's output on it (eval mode, no gradients) and the counts, as .npz."""
    import numpy as np

    args = masked(names, args)
    with torch.no_grad():
        out = model(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    np.savez_compressed(path, **{f"in_{n}": a.numpy() for n, a in zip(names, args)},
                        **{f"out_{i}": o.detach().numpy() for i, o in enumerate(outs)},
                        params=np.int64(rec["params"]), macs=np.int64(rec["macs"]))


def main(argv: list[str]) -> int:
    """Export every (or the named) model with both exporters and write counts.json."""
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    counts_path = OUT / "counts.json"
    counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}
    cat = {**catalogue(), **hf_catalogue()}
    for name, (make, args, names) in cat.items():
        if argv and name not in argv:
            continue
        torch.manual_seed(0)
        model = make().eval()
        rec = true_counts(model, args)
        save_io(model, args, names, OUT / f"{name}.npz", rec)
        rec["inputs"] = {n: list(a.shape) for n, a in zip(names, args)}
        rec["exports"] = {}
        for exp in ("legacy", "dynamo"):
            err = export(model, args, names, OUT / f"{name}.{exp}.onnx", exp == "dynamo")
            rec["exports"][exp] = "ok" if err is None else err
            print(f"{name:24s} {exp:7s} {'ok' if err is None else err}", file=sys.stderr)
        for op in OLD_OPSETS.get(name, []):
            err = export(model, args, names, OUT / f"{name}.legacy{op}.onnx", False, op)
            rec["exports"][f"legacy{op}"] = "ok" if err is None else err
        if name in NOOPT:
            err = export(model, args, names, OUT / f"{name}.dynamo-noopt.onnx", True, optimize=False)
            if err is None:
                strip_stack_traces(OUT / f"{name}.dynamo-noopt.onnx")
            rec["exports"]["dynamo-noopt"] = "ok" if err is None else err
        counts[name] = rec
    counts_path.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
