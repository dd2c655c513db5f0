"""Batchnorm and residual-add training engines, bit-exact against fpga_models.train_fixed and
cycle-exact against fpga_models.engines.

- ``train_batchnorm`` forward and backward with ``sgd_update`` owning scale (as its MH = C,
  MW = 1 weights) and shift (as its biases), wired as a board wires them (wrapper below): over
  two iterations of three micro-batches, forward outputs (fixedpoint.batchnorm_fwd), input
  gradients (train_fixed.batchnorm_bwd_input), scale and shift after each update
  (train_fixed.sgd_update of the master copies on the exact batchnorm_bwd_weight sums, then
  forward_weights), every pass exactly ``engines.batchnorm_train_cycles``, the update
  ``engines.sgd_update_cycles(C, 1, C, 1)``.
- ``train_add``: fixedpoint.add_fwd (forward join) and train_fixed.add_grads (the fork's
  gradient sum) on random values including saturating ones, ``engines.add_train_cycles``.
"""
from __future__ import annotations

import numpy as np
import pytest

from cocotb_tests.train_tb import pack, run_op, unpack
from cocotb_tests.common import build, check, needs_verilator, xdist_group

pytestmark = [*needs_verilator, xdist_group("train_bn_add")]

FMT = "fixed16"
#: micro-batches an iteration in the batchnorm test (the sums span them) and its iterations
MICROBATCHES, ITERATIONS = 3, 2

BN_WRAPPER = """
`default_nettype none
module train_bn_unit #(
    parameter integer N = 12, parameter integer C = 3, parameter integer LANES = 4, parameter integer CNT_W = 2,
    parameter integer MU_Q = 1, parameter integer LR_Q = 1, parameter integer LR_SHIFT = 1
) (
    input  wire clk, input wire rst,
    input  wire f_start, input wire [N*16-1:0] x, output wire [N*16-1:0] y, output wire f_done,
    input  wire b_start, input wire [N*16-1:0] xs, input wire [N*16-1:0] dy, output wire [N*16-1:0] dx,
    output wire b_done,
    input  wire u_start, output wire u_done,
    output wire [C*16-1:0] scale, output wire [C*16-1:0] shift
);
    wire ga;
    wire gclr, gclrb, infl;
    wire [C*48-1:0] gt, gb;
    wire [C*48-1:0] unused_t, unused_b;
    wire [47:0] ar_f, ar_b;
    wire [C*16-1:0] scale_b;
    train_batchnorm #(.N(N), .C(C), .LANES(LANES), .ELEM_W(16), .FRAC(10), .ACC_W(48), .BWD(0), .CNT_W(CNT_W)) f (
        .clk(clk), .rst(rst), .start(f_start), .x(x), .dy(x), .scale(scale), .shift(shift), .g_clr(1'b0),
        .g_clr_bias(1'b0), .y(y), .done(f_done), .g_tile(unused_t), .g_bias(unused_b), .ar_raddr(16'd0), .ar_we(1'b0),
        .ar_add(1'b0), .ar_waddr(16'd0), .ar_wdata(48'd0), .ar_rdata(ar_f));
    train_batchnorm #(.N(N), .C(C), .LANES(LANES), .ELEM_W(16), .FRAC(10), .ACC_W(48), .BWD(1), .CNT_W(CNT_W)) b (
        .clk(clk), .rst(rst), .start(b_start), .x(xs), .dy(dy), .scale(scale_b), .shift(shift), .g_clr(gclr),
        .g_clr_bias(gclrb), .y(dx), .done(b_done), .g_tile(gt), .g_bias(gb), .ar_raddr(16'd0), .ar_we(1'b0),
        .ar_add(1'b0), .ar_waddr(16'd0), .ar_wdata(48'd0), .ar_rdata(ar_b));
    sgd_update #(.MW(1), .MH(C), .PE(C), .SIMD(1), .ELEM_W(16), .FRAC(10), .ACC_W(48), .ADDR_W(1),
                 .MU_Q(MU_Q), .LR_TABLE(LR_Q[31:0]), .LR_SHIFT(LR_SHIFT), .NAME("unit")) u (
        .clk(clk), .rst(rst), .rd_a_addr(1'b0), .rd_a_tile(scale), .rd_b_addr(1'b0), .rd_b_tile(scale_b),
        .bias(shift), .start(u_start), .g_addr(ga), .g_clr(gclr), .g_clr_bias(gclrb), .g_tile(gt), .g_bias(gb),
        .done(u_done), .inflight(infl));
endmodule
`default_nettype wire
"""


