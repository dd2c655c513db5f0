"""Off-chip weights of time-multiplexed HLS kernels (issue 16 item 1, weights): 512-bit bursts
into a ping-pong buffer of whole-matrix tiles, or a FIFO for a matrix too big to be a tile.
One rule (fpga_models.allocate: weight_resident, tm_weight_bytes, tm_weight_turns; the cycle
formula fpga_models.engines.weight_tiles_cycles) for the planner and the lowering
(codegen.design.weight_memory); csim stays 0 LSB."""
from __future__ import annotations

import re

import pytest

from bapipe import toolchain
from bapipe.models import load_model
from bapipe.fpga_models.allocate import (kernel_onchip_budget, tm_weight_bytes, tm_weight_tiles, tm_weight_turns,
                                  weight_resident, weights_offchip)
from bapipe.fpga_models.boards import get_board
from bapipe.fpga_models.engines import weight_stream_beats, weight_tiles_cycles, weight_words


def test_weight_words_and_the_ping_pong_formula_by_hand():
    # fixed16: 32 elements a 512-bit word, packed densely (the bytes of the stage's weight image)
    assert weight_words(64 * 27, 16) == 54                 # VGG conv1_1: 1,728 weights
    assert weight_words(512 * 4_608, 16) == 73_728         # conv5_x: 4.7 MB
    assert weight_words(4_096 * 25_088, 16) == 3_211_264   # fc6: 205 MB
    assert weight_words(72, 16) == 3 and weight_words(72, 8) == 2   # a partial last word counts
    # a FIFO of PE x SIMD words: the memory words or the FIFO words, whichever are more
    assert weight_stream_beats(4_096 * 25_088, 64 * 64, 16) == 3_211_264
    assert weight_stream_beats(640, 1, 16) == 640
    # fill (the first tile's fetch), then per tile max(compute, next fetch); the last fetches nothing
    assert weight_tiles_cycles([10, 10, 10], [5, 20, 3]) == 5 + 20 + 10 + 10
    assert weight_tiles_cycles([], []) == 0


def test_which_matrices_are_tiles_on_a_u250():
    """A kernel's share of a U250 at cap 0.8 in training is 23,121,100 bytes; a tile may take a
    quarter (5,780,275): VGG-16's biggest convolution (4,718,592 bytes) is a tile, fc8
    (8,192,000) and fc6 stream."""
    u250 = get_board("U250")
    share = kernel_onchip_budget(u250, 0.8, 1, train=True)
    assert share == 23_121_100
    assert weight_resident(512 * 4_608, 2, share) and not weight_resident(4_096 * 1_000, 2, share)
    assert weight_resident(10 ** 12, 2, None)   # no board: no budget to stay within
    model = load_model("vgg16")
    assert weights_offchip(list(model.layers)[:1], train=True)
    assert not weights_offchip(list(load_model("tiny-cnn").layers), train=False)   # 6,410 <= 65,536: ROM
    assert weights_offchip(list(model.layers), train=False)                          # 138 M: off chip
    layers = [l for l in model.layers if l.name in ("conv13", "fc6", "fc8")]
    fold = {"conv13": (32, 96), "fc6": (64, 64), "fc8": (8, 32)}
    tiles = tm_weight_tiles(layers, fold, "fixed16", share)
    assert [(l.name, e, r) for l, e, r in tiles] == [("conv13", 2_359_296, True), ("fc6", 102_760_448, False),
                                                     ("fc8", 4_096_000, False)]
    # the buffer: two halves of conv13; the FIFOs: two PE x SIMD words of fc6 and of fc8
    assert tm_weight_bytes(layers, fold, "fixed16", share, True) == 2 * 2_359_296 * 2 + 2 * (4_096 + 256) * 2
    fill, turn = tm_weight_turns(layers, fold, "fixed16", share)
    # conv13 is the only tile: its fetch is the fill, and no MVU turn after it fetches a tile
    assert fill == 73_728 and "conv13" not in turn
    assert turn == {"fc6": 3_211_264, "fc8": 128_000}


