"""A packaged RTL stage as XRT drives it: the s_axilite control slave (ap_ctrl_hs) started by
cocotbext-axi's AxiLiteMaster, samples streamed in and out through AXI4-Stream with TLAST,
outputs bit-exact against the numpy fixed-point reference of the stage's layers.

The kernel is stage 2 of the 4-board tiny-mlp RTL plan (fc3 + relu3: 64 elements in, 32 out
per sample, the engines' 16-lane output narrowed to one element a beat by the wrapper), as
`bapipe gen --engines rtl` writes it under rtl/kernels/stage2/.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from cocotb_tests.common import build, check, needs_verilator, xdist_group
from codegen.sim_harness import CACHE, tb_config

try:
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ClockCycles, RisingEdge
    from cocotbext.axi import (AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamFrame, AxiStreamSink,
                               AxiStreamSource)

    from codegen import sim_tb as tb

    async def _read(axil, addr: int) -> int:
        return int.from_bytes(await axil.read(addr, 4), "little")

    @cocotb.test()
    async def kernel_runs(dut):
        """Two runs (ap_start twice): no beat taken before ap_start, exactly samples x beats
        after, TLAST on every sample's last beat, ap_done/ap_idle/interrupt as ap_ctrl_hs says."""
        cfg = tb_config()
        rng = random.Random(cfg["seed"])
        ew, in_beats, out_beats = cfg["elem_w"], cfg["in_beats"], cfg["out_beats"]
        cocotb.start_soon(Clock(dut.ap_clk, 10, unit="ns").start())
        dut.ap_rst_n.value = 0
        axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_control"), dut.ap_clk, dut.ap_rst_n,
                             reset_active_level=False)
        src = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_{cfg['in_port']}"), dut.ap_clk, dut.ap_rst_n,
                              reset_active_level=False, byte_size=ew)
        snk = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"m_axis_{cfg['out_port']}"), dut.ap_clk, dut.ap_rst_n,
                            reset_active_level=False, byte_size=ew)
        src.set_pause_generator(tb.pauses(rng, cfg["p_idle"]))
        snk.set_pause_generator(tb.pauses(rng, cfg["p_stall"]))
        await ClockCycles(dut.ap_clk, 5)
        dut.ap_rst_n.value = 1
        await ClockCycles(dut.ap_clk, 2)
        assert await _read(axil, 0x00) == 0x4, "after reset: idle, not started, not done"
        await axil.write(0x04, (1).to_bytes(4, "little"))   # GIE
        await axil.write(0x08, (1).to_bytes(4, "little"))   # IER: ap_done
        x = cfg["x"]
        y = cfg["y"]
        taken = 0
        for run, n in enumerate(cfg["runs"]):
            rows = x[taken:taken + n]
            for r in rows:   # queued before ap_start: the kernel must not take any of it yet
                await src.send(AxiStreamFrame(tb.to_unsigned(r, ew)))
            tready = getattr(dut, f"s_axis_{cfg['in_port']}_tready")
            for _ in range(40):   # idle: no input beat can be taken
                await RisingEdge(dut.ap_clk)
                assert int(tready.value) == 0, "s_axis tready before ap_start"
            await axil.write(0x10, n.to_bytes(4, "little"))
            assert await _read(axil, 0x10) == n
            await axil.write(0x00, (1).to_bytes(4, "little"))   # ap_start
            for k in range(n):
                frame = await snk.recv()
                assert len(frame.tdata) == out_beats, f"sample {taken + k}: TLAST after {len(frame.tdata)} beats"
                got = tb.to_signed(frame.tdata, ew)
                assert got == list(y[taken + k]), f"sample {taken + k}: got {got[:8]}, expected {list(y[taken + k])[:8]}"
            for _ in range(200):   # ap_done follows the last output beat within a few cycles
                if int(dut.interrupt.value):
                    break
                await RisingEdge(dut.ap_clk)
            assert int(dut.interrupt.value) == 1, "no interrupt after the run"
            ctrl = await _read(axil, 0x00)
            assert ctrl & 0x6 == 0x6, f"control 0x{ctrl:x}: expected ap_done and ap_idle"
            assert await _read(axil, 0x00) & 0x2 == 0, "ap_done not cleared by the read"
            assert await _read(axil, 0x18) == 0, "status: TLAST off a sample boundary or overflow"
            await axil.write(0x0C, (1).to_bytes(4, "little"))   # ISR: toggle ap_done off
            assert await _read(axil, 0x0C) == 0 and int(dut.interrupt.value) == 0, "interrupt not cleared"
            taken += n
        await ClockCycles(dut.ap_clk, 50)
        assert snk.empty(), "beats after the last run's end"
        assert src.empty()
except ImportError:
    pass

pytestmark = [*needs_verilator, xdist_group("kernel_wrapper")]


def _kernel(tmp_path, stage: int = 2):
    """Generate the tiny-mlp RTL build; the stage's kernel sources, memory dir and figures."""
    from cocotb_tests.plans import tiny_mlp_plan
    from codegen.cli_gen import generate_plan
    from fpga_models.plancheck import resolve

    plan = tiny_mlp_plan(4)
    model, cluster = resolve(plan)
    out = CACHE / "kernel_wrapper" / "tiny-mlp-4"   # a fixed folder: the compiled simulation is reused
    generate_plan(plan, model, cluster, out, engines="rtl")
    d = out / "rtl" / "kernels" / f"stage{stage}"
    src = json.loads((d / "sources.json").read_text())
    files = {p.split("/")[-1]: (d / p).read_text() for p in src["sources"]}
    return plan, model, out, files


@pytest.mark.slow   # one Verilator build: ~46 s from scratch on a shared 2-core machine, ~7 s cached
def test_kernel_wrapper_bit_exact(tmp_path):
    from codegen.rtl import read_params
    from fpga_models.fixedpoint import model_fwd

    plan, model, out, files = _kernel(tmp_path)
    layers = [model.layers[model.index[n]] for n in plan.stages[2].layers]
    params = read_params(out / "rtl", [l.name for l in layers])
    xp = {n: {k: v for k, v in p.items()} for n, p in params.items()}
    design = json.loads((out / "design.json").read_text())["stages"][2]
    n_in, n_out = design["in_elems"], design["out_elems"]
    rng = np.random.default_rng(0)
    x = rng.integers(-2048, 2048, size=(5, n_in))   # raw fixed16 values in [-2, 2)
    y = model_fwd(layers, {layers[0].inputs[0]: x}, xp, plan.number_format)[layers[-1].name]
    assert y.shape == (5, n_out)
    d = build("stage2", files, mem_dir=out / "rtl")
    check(d, "stage2", "cocotb_tests.test_kernel_wrapper", "kernel_runs", seed=0, elem_w=16, in_beats=n_in,
          out_beats=n_out, in_port="in0", out_port="out0", x=x.tolist(), y=np.asarray(y).tolist(), runs=[3, 2],
          p_idle=0.2, p_stall=0.2)
