"""cocotb testbench of `bapipe rtlsim`: streams samples through cluster_top, times the outputs.

Configuration (BAPIPE_TB): ``inputs`` (path of a .npy of raw input words, one row per
sample, already in stream order), ``in_lanes``, ``out_lanes``, ``out_elems``, ``elem_w``,
``result`` (path of the JSON written at the end: outputs, output-beat cycles, overflow,
simulated cycles, wall seconds).
"""
from __future__ import annotations

import json
import time

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from bapipe.codegen.check import sim_tb as tb
from bapipe.codegen.check.sim_harness import tb_config


@cocotb.test()
async def pipeline(dut):
    """All samples back to back, sink always ready: outputs and steady-state cycles per sample."""
    cfg = tb_config()
    x = np.load(cfg["inputs"])
    elem_w, lanes_in, lanes_out = cfg["elem_w"], cfg["in_lanes"], cfg["out_lanes"]
    t0 = time.perf_counter()
    await tb.start(dut)
    count = tb.Counter(dut)
    hin, hout = tb.Handshakes(dut, "s_axis"), tb.Handshakes(dut, "m_axis")
    src = tb.source(dut, "s_axis", elem_w)
    snk = tb.sink(dut, "m_axis", elem_w)
    words = tb.to_unsigned(x.reshape(-1), elem_w)
    cocotb.start_soon(tb.send_all(src, words, lanes_in))
    got = await tb.recv_words(snk, len(x) * cfg["out_elems"])
    await ClockCycles(dut.clk, 10)
    wall = time.perf_counter() - t0
    result = {
        "outputs": tb.to_signed(got, elem_w),
        "in_cycles": hin.cycles, "out_cycles": hout.cycles,
        "overflow": int(dut.overflow.value), "sim_cycles": count.cycle, "wall_s": wall,
        "extra_beats": not snk.empty(),
    }
    with open(cfg["result"], "w") as f:
        json.dump(result, f)
