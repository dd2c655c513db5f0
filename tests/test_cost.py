"""Per-layer FPGA/GPU cost formulas against hand-computed values."""
import pytest

from bapipe.models import load_model
from bapipe.fpga_models.boards import BRAM36_BYTES, URAM_BYTES, get_board
from bapipe.fpga_models.cost import (Budget, best_folding, divisors, folding_candidates, gpu_layer_cost, layer_cost,
                              matrix_shape, mvu_cycles, onchip_blocks, onchip_capacity, profile_layer, weight_copies)
from tolerances import U64


def _layer(model, name):
    m = load_model(model)
    return m.layers[m.index[name]]


def test_divisors():
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    assert divisors(50257) == (1, 29, 1733, 50257)


def test_mvu_cycles_conv_hand_computed():
    # tiny-cnn conv2: 8 -> 8 channels, 3x3, 8x8 output: MH = 8, MW = 8*9 = 72, 64 pixels
    l = _layer("tiny-cnn", "conv2")
    assert matrix_shape(l) == (8, 72, 64.0)
    u250 = get_board("U250")
    c = layer_cost(l, u250, pe=4, simd=8, batch=3)
    assert c.fwd_cycles == (8 // 4) * (72 // 8) * 64 * 3 == 3456
    assert c.bwd_in_cycles == c.fwd_cycles and c.bwd_w_cycles == c.fwd_cycles
    assert c.dsp == 32  # 4 x 8 MAC lanes, 1 DSP per fixed16 MAC
    # line buffer: 3 rows of the 8x8x8 input, 2 bytes each
    assert c.buffer_bytes == 3 * 8 * 8 * 2


def test_mvu_cycles_vgg_hand_computed():
    u250 = get_board("U250")
    conv1 = _layer("vgg16", "conv1")   # 3 -> 64, 3x3, 224x224: MW = 27
    assert layer_cost(conv1, u250, 64, 27).fwd_cycles == 224 * 224
    fc7 = _layer("vgg16", "fc7")       # 4096 x 4096
    assert layer_cost(fc7, u250, 2, 4096).fwd_cycles == 2048
    assert layer_cost(fc7, u250, 2, 4096, fmt="int8").dsp == 4096  # int8 packs 2 MACs per DSP


def test_mvu_cycles_rounds_up():
    assert mvu_cycles(100, 3, 3) == 12
    assert mvu_cycles(99, 3, 3) == 11


def test_best_folding_is_the_best_legal_pair():
    u250 = get_board("U250")
    for name in ("conv1", "conv2", "fc8"):
        l = _layer("vgg16", name)
        mh, mw, _ = matrix_shape(l)
        for budget in (7, 100, 1000, 5000):
            pe, simd = best_folding(l, u250, dsp_budget=budget, lut_budget=1e12)
            assert mh % pe == 0 and mw % simd == 0 and pe * simd <= budget
            brute = max(p * s for p, s in folding_candidates(l) if p * s <= budget)
            assert pe * simd == brute


def test_elementwise_lanes_divide_channels():
    l = _layer("tiny-cnn", "relu3")
    pe, simd = best_folding(l, get_board("U250"))
    assert pe == 1 and 16 % simd == 0
    c = layer_cost(l, get_board("U250"), 1, simd, batch=2)
    assert c.fwd_cycles == -(-(16 * 4 * 4 * 2) // simd)
    assert c.dsp == 0


def test_gpu_roofline():
    v100 = get_board("V100")
    fc6 = _layer("vgg16", "fc6")  # 25088 x 4096: memory bound at batch 1 on a V100
    g = gpu_layer_cost(fc6, v100, "fixed16", 1)
    bytes_f = fc6.params * 2 + (fc6.in_elems + fc6.out_elems) * 2
    # an integer over a rate: one rounding here, at most one more however the code groups it
    assert g.fwd_s == pytest.approx(bytes_f / 900e9, rel=2 * U64)
    assert g.fwd_bound == "memory"
    conv2 = _layer("vgg16", "conv2")
    g2 = gpu_layer_cost(conv2, v100, "fixed16", 64)
    assert g2.fwd_s == pytest.approx(2 * conv2.fwd_macs * 64 / 125e12, rel=2 * U64)   # likewise
    assert g2.fwd_bound == "compute"


def test_profile_layer_keys_and_spill():
    u55c = get_board("U55C")
    fc6 = _layer("vgg16", "fc6")   # 205 MB of fixed16 weights: more than the 43 MB on chip
    p = profile_layer(fc6, u55c)
    for k in ("fwd_s", "bwd_s", "fwd_cycles", "bwd_cycles", "pe", "simd", "dsp", "weight_bytes", "bound"):
        assert k in p
    spill = fc6.params * 2 - onchip_capacity(u55c)
    # integer cycles or bytes over a rate (see test_gpu_roofline)
    assert p["fwd_s"] == pytest.approx(max(p["fwd_cycles"] / 300e6, spill / 460e9), rel=2 * U64)
    conv = profile_layer(_layer("vgg16", "conv2"), u55c)
    assert conv["bound"] == "compute" and conv["fwd_s"] == pytest.approx(conv["fwd_cycles"] / 300e6, rel=2 * U64)
    gp = profile_layer(fc6, get_board("V100"), batch=4)
    assert gp["fwd_s"] > 0 and gp["bwd_s"] > gp["fwd_s"]


def test_memory_blocks_and_copies():
    u250 = get_board("U250")
    assert onchip_capacity(u250, 1.0) == 1280 * URAM_BYTES + 2304 * BRAM36_BYTES
    blocks = onchip_blocks(u250, 3 * URAM_BYTES + 10, cap=1.0)
    assert blocks == {"uram": 4, "bram36": 0}
    full = onchip_blocks(u250, 1280 * URAM_BYTES + 2 * BRAM36_BYTES, cap=1.0)
    assert full == {"uram": 1280, "bram36": 2}
    assert weight_copies("sgd") == 2 and weight_copies("adam") == 4
    assert weight_copies("sgd", versions=2) == 3 and weight_copies("adam", "inference") == 1
    b = Budget.of(u250, 0.5)
    assert b.dsp == 5760 and b.offchip_bytes == u250.offchip_bytes
