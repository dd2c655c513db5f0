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
from bapipe.codegen.check.sim_harness import CACHE, tb_config

try:
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ClockCycles, RisingEdge
    from cocotbext.axi import (AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamFrame, AxiStreamSink,
                               AxiStreamSource)

    from bapipe.codegen.check import sim_tb as tb

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
        io = np.load(cfg["data"])   # (samples, in_beats), (samples, out_beats): too big for the environment
        x, y = io["x"].tolist(), io["y"].tolist()
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


def _kernel(name: str, plan, stage: int):
    """Generate the plan's RTL build (a fixed folder under the cache, so the compiled
    simulation is reused); the stage's kernel sources by file name."""
    from bapipe.codegen.cli_gen import generate_plan
    from bapipe.fpga_models.plancheck import resolve

    model, cluster = resolve(plan)
    out = CACHE / "kernel_wrapper" / name
    generate_plan(plan, model, cluster, out, engines="rtl")
    d = out / "rtl" / "kernels" / f"stage{stage}"
    src = json.loads((d / "sources.json").read_text())
    files = {p.split("/")[-1]: (d / p).read_text() for p in src["sources"]}
    return model, out, files


def _hwc(a: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> rows in stream order (HWC); vectors unchanged."""
    return (a.transpose(0, 2, 3, 1) if a.ndim == 4 else a).reshape(len(a), -1)


def _run_kernel(name: str, plan, stage: int, samples: int, runs: list[int], seed: int, p: float) -> None:
    from bapipe.codegen.rtl.pipeline import read_params
    from bapipe.fpga_models.fixedpoint import model_fwd

    model, out, files = _kernel(name, plan, stage)
    layers = [model.layers[model.index[n]] for n in plan.stages[stage].layers]
    params = read_params(out / "rtl", [l.name for l in layers])
    design = json.loads((out / "design.json").read_text())["stages"][stage]
    n_in, n_out = design["in_elems"], design["out_elems"]
    src = layers[0].inputs[0]
    in_shape = model.inputs[0].shape if src == model.inputs[0].name else model.layers[model.index[src]].out_shape
    rng = np.random.default_rng(seed)
    x = rng.integers(-2048, 2048, size=(samples, *in_shape))   # raw fixed16 values in [-2, 2)
    y = _hwc(np.asarray(model_fwd(layers, {src: x}, params, plan.number_format)[layers[-1].name]))
    x = _hwc(x)
    assert x.shape == (samples, n_in) and y.shape == (samples, n_out)
    top = f"stage{stage}"
    d = build(top, files, mem_dir=out / "rtl")
    data = d / f"io-{samples}-{seed}.npz"
    np.savez(data, x=x, y=y)
    check(d, top, "cocotb_tests.test_kernel_wrapper", "kernel_runs", seed=seed, elem_w=16, in_beats=n_in,
          out_beats=n_out, in_port="in0", out_port="out0", data=str(data), runs=runs, p_idle=p, p_stall=p)


@pytest.mark.slow   # one Verilator build: ~46 s from scratch on a shared 2-core machine, ~7 s cached
def test_kernel_wrapper_bit_exact():
    """tiny-mlp stage 2 (fc3 + relu3), 5 samples in two runs, 20% idle and backpressure."""
    from tests.handplan import tiny_mlp_plan

    _run_kernel("tiny-mlp-4", tiny_mlp_plan(4), 2, 5, [3, 2], 0, 0.2)


@pytest.mark.slow
@pytest.mark.soak   # another Verilator build and 60 images: make test-all
def test_kernel_wrapper_conv_stage_soak():
    """tiny-cnn stage 0 (conv1, relu1, conv2, relu2: window generators, 4-lane output narrowed
    to one element a beat), 60 images in three runs, 30% idle and backpressure."""
    from tests.handplan import tiny_cnn_plan

    _run_kernel("tiny-cnn-3", tiny_cnn_plan(), 0, 60, [25, 1, 34], 3, 0.3)
