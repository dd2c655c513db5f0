"""Inside-a-board allocation: time-multiplexed sums, dataflow min-max folding under budgets."""
import itertools
from dataclasses import replace

import pytest

from bapipe.models import load_model
from bapipe.fpga_models.allocate import (allocate_stage, board_dsp, board_kernels, dataflow, engine_share, kernel_dsp,
                                  stage_budget, time_multiplexed)
from bapipe.fpga_models.boards import get_board
from bapipe.fpga_models.cost import best_folding, folding_candidates, layer_cost
from tolerances import f64_sum


def _small_board(dsp):
    return replace(get_board("U250"), usable_dsp=dsp, usable_lut=10**9)


def test_time_multiplexed_is_the_sum_of_best_layers():
    """Every sample takes every layer's turn: its cycles plus its engine's fill (MVU 4, pool 1,
    element-wise 0; fpga_models.engines), and one sequencer switch per job. Training: each
    layer folded within a third of the capped budget (forward, input- and weight-gradient arrays)."""
    layers = list(load_model("tiny-cnn").layers)
    u250 = get_board("U250")
    a = time_multiplexed(layers, u250, batch=4, cap=0.8)
    want_f = want_b = 0
    fill = {"conv2d": 4, "dense": 4, "maxpool": 1, "avgpool": 1, "relu": 0, "flatten": 0}
    for l in layers:
        pe, simd = best_folding(l, u250, "fixed16", u250.usable_dsp * 0.8 / 3, u250.usable_lut * 0.8 / 3)
        c = layer_cost(l, u250, pe, simd, batch=4)
        want_f += c.fwd_cycles + (4 * fill[l.type] if c.fwd_cycles else 0)
        want_b += c.bwd_cycles + (4 * fill[l.type] if c.bwd_cycles else 0)
        assert a.folding[l.name] == (pe, simd)
    assert (a.fwd_cycles, a.bwd_cycles) == (want_f + 4, want_b + 4)   # + TM_SWITCH per sample
    assert a.style == "time-multiplexed"


@pytest.mark.parametrize("dsp", [16, 40, pytest.param(100, marks=pytest.mark.slow),  # 100: ~0.8 s, 300: ~2 s of brute force
                                 pytest.param(300, marks=pytest.mark.slow)])
def test_dataflow_bottleneck_matches_brute_force(dsp):
    model = load_model("tiny-mlp")
    layers = [l for l in model.layers if l.type == "dense"][:3]
    board = _small_board(dsp)
    a = dataflow(layers, board, cap=1.0, batch=1, train=False)
    assert a is not None
    used = sum(layer_cost(l, board, *a.folding[l.name]).dsp for l in layers)
    assert used <= dsp
    got = max(layer_cost(l, board, *a.folding[l.name]).fwd_cycles + layer_cost(l, board, *a.folding[l.name]).bwd_cycles
              for l in layers)
    best = None
    for combo in itertools.product(*[folding_candidates(l) for l in layers]):
        if sum(p * s for p, s in combo) > dsp:
            continue
        worst = max(layer_cost(l, board, p, s).fwd_cycles + layer_cost(l, board, p, s).bwd_cycles
                    for l, (p, s) in zip(layers, combo))
        best = worst if best is None else min(best, worst)
    assert got <= best + 2  # bisection tolerance of about one cycle per pass


def test_dataflow_stream_formula():
    layers = list(load_model("tiny-cnn").layers)
    u250 = get_board("U250")
    a1 = dataflow(layers, u250, batch=1)
    a8 = dataflow(layers, u250, batch=8)
    f = [layer_cost(l, u250, *a8.folding[l.name]).fwd_cycles for l in layers]
    assert a8.fwd_cycles == sum(f) + 7 * max(f)
    assert a1.fwd_cycles == sum(f)