def test_vgg16_first_block_tiles_by_hand():
    """conv1_1, conv1_2 and conv2_1 of VGG-16 (1,728, 36,864 and 73,728 weights): on a U250
    kernel's share (23.1 MB) all three stay on chip for the call, no traffic per sample. At a
    400,000-byte share (224,640 bytes of weights > two 100,000-byte tiles) they take turns in
    the ping-pong buffer: conv1_1's 54 words are the fill, conv1_1's turn fetches conv1_2's
    1,152 words into the other half (hidden behind its 50,176 cycles), conv1_2's turn conv2_1's
    2,304; conv2_1 (147,456 bytes) is a tile although over 100,000: a convolution's matrix is
    never streamed (it would be re-read for each of its 12,544 output pixels)."""
    model = load_model("vgg16")
    layers = list(model.layers)[:6]
    assert [l.name for l in layers if l.type == "conv2d"] == ["conv1", "conv2", "conv3"]
    fold = {l.name: (1, 64) for l in layers}
    fold.update({"conv1": (64, 27), "conv2": (16, 192), "conv3": (32, 64)})
    share = kernel_onchip_budget(get_board("U250"), 0.8, 1, train=True)
    assert tm_weight_turns(layers, fold, "fixed16", share) == (0, {})
    assert tm_weight_bytes(layers, fold, "fixed16", share, True) == 112_320 * 2
    assert tm_weight_turns(layers, fold, "fixed16", 400_000) == (54, {"conv1": 1_152, "conv2": 2_304})
    assert tm_weight_bytes(layers, fold, "fixed16", 400_000, True) == 2 * 73_728 * 2
    # inference: their 112,448 parameters are beyond on-chip ROM (WEIGHT_ROM_LIMIT 65,536) too
    assert tm_weight_bytes(layers, fold, "fixed16", share, False) == 112_320 * 2
    assert tm_weight_bytes(layers[:3], fold, "fixed16", share, False) == 0   # 38,720: ROM


def _gen(tmp_path, monkeypatch, budget=None):
    """tiny-cnn as one time-multiplexed stage with its weights off chip (EMBED_LIMIT 0), the
    kernel's on-chip share forced to ``budget`` bytes (None: the U250's)."""
    import bapipe.codegen.design.context as cx
    import bapipe.codegen.design.lower as hd   # the lowering pass reads the budget
    from bapipe.codegen.cli_gen import generate_plan
    from handplan import make_plan

    monkeypatch.setattr(cx, "EMBED_LIMIT", 0)
    if budget is not None:
        monkeypatch.setattr(hd, "onchip_budget", lambda *a: budget)
    plan, model, cluster = make_plan(cuts=(), style="time-multiplexed", mode="inference")
    generate_plan(plan, model, cluster, tmp_path)
    src = (tmp_path / "stage0/stage0.cpp").read_text()
    ports = re.findall(r"mode=m_axi port=(\w+_mvu_w) offset=slave bundle=(\w+) depth=(\d+) "
                       r"max_read_burst_length=64 max_widen_bitwidth=512", src)
    # conv1 72, conv2 576, conv3 1,152, fc 640 weights: 3, 18, 36, 20 words; never two read at once
    # (one load process, or one fetch a turn), so one bundle: one AXI master (codegen.design.bundles)
    assert sorted((p, int(d)) for p, b, d in ports) == [
        ("s0_conv1_mvu_w", 3), ("s0_conv2_mvu_w", 18), ("s0_conv3_mvu_w", 36), ("s0_fc_mvu_w", 20)]
    assert {b for _p, b, _d in ports} == {"gmem0"}
    assert "bapipe::mvu<" not in src
    cfg = (tmp_path / "link/fpga0.cfg").read_text()
    for p, _b, _d in ports:
        assert re.search(rf"^sp=stage0_1\.{p}:DDR\[[0-3]\]$", cfg, re.M), p
    files = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.suffix in (".cpp", ".h")}
    return src, files


