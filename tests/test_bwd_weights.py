"""Backward weights that do not all fit on chip (issue 16 item 1; codegen.design.backward._tile_weights).

A time-multiplexed backward kernel whose weights fail the forward's all-resident rule
(fpga_models.allocate.weights_all_resident) copies each input-gradient turn's matrix into one
on-chip tile before the turn, in 512-bit beats, instead of reading m_axi inside the MAC loop.
tiny-cnn's training plan is forced there by making the backward's copy rule answer no (its
budget itself holds the 2,482 weights)."""
from __future__ import annotations

import re

import pytest

from bapipe import toolchain

def _not_resident(monkeypatch):
    """The backward kernel's weights fail the all-resident rule, in the plan's backward memory
    (fpga_models.bwd_memory: no copies, a weight tile whose fills the planner prices) and in the
    lowering (hls_bwd._copy_weights makes no copies); the forward's rule stays the default's."""
    import bapipe.codegen.design.backward as hb
    import bapipe.fpga_models.bwd_memory as bm

    monkeypatch.setattr(hb, "_copy_weights", lambda *a, **k: [])
    monkeypatch.setattr(bm, "weights_all_resident", lambda *a, **k: False)


@pytest.mark.slow   # plans and generates tiny-cnn (~3 s)
def test_tiny_cnn_backward_reads_weights_from_a_tile(tmp_path, monkeypatch):
    """fc (10 x 64), conv3 (16 x 72) and conv2 (8 x 72), the turns with an input gradient (run
    in that order), read a ping-pong pair of 16 x 72 tiles (two fit the share): fc's matrix is
    filled into wt0 before its turn, conv3's into wt1 during fc's turn and conv2's into wt0
    during conv3's (weight_tile, 32 elements a 512-bit beat, a process of the MVU turns'
    DATAFLOW region); fc and conv2 read wt0, conv3 wt1; their ports are widened to 512 bits;
    the MAC function takes no m_axi matrix it reads (conv1 has no input gradient, so its matrix
    is never read)."""
    from test_hls_mac import _tiny_cnn_tm

    _not_resident(monkeypatch)
    _plan, out = _tiny_cnn_tm(tmp_path, "train")
    cpp = (out / "stage0" / "stage0_bwd.cpp").read_text()
    assert "static data_t s0_bwd_wt0[16][72];" in cpp and "static data_t s0_bwd_wt1[16][72];" in cpp
    assert "s0_bwd_wt[" not in cpp and "wc_" not in cpp
    fetch = re.findall(r"bapipe::weight_tile<(\d+), (\d+), 16, 72, 32>\((\w+), (s0_bwd_wt\d)\)", cpp)
    assert fetch == [("16", "72", "conv3_w", "s0_bwd_wt1"), ("8", "72", "conv2_w", "s0_bwd_wt0"),
                     ("10", "64", "fc_w", "s0_bwd_wt0")]
    ins = re.findall(r"bapipe::bwd_mac_in<(\d+), (\d+), \d+, \d+, (\d), [^>]*, (\d+), (\d+)>\(\w+, \w+, (\w+),", cpp)
    assert ins == [("10", "64", "1", "16", "72", "s0_bwd_wt0"), ("16", "72", "1", "16", "72", "s0_bwd_wt1"),
                   ("8", "72", "1", "16", "72", "s0_bwd_wt0"), ("8", "9", "0", "8", "9", "conv1_w")]
    for w in ("fc_w", "conv3_w", "conv2_w"):
        assert re.search(rf"port={w} offset=slave bundle=gmem_w depth=\d+ max_widen_bitwidth=512", cpp)
    assert cpp.count("BAPIPE_PROCESS(s0_bwd_mac_wfetch(t, conv3_w, conv2_w, s0_bwd_wt0, s0_bwd_wt1, n));") == 1
    assert cpp.count("bapipe::weight_tile<10, 64, 16, 72, 32>(fc_w, s0_bwd_wt0);") == 1


