"""Training engines one by one, bit-exact against numpy and cycle-exact against fpga_models.engines.

A dense layer's four engines (train_mvu_fwd, mvu_bwd_in, mvu_bwd_w, sgd_update, wired as a
board wires them, test wrapper below) over two iterations of three micro-batches: forward
outputs (fixedpoint.dense_fwd), input gradients (train_fixed.dense_bwd_input), the forward
weights and biases after each update (train_fixed.sgd_update of the 32-bit master weights on
the exact sums, momentum carried over, then train_fixed.forward_weights), and
every engine run exactly ``engines.mvu_bwd_cycles`` / ``mvu_vector_cycles`` /
``sgd_update_cycles`` cycles from start to done. ReLU forward and backward (train_relu) the
same way. Also `verilator --lint-only -Wall` on a whole generated training cluster.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from cocotb_tests.train_tb import pack, run_op, unpack
from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import CACHE, tb_config

pytestmark = [*needs_verilator, xdist_group("train_engines")]

FMT = "fixed16"


def _consts():
    """A two-step rate schedule, one update a step: the second update runs at half the rate, so the
    engine's own step counter (sgd_update LR_TABLE) is checked against train_fixed.SgdSchedule."""
    from bapipe.fpga_models import train_fixed as tfx
    return tfx.sgd_schedule(0.05, 0.9, 3, tfx.get_formats(FMT), [1.0, 0.5], 1)


def _lr_params(s) -> dict:
    """The wrappers' rate parameters of schedule ``s`` (two steps)."""
    return {"MU_Q": s.steps[0].mu, "LR_Q0": s.steps[0].lr, "LR_Q1": s.steps[1].lr, "LR_SHIFT": s.steps[0].shift}

WRAPPER = """
`default_nettype none
module train_dense_unit #(
    parameter integer MW = 8, parameter integer MH = 6, parameter integer PE = 2, parameter integer SIMD = 4,
    parameter integer ADDR_W = 3, parameter integer MU_Q = 1, parameter integer LR_Q0 = 1,
    parameter integer LR_Q1 = 1, parameter integer LR_SHIFT = 1
) (
    input  wire clk, input wire rst,
    input  wire f_start, input wire [MW*16-1:0] x, output wire [MH*16-1:0] y, output wire f_done,
    input  wire bi_start, input wire [MH*16-1:0] dy, output wire [MW*16-1:0] dx, output wire bi_done,
    input  wire bw_start, output wire bw_done,
    input  wire u_start, output wire u_done,
    input  wire peek, input wire [ADDR_W-1:0] peek_addr, output wire [PE*SIMD*16-1:0] peek_tile,
    output wire [MH*16-1:0] bias
);
    wire [ADDR_W-1:0] fa, ba, ga;
    wire [PE*SIMD*16-1:0] ft;
    wire gclr, gclrb, infl;
    wire [PE*SIMD*48-1:0] gt;
    wire [MH*48-1:0] gb;
    wire [PE*SIMD*16-1:0] bt;
    assign peek_tile = bt;
    train_mvu_fwd #(.MW(MW), .MH(MH), .PE(PE), .SIMD(SIMD), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(ADDR_W)) f (
        .clk(clk), .rst(rst), .start(f_start), .x(x), .w_addr(fa), .w_tile(ft), .bias(bias), .y(y), .done(f_done));
    mvu_bwd_in #(.MW(MW), .MH(MH), .PE(PE), .SIMD(SIMD), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(ADDR_W)) bi (
        .clk(clk), .rst(rst), .start(bi_start), .dy(dy), .w_addr(ba), .w_tile(bt), .dx(dx), .done(bi_done));
    mvu_bwd_w #(.MW(MW), .MH(MH), .PE(PE), .SIMD(SIMD), .ELEM_W(16), .ACC_W(48), .ADDR_W(ADDR_W)) bw (
        .clk(clk), .rst(rst), .start(bw_start), .dy(dy), .x(x), .done(bw_done), .g_addr(ga), .g_clr(gclr),
        .g_clr_bias(gclrb), .g_tile(gt), .g_bias(gb));
    sgd_update #(.MW(MW), .MH(MH), .PE(PE), .SIMD(SIMD), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(ADDR_W),
                 .MU_Q(MU_Q), .LR_STEPS(2), .LR_PERIOD(1), .LR_TABLE({LR_Q1[31:0], LR_Q0[31:0]}),
                 .LR_SHIFT(LR_SHIFT), .NAME("unit")) u (
        .clk(clk), .rst(rst), .rd_a_addr(fa), .rd_a_tile(ft), .rd_b_addr(peek ? peek_addr : ba), .rd_b_tile(bt),
        .bias(bias), .start(u_start), .g_addr(ga), .g_clr(gclr), .g_clr_bias(gclrb), .g_tile(gt), .g_bias(gb),
        .done(u_done), .inflight(infl));
endmodule
`default_nettype wire
"""