def _tiles(src: str, n: int) -> list[tuple[int, int, int]]:
    """(matrix elements, buffer half, weight-word offset) of each MVU turn of the shared MAC array
    (codegen.design.mac_share) reading the packed weight buffer of ``n`` bank words a bank, in
    turn order (tiny-cnn's hand plan: PE = SIMD = 1, one element a weight word and a bank word)."""
    fold = {t: int(nf) * int(sf) * int(used) for t, nf, sf, used in
            re.findall(r"case (\d+):\n\s+NF = (\d+), SF = (\d+), used = (\d+),", src)}
    reads = re.findall(rf"case (\d+): {{\n\s+bapipe::w_banks<1, {n}, 1, 1, 1, 1> w = {{s0_wbuf\[(\d)\], (\d+)L, 0}};",
                       src)
    return [(fold[t], int(h), int(o)) for t, h, o in reads]


@pytest.mark.slow   # one project generated (~2 s alone)
def test_tiny_cnn_weights_all_stay_on_chip_for_the_call(tmp_path, monkeypatch):
    """Its 2,440 weights (4,880 bytes) fit a U250 kernel's share: one packed buffer holds the
    four matrices one after another (PE x SIMD = 1: one bank of one-element words, 2,440 deep;
    BRAM: 3 BRAM18 are 0.065% of a U250's BRAM, one URAM 0.078% of its URAM), filled once a call
    by ONE process reading the four ports one after another (one writer: no DATAFLOW region),
    before the samples' turns; each MVU reads its part; the C++ declarations hold the buffer and
    the Design counts the same bytes."""
    from bapipe.codegen.check.cxx_memory import kernel_memory

    src, files = _gen(tmp_path, monkeypatch)
    assert "static bapipe::rom_t s0_wbuf[1][1][2440][1];" in src
    assert "BIND_STORAGE variable=s0_wbuf type=ram_2p impl=bram" in src
    loads = re.findall(r"bapipe::weight_fetch_banks<1, 1, 2440, 1, 1, 1, 512>\((\w+), s0_wbuf, 0, (\d+)L, (\d+)L", src)
    assert loads == [("s0_conv1_mvu_w", "0", "72"), ("s0_conv2_mvu_w", "72", "576"),
                     ("s0_conv3_mvu_w", "648", "1152"), ("s0_fc_mvu_w", "1800", "640")]
    wload = src[src.index("static void s0_wload("):src.index("static void s0_turn0(")]
    assert "BAPIPE_DATAFLOW_BEGIN" not in wload and "BAPIPE_PROCESS" not in wload
    body = src[src.index("static void stage0_turns("):]
    assert body.index("s0_wload(") < body.index("for (int i = 0; i < n; i++)")   # once a call
    assert _tiles(src, 2440) == [(72, 0, 0), (576, 0, 72), (1_152, 0, 648), (640, 0, 1_800)]
    km = kernel_memory(files, "stage0/stage0.cpp", "stage0")
    buf = [it for it in km.items if it.path.endswith("/s0_wbuf")]
    assert len(buf) == 1 and buf[0].bits == 2_440 * 16 and buf[0].storage == "bram"


