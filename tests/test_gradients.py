"""The one rule of which backward passes run (fpga_models.gradients), as every part reads it:
nothing computes or charges the model input's gradient (issue 16 item 4)."""
from __future__ import annotations

import pytest

from bapipe.spec import model_from_text
from bapipe.zoo import get
from bapipe.fpga_models.boards import get_board
from bapipe.fpga_models.gradients import backward_work, gradient_tensors, no_input_gradient


@pytest.mark.parametrize("name,first", [("tiny-cnn", "conv1"), ("tiny-mlp", "fc1"), ("vgg16", "conv1"),
                                        ("resnet50", "conv1")])
def test_only_the_layer_reading_the_model_input_skips_its_input_gradient(name, first):
    m = get(name)
    assert no_input_gradient(m) == {first}   # every other layer computes its input's gradient


def test_layers_without_parameters_before_the_first_weights_have_no_backward():
    m = model_from_text("name: t\ninput: [1, 8, 8]\nlayers:\n  - {name: p, type: maxpool, kernel: 2}\n"
                        "  - {name: r, type: relu}\n  - {name: c, type: conv2d, out_channels: 2, kernel: 3}\n"
                        "  - {name: r2, type: relu}\n")
    assert gradient_tensors(m) == {"c", "r2"}
    assert no_input_gradient(m) == {"p", "r", "c"}
    assert backward_work(7, 0, False) == 0       # a pool on the input: no backward at all
    assert backward_work(7, 5, False) == 5       # the conv: its dW only
    assert backward_work(7, 5, True) == 12


def test_planner_table_and_allocation_charge_the_first_layer_dw_only():
    """tiny-mlp on a U250: the planner's layer table holds fc1's bwd_w MACs (not bwd_in + bwd_w),
    every other dense layer both; fpga_models.allocate's stage backward drops fc1's bwd_in cycles."""
    from bapipe.fpga_models.allocate import time_multiplexed
    from bapipe.fpga_models.cost import layer_cost
    from bapipe.planner.stagecost import layer_table

    m = get("tiny-mlp")
    u250 = get_board("U250")
    t = layer_table(m, u250, "fixed16", 0.8)
    for k, l in enumerate(m.layers):
        if l.type == "dense":
            want = l.bwd_w_macs if l.name == "fc1" else l.bwd_in_macs + l.bwd_w_macs
            assert t.bwd_work[k] == want, l.name
    layers = list(m.layers)
    full = time_multiplexed(layers, u250, "fixed16", 1, 0.8, True)
    skip = time_multiplexed(layers, u250, "fixed16", 1, 0.8, True, no_dx=no_input_gradient(m))
    pe, simd = skip.folding["fc1"]
    assert full.bwd_cycles - skip.bwd_cycles == layer_cost(layers[0], u250, pe, simd).bwd_in_cycles > 0
    assert full.fwd_cycles == skip.fwd_cycles


@pytest.mark.slow  # runs the planner (~2 s)
def test_demo_split_plan_prices_conv1_without_dx(tmp_path):
    """The demo's tiny-cnn split: stage 0 (conv1, relu1; dataflow, micro-batches of 4) was
    priced 576 backward cycles a micro-batch with conv1's bwd_in (128 a sample, its slowest
    layer); the kernel computes dW only (64 a sample, = relu1's), so 64 + 64 + 3 x 64 = 320 and
    plan_bwd_cycles' steady state 64, what csim counts (tests/test_csim_cycles.py, soak)."""
    from bapipe.cli import main
    from bapipe.plan import load_plan
    from bapipe.codegen.design.backward import plan_bwd_cycles

    pf = tmp_path / "p.yaml"
    assert main(["plan", "tiny-cnn", "4xU250-ring", "-o", str(pf), "--force", "--partition", "0-1,2-3,4-8,9"]) in (0, None)
    plan = load_plan(pf)
    m = get("tiny-cnn")
    st = plan.stages[0]
    assert st.layers == ["conv1", "relu1"] and st.style == "dataflow"
    assert st.cycles["bwd"] == 320
    got = plan_bwd_cycles(plan, m, 0, get_board(st.board_type))
    assert got["per_sample"] == 64 and got["layers"] == {"conv1": 64, "relu1": 64}
    # the backward kernel builds what the plan prices: conv1's tiled engine makes dW only (one
    # pass of its NF x SF blocks a pixel), every other matrix engine dx and dW (two)
    from bapipe.codegen.design.lower import build_project
    from bapipe.fpga_models.cluster import load_cluster

    ctx = build_project(plan, m, load_cluster(plan.cluster), str(pf))
    for k, s in enumerate(plan.stages):
        want = plan_bwd_cycles(plan, m, k, get_board(s.board_type))["layers"]
        mvus = {e["layer"]: e["cycles_per_sample"] for e in ctx.stages[k].bwd.engines
                if e["engine"].startswith("tiled_")}
        assert mvus and all(c == want[n] for n, c in mvus.items()), (k, mvus, want)