def _consts():
    from bapipe.fpga_models import train_fixed as tfx
    return tfx.sgd_constants(0.05, 0.9, MICROBATCHES, tfx.get_formats(FMT))


_pack, _unpack = pack, unpack


try:
    import cocotb
    from cocotb.triggers import ReadOnly, RisingEdge

    from bapipe.codegen.check import sim_tb as tb

    _run = run_op

    @cocotb.test()
    async def bn_unit(dut):
        from bapipe.codegen.check.sim_harness import tb_config
        from bapipe.fpga_models import engines
        from bapipe.fpga_models import train_fixed as tfx
        from bapipe.fpga_models.fixedpoint import batchnorm_fwd

        cfg = tb_config()
        c, hw, lanes = cfg["c"], cfg["hw"], cfg["lanes"]
        n = c * hw
        tf = tfx.get_formats(FMT)
        consts = _consts()
        scale = np.array(cfg["scale"], dtype=np.int64)
        shift = np.array(cfg["shift"], dtype=np.int64)
        up = tf.master.frac - tf.act.frac
        master = {"scale": scale << up, "shift": shift << up}
        vel = {"scale": np.zeros_like(scale), "shift": np.zeros_like(shift)}
        rng = np.random.default_rng(cfg["seed"])
        for sig in ("f_start", "b_start", "u_start"):
            getattr(dut, sig).value = 0
        await tb.start(dut)
        cyc: dict[str, list] = {"f": [], "b": [], "u": []}
        for it in range(ITERATIONS):
            gs = np.zeros(c, dtype=np.int64)
            gh = np.zeros(c, dtype=np.int64)
            for _mb in range(MICROBATCHES):
                # full-range inputs: products saturate the output both ways
                x = rng.integers(-32768, 32768, (1, c, hw, 1))
                dy = rng.integers(-32768, 32768, (1, c, hw, 1))
                dut.x.value = _pack(x)
                await _run(dut, dut.f_start, dut.f_done, cyc["f"])
                got = _unpack(int(dut.y.value), n)
                assert np.array_equal(got, batchnorm_fwd(x, scale, shift, FMT).reshape(-1)), f"forward, iteration {it}"
                dut.xs.value = _pack(x)
                dut.dy.value = _pack(dy)
                await _run(dut, dut.b_start, dut.b_done, cyc["b"])
                got = _unpack(int(dut.dx.value), n)
                assert np.array_equal(got, tfx.batchnorm_bwd_input(dy, scale, tf).reshape(-1)), f"dx, iteration {it}"
                ds, dsh = tfx.batchnorm_bwd_weight(dy, x, tf)
                gs += ds
                gh += dsh
            await _run(dut, dut.u_start, dut.u_done, cyc["u"])
            # the engine sums dy (g_bias); sgd_update scales it by 2^FRAC: batchnorm_bwd_weight's dshift
            master["scale"], vel["scale"] = tfx.sgd_update(master["scale"], vel["scale"], gs, consts, tf)
            master["shift"], vel["shift"] = tfx.sgd_update(master["shift"], vel["shift"], gh, consts, tf)
            fwd = tfx.forward_weights({"l": master}, tf)["l"]
            scale, shift = fwd["scale"], fwd["shift"]
            await ReadOnly()
            assert np.array_equal(_unpack(int(dut.scale.value), c), scale), f"scale, iteration {it}"
            assert np.array_equal(_unpack(int(dut.shift.value), c), shift), f"shift, iteration {it}"
            assert not np.array_equal(master["scale"] >> up, np.array(cfg["scale"])) or it, "the update moved nothing"
            await RisingEdge(dut.clk)
        fc, bc = engines.batchnorm_train_cycles(n, lanes)
        assert set(cyc["f"]) == {fc} and set(cyc["b"]) == {bc}, cyc
        assert set(cyc["u"]) == {engines.sgd_update_cycles(c, 1, c, 1)}

    @cocotb.test()
    async def add_unit(dut):
        from bapipe.codegen.check.sim_harness import tb_config
        from bapipe.fpga_models import engines
        from bapipe.fpga_models import train_fixed as tfx
        from bapipe.fpga_models.fixedpoint import add_fwd

        cfg = tb_config()
        n, lanes = cfg["n"], cfg["lanes"]
        tf = tfx.get_formats(FMT)
        rng = np.random.default_rng(cfg["seed"])
        dut.start.value = 0
        await tb.start(dut)
        cyc: list = []
        for k in range(4):
            a = rng.integers(-32768, 32768, n)
            b = rng.integers(-32768, 32768, n)
            dut.a.value = _pack(a)
            dut.b.value = _pack(b)
            await _run(dut, dut.start, dut.done, cyc)
            got = _unpack(int(dut.y.value), n)
            # both directions are the same 16-bit saturating sum (activations and gradients are 16 bits)
            assert np.array_equal(got, add_fwd(a, b, FMT)), f"forward join, vector {k}"
            assert np.array_equal(got, tfx.add_grads(a, b, tf)), f"fork gradient sum, vector {k}"
        assert set(cyc) == {engines.add_train_cycles(n, lanes)}
