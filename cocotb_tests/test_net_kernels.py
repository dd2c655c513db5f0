"""The packaged framing kernels of a real `bapipe gen` build, back to back in Verilator.

Two boards' Vitis tops (``net/bapipe_net_<board>_q<q>/``, as package_xo packs them: ap_clk,
ap_rst_n, the board port's channels) are joined line to line by two channel models with
datagrams lost and reordered, TDEST renumbered as the two XUP VNx socket tables would (from
design.json's placement channels). Every stage stream crossing that cable (the training plan:
forward activations one way, backward gradients the other, both at once; the gradients leave
2 lanes a beat and arrive 1 lane a beat) arrives exactly, in order, once, under random idle
and backpressure; no receive buffer overflows.
"""
from __future__ import annotations

import random

import pytest

from cocotb_tests.common import ELEM_W, build, check, needs_verilator, xdist_group

try:
    import cocotb

    from bapipe.codegen.check import sim_tb as tb
    from bapipe.codegen.check.sim_harness import tb_config

    @cocotb.test()
    async def net_kernels_pair(dut):
        """All the cable's streams at once, faults on both lines."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        dut.faults_en.value = 1
        await tb.start(dut)
        runs = []
        for s in cfg["streams"]:
            w = [rng.randrange(1 << ELEM_W) for _ in range(s["samples"] * s["elements"])]
            runs.append(cocotb.start_soon(tb.stream_check(
                dut, w, s["lanes_in"], w, s["lanes_out"], ELEM_W, random.Random(rng.random()),
                cfg["p_idle"], cfg["p_stall"], s["src"], s["dst"])))
        for r in runs:
            await r
        st = {k: int(getattr(dut, k).value) for k in ("lost", "overflow")}
        dut._log.info("%d streams, faults %s", len(cfg["streams"]), st)
        assert st["overflow"] == 0 and st["lost"] > 0, st
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("net_kernels")]

CHANNEL_PARAMS = ("BEAT_W", "DEST_W", "ACK_W", "BEAT_BYTES", "BW_NUM", "BW_DEN", "TOKEN_W", "LATENCY", "PTR_W",
                  "HOLD_W", "HOLD_MAX", "P_LOSS", "P_REORDER", "P_ACK_LOSS", "SEED")


def _ports(text: str, module: str) -> list[tuple[str, str, int]]:
    import re
    head = re.search(rf"^module {module} \((.*?)\n\);", text, re.S | re.M).group(1)
    return [(d, n, int(m) + 1 if m else 1)
            for d, m, n in re.findall(r"^\s*(input|output)\s+wire\s*(?:\[(\d+):0\])?\s*(\w+)", head, re.M)]


def pair_top(a: str, a_text: str, b: str, b_text: str, a2b: dict[int, int], b2a: dict[int, int],
             channel: dict[str, int]) -> str:
    """A testbench top: kernels ``a`` and ``b`` (their Vitis tops), a's line -> channel -> b's
    line in (TDEST renumbered by ``a2b``) and back (``b2a``); stage ports exported as a_* / b_*."""
    lines = ["`default_nettype none", "module net_kernel_pair (", "    input  wire clk,", "    input  wire rst,",
             "    input  wire faults_en,"]
    body, insts = [], []
    for tag, mod, text in (("a", a, a_text), ("b", b, b_text)):
        conns = [".ap_clk(clk)", ".ap_rst_n(!rst)"]
        for d, n, w in _ports(text, mod):
            if n in ("ap_clk", "ap_rst_n"):
                continue
            if "_line_" in n:
                body.append(f"    wire [{w - 1}:0] {tag}_{n};")
            else:
                lines.append(f"    {d}  wire [{w - 1}:0] {tag}_{n},")
            conns.append(f".{n}({tag}_{n})")
        insts.append(f"    {mod} u_{tag} (\n        " + ",\n        ".join(conns) + ");")
    lines += ["    output wire [31:0] lost,", "    output wire overflow", ");"]
    body += ["    wire [15:0] ab_dest, ba_dest;", "    wire [31:0] ab_lost, ba_lost, ab_held, ba_held, ab_ack, ba_ack;",
             "    wire ab_ack_valid, ba_ack_valid, ab_over, ba_over;",
             "    assign lost = ab_lost + ba_lost;", "    assign overflow = ab_over | ba_over;"]

    def remap(name: str, src: str, table: dict[int, int]) -> str:
        expr = "16'd0"
        for k, v in sorted(table.items(), reverse=True):
            expr = f"({src} == 16'd{k}) ? 16'd{v} : {expr}"
        return f"    assign {name} = {expr};"

    body += [remap("b_s_axis_line_tdest", "ab_dest", a2b), remap("a_s_axis_line_tdest", "ba_dest", b2a)]
    params = ", ".join(f".{k}({v})" for k, v in channel.items())
    for frm, to, seed_off in (("a", "b", 0), ("b", "a", 1)):
        p = params.replace(f".SEED({channel['SEED']})", f".SEED({channel['SEED'] + seed_off})")
        body.append(
            f"    net_channel #({p}) u_{frm}{to} (\n"
            f"        .clk(clk), .rst(rst), .faults_en(faults_en),\n"
            f"        .s_axis_tdata({frm}_m_axis_line_tdata), .s_axis_tkeep({frm}_m_axis_line_tkeep),\n"
            f"        .s_axis_tdest({frm}_m_axis_line_tdest), .s_axis_tlast({frm}_m_axis_line_tlast),\n"
            f"        .s_axis_tvalid({frm}_m_axis_line_tvalid), .s_axis_tready({frm}_m_axis_line_tready),\n"
            f"        .m_axis_tdata({to}_s_axis_line_tdata), .m_axis_tkeep({to}_s_axis_line_tkeep),\n"
            f"        .m_axis_tdest({frm}{to}_dest), .m_axis_tlast({to}_s_axis_line_tlast),\n"
            f"        .m_axis_tvalid({to}_s_axis_line_tvalid), .m_axis_tready({to}_s_axis_line_tready),\n"
            f"        .s_axis_ack_tdata(32'd0), .s_axis_ack_tvalid(1'b0), .m_axis_ack_tdata({frm}{to}_ack),\n"
            f"        .m_axis_ack_tvalid({frm}{to}_ack_valid), .lost({frm}{to}_lost), .held({frm}{to}_held),\n"
            f"        .overflow({frm}{to}_over));")
    return "\n".join(lines + body + insts + ["endmodule", "`default_nettype wire", ""])


def _build_files(seed: int, p: float):
    """(Verilog sources, top parameters-free, the cocotb stream list) for the tiny-cnn training
    build's fpga0 <-> fpga1 cable, rendered in memory by codegen.package.project.render_files."""
    import json
    from dataclasses import replace

    from bapipe.codegen.design.lower import build_project
    from bapipe.codegen.package.network import channel_spec, net_kernels
    from bapipe.codegen.rtl.env import render_template
    from bapipe.codegen.design.links import Faults
    from tests.handplan import named_plan
    from bapipe.fpga_models.plancheck import resolve

    fold = {"conv1": (4, 3), "conv2": (4, 8), "pool1": (2, 1), "conv3": (8, 4), "pool2": (4, 1), "fc": (2, 16)}
    cuts = [["conv1", "relu1", "conv2", "relu2"], ["pool1", "conv3", "relu3"], ["pool2", "flatten", "fc"]]
    plan = named_plan("tiny-cnn", "4xU250-ring", cuts, fold, mode="train")   # a stream each way per cable
    model, cluster = resolve(plan)
    ctx = build_project(plan, model, cluster)
    from bapipe.codegen.package.project import render_files
    files = render_files(ctx, plan.dumps(), cluster)
    pl = json.loads(files["placement.json"])
    kernels = {(k.board, k.qsfp): k for k in net_kernels(ctx, cluster, pl, "hls")}
    ka = kernels[("fpga0", next(q for (b, q), k in kernels.items() if b == "fpga0" and k.towards == "fpga1"))]
    kb = kernels[("fpga1", next(q for (b, q), k in kernels.items() if b == "fpga1" and k.towards == "fpga0"))]
    a2b, b2a, streams = {}, {}, []
    clock = min(cb.board.clock_hz for cb in cluster.boards)
    for c in pl["channels"]:
        s, d = c["src"], c["dst"]
        if {s["board"], d["board"]} != {"fpga0", "fpga1"}:
            continue
        fwd = s["board"] == "fpga0"
        # data a -> b arrives on b's socket; b's acknowledgements of it come back on a's socket
        (a2b if fwd else b2a)[s["socket"]] = d["socket"]
        (b2a if fwd else a2b)[d["socket"]] = s["socket"]
        tx, rx = channel_spec(ctx, cluster, c, "hls", clock)
        k_src, k_dst = (ka, kb) if fwd else (kb, ka)
        streams.append({"src": f"{'a' if fwd else 'b'}_s_axis_tx{s['socket']}",
                        "dst": f"{'b' if fwd else 'a'}_m_axis_rx{d['socket'] - len(k_dst.tx)}",
                        "lanes_in": tx.stage_w // ELEM_W, "lanes_out": rx.stage_w // ELEM_W,
                        "elements": c["elements"], "samples": 0})
    spec = ka.tx[0].spec
    channel = {k: v for k, v in replace(spec, faults=Faults(p, p, 0.0, seed)).channel_params().items()
               if k in CHANNEL_PARAMS}
    text = {k: v.decode() for k, v in files.items()
            if k.startswith(("net/common/", f"{ka.dir}/", f"{kb.dir}/")) and k.endswith(".v")}
    srcs = {f"{m.rsplit('/', 1)[1]}": t for m, t in text.items()}
    srcs["net_channel.v"] = render_template("net_channel")
    srcs["net_kernel_pair.v"] = pair_top(ka.name, text[f"{ka.dir}/{ka.name}.v"], kb.name, text[f"{kb.dir}/{kb.name}.v"],
                                         a2b, b2a, channel)
    return srcs, streams, (ka, kb)


@pytest.mark.soak   # one Verilator build of two framing kernels (~1 min on the shared machine): make test-all
@pytest.mark.slow
def test_packaged_kernels_back_to_back():
    """tiny-cnn training on 4xU250-ring, fpga0 <-> fpga1: stage0.out0 -> stage1.in0 and
    stage1_bwd.dx_in0 -> stage0_bwd.dy_out0 at once, 3% of datagrams lost and 3% reordered on
    both lines (the link's own rate and latency: 39.7 B/cycle, 150 cycles each way)."""
    srcs, streams, (ka, kb) = _build_files(seed=5, p=0.03)
    assert len(streams) == 2 and len(ka.tx) == len(ka.rx) == 1
    for s in streams:
        s["samples"] = max(1, 6000 // s["elements"])     # a few thousand words each way
    d = build("net_kernel_pair", srcs)
    check(d, "net_kernel_pair", "cocotb_tests.test_net_kernels", "net_kernels_pair", streams=streams, seed=5,
          p_idle=0.2, p_stall=0.2)