@pytest.mark.csim
@pytest.mark.soak   # one g++ build of the backward kernel (~15 s fresh) and its run
@pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                    reason="needs g++ and the hls4ml ap_types headers")
def test_tiny_cnn_tiled_backward_weights_bit_exact(tmp_path, monkeypatch):
    """The same kernel in C-simulation: input gradient and weight-gradient sums 0 LSB against
    train_fixed, no stream beyond its depth; cycles per sample within 10% of the plan, which
    prices what the kernel waits on the tile fills: fc's 640 / 32 = 20 beats + 2 before its turn,
    conv3's and conv2's (36 + 2, 18 + 2) during the turn before, shorter than it
    (fpga_models.bwd_memory.tile_stall_cycles)."""
    from test_csim_bwd_tm import _csim_stage
    from test_hls_mac import _tiny_cnn_tm, assert_exact_on_plan

    _not_resident(monkeypatch)
    plan, _out = _tiny_cnn_tm(tmp_path, "train")
    r = _csim_stage(plan, tmp_path / "b", 0)
    assert_exact_on_plan(r)


def _job(turn, mh, mw, w, dx=True, vec=16, pe=1, simd=8):
    from types import SimpleNamespace

    return SimpleNamespace(turn=turn, mh=mh, mw=mw, w=w, aw=f"aw_{w[:-2]}", dx=dx, vec=vec, pe=pe, simd=simd)


def _ctx(jobs, onchip):
    from types import SimpleNamespace

    ws = [SimpleNamespace(name=j.w, dims=f"[{j.mh}][{j.mw}]") for j in jobs]
    decls = [f"const data_t {w.name}{w.dims}" for w in ws]
    mac = SimpleNamespace(jobs=jobs, mac_params=list(decls), turn_params=list(decls), turns=[])
    return SimpleNamespace(mac=mac, copies=[], weights=ws, onchip_bytes=onchip, arrays=[], wtile={})


def test_tile_takes_what_the_share_leaves():
    """fpga_models.bwd_memory.choose_tile: the tile (largest MH x largest MW of its matrices,
    2-byte elements) holds the smallest matrices (ties: the later layer, whose turn is earlier)
    that fit the bytes the share leaves; no room, no tile. Its fills: 512-bit beats + 2 a
    matrix. The lowering builds exactly the plan's tile (hls_bwd._tile_weights), and refuses a
    tile whose matrices are not its turns with dx."""
    from bapipe.codegen.design.backward import _tile_weights
    from bapipe.fpga_models.bwd_memory import WeightTile, choose_tile, tile_fill_cycles

    cands = [("a", 10, 64), ("b", 16, 72), ("c", 8, 72)]
    # 1,440 bytes left: c (8 x 72, 1,152) and a (10 x 72 = 1,440 with c) fit, b (16 x 72 = 2,304) not
    t = choose_tile(cands, 2, 1_440)
    assert t == WeightTile(10, 72, (("a", 10, 64), ("c", 8, 72))) and t.layers == ("a", "c")
    assert choose_tile(cands, 2, 1_439) == WeightTile(8, 72, (("c", 8, 72),))
    assert choose_tile(cands, 2, 1_151) is None
    assert choose_tile(cands, 2, None) == WeightTile(16, 72, tuple(cands))
    # equal sizes: the later layer's first; the other does not fit beside it (4 x 8 x 2 = 64 > 32)
    assert choose_tile([("x", 2, 8), ("y", 4, 4)], 2, 32).layers == ("y",)
    # fills a sample: ceil(640 x 16 / 512) + 2 and ceil(576 x 16 / 512) + 2
    assert tile_fill_cycles(t, "fixed16") == (20 + 2) + (18 + 2) and tile_fill_cycles(None, "fixed16") == 0

    jobs = [_job(0, 10, 64, "a_w"), _job(3, 16, 72, "b_w"), _job(5, 8, 72, "c_w"), _job(7, 8, 9, "d_w", dx=False)]
    ctx = _ctx(jobs, 10_000)
    _tile_weights(ctx, 0, 16, t, {f"aw_{n}": n for n in "abcd"})
    assert not ctx.wtile["double"] and [f[4] for f in ctx.wtile["fetches"]] == ["s0_bwd_wt", "s0_bwd_wt"]
    assert [f[:2] for f in ctx.wtile["fetches"]] == [(0, "a_w"), (5, "c_w")]
    assert ctx.arrays[0].dims == (10, 72) and ctx.arrays[0].bytes == 1_440
    assert [j.w for j in jobs] == ["s0_bwd_wt", "b_w", "s0_bwd_wt", "d_w"]
    assert ctx.wtile["shapes"] == {"s0_bwd_wt": (10, 72), "b_w": (16, 72), "d_w": (8, 9)}
    assert sorted(ctx.mac.mac_params) == sorted(["const data_t b_w[16][72]", "const data_t d_w[8][9]",
                                                 "data_t s0_bwd_wt[10][72]"])
    # no planned tile: nothing changes
    jobs = [_job(0, 10, 64, "a_w")]
    ctx = _ctx(jobs, 10_000)
    _tile_weights(ctx, 0, 16, None, {"aw_a": "a"})
    assert ctx.wtile == {} and jobs[0].w == "a_w"
    # a planned matrix the kernel's turns with dx do not have (d computes none): refused
    jobs = [_job(7, 8, 9, "d_w", dx=False)]
    with pytest.raises(ValueError, match="planned weight tile"):
        _tile_weights(_ctx(jobs, 0), 0, 16, WeightTile(8, 9, (("d", 8, 9),)), {"aw_d": "d"})