def test_allocate_picks_the_faster_style():
    layers = list(load_model("tiny-cnn").layers)
    u250 = get_board("U250")
    for batch in (1, 64):
        a = allocate_stage(layers, u250, batch=batch)
        tm = time_multiplexed(layers, u250, batch=batch)
        df = dataflow(layers, u250, batch=batch)
        assert a.fwd_cycles + a.bwd_cycles == min(tm.fwd_cycles + tm.bwd_cycles, df.fwd_cycles + df.bwd_cycles)
    # many small layers and a large batch: resident engines beat taking turns
    assert allocate_stage(layers, u250, batch=64).style == "dataflow"
    assert allocate_stage(layers, u250, style="time-multiplexed").style == "time-multiplexed"


def test_dataflow_none_when_nothing_fits():
    layers = [l for l in load_model("tiny-mlp").layers if l.type == "dense"]
    assert dataflow(layers, _small_board(2), cap=1.0) is None


# --- the board budget: which kernels a board holds, and each stage's share --------------------


def test_board_kernels_and_shares():
    """Inference: one forward kernel per stage on the board; training: forward and backward.
    The share divides the capped budget by stages on the board x arrays per matrix layer
    (1 forward + 2 backward: input gradient and weight gradient)."""
    assert board_kernels([2, 0], train=False) == [(0, "fwd"), (2, "fwd")]
    assert board_kernels([2, 0], train=True) == [(0, "fwd"), (0, "bwd"), (2, "fwd"), (2, "bwd")]
    assert engine_share(1, False) == 1.0
    assert engine_share(2, False) == 0.5
    assert engine_share(1, True) == 1 / 3   # 1.0 / 3: the same single rounded division
    assert engine_share(2, True) == 1 / 6
    u250 = get_board("U250")
    # budget x cap x (1/6) against budget x cap / 6: two roundings and the share's one against
    # two (measured: equal)
    assert stage_budget(u250, 0.8, 2, True) == pytest.approx((11_520 * 0.8 / 6, u250.usable_lut * 0.8 / 6),
                                                             rel=f64_sum(5), abs=0)
    # kernel DSP: dataflow sums the layers' arrays, time-multiplexed takes the largest; bwd x 2
    assert kernel_dsp([64, 256, 8], "dataflow", "fwd") == 328
    assert kernel_dsp([64, 256, 8], "time-multiplexed", "bwd") == 512
    assert board_dsp([([64, 256], "dataflow"), ([100], "time-multiplexed")], train=True) == 3 * 320 + 3 * 100
    assert board_dsp([([64, 256], "dataflow"), ([100], "time-multiplexed")], train=False) == 420
    # no input-gradient array for a layer without dx (fpga_models.gradients: the model input's)
    assert kernel_dsp([64, 256, 8], "dataflow", "bwd", [False, True, True]) == 328 + 264
    assert kernel_dsp([256, 64, 8], "time-multiplexed", "bwd", [False, True, True]) == 256 + 64
    assert kernel_dsp([64, 256, 8], "time-multiplexed", "bwd", [False, False, False]) == 256
    assert kernel_dsp([64, 256, 8], "time-multiplexed", "fwd", [False, False, False]) == 256
    assert board_dsp([([72], "dataflow", [False])], train=True) == 2 * 72     # tiny-cnn's conv1


@pytest.mark.parametrize("style", ["time-multiplexed", "dataflow"])
@pytest.mark.parametrize("chunks,train", [(1, False), (1, True), (2, True), (3, False)])
def test_allocation_fits_its_share(style, chunks, train):
    """vgg16's layers 0-6 on a U250 at cap 0.8: the stage's arrays (x chunks stages, x 3 when
    training) fit the capped 9,216 DSP, and a smaller share is never faster."""
    layers = list(load_model("vgg16").layers)[:7]
    u250 = get_board("U250")
    a = allocate_stage(layers, u250, batch=2, cap=0.8, train=train, style=style, chunks=chunks)
    assert a.style == style
    arrays = 3 if train else 1
    assert chunks * arrays * a.dsp <= 11_520 * 0.8
    assert chunks * arrays * a.dsp > 11_520 * 0.8 / 2    # the share is used, not left idle
    whole = allocate_stage(layers, u250, batch=2, cap=0.8, train=False, style=style, chunks=1)
    assert a.fwd_cycles >= whole.fwd_cycles
