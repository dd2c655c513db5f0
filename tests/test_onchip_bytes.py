"""On-chip bytes per kernel (issue 16 item 5): the Design's figure (codegen.design.onchip, from the
engines and the context's decisions) against an independent reading of the generated C++
declarations (codegen.check.cxx_memory: arrays, hls::stream depths, ROMs, BIND_STORAGE), within 10%,
and against the board's usable BRAM/URAM, for tiny-cnn and the planner's vgg16 on 4xU250-ring.

The 10% bound: the C++ reading also counts what the Design leaves out on purpose (a pool's
per-channel accumulators, a few scalar buffers of the backward engines), which is a few
percent of these kernels; anything structural (a whole-image buffer where the Design has a
line buffer, a FIFO deeper than the Design's) is far beyond it."""
from __future__ import annotations

import pytest

from bapipe.codegen.check.cxx_memory import kernel_memory, parse_program, kernel_items, eval_expr, type_bits
from bapipe.codegen.design.onchip import kernel_onchip_bytes
from test_link_cfg import build

#: the Design's figure and the C++ reading agree within this fraction (see the module docstring)
TOLERANCE = 0.10


def kernels(ctx):
    for s in ctx.stages:
        yield s, s.name, f"{s.name}/{s.name}.cpp", False
        if s.bwd is not None:
            yield s, s.bwd.name, f"{s.name}/{s.bwd.name}.cpp", True


def measure(key: str) -> list[dict]:
    plan, model, cluster, ctx, files = build(key)
    boards = {cb.name: cb.board for cb in cluster.boards}
    rows = []
    for s, top, path, bwd in kernels(ctx):
        km = kernel_memory(files, path, top)
        board = boards[s.boards[0]]
        rows.append({"kernel": top, "design": kernel_onchip_bytes(s, ctx.fmt, bwd=bwd), "cxx": km.total,
                     "block_ram": km.bytes("bram", "uram", "unspecified", "fifo"),
                     "slr_bytes": max(x.on_chip_bytes for x in board.slrs),
                     "board_bytes": sum(x.on_chip_bytes for x in board.slrs), "style": s.style})
    return rows


def disagreements(rows):
    return [f"{r['kernel']}: C++ {r['cxx']:,} B vs Design {r['design']:,} B" for r in rows
            if abs(r["cxx"] - r["design"]) > TOLERANCE * r["design"]]


@pytest.mark.xdist_group("placement_builds")  # one worker renders each build once
@pytest.mark.slow  # a planner run and an in-memory render (~1 s), shared with test_link_cfg
def test_tiny_cnn_onchip_bytes_match_the_design_and_fit():
    rows = measure("tiny-cnn")
    assert len(rows) == 6   # 3 stages, forward and backward
    assert disagreements(rows) == []
    for r in rows:
        assert 0 < r["cxx"] and r["block_ram"] <= r["slr_bytes"], r


@pytest.mark.xdist_group("placement_builds")  # one worker renders each build once
@pytest.mark.soak  # the planner's VGG-16 plan rendered in memory with zero weights: ~25 s (make test-all)
def test_vgg16_onchip_bytes_match_the_design_and_fit():
    rows = measure("vgg16")
    report = "; ".join(disagreements(rows))
    assert report == "", f"the generated kernels disagree with the Design: {report}"
    too_big = [f"{r['kernel']}: {r['block_ram']:,} B > {r['board_bytes']:,} B usable on the board"
               for r in rows if r["block_ram"] > r["board_bytes"]]
    assert too_big == []


# --- the C++ reader on its own ------------------------------------------------------------------


SRC = """
typedef ap_fixed<16,6,AP_RND,AP_SAT> data_t;
template <int L> struct vec { data_t v[L]; };
#if defined(__SYNTHESIS__)
template <int GB> using gacc = ap_int<GB>;
#else
template <int GB> using gacc = long long;
#endif
#define ROWS_OF(k) (k + 1)
static const data_t rom_w[4][8] = {{0}};
template <int C, int W, int K>
void swg(hls::stream<vec<C> > &in, hls::stream<vec<C * K> > &out) {
    const int R = K + 1;
    data_t buf[R][W][C];
#pragma HLS BIND_STORAGE variable=buf type=ram_2p impl=uram
    gacc<41> acc[C];
#pragma HLS ARRAY_PARTITION variable=acc complete dim=1
    if (true) buf[0][0][0] = 0; else buf[0][0][1] = 1;
}
void top(hls::stream<vec<2> > &in0, hls::stream<vec<6> > &out0) {
#pragma HLS DATAFLOW
    hls::stream<vec<2>, 16> mid("mid");
    hls::stream<vec<2> > deep("deep");
    hls::stream<vec<4>, 8> lanes[3];
#pragma HLS STREAM variable=deep depth=64
    static gacc<20> lb[3][5];
    data_t x = rom_w[0][0];
    swg<2, 10, 3>(in0, out0);
    bapipe::swg<2, 10, 3>(mid, out0);
}
"""


def test_reader_sizes_declarations():
    prog = parse_program([SRC])
    items = {i.path: i for i in kernel_items(prog, "top")}
    assert items["top/mid"].bits == 16 * 32 and items["top/deep"].bits == 64 * 32     # depth x vec<2>
    assert items["top/lanes"].bits == 3 * 8 * 64                                      # 3 streams of vec<4>
    assert items["top/lb"].bits == 15 * 24                    # gacc<20>: ap_int<20> under __SYNTHESIS__
    assert items["top/rom_w"].kind == "rom" and items["top/rom_w"].bits == 32 * 16
    bufs = [i for p, i in items.items() if p.endswith("/buf")]
    # one instance per call site: (K+1) x W x C x 16 bit, in URAM
    assert [(b.bits, b.storage) for b in bufs] == [(4 * 10 * 2 * 16, "uram")]
    assert sum(1 for i in kernel_items(prog, "top") if i.path.endswith("/buf")) == 2
    assert next(i for p, i in items.items() if p.endswith("/acc")).storage == "register"
    assert eval_expr("(H + 2 * PAD - K) / STRIDE + 1", {"H": 7, "PAD": 1, "K": 3, "STRIDE": 2}) == 4
    assert eval_expr("-7 / 2", {}) == -3   # C truncates towards zero
    assert type_bits("vec<8>", prog, {}) == 128