except ImportError:  # pragma: no cover - cocotb missing: the pytest side skips
    pass


# one Verilator build (~15 s CPU), cached after: the default run's engine-level check of both
# directions of batchnorm training (a 3-channel, 5-pixel vector whose 4-lane chunks straddle channels)
@pytest.mark.slow
def test_batchnorm_engines_bit_exact():
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.training import hex_lines
    c, hw, lanes = 3, 5, 4
    rng = np.random.default_rng(17)
    scale = rng.integers(-2048, 2048, c)
    shift = rng.integers(-2048, 2048, c)
    cs = _consts()
    files = {f"{m}.v": render_template(m) for m in ("train_batchnorm", "sgd_update")}
    files["train_bn_unit.v"] = BN_WRAPPER
    files["unit_w.hex"] = hex_lines(scale, 16)
    files["unit_b.hex"] = hex_lines(shift, 16)
    n = c * hw
    d = build("train_bn_unit", files,
              parameters={"N": n, "C": c, "LANES": lanes, "CNT_W": max(1, (-(-n // lanes) - 1).bit_length()),
                          "MU_Q": cs.mu, "LR_Q": cs.lr, "LR_SHIFT": cs.shift})
    check(d, "train_bn_unit", "cocotb_tests.test_train_bn_add", "bn_unit", c=c, hw=hw, lanes=lanes,
          scale=scale.tolist(), shift=shift.tolist(), seed=23)


@pytest.mark.soak  # one Verilator build per parameter set (~10 s CPU), cached after
@pytest.mark.parametrize("n,lanes", [(10, 4), (16, 16)])
def test_add_engine_bit_exact(n, lanes):
    from bapipe.codegen.rtl.env import render_template
    d = build("train_add", {"train_add.v": render_template("train_add")},
              parameters={"N": n, "LANES": lanes, "CNT_W": max(1, (-(-n // lanes) - 1).bit_length())})
    check(d, "train_add", "cocotb_tests.test_train_bn_add", "add_unit", n=n, lanes=lanes, seed=29)


# ------------------------------------------------------------------ a residual block, whole

MINI_RESNET = __import__("pathlib").Path(__file__).parent / "models" / "mini-resnet.yaml"


def _mini_resnet_plan(tmp, schedule: str, batch: int = 2, partition: str = "0-9,10-11", cap: str = "0.3"):
    """cocotb_tests/models/mini-resnet.yaml on 2 boards (the residual block | pool, fc), 2
    micro-batches (of 1 sample by default), both stages dataflow."""
    import subprocess
    import sys
    out = tmp / f"mini-resnet-{schedule}-{batch}.yaml"
    subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", str(MINI_RESNET), "4xU250-ring", "--mode", "train",
                    "--schedule", schedule, "--microbatches", "2", "--global-batch", str(batch), "--partition",
                    partition, "--cap", cap, "-o", str(out), "--force"], check=True, capture_output=True)
    return out


@pytest.mark.slow  # runs the planner (~2 s)
def test_mini_resnet_design_is_the_plans(tmp_path):
    """The residual block's training design: b1_add reads b1_bn2 and the skip (stem_relu), whose
    gradient is the sum of the two that come back (a fork step before stem_relu's backward); every
    engine's cycles from fpga_models.engines add up to the plan's stage cycles: board 0 forward
    3 convs x 16 + 3 batchnorms x 16 + 3 relus x 16 + add 16 = 160, backward the stem's dW 16 (no
    dx of the model input, fpga_models.gradients) + 2 x (16 + 16) conv (dx, dW) + 3 x 16 batchnorm
    (one pass) + 3 x 16 relu + the fork's 16 + the add's one-cycle pass-through unit = 193, where the
    plan has 192 (it prices the add's backward as a 16-cycle stream pass and the fork's sum as none);
    board 1 17 / 18."""
    from bapipe.plan import load_plan
    from bapipe.models import load_model
    from bapipe.codegen.design.training import train_design
    from bapipe.fpga_models.cluster import load_cluster

    plan = load_plan(_mini_resnet_plan(tmp_path, "gpipe"))
    td = train_design(plan, load_model(plan.model), load_cluster(plan.cluster))
    b0 = td.boards[0]
    by = {l.name: l for l in b0.layers}
    assert by["b1_add"].inputs == ("b1_bn2", "stem_relu") and by["stem"].inputs == ("",)
    assert by["stem_relu"].fork_cycles == 16 and sum(l.fork_cycles for l in b0.layers) == 16
    names = [s[1] for s in b0.steps()]
    assert names.index("b1_conv1_bi") < names.index("stem_relu_fs") < names.index("stem_relu_b")
    got = [(b.op_fwd_cycles, b.op_bwd_cycles) for b in td.boards]
    assert [(s.cycles["fwd"], s.cycles["bwd_rtl"]) for s in plan.stages] == [(160, 192), (17, 18)]
    assert got == [(160, 193), (17, 18)]
    assert [l.name for l in b0.layers if l.kind == "batchnorm"] == ["stem_bn", "b1_bn1", "b1_bn2"]


@pytest.mark.soak  # gen + a 2- or 4-board Verilator build (~2.5 / 7 min wall on the shared machine) + 2 iterations
@pytest.mark.parametrize("schedule,batch,partition,cap", [
    ("gpipe", 2, "0-9,10-11", "0.3"), ("1f1b", 2, "0-9,10-11", "0.3"),
    ("gpipe", 4, "0-9,10-11", "0.3"),            # 2 samples a micro-batch stream through the block
    ("gpipe", 8, "0-9x2,10-11x2", "1.0"),        # 2 replicas a stage, 2 samples each: the ring reduces bn sums
])
def test_mini_resnet_trains_bit_exact(tmp_path, schedule, batch, partition, cap):
    """`bapipe gen` + `bapipe rtlsim --iterations 2` on the residual block: every conv, batchnorm
    (scale, shift) and dense master weight bit-exact against train_fixed.train_step after each
    iteration, outputs bit-exact, no overflow, the cluster lint -Wall clean, iteration cycles within
    2% of the plan (measured gpipe 1062 / 1063 vs 1057.91, +0.48%; 1f1b 902 / 903 vs 897.91, +0.57%;
    streaming 2 samples a micro-batch 1204 / 1205 vs 1198.82, +0.52%; 2 replicas x 2 samples 1884 /
    1885 vs 1882.26, +0.15%, every replica bit-exact)."""
    import json
    import os
    import subprocess
    import sys

    from bapipe.toolchain import verilator_bin, wire_verilator

    build_dir = tmp_path / "build"
    subprocess.run([sys.executable, "-m", "bapipe.cli", "gen", str(_mini_resnet_plan(tmp_path, schedule, batch, partition, cap)), "-o",
                    str(build_dir)], check=True, capture_output=True)
    rtl = build_dir / "rtl" / "train"
    env = wire_verilator(dict(os.environ))
    r = subprocess.run([str(verilator_bin() / "verilator"), "--lint-only", "-Wall", f"-I{rtl}", "--top-module",
                        "train_cluster_top", str(rtl / "train_cluster_top.v")], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr[:2000]
    r = subprocess.run([sys.executable, "-m", "bapipe.cli", "rtlsim", str(build_dir), "--json", "--iterations", "2"],
                       capture_output=True, text=True)
    res = json.loads(r.stdout)
    assert res["weights_match"] and res["outputs_match"] and not res["overflow"], res
    assert len(res["iteration_cycles"]) == 2
    # 2%: issue 17's bound on iteration cycles vs the plan's iteration time
    assert res["max_iteration_error"] < 0.02, res


# ------------------------------------------------------------------ small-resnet, the zoo's residual CNN

SMALL_RESNET = __import__("pathlib").Path(__file__).parents[1] / "examples" / "models" / "small-resnet.yaml"


def _small_resnet_plan(tmp):
    """`bapipe plan small-resnet 4xU250-ring --partition 0-20x4 --microbatches 1 --schedule 1f1b`: one
    dataflow stage x 4 replicas, one micro-batch of 32, 8 samples a replica (the default plan until
    the HLS backward's tiled engines were priced; since then the default search settles on 2 stages
    x 2 replicas cut inside a residual block, 1.07 ms, which the training RTL does not build, while
    this plan prices 854 us: a search miss, reported, not pinned here)."""
    import subprocess
    import sys
    out = tmp / "small-resnet.yaml"
    subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", str(SMALL_RESNET), "4xU250-ring", "--partition",
                    "0-20x4", "--microbatches", "1", "--schedule", "1f1b", "-o", str(out), "--force"],
                   check=True, capture_output=True)
    return out


@pytest.mark.slow  # runs the planner (~1 s)
def test_small_resnet_design_is_the_plans(tmp_path):
    """small-resnet's one-stage plan (:func:`_small_resnet_plan`): a fork's gradient sum (stem_relu's, b1_relu's: 4,096 cycles a
    sample) is a backward unit of its own, so 8 samples stream through it and the forked relu's
    backward as through every other pass, and the B op is sum + 7 x max with the max a conv's 6,144:
    133,762 cycles against the plan's 133,760 (the RTL's two adds pass dy on in 1 cycle where the plan
    prices a 4,096-cycle stream pass, and the RTL's two fork sums take the 4,096 the plan gives
    none). With the sum inside the relu's unit (session 8) that unit took 8,192 a sample and the op
    148,098 (+10.7%). The F op is the plan's, 104,768."""
    from bapipe.plan import load_plan
    from bapipe.models import load_model
    from bapipe.codegen.design.training import train_design
    from bapipe.fpga_models.cluster import load_cluster

    plan = load_plan(_small_resnet_plan(tmp_path))
    td = train_design(plan, load_model(plan.model), load_cluster(plan.cluster))
    assert (td.replicas, plan.schedule, plan.microbatches, plan.microbatch_size) == (4, "1f1b", 1, 32)
    for b in td.boards:
        units = [(l.name, part) for l, part in b.bwd_units()]
        cyc = b.unit_cycles("B")
        assert [u for u in units if u[1] == "fs"] == [("b1_relu", "fs"), ("stem_relu", "fs")]
        assert cyc[units.index(("stem_relu", "fs"))] == cyc[units.index(("stem_relu", "b"))] == 4096
        assert max(cyc) == 6144 and b.beta == 8
        assert (b.op_fwd_cycles, b.plan_fwd_cycles) == (104768, 104768)
        assert (b.op_bwd_cycles, b.plan_bwd_cycles) == (133762, 133760)
        assert b.op_bwd_cycles == sum(cyc) + 7 * max(cyc)


@pytest.mark.soak  # gen + a 4-board Verilator build of 16,384-element vectors + 2 iterations (see docs/rtl.md)
def test_small_resnet_trains_bit_exact(tmp_path):
    """`bapipe gen` + `bapipe rtlsim --iterations 2 --json` on small-resnet's one-stage training plan (4
    replicas x 8 samples, 1f1b, the ring all-reduce): every conv, batchnorm and dense master weight of
    every replica bit-exact against train_fixed.train_step after each iteration, outputs bit-exact, no
    overflow; the RTL's ring (design.json) is the plan's (30,960 cycles: the model's 19,994 parameters,
    share 4,999, 1 sum a word, engines.link_lanes) and the iteration cycles within 2% of the plan's
    269,488. About 18 min wall for the whole run under load ~11."""
    import json
    import subprocess
    import sys

    from bapipe.plan import load_plan

    build_dir, plan_path = tmp_path / "build", _small_resnet_plan(tmp_path)
    subprocess.run([sys.executable, "-m", "bapipe.cli", "gen", str(plan_path), "-o", str(build_dir)],
                   check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "bapipe.cli", "rtlsim", str(build_dir), "--json", "--iterations", "2"],
                       capture_output=True, text=True)
    res = json.loads(r.stdout)
    assert res["completed"] and res["weights_match"] and res["outputs_match"] and not res["overflow"], res
    assert res["weights_match_per_iteration"] == [True, True]
    design = json.loads((build_dir / "design.json").read_text())["train"]
    plan_ring = float(load_plan(plan_path).stages[0].allreduce_s) * design["clock_hz"]
    # the ring's cycles are computed from the same sums by fpga_models.collective: equal up to float rounding
    assert all(abs(h["allreduce_cycles"] - plan_ring) < 1e-6 * plan_ring for h in design["rings"]), (plan_ring, design)
    # 2%: issue 17's bound on iteration cycles vs the plan's iteration time
    assert res["max_iteration_error"] < 0.02, res