def test_ping_pong_tile_when_two_fit():
    """fpga_models.bwd_memory.double_tile: the same matrices in a ping-pong pair when two tiles
    fit what the share leaves and two or more turns read them, else the one tile; the kernel
    waits on the first fill (turn order: the later layer first) and on each later one only for
    what it takes beyond the previous tiled turn's region (tile_stall_cycles). The lowering
    reads tile k % 2 in the k-th tiled turn and fills the next one's matrix during it."""
    from bapipe.codegen.design.backward import _tile_weights
    from bapipe.fpga_models.bwd_memory import WeightTile, choose_tile, double_tile, tile_stall_cycles

    cands = [("a", 10, 64), ("c", 8, 72)]
    one = choose_tile(cands, 2, 1_440)
    assert one == WeightTile(10, 72, tuple(cands)) and one.buffers == 1
    assert double_tile(one, 2, 2_879) == one                               # 2 x 1,440 B do not fit
    two = double_tile(one, 2, 2_880)
    assert two == WeightTile(10, 72, tuple(cands), 2) and double_tile(one, 2, None) == two
    assert double_tile(WeightTile(8, 72, (("c", 8, 72),)), 2, None).buffers == 1   # one turn: nothing to overlap
    # turn order c (fill 18 + 2) then a (20 + 2): c's fill before its turn; a's during c's turn,
    # which takes 15 cycles: 7 more; at 30 none. One tile: both fills, 42.
    assert two.turn_fills == (("c", 8, 72), ("a", 10, 64))
    assert tile_stall_cycles(two, "fixed16", {"c": 15, "a": 100}) == 20 + 7
    assert tile_stall_cycles(two, "fixed16", {"c": 30}) == 20
    assert tile_stall_cycles(one, "fixed16", {"c": 30}) == 42

    jobs = [_job(0, 8, 72, "c_w"), _job(3, 16, 72, "b_w"), _job(5, 10, 64, "a_w")]
    ctx = _ctx(jobs, 10_000)
    _tile_weights(ctx, 0, 16, two, {f"aw_{n}": n for n in "abc"})
    assert ctx.wtile["double"] and [a.name for a in ctx.arrays] == ["s0_bwd_wt0", "s0_bwd_wt1"]
    assert sum(a.bytes for a in ctx.arrays) == 2 * 1_440
    assert ctx.wtile["first"] == (0, "c_w", 8, 72, "s0_bwd_wt0")
    assert ctx.wtile["fetches"] == [(0, "a_w", 10, 64, "s0_bwd_wt1")]
    assert [j.w for j in jobs] == ["s0_bwd_wt0", "b_w", "s0_bwd_wt1"]
    assert ctx.wtile["ports"] == ["a_w", "c_w"] and ctx.wtile["args"] == ["a_w", "s0_bwd_wt0", "s0_bwd_wt1"]
    # the planned order of fills is the kernel's order of turns, or the lowering refuses
    jobs = [_job(0, 10, 64, "a_w"), _job(5, 8, 72, "c_w")]
    with pytest.raises(ValueError, match="prices"):
        _tile_weights(_ctx(jobs, 0), 0, 16, two, {f"aw_{n}": n for n in "ac"})


