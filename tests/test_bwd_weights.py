"""The weights a backward kernel's input gradient reads (fpga_models.bwd_tiles: the weight store).

A time-multiplexed kernel's chunk engine reads a PE x SIMD weight block every PX cycles (one
block serves a group of PX vectors), shifting the next block in KW weights a cycle from a store
of KW/4 64-bit words a row. The store holds every matrix with an input gradient at its base rows
when they fit the weight share (filled once an iteration by the kernel's first call), else one
turn's matrix, filled before its turn in 512-bit beats (the planner prices the fill). A row
engine (one vector a sample) reads its matrix where it lives, one 512-bit beat a cycle at most.
tiny-cnn's training plan as one time-multiplexed stage: conv3 (16 x 72) and conv2 (8 x 72) have
an input gradient on a 2 x 18 grid (NF x SF = 8 x 4 and 4 x 4 blocks), chunks of 16, PX = 8:
KW = ceil(36 / 8) = 5 weights a cycle, WJ = ceil(36 / 5) = 8 rows a block, KWW = 2 words a row."""
from __future__ import annotations

import re

import pytest

from bapipe import toolchain


def _tile_mode(monkeypatch):
    """The matrices do not fit the weight share: the store holds one turn's (planner and lowering
    read the same module constant)."""
    import bapipe.fpga_models.bwd_tiles as bt

    monkeypatch.setattr(bt, "WEIGHT_URAM_SHARE", 0.0)


@pytest.mark.slow   # plans and generates tiny-cnn (~3 s)
def test_tiny_cnn_backward_holds_its_matrices_in_one_store(tmp_path):
    """Resident: conv2's 16 blocks at rows 0..127 and conv3's 32 at 128..383 of one store of 384 x 2
    words (layer order), filled by one process of the weight load in turn order (wst_fill: a 512-bit beat of
    weights a cycle into a row register, a row written when its 5 weights are in); no per-layer
    copy of a matrix; conv1 (no input gradient) and fc (a row engine) read none of it; every
    weight port widened to 512 bits."""
    from test_hls_mac import _tiny_cnn_tm

    _plan, out = _tiny_cnn_tm(tmp_path, "train")
    cpp = (out / "stage0" / "stage0_bwd.cpp").read_text()
    assert "static bapipe::wsword_t s0_bwd_wst[384][2];" in cpp and "wc_conv" not in cpp
    fills = re.findall(r"bapipe::wst_fill<(\d+), (\d+), 2, 18, 5, 2, 8, 384>\((\w+), s0_bwd_wst, (\d+)\);", cpp)
    assert fills == [("16", "72", "conv3_w", str(16 * 8)), ("8", "72", "conv2_w", "0")]   # turn order
    assert cpp.count("BAPIPE_PROCESS(s0_bwd_wst_load(conv3_w, conv2_w, s0_bwd_wst));") == 1
    for w in ("fc_w", "conv3_w", "conv2_w", "conv1_w"):
        assert re.search(rf"port={w} offset=slave bundle=gmem_w depth=\d+ max_widen_bitwidth=512", cpp)
    # the row engine reads fc's row, 32 weights (one beat) a step, where it lives
    assert "xw[l] = fc_w[ro][rk * 32 + l];" in cpp


@pytest.mark.slow   # plans and generates tiny-cnn (~3 s)
def test_tiny_cnn_backward_fills_a_turns_matrix_before_it(tmp_path, monkeypatch):
    """Tile: the store holds the largest matrix (conv3's 32 blocks x 8 rows = 256); before each MVU
    turn of a sample the sequencer fills the turn's matrix at row 0 (s0_bwd_wfill, a case a turn
    with an input gradient); the plan prices each fill (32 x 8 rows a beat + 4, 16 x 8 + 4)."""
    from test_hls_mac import _tiny_cnn_tm

    from bapipe.plan import load_plan
    from bapipe.fpga_models.boards import get_board
    from bapipe.fpga_models import bwd_tiles as bt
    from bapipe.models import load_model

    _tile_mode(monkeypatch)
    plan_path, out = _tiny_cnn_tm(tmp_path, "train")
    cpp = (out / "stage0" / "stage0_bwd.cpp").read_text()
    assert "static bapipe::wsword_t s0_bwd_wst[256][2];" in cpp
    cases = re.findall(r"case (\d+):\n\s+bapipe::wst_fill<(\d+), (\d+), 2, 18, 5, 2, 8, 256>\((\w+), s0_bwd_wst, 0\);", cpp)
    assert cases == [("4", "16", "72", "conv3_w"), ("7", "8", "72", "conv2_w")]
    assert cpp.count("if (one) s0_bwd_wfill(t, conv2_w, conv3_w, s0_bwd_wst);") == 1
    plan = load_plan(plan_path)
    model = load_model(plan.model)
    st = plan.stages[0]
    layers = [model.layers[model.index[n]] for n in st.layers]
    fold = {n: (f.pe, f.simd) if f.lanes is None else (1, f.lanes) for n, f in st.folding.items()}
    tiles = bt.stage_tiles(model, layers, fold, "tm", 1, plan.microbatches, get_board(st.board_type))
    t = tiles["conv3"]
    assert t.weights == "tile"
    assert [bt.fill_cycles(t, t.job(n)) for n in ("conv3", "conv2", "conv1", "fc")] == [32 * 8 + 4, 16 * 8 + 4, 0, 0]