_pack, _unpack = pack, unpack


try:
    import cocotb
    from cocotb.triggers import ReadOnly, RisingEdge

    from bapipe.codegen.check import sim_tb as tb

    _run = run_op

    async def _update_and_read(dut, master: dict, vel: dict, acc, gsum, consts, tf, cycles_out: list,
                               mh: int, mw: int, pe: int, simd: int):
        """Run sgd_update once (u_start), apply train_fixed.sgd_update to ``master`` / ``vel`` (in
        place) and read the engine's forward weights back through the peek port, one tile a
        cycle: (the expected forward weights, biases; the MH x MW matrix read, the biases read)."""
        from bapipe.codegen.design.training import from_tile_order
        from bapipe.fpga_models import train_fixed as tfx

        await _run(dut, dut.u_start, dut.u_done, cycles_out)
        master["w"], vel["w"] = tfx.sgd_update(master["w"], vel["w"], acc, consts, tf)
        master["b"], vel["b"] = tfx.sgd_update(master["b"], vel["b"], gsum, consts, tf)
        fwd = tfx.forward_weights({"l": master}, tf)["l"]
        dut.peek.value = 1
        flat = []
        for a in range((mh // pe) * (mw // simd)):
            dut.peek_addr.value = a
            await ReadOnly()
            flat += _unpack(int(dut.peek_tile.value), pe * simd).tolist()
            await RisingEdge(dut.clk)
        await ReadOnly()
        bias_now = _unpack(int(dut.bias.value), mh)
        await RisingEdge(dut.clk)
        dut.peek.value = 0
        return fwd["w"], fwd["b"], from_tile_order(np.array(flat), mh, mw, pe, simd), bias_now

    @cocotb.test()
    async def dense_unit(dut):
        from bapipe.fpga_models import engines
        from bapipe.fpga_models import train_fixed as tfx
        from bapipe.fpga_models.fixedpoint import dense_fwd

        cfg = tb_config()
        mw, mh, pe, simd = cfg["mw"], cfg["mh"], cfg["pe"], cfg["simd"]
        tf = tfx.get_formats(FMT)
        consts = _consts()
        w = np.array(cfg["w"], dtype=np.int64)           # forward copies (16 bits)
        b = np.array(cfg["b"], dtype=np.int64)
        up = tf.master.frac - tf.act.frac
        master = {"w": w << up, "b": b << up}
        vel = {"w": np.zeros_like(w), "b": np.zeros_like(b)}
        rng = np.random.default_rng(cfg["seed"])
        for sig in ("f_start", "bi_start", "bw_start", "u_start", "peek"):
            getattr(dut, sig).value = 0
        await tb.start(dut)
        n_tiles = engines.mvu_vector_cycles(mh, mw, pe, simd)
        cyc: dict[str, list] = {"f": [], "bi": [], "bw": [], "u": []}
        for it in range(2):
            acc = np.zeros((mh, mw), dtype=np.int64)
            gsum = np.zeros(mh, dtype=np.int64)
            for _mb in range(3):
                x = rng.integers(-2048, 2048, mw)
                dy = rng.integers(-2048, 2048, mh)
                dut.x.value = _pack(x)
                await _run(dut, dut.f_start, dut.f_done, cyc["f"])
                assert np.array_equal(_unpack(int(dut.y.value), mh), dense_fwd(x, w, b, FMT))
                dut.dy.value = _pack(dy)
                await _run(dut, dut.bi_start, dut.bi_done, cyc["bi"])
                assert np.array_equal(_unpack(int(dut.dx.value), mw), tfx.dense_bwd_input(dy, w, tf))
                await _run(dut, dut.bw_start, dut.bw_done, cyc["bw"])
                dw, db = tfx.dense_bwd_weight(dy, x, tf)
                acc += dw
                gsum += db
            w, b, got_w, got_b = await _update_and_read(dut, master, vel, acc, gsum, consts.at(it), tf, cyc["u"],
                                                        mh, mw, pe, simd)
            assert np.array_equal(got_w, w), f"weights, iteration {it}"
            assert np.array_equal(got_b, b), f"biases, iteration {it}"
        bi, bw = engines.mvu_bwd_cycles(mh, mw, pe, simd)
        assert set(cyc["f"]) == {n_tiles} and set(cyc["bi"]) == {bi} and set(cyc["bw"]) == {bw}
        assert set(cyc["u"]) == {engines.sgd_update_cycles(mh, mw, pe, simd)}

    @cocotb.test()
    async def relu_unit(dut):
        from bapipe.fpga_models import engines
        from bapipe.fpga_models.fixedpoint import relu_bwd, relu_fwd

        cfg = tb_config()
        n, lanes, bwd = cfg["n"], cfg["lanes"], cfg["bwd"]
        rng = np.random.default_rng(cfg["seed"])
        dut.start.value = 0
        await tb.start(dut)
        cyc: list = []
        for _ in range(4):
            x = rng.integers(-32768, 32768, n)
            dy = rng.integers(-32768, 32768, n)
            dut.x.value = _pack(x)
            dut.dy.value = _pack(dy)
            await _run(dut, dut.start, dut.done, cyc)
            want = relu_bwd(dy, x) if bwd else relu_fwd(x)
            assert np.array_equal(_unpack(int(dut.y.value), n), want)
        assert set(cyc) == {engines.relu_bwd_cycles(n, lanes) if bwd else engines.stream_cycles(n, lanes)}
except ImportError:  # pragma: no cover - cocotb missing: the pytest side skips
    pass


def _dense_files(mw, mh, pe, simd, w, b):
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.training import hex_lines, tile_order
    files = {f"{n}.v": render_template(n) for n in ("train_mvu_fwd", "mvu_bwd_in", "mvu_bwd_w", "sgd_update")}
    files["train_dense_unit.v"] = WRAPPER
    files["unit_w.hex"] = hex_lines(tile_order(w, pe, simd), ELEM_W)
    files["unit_b.hex"] = hex_lines(b, ELEM_W)
    return files


@pytest.mark.soak  # one Verilator build per parameter set (~18 s CPU, 1 min wall), cached after
@pytest.mark.parametrize("mw,mh,pe,simd", [(8, 6, 2, 4), (6, 4, 4, 3)])
def test_dense_engines_bit_exact(mw, mh, pe, simd):
    rng = np.random.default_rng(mw * 100 + mh)
    w = rng.integers(-600, 600, (mh, mw))
    b = rng.integers(-200, 200, mh)
    addr_w = max(1, ((mh // pe) * (mw // simd) - 1).bit_length())
    c = _consts()
    d = build("train_dense_unit", _dense_files(mw, mh, pe, simd, w, b),
              parameters={"MW": mw, "MH": mh, "PE": pe, "SIMD": simd, "ADDR_W": addr_w, **_lr_params(c)})
    check(d, "train_dense_unit", "cocotb_tests.test_train_engines", "dense_unit", mw=mw, mh=mh, pe=pe, simd=simd,
          w=w.tolist(), b=b.tolist(), seed=7)


@pytest.mark.soak  # one Verilator build per parameter set (~10 s CPU), cached after
@pytest.mark.parametrize("n,lanes,bwd", [(10, 4, 0), (10, 4, 1)])
def test_relu_engines_bit_exact(n, lanes, bwd):
    from bapipe.codegen.rtl.env import render_template
    d = build("train_relu", {"train_relu.v": render_template("train_relu")},
              parameters={"N": n, "LANES": lanes, "BWD": bwd, "CNT_W": 2})
    check(d, "train_relu", "cocotb_tests.test_train_engines", "relu_unit", n=n, lanes=lanes, bwd=bwd, seed=3)


@pytest.mark.slow  # renders a tiny-mlp training build and lints it whole (~10 s CPU)
@pytest.mark.parametrize("samples,style", [(1, "dataflow"), (4, "dataflow"), (4, "time-multiplexed")])
def test_training_rtl_lint_clean(tmp_path, samples, style):
    """`verilator --lint-only -Wall` reports nothing on a 4-board training cluster (every module):
    micro-batches of one sample, of 4 samples streaming through the layers (the per-sample
    buffers), and of 4 samples one engine at a time (time-multiplexed stages)."""
    from dataclasses import replace

    from bapipe.toolchain import verilator_bin, wire_verilator
    from bapipe.codegen.rtl.train import render_train
    from bapipe.codegen.design.training import train_design
    from tests.handplan import named_plan

    plan = named_plan("tiny-mlp", "4xU250-ring", [["fc1", "relu1"], ["fc2", "relu2"], ["fc3", "relu3"], ["fc4"]],
                     {"fc1": (4, 8), "fc2": (4, 8), "fc3": (4, 8), "fc4": (2, 4)}, mode="train", style=style)
    plan = replace(plan, microbatch_size=samples, microbatches=2, global_batch=2 * samples)
    from bapipe.fpga_models.plancheck import resolve
    model, cluster = resolve(plan)
    files = render_train(train_design(plan, model, cluster))
    d = CACHE / f"lint-train-{samples}-{style}"
    d.mkdir(parents=True, exist_ok=True)
    for n, t in files.items():
        if n.endswith(".v"):
            (d / n).write_text(t)
    env = wire_verilator(dict(__import__("os").environ))
    r = subprocess.run([str(verilator_bin() / "verilator"), "--lint-only", "-Wall", "--top-module", "train_cluster_top",
                        *sorted(str(d / n) for n in files if n.endswith(".v"))], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "%Warning" not in r.stderr, r.stderr[:3000]


# ---------------------------------------------------------------- conv2d and pools (tiny-cnn)

CONV_WRAPPER = """
`default_nettype none
module train_conv_unit #(
    parameter integer C = 2, parameter integer H = 4, parameter integer W = 4, parameter integer K = 3,
    parameter integer STRIDE = 1, parameter integer PAD = 1, parameter integer OH = 4, parameter integer OW = 4,
    parameter integer MH = 4, parameter integer PE = 2, parameter integer SIMD = 6,
    parameter integer ADDR_W = 3, parameter integer MU_Q = 1, parameter integer LR_Q0 = 1,
    parameter integer LR_Q1 = 1, parameter integer LR_SHIFT = 1
) (
    input  wire clk, input wire rst,
    input  wire f_start, input wire [C*H*W*16-1:0] x, output wire [MH*OH*OW*16-1:0] y, output wire f_done,
    input  wire bi_start, input wire [MH*OH*OW*16-1:0] dy, output wire [C*H*W*16-1:0] dx, output wire bi_done,
    input  wire bw_start, output wire bw_done,
    input  wire u_start, output wire u_done,
    input  wire peek, input wire [ADDR_W-1:0] peek_addr, output wire [PE*SIMD*16-1:0] peek_tile,
    output wire [MH*16-1:0] bias
);
    wire [ADDR_W-1:0] fa, ba, ga;
    wire [PE*SIMD*16-1:0] ft;
    wire gclr, gclrb, infl;
    wire [PE*SIMD*48-1:0] gt;
    wire [MH*48-1:0] gb;
    wire [PE*SIMD*16-1:0] bt;
    wire [47:0] ard;      // the all-reduce port (replicated stages) is idle here
    assign peek_tile = bt;
    train_conv_fwd #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MH(MH), .PE(PE),
                     .SIMD(SIMD), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(ADDR_W)) f (
        .clk(clk), .rst(rst), .start(f_start), .x(x), .w_addr(fa), .w_tile(ft), .bias(bias), .y(y), .done(f_done));
    conv_bwd_in #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MH(MH), .PE(PE),
                  .SIMD(SIMD), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(ADDR_W)) bi (
        .clk(clk), .rst(rst), .start(bi_start), .dy(dy), .w_addr(ba), .w_tile(bt), .dx(dx), .done(bi_done));
    conv_bwd_w #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MH(MH), .PE(PE),
                 .SIMD(SIMD), .ELEM_W(16), .ACC_W(48), .ADDR_W(ADDR_W)) bw (
        .clk(clk), .rst(rst), .start(bw_start), .dy(dy), .x(x), .done(bw_done), .g_addr(ga), .g_clr(gclr),
        .g_clr_bias(gclrb), .g_tile(gt), .g_bias(gb), .ar_raddr(16'd0), .ar_rdata(ard), .ar_we(1'b0),
        .ar_add(1'b0), .ar_waddr(16'd0), .ar_wdata(48'd0));
    sgd_update #(.MW(K*K*C), .MH(MH), .PE(PE), .SIMD(SIMD), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(ADDR_W),
                 .MU_Q(MU_Q), .LR_STEPS(2), .LR_PERIOD(1), .LR_TABLE({LR_Q1[31:0], LR_Q0[31:0]}),
                 .LR_SHIFT(LR_SHIFT), .NAME("unit")) u (
        .clk(clk), .rst(rst), .rd_a_addr(fa), .rd_a_tile(ft), .rd_b_addr(peek ? peek_addr : ba), .rd_b_tile(bt),
        .bias(bias), .start(u_start), .g_addr(ga), .g_clr(gclr), .g_clr_bias(gclrb), .g_tile(gt), .g_bias(gb),
        .done(u_done), .inflight(infl));
endmodule
`default_nettype wire
"""

POOL_WRAPPER = """
`default_nettype none
module train_pool_unit #(
    parameter integer C = 2, parameter integer H = 4, parameter integer W = 4, parameter integer K = 2,
    parameter integer STRIDE = 2, parameter integer PAD = 0, parameter integer OH = 2, parameter integer OW = 2,
    parameter integer FC = 4, parameter integer FIPC = 2, parameter integer BC = 4, parameter integer BIPC = 8,
    parameter integer RECIP = 65536
) (
    input  wire clk, input wire rst, input wire [3:0] start,
    input  wire [C*H*W*16-1:0] x, input wire [C*OH*OW*16-1:0] dy,
    output wire [C*OH*OW*16-1:0] y_max, output wire [C*OH*OW*16-1:0] y_avg,
    output wire [C*H*W*16-1:0] dx_max, output wire [C*H*W*16-1:0] dx_avg, output wire [3:0] done
);
    train_pool #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MODE(0), .BWD(0),
                 .CYCLES(FC), .IPC(FIPC), .RECIP(RECIP)) mf (.clk(clk), .rst(rst), .start(start[0]), .x(x), .dy(dy),
                 .y(y_max), .done(done[0]));
    train_pool #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MODE(1), .BWD(0),
                 .CYCLES(FC), .IPC(FIPC), .RECIP(RECIP)) af (.clk(clk), .rst(rst), .start(start[1]), .x(x), .dy(dy),
                 .y(y_avg), .done(done[1]));
    train_pool #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MODE(0), .BWD(1),
                 .CYCLES(BC), .IPC(BIPC), .RECIP(RECIP)) mb (.clk(clk), .rst(rst), .start(start[2]), .x(x), .dy(dy),
                 .y(dx_max), .done(done[2]));
    train_pool #(.C(C), .H(H), .W(W), .K(K), .STRIDE(STRIDE), .PAD(PAD), .OH(OH), .OW(OW), .MODE(1), .BWD(1),
                 .CYCLES(BC), .IPC(BIPC), .RECIP(RECIP)) ab (.clk(clk), .rst(rst), .start(start[3]), .x(x), .dy(dy),
                 .y(dx_avg), .done(done[3]));
endmodule
`default_nettype wire
"""

try:
    import cocotb
    from cocotb.triggers import ReadOnly, RisingEdge

    from bapipe.codegen.check import sim_tb as tb

    @cocotb.test()
    async def conv_unit(dut):
        """train_conv_fwd, conv_bwd_in, conv_bwd_w and sgd_update over 2 iterations x 2 micro-batches:
        outputs (fixedpoint.conv2d_fwd), input gradients (train_fixed.conv2d_bwd_input), the forward
        weights after each update (train_fixed.sgd_update on conv2d_bwd_weight's exact sums, momentum
        carried), every engine exactly engines.conv_train_cycles / sgd_update_cycles."""
        from bapipe.codegen.design.training import weight_matrix
        from bapipe.fpga_models import engines
        from bapipe.fpga_models import train_fixed as tfx
        from bapipe.fpga_models.fixedpoint import conv2d_fwd

        cfg = tb_config()
        c, h, w_, k, st, pad, o, pe, simd = (cfg[n] for n in ("c", "h", "wd", "k", "stride", "pad", "o", "pe", "simd"))
        oh, ow = (h + 2 * pad - k) // st + 1, (w_ + 2 * pad - k) // st + 1
        mw = k * k * c
        tf = tfx.get_formats(FMT)
        consts = _consts()
        w = np.array(cfg["w"], dtype=np.int64)           # (O, C, K, K) forward copies
        b = np.array(cfg["b"], dtype=np.int64)
        up = tf.master.frac - tf.act.frac
        master = {"w": w << up, "b": b << up}
        vel = {"w": np.zeros_like(w), "b": np.zeros_like(b)}
        rng = np.random.default_rng(cfg["seed"])
        for sig in ("f_start", "bi_start", "bw_start", "u_start", "peek"):
            getattr(dut, sig).value = 0
        await tb.start(dut)
        cyc: dict[str, list] = {"f": [], "bi": [], "bw": [], "u": []}
        for it in range(2):
            acc = np.zeros((o, c, k, k), dtype=np.int64)
            gsum = np.zeros(o, dtype=np.int64)
            for _mb in range(2):
                x = rng.integers(-2048, 2048, (1, c, h, w_))
                dy = rng.integers(-2048, 2048, (1, o, oh, ow))
                dut.x.value = _pack(x)
                await _run(dut, dut.f_start, dut.f_done, cyc["f"])
                assert np.array_equal(_unpack(int(dut.y.value), o * oh * ow),
                                      conv2d_fwd(x, w, b, FMT, st, pad).reshape(-1)), f"forward, iteration {it}"
                dut.dy.value = _pack(dy)
                await _run(dut, dut.bi_start, dut.bi_done, cyc["bi"])
                assert np.array_equal(_unpack(int(dut.dx.value), c * h * w_),
                                      tfx.conv2d_bwd_input(dy, w, (h, w_), tf, st, pad).reshape(-1)), "input gradient"
                await _run(dut, dut.bw_start, dut.bw_done, cyc["bw"])
                dw, db = tfx.conv2d_bwd_weight(dy, x, k, tf, st, pad)
                acc += dw
                gsum += db
            w, b, got_w, got_b = await _update_and_read(dut, master, vel, acc, gsum, consts.at(it), tf, cyc["u"],
                                                        o, mw, pe, simd)
            assert np.array_equal(got_w, weight_matrix(w)), f"weights, iteration {it}"
            assert np.array_equal(got_b, b), f"biases, iteration {it}"
        fc, bi, bw = engines.conv_train_cycles(o, mw, oh * ow, pe, simd)
        assert set(cyc["f"]) == {fc} and set(cyc["bi"]) == {bi} and set(cyc["bw"]) == {bw}, cyc
        assert set(cyc["u"]) == {engines.sgd_update_cycles(o, mw, pe, simd)}

    @cocotb.test()
    async def pool_unit(dut):
        """train_pool's four engines (max / avg, forward / backward) on random images, against
        fixedpoint.maxpool_fwd / avgpool_fwd and train_fixed.maxpool_bwd / avgpool_bwd (ties
        included: the values are drawn from a small range), each exactly its CYCLES."""
        from bapipe.fpga_models import train_fixed as tfx
        from bapipe.fpga_models.fixedpoint import avgpool_fwd, maxpool_fwd

        cfg = tb_config()
        c, h, w_, k, st, pad = (cfg[n] for n in ("c", "h", "w", "k", "stride", "pad"))
        oh, ow = (h + 2 * pad - k) // st + 1, (w_ + 2 * pad - k) // st + 1
        tf = tfx.get_formats(FMT)
        rng = np.random.default_rng(cfg["seed"])
        dut.start.value = 0
        await tb.start(dut)
        cyc: dict[int, list] = {0: [], 1: [], 2: [], 3: []}
        for trial in range(3):
            lim = 4 if trial == 0 else 32768                 # trial 0: many ties (the first maximum wins)
            x = rng.integers(-lim, lim, (1, c, h, w_))
            dy = rng.integers(-32768, 32768, (1, c, oh, ow))
            dut.x.value = _pack(x)
            dut.dy.value = _pack(dy)
            want = {0: maxpool_fwd(x, k, st, pad), 1: avgpool_fwd(x, k, FMT, st, pad),
                    2: tfx.maxpool_bwd(x, dy, k, tf, st, pad), 3: tfx.avgpool_bwd(dy, (h, w_), k, tf, st, pad)}
            outs = {0: dut.y_max, 1: dut.y_avg, 2: dut.dx_max, 3: dut.dx_avg}
            for e in range(4):
                dut.start.value = 1 << e
                n = 1
                await ReadOnly()
                while not (int(dut.done.value) >> e) & 1:
                    await RisingEdge(dut.clk)
                    dut.start.value = 0
                    n += 1
                    await ReadOnly()
                await RisingEdge(dut.clk)
                dut.start.value = 0
                await ReadOnly()
                await RisingEdge(dut.clk)
                cyc[e].append(n)
                got = _unpack(int(outs[e].value), want[e].size)
                assert np.array_equal(got, want[e].reshape(-1)), f"engine {e}, trial {trial}"
        assert set(cyc[0]) == set(cyc[1]) == {cfg["fc"]} and set(cyc[2]) == set(cyc[3]) == {cfg["bc"]}, cyc
except ImportError:  # pragma: no cover - cocotb missing: the pytest side skips
    pass


@pytest.mark.soak  # one Verilator build per parameter set (~1 min wall on the shared machine), cached after
@pytest.mark.parametrize("c,h,w,k,stride,pad,o,pe,simd", [(2, 4, 4, 3, 1, 1, 4, 2, 6), (2, 5, 5, 3, 2, 1, 4, 4, 9)])
def test_conv_engines_bit_exact(c, h, w, k, stride, pad, o, pe, simd):
    """conv2d's training engines (tiny-cnn's 3 x 3 / pad 1 shape, and a stride-2 one whose windows
    leave input pixels out and cross the padding)."""
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.training import hex_lines, tile_order, weight_matrix
    rng = np.random.default_rng(c * 100 + h)
    wq = rng.integers(-600, 600, (o, c, k, k))
    b = rng.integers(-200, 200, o)
    mw = k * k * c
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    addr_w = max(1, ((o // pe) * (mw // simd) - 1).bit_length())
    files = {f"{n}.v": render_template(n) for n in ("train_conv_fwd", "conv_bwd_in", "conv_bwd_w", "sgd_update")}
    files["train_conv_unit.v"] = CONV_WRAPPER
    files["unit_w.hex"] = hex_lines(tile_order(weight_matrix(wq), pe, simd), ELEM_W)
    files["unit_b.hex"] = hex_lines(b, ELEM_W)
    cs = _consts()
    d = build("train_conv_unit", files,
              parameters={"C": c, "H": h, "W": w, "K": k, "STRIDE": stride, "PAD": pad, "OH": oh, "OW": ow, "MH": o,
                          "PE": pe, "SIMD": simd, "ADDR_W": addr_w, **_lr_params(cs)})
    check(d, "train_conv_unit", "cocotb_tests.test_train_engines", "conv_unit", c=c, h=h, wd=w, k=k, stride=stride,
          pad=pad, o=o, pe=pe, simd=simd, w=wq.tolist(), b=b.tolist(), seed=5)


@pytest.mark.soak  # one Verilator build per parameter set (~30 s wall), cached after
@pytest.mark.parametrize("c,h,w,k,stride,pad,lanes", [(2, 4, 4, 2, 2, 0, 4), (2, 5, 5, 3, 2, 1, 3)])
def test_pool_engines_bit_exact(c, h, w, k, stride, pad, lanes):
    """max / avg pool forward and backward (tiny-cnn's 2 x 2 / stride 2, and overlapping 3 x 3 /
    stride 2 / pad 1 windows whose gradients add), cycles from engines.pool_train_cycles."""
    from bapipe.codegen.rtl.env import render_template
    from bapipe.fpga_models import engines
    from bapipe.fpga_models.fixedpoint import avg_recip
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    work = c * oh * ow * k * k                      # the layer's fwd_ops: windows x taps (stream_elements)
    fc, bc = engines.pool_train_cycles(work, lanes)
    d = build("train_pool_unit", {"train_pool.v": render_template("train_pool"), "train_pool_unit.v": POOL_WRAPPER},
              parameters={"C": c, "H": h, "W": w, "K": k, "STRIDE": stride, "PAD": pad, "OH": oh, "OW": ow,
                          "FC": fc, "FIPC": -(-c * oh * ow // fc), "BC": bc, "BIPC": -(-c * h * w // bc),
                          "RECIP": avg_recip(k * k)})
    check(d, "train_pool_unit", "cocotb_tests.test_train_engines", "pool_unit", c=c, h=h, w=w, k=k, stride=stride,
          pad=pad, fc=fc, bc=bc, seed=11)