def _tiny_cnn_streamed(tmp_path, monkeypatch):
    """tiny-cnn's TM training plan with the backward forced off the copies and every one-vector
    matrix made too big for a tile (in fpga_models.bwd_memory, so the plan prices the tile's
    fills; the forward's rule untouched): fc (10 x 64, one vector a sample) streams, conv3 and
    conv2 tile."""
    from bapipe.cli import main

    import bapipe.fpga_models.bwd_memory as bm

    _not_resident(monkeypatch)
    monkeypatch.setattr(bm, "weight_resident", lambda elems, eb, budget, vectors=1: vectors > 1)
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "tiny-cnn", "4xU250-ring", "--cap", "0.01", "--partition", "0-9", "--mode", "train",
                 "-o", str(plan), "--force"]) in (0, None)
    return plan


@pytest.mark.slow   # plans and generates tiny-cnn (~3 s)
def test_tiny_cnn_backward_streams_a_dense_matrix(tmp_path, monkeypatch):
    """fc's matrix reaches the MAC on a two-deep FIFO of 1 x 32 words (weight_stream_rows, once a
    vector in row order, a process beside the MAC function); its turn sums dx in row order
    (bwd_mac_in_ws / bwd_mac_out_ws); conv3 and conv2 read a ping-pong pair of 16 x 72 tiles."""
    from bapipe.cli import main

    plan = _tiny_cnn_streamed(tmp_path, monkeypatch)
    out = tmp_path / "build"
    assert main(["gen", str(plan), "-o", str(out), "--allow-rule-violations"]) in (0, None)
    cpp = (out / "stage0" / "stage0_bwd.cpp").read_text()
    assert "bapipe::weight_stream_rows<10, 64, 1, 32, 32>(fc_w, s0_bwd_ws, (long)n * 1);" in cpp
    assert "hls::stream<bapipe::bvec<32>, 2> s0_bwd_ws(\"s0_bwd_ws\");" in cpp
    assert cpp.count("bapipe::bwd_mac_in_ws<10, 64, 1, 32,") == 1 and cpp.count("bapipe::bwd_mac_out_ws<10, 64,") == 1
    # a ping-pong pair: conv2's matrix is filled into wt1 during conv3's turn, conv3's into wt0 before it
    assert re.findall(r"bapipe::weight_tile<(\d+), (\d+), 16, 72, 32>\((\w+), (\w+)\)", cpp) == [
        ("8", "72", "conv2_w", "s0_bwd_wt1"), ("16", "72", "conv3_w", "s0_bwd_wt0")]
    assert re.search(r"port=fc_w offset=slave bundle=gmem_w depth=640 max_widen_bitwidth=512", cpp)


@pytest.mark.csim
@pytest.mark.soak   # one g++ build of the backward kernel (~15 s fresh) and its run
@pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                    reason="needs g++ and the hls4ml ap_types headers")
def test_tiny_cnn_streamed_backward_weights_bit_exact(tmp_path, monkeypatch):
    """The same kernel in C-simulation: 0 LSB against train_fixed (dx summed in row order is the
    same exact integer sum), the weight FIFO never beyond its depth 2, cycles per sample within
    10% of the plan, which prices the tile fills (conv3's 36 beats + 2 before its turn; conv2's
    18 + 2 overlap conv3's turn; the stream overlaps the MAC)."""
    from test_csim_bwd_tm import _csim_stage
    from test_hls_mac import assert_exact_on_plan

    plan = _tiny_cnn_streamed(tmp_path, monkeypatch)
    r = _csim_stage(plan, tmp_path / "b", 0)
    assert_exact_on_plan(r)
    assert r["streams"]["s0_bwd_ws"]["depth"] == 2 and r["streams"]["s0_bwd_ws"]["peak"] >= 1
