"""Zoo counts against published figures (sources in docs/models.md)."""
import pytest

from bapipe import zoo
from bapipe.layers import prod

# (params, fwd GMAC rounded as published or None) — sources in docs/models.md
PUBLISHED = {
    "vgg16": (138_357_544, 15.47),
    "resnet50": (25_557_032, 4.09),
    "gnmt8": (160_671_297, None),
    "bert-large": (335_141_888, None),
    "gpt2": (124_439_808, None),
    "gpt2-medium": (354_823_168, None),
    "gpt2-large": (774_030_080, None),
    "gpt2-xl": (1_557_611_200, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_counts(name):
    m = zoo.get(name)
    params, gmac = PUBLISHED[name]
    assert m.params == params
    if gmac is not None:
        assert round(m.fwd_macs / 1e9, 2) == gmac


def test_gpt3_matches_paper_within_rounding():
    # Brown et al. 2020, Table 2.1: 175.0B parameters (n_layers 96, d_model 12288, 96 heads, ctx 2048).
    m = zoo.get("gpt3-175b")
    d, L, V, ctx = 12288, 96, 50257, 2048
    assert m.params == L * (12 * d * d + 13 * d) + V * d + ctx * d + 2 * d
    # the table's 175.0B is 175B to the billion (this count: 174.6B): within half a billion
    assert abs(m.params - 175.0e9) <= 0.5e9


def test_vgg16_per_layer_macs_and_fc6():
    m = zoo.get("vgg16")
    convs = [l for l in m.layers if l.type == "conv2d"]
    expect_m = [86.7, 1849.7, 924.8, 1849.7, 924.8, 1849.7, 1849.7, 924.8, 1849.7, 1849.7, 462.4, 462.4, 462.4]
    assert [round(l.fwd_macs / 1e6, 1) for l in convs] == expect_m
    fc = {l.name: l for l in m.layers if l.type == "dense"}
    assert fc["fc6"].params == 102_764_544
    assert [round(fc[n].fwd_macs / 1e6, 1) for n in ("fc6", "fc7", "fc8")] == [102.8, 16.8, 4.1]


def test_conv_formula_by_hand():
    m = zoo.get("vgg16")
    c1 = m.layers[0]
    assert c1.out_shape == (64, 224, 224)
    assert c1.params == 64 * 3 * 9 + 64
    assert c1.fwd_macs == 64 * 224 * 224 * 3 * 9 == c1.bwd_in_macs == c1.bwd_w_macs


def test_resnet_skip_tensors_cross_cuts():
    m = zoo.get("resnet50")
    # cut right after the first bottleneck's conv1: the block input (pool1 output) is an open skip
    k = m.index["res2a_conv1"]
    names = [t.producer for t in m.cut_tensors(k)]
    assert names == ["pool1", "res2a_conv1"]
    assert m.cut_elements(k) == 64 * 56 * 56 * 2
    # after a block's final relu only the main path crosses
    k = m.index["res2a_relu"]
    assert [t.producer for t in m.cut_tensors(k)] == ["res2a_relu"]
    assert list(m.cut_elements_all) == [m.cut_elements(i) for i in range(len(m.layers) - 1)]


def test_gnmt_cuts_carry_target_tokens_and_context():
    m = zoo.get("gnmt8")
    k = m.index["enc_res3"]
    assert {t.producer for t in m.cut_tensors(k)} == {"tgt", "enc_res3"}
    k = m.index["dec_lstm1"]
    assert {t.producer for t in m.cut_tensors(k)} == {"dec_lstm1", "attention"}
    assert m.layers[m.index["dec_embed"]].weight_params == 0  # shared with the encoder embedding


def test_gpt2_layer_counts_by_formula():
    m = zoo.get("gpt2")
    attn = m.layers[m.index["h0_attn"]]
    s, d = 1024, 768
    assert attn.params == 4 * d * d + 4 * d
    assert attn.fwd_macs == 4 * s * d * d + 2 * s * s * d
    assert attn.bwd_w_macs == 4 * s * d * d
    lm = m.layers[-1]
    assert lm.tied_to == "embed" and lm.weight_params == 0 and lm.fwd_macs == s * d * 50257


def test_lstm_counts():
    m = zoo.get("gnmt8")
    l0 = m.layers[m.index["enc_lstm0"]]
    h = 1024
    assert l0.out_shape == (50, 2 * h)
    assert l0.params == 2 * (4 * h * (h + h) + 8 * h)
    assert l0.fwd_macs == 2 * 50 * 4 * h * 2 * h


def test_every_zoo_model_is_consistent():
    for name in zoo.ZOO:
        m = zoo.get(name)
        for l in m.layers:
            assert l.out_elems == prod(l.out_shape) > 0
            assert l.bwd_in_macs >= 0 and l.bwd_w_macs >= 0
        assert m.fingerprint() == zoo.get(name).fingerprint()