@pytest.mark.csim
@pytest.mark.soak   # one g++ build of the backward kernel (~15 s fresh) and its run
@pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                    reason="needs g++ and the hls4ml ap_types headers")
def test_tiny_cnn_tiled_backward_weights_bit_exact(tmp_path, monkeypatch):
    """The tile kernel in C-simulation: input gradient and weight-gradient sums 0 LSB against
    train_fixed, no stream beyond its depth, cycles per sample within 10% of the plan (which
    prices the fills before the turns)."""
    from test_csim_bwd_tm import _csim_stage
    from test_hls_mac import _tiny_cnn_tm, assert_exact_on_plan

    _tile_mode(monkeypatch)
    plan, _out = _tiny_cnn_tm(tmp_path, "train")
    assert_exact_on_plan(_csim_stage(plan, tmp_path / "b", 0))


@pytest.mark.slow   # small-resnet lowered and rendered in memory (~8 s)
def test_banked_batchnorm_copies_where_the_block_rule_puts_them():
    """small-resnet as one time-multiplexed training stage: each batchnorm's scale copy is read a
    channel a bank (16 or 32 banks of one word), so memory_blocks.storage_impl puts its banks in
    LUTRAM, not a BRAM18 each (resnet50's 512-channel scales in 256 banks of 2 took 128 BRAM36
    apiece that the plan did not count); the check reads no BRAM for them, and the Design's
    backward BRAM36 is the check's."""
    import sys
    from pathlib import Path

    from bapipe.codegen.check.physical_rules import _scans, kernel_figures
    from bapipe.codegen.design.bwd_engines import design_blocks

    sys.path.insert(0, str(Path(__file__).parent))
    from handplan import make_plan
    from test_link_cfg import render

    sr = str(Path(__file__).resolve().parent.parent / "examples/models/small-resnet.yaml")
    plan, model, cluster = make_plan(sr, cuts=(), style="time-multiplexed", mode="train")
    ctx, files = render(plan, model, cluster)
    files = {k: v.decode() if isinstance(v, bytes) else v for k, v in files.items() if k.endswith((".cpp", ".h"))}
    cpp = files["stage0/stage0_bwd.cpp"]
    copies = re.findall(r"static data_t (wc_\w+_scale)\[(\d+)\];[^\n]*\n#pragma HLS BIND_STORAGE variable=\w+ "
                        r"type=ram_2p impl=(\w+)\n#pragma HLS ARRAY_PARTITION variable=\w+ cyclic factor=(\d+) dim=1",
                        cpp)
    assert len(copies) == 6 and all(impl == "lutram" and n == f for _name, n, impl, f in copies), copies
    f = kernel_figures(*_scans(files, "stage0/stage0_bwd.cpp", "stage0_bwd"))
    design = design_blocks(ctx.stages[0].bwd)
    assert f.blocks.bram36 == design["bram36"]
    # DSP: the matrix engines' and two products a lane of each of the six batchnorms (dy x scale,
    # dy x x: fpga_models.bwd_memory.elementwise_dsp), as the check counts the multipliers
    from bapipe.fpga_models.bwd_memory import elementwise_dsp
    from bapipe.fpga_models.bwd_tiles import kernel_dsp

    st = plan.stages[0]
    layers = [model.layers[model.index[n]] for n in st.layers]
    fold = {n: (fo.pe, fo.simd) if fo.lanes is None else (1, fo.lanes) for n, fo in st.folding.items()}
    ew = elementwise_dsp(layers, fold)
    lanes = [fold.get(l.name, (1, 1)) for l in layers if l.type == "batchnorm"]
    assert len(lanes) == 6 and ew == 2 * sum(p * q for p, q in lanes) > 0
    assert f.dsp == design["dsp"] == kernel_dsp(ctx.stages[0].bwd.tiles) + ew
