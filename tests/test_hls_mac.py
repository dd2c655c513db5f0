"""One MAC array per time-multiplexed kernel (issue 16, the DSP rule; codegen.hls_mac).

The MAC lanes a Vitis build instantiates, read from the generated C++ (codegen.hls_mac.mac_lanes:
each MVU call site a PE x SIMD array, each shared array's ``mac_products`` LANES multipliers),
equal the Design's DSP figure for the kernel (codegen.placement.kernel_needs, from the planner's
fpga_models.allocate.kernel_dsp: the largest layer's array when the layers take turns) and fit
the board; csim stays 0 LSB and its counted cycles on the plan."""
from __future__ import annotations

import json
import math
import re

import pytest

from bapipe import toolchain
from codegen.hls_mac import mac_lanes, share_mac

#: issue 16's bound on csim's counted cycles per sample against the plan's
CYCLE_TOL = 0.10


def _tiny_cnn_tm(tmp_path, mode: str):
    """tiny-cnn as one time-multiplexed stage (the planner at cap 0.01, all layers on one
    U250): the plan, and the build `bapipe gen` writes."""
    from bapipe.cli import main

    plan = tmp_path / "plan.yaml"
    assert main(["plan", "tiny-cnn", "4xU250-ring", "--cap", "0.01", "--partition", "0-9", "--mode", mode,
                 "-o", str(plan), "--force"]) in (0, None)
    out = tmp_path / "build"
    assert main(["gen", str(plan), "-o", str(out)]) in (0, None)
    return plan, out


def _design_dsp(out, kernel: str) -> tuple[int, int]:
    """(the Design's DSP need of ``kernel``'s first instance, its board's usable DSP) from design.json."""
    d = json.loads((out / "design.json").read_text())
    for b in d["placement"]["boards"].values():
        for u in b["units"]:
            if u["instance"] == f"{kernel}_1":
                return u["need"]["dsp"], sum(s["usable_dsp"] for s in b["slrs"])
    raise AssertionError(f"{kernel}: not placed")


def test_mac_lanes_reads_call_sites_and_shared_arrays():
    src = """
    bapipe::mvu<64, 27, 16, 9, true>(a, b, w, bias, (long)n * 4);   // 144 lanes
    // bapipe::mvu<8, 8, 8, 8, true>(...) in a comment builds nothing
    bapipe::mvu_tile<64, 576, 4, 32, false, 2, 1152>(a, b, buf, 0, 0L, bias, n);
    bapipe::mac_products<3072>(xs, ws, prod, used);
    """
    assert mac_lanes(src) == 144 + 128 + 3072


@pytest.mark.slow   # plans and generates tiny-cnn (~3 s)
def test_tiny_cnn_time_multiplexed_kernel_has_one_array(tmp_path):
    """Training plan (weights off chip: the MVU turns read a weight buffer; stash tees in the
    turns): conv1 4 x 9, conv2 1 x 36, conv3 1 x 36, fc 1 x 32 share one array of 36 lanes (the
    Design's 36 DSP; one array per layer would be 140), called from one site."""
    plan, out = _tiny_cnn_tm(tmp_path, "train")
    cpp = (out / "stage0" / "stage0.cpp").read_text()
    need, usable = _design_dsp(out, "stage0")
    assert need == 36 and mac_lanes(cpp) == need <= usable
    assert cpp.count("bapipe::mac_products<36>(") == 1
    assert "bapipe::mvu_tile<" not in cpp and "bapipe::mvu<" not in cpp
    # one call site of the MVU turns' function (one instance), and of the MAC function in it
    assert cpp.count("s0_mvu_turn(t, i,") == 1 and cpp.count("s0_mac(t,") == 1
    # each MVU turn's folding is a run-time job: (turn, PE x SIMD lanes used)
    jobs = re.findall(r"case (\d+):\n\s+NF = (\d+), SF = (\d+), used = (\d+),", cpp)
    assert [(int(t), int(u)) for t, _nf, _sf, u in jobs] == [(0, 36), (2, 36), (5, 36), (8, 32)]
    # the on-chip bytes the C++ declares are the Design's (the array's input vector counted by both)
    from codegen.cxx_memory import kernel_memory
    files = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.suffix in (".cpp", ".h")}
    d = json.loads((out / "design.json").read_text())
    onchip = next(u["need"]["onchip_bytes"] for b in d["placement"]["boards"].values() for u in b["units"]
                  if u["instance"] == "stage0_1")
    assert kernel_memory(files, "stage0/stage0.cpp", "stage0").total == onchip


@pytest.mark.csim
@pytest.mark.slow
@pytest.mark.soak   # two kernels compiled and run (~25 s): make test-all
@pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                    reason="needs g++ and the hls4ml ap_types headers")
def test_tiny_cnn_shared_array_is_bit_exact_and_on_plan(tmp_path):
    """The inference plan (on-chip ROM weights, one array of 96 lanes) through `bapipe
    csim`: 0 LSB against numpy, no stream beyond its depth, cycles within 10% of the plan
    (measured 922 vs 891, +3.5%: the same count as one array per layer, 922)."""
    from bapipe.cli import main

    _plan, out = _tiny_cnn_tm(tmp_path, "inference")
    cpp = (out / "stage0" / "stage0.cpp").read_text()
    need, usable = _design_dsp(out, "stage0")
    assert mac_lanes(cpp) == need <= usable
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["csim", str(out), "--json"]) in (0, None)
    r = json.loads(buf.getvalue())
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r
    [s] = r["stages"]
    assert abs(s["cycles_per_sample"] - s["plan_cycles_per_sample"]) <= CYCLE_TOL * s["plan_cycles_per_sample"], s


@pytest.mark.soak   # the planner's VGG-16 plan rendered in memory with zero weights (~1 min, ~3 GB)
def test_vgg16_forward_kernels_build_the_planned_dsp():
    """The default vgg16 4xU250-ring plan (time-multiplexed stages): each forward kernel's MAC
    lanes from the C++ equal the Design's DSP (3,072 at fixed16; one array per layer built
    45,248) and fit the board."""
    from test_link_cfg import _plan, render

    from codegen.placement import kernel_needs
    from fpga_models.cluster import load_cluster

    cluster = load_cluster("4xU250-ring")
    plan, model = _plan("vgg16", cluster)
    ctx, files = render(plan, model, cluster)
    boards = {cb.name: cb.board for cb in cluster.boards}
    for s in ctx.stages:
        assert s.style == "time-multiplexed" and share_mac(s.engine, s.index) is not None
        board = boards[s.boards[0]]
        need = kernel_needs(ctx, board, plan.number_format)[s.name].dsp
        lanes = mac_lanes(files[f"{s.name}/{s.name}.cpp"].decode())
        assert math.ceil(lanes * board.dsp_per_mac.get(plan.number_format, 1.0)) == need <= board.usable_dsp, \
            (s.name, lanes, need)