@pytest.mark.csim
@pytest.mark.slow
@pytest.mark.soak   # one stage kernel compiled and run (~15 s): make test-all (make test sat at 9 min 59 s)
@pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                    reason="needs g++ and the hls4ml ap_types headers")
def test_tiny_cnn_weight_tiles_and_streams_are_bit_exact(tmp_path, monkeypatch):
    """A 4,000-byte share (tiles up to 1,000 bytes; the 4,880 bytes of weights do not all fit):
    the three convolutions take turns in a ping-pong buffer of two halves of the largest
    (conv3, 1,152), the fill turn fetching conv1's before its turn, conv1's turn conv2's into
    the other half, conv2's conv3's; fc (1,280 bytes, one vector a sample) streams through a
    two-deep FIFO; the frame buffers go off chip too; csim 0 LSB against numpy."""
    import bapipe.codegen.check.csim as cs

    src, _files = _gen(tmp_path, monkeypatch, 4_000)
    assert "static bapipe::rom_t s0_wbuf[2][1][1152][1];" in src
    assert "ARRAY_PARTITION variable=s0_wbuf complete dim=1" in src   # the halves: banks of their own
    assert _tiles(src, 1152) == [(72, 0, 0), (576, 1, 0), (1_152, 0, 0)]
    fetch = re.findall(r"bapipe::weight_fetch_banks<2, 1, 1152, 1, 1, 1, 512>\((\w+), s0_wbuf, (\d), 0L, (\d+)L", src)
    assert fetch == [("s0_conv1_mvu_w", "0", "72"), ("s0_conv2_mvu_w", "1", "576"), ("s0_conv3_mvu_w", "0", "1152")]
    assert src.index("static void s0_wfill(") < src.index("static void s0_turn0(")
    assert re.search(r"bapipe::weight_stream<1, 512>\(s0_fc_mvu_w, s0_fc_mvu_ws, 640L, \(long\)n \* 1\)", src)
    assert "hls::stream<bapipe::vec<1>, 2> s0_fc_mvu_ws" in src and "bapipe::w_fifo<1, 1> w; w.ws = &s0_fc_mvu_ws" in src
    assert "frame_write<" in src
    r = cs.csim_project(tmp_path, samples=2)
    assert r["passed"] and r["model_max_abs_err_lsb"] == 0, r


@pytest.mark.slow   # one project generated (~2 s alone)
def test_dataflow_stages_read_on_chip_copies_of_their_weights(tmp_path):
    """A training build's dataflow stages keep their weights in m_axi memory (the update kernel
    rewrites them): each MVU reads a packed on-chip copy of its matrix (PE x SIMD / 8 banks of
    4-element words, two a bank a cycle), filled once a call from the port in 512-bit bursts by
    one load process (codegen.design.weight_memory.load_weights_once), never the port inside its
    II=1 loop; the copies are the Design's on-chip bytes and the C++'s."""
    from bapipe.codegen.cli_gen import generate_plan
    from bapipe.codegen.check.cxx_memory import kernel_memory
    from bapipe.codegen.design.onchip import kernel_onchip_bytes
    from bapipe.codegen.design.lower import build_project
    from handplan import make_plan

    plan, model, cluster = make_plan(cuts=(3, 6), style="dataflow", mode="train",
                                     folding={"conv2": (4, 8), "conv3": (2, 8)})
    generate_plan(plan, model, cluster, tmp_path)
    ctx = build_project(plan, model, cluster)
    files = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.suffix in (".cpp", ".h")}
    for s in ctx.stages:
        src = files[f"{s.name}/{s.name}.cpp"]
        mvus = re.findall(r"bapipe::mvu\w*<[^>]*>\(\w+, \w+, (\w+),", src)
        assert mvus and all(w.endswith("_mvu_wt") for w in mvus), src   # the copies, not the ports
        for w in mvus:
            port = w[:-1]   # s<i>_<layer>_mvu_w
            [words] = re.findall(rf"port={port} offset=slave bundle=gmem\d+ depth=(\d+) max_read_burst_length=64 "
                                    r"max_widen_bitwidth=512", src)
            elems = next(r.size for r in s.engine.roms if r.name == port)
            assert int(words) == -(-elems // 32)   # 32 fixed16 elements a 512-bit word
            assert re.search(rf"bapipe::weight_fetch_banks<1, \d+, \d+, [124], [12], \d+, 512>\({port}, {w}, 0, 0L, "
                             rf"{elems}L, 1L\)", src)
        assert src.index(f"{s.name}_wload(") < src.index(f"{s.name}_engines(in0")
        km = kernel_memory(files, f"{s.name}/{s.name}.cpp", s.name)
        assert km.total == kernel_onchip_bytes(s, ctx.fmt)
    s0 = files["stage0/stage0.cpp"]
    # conv2 (8 x 72 on 4 x 8): 32 lanes in 4 banks of 4-element words, 2 x NF x SF = 2 x 2 x 9 deep
    assert "static bapipe::rom_t s0_conv2_mvu_wt[1][4][36][4];" in s0
