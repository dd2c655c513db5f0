"""`bapipe check`'s rules on hand-written C++ with hand-computed figures (block counts from AMD
UG573's RAMB18E2/RAMB36E2/URAM288 width x depth modes, ports from UG573's true dual port, FIFO
binding from UG1399 config_storage), and on generated tiny builds (gen refuses a build that
breaks a rule unless --allow-rule-violations)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bapipe.codegen.check.cxx_scan import scan_kernel
from bapipe.codegen.check.physical_rules import decl_blocks, dsp_per_multiplier, kernel_figures, layout, reach_ii
from bapipe.fpga_models.memory_blocks import bram18_units, fifo_impl, uram_blocks


@pytest.mark.parametrize("width,depth,units", [
    (16, 1024, 1),     # RAMB18E2 1K x 18
    (18, 1024, 1),
    (36, 512, 1),      # RAMB18E2 512 x 36
    (72, 512, 2),      # RAMB36E2 512 x 72 = 2 units (or two RAMB18 512 x 36)
    (16, 2048, 2),     # RAMB36E2 2K x 18
    (1, 32768, 2),     # RAMB36E2 32K x 1
    (1, 16384, 1),     # RAMB18E2 16K x 1
    (9, 4096, 2),      # RAMB36E2 4K x 9
    (47, 192, 2),      # 512 x 36 twice (a 47-bit accumulator bank)
    (2048, 12544, 1425),   # ceil(2048/72) x ceil(12544/512) RAMB36 = 29 x 25 = 725 x 2 = 1450;
                           # RAMB18 1K x 18 tiling: 114 x 13 = 1482; RAMB36 2K x 18: 114 x 7 x 2 = 1596;
                           # RAMB18 2K x 9: 228 x 7 = 1596; RAMB36 1K x 36: 57 x 13 x 2 = 1482;
                           # RAMB18 512 x 36: 57 x 25 = 1425 (the cheapest)
])
def test_bram_units_by_ug573_modes(width, depth, units):
    assert bram18_units(width, depth) == units


@pytest.mark.parametrize("width,depth,blocks", [(72, 4096, 1), (73, 4096, 2), (47, 192, 1), (16, 1144512, 280),
                                                (16, 4097, 2)])
def test_uram_blocks_4k_x_72_cascaded(width, depth, blocks):
    assert uram_blocks(width, depth) == blocks


def test_fifo_binding_ug1399_defaults():
    assert fifo_impl(12288, 2) == "srl"       # within auto_srl_max_depth = 2
    assert fifo_impl(32, 32) == "srl"         # 1,024 bits: within auto_srl_max_bits
    assert fifo_impl(2048, 3136) == "bram"
    assert fifo_impl(2048, 3136, "uram") == "uram"   # BIND_STORAGE wins


def test_dsp_per_multiplier_27x18():
    assert dsp_per_multiplier(16, 16) == 1 and dsp_per_multiplier(27, 18) == 1
    assert dsp_per_multiplier(32, 32) == 4    # ceil(32/27) x ceil(32/18)
    assert dsp_per_multiplier(18, 40) == 2    # 40 on the 27-bit side: 2 x 1


SNIPPET = r'''
#include "ap_int.h"
typedef short rom_t;
typedef ap_fixed<16,6> data_t;
template <int L> struct vec { data_t v[L]; };
struct tile { const rom_t *w; int t; data_t at(int s) const { return w[t * 8 + s]; } };

inline data_t mul(const data_t &a, const data_t &b) { return a * b; }

template <int N, int PE>
void fill(rom_t buf[N], int k) {
fill_loop:
    for (int i = 0; i < N / PE; i++) {
#pragma HLS PIPELINE II=1
        for (int p = 0; p < PE; p++) {
#pragma HLS UNROLL
            buf[i * PE + p] = (rom_t)k;
        }
    }
}

template <int PE>
void use(hls::stream<vec<PE> > &out, const rom_t buf[4096]) {
    tile w = {buf, 0};
use_loop:
    for (int i = 0; i < 64; i++) {
#pragma HLS PIPELINE II=1
        vec<PE> y;
        for (int p = 0; p < PE; p++) {
#pragma HLS UNROLL
            y.v[p] = mul(w.at(p), w.at(p));
        }
        out.write(y);
    }
}

void top(hls::stream<vec<8> > &out, int n) {
#pragma HLS INTERFACE mode=axis port=out
    static rom_t big[4096];
#pragma HLS BIND_STORAGE variable=big type=ram_2p impl=uram
    static rom_t parted[8][1024];
#pragma HLS ARRAY_PARTITION variable=parted cyclic factor=4 dim=2
    static data_t regs[8];
#pragma HLS ARRAY_PARTITION variable=regs complete
    hls::stream<vec<8>, 64> deep("deep");
#pragma HLS DATAFLOW
    fill<4096, 8>(big, n);
    fill<4096, 8>(big, n);
    use<8>(out, big);
}
'''


def _scan():
    return scan_kernel({"k/top.cpp": SNIPPET}, "k/top.cpp", "top")


def test_snippet_blocks_by_hand():
    sc = _scan()
    big, parted, regs, deep = (sc.decls[f"top/{v}"] for v in ("big", "parted", "regs", "deep"))
    # big: 4096 x 16 bits bound to URAM, one bank: one URAM288 (4K x 72)
    assert layout(big)[:4] == ("uram", 1, 16, 4096) and decl_blocks(big).uram == 1
    # parted: [8][1024] x 16, cyclic 4 on dim 2: 4 banks of 2048 x 16 -> RAMB36 2K x 18 = 2 units each
    assert layout(parted)[:4] == ("auto", 4, 16, 2048) and decl_blocks(parted).bram18 == 8
    # regs: completely partitioned: flip-flops, no block
    assert layout(regs)[0] == "register" and decl_blocks(regs).bram18 == decl_blocks(regs).uram == 0
    # deep: 64 x 128 bits = 8,192 bits > 1,024 and deeper than 2: BRAM, 128/36 -> 4 x RAMB18 512 x 36
    assert layout(deep)[0] == "bram" and decl_blocks(deep).bram18 == 4


def test_snippet_ports_ii_and_dataflow():
    sc = _scan()
    fig = kernel_figures(sc, "k/top.cpp")
    fills = [lp for lp in sc.loops if lp.label == "fill_loop"]
    uses = [lp for lp in sc.loops if lp.label == "use_loop"]
    assert len(fills) == 2 and len(uses) == 1
    # fill writes 8 elements a cycle into one URAM bank (2 ports): II 4
    assert fills[0].access["top/big"] == [0, 8] and reach_ii(fills[0], sc.decls) == (4, "top/big")
    # use reads w.at(p) twice per lane (same element: one read) for 8 lanes through the struct: II 4
    assert uses[0].access["top/big"] == [8, 0] and reach_ii(uses[0], sc.decls)[0] == 4
    # 8 multipliers of 16 x 16 bits: 8 DSP48E2
    assert fig.dsp == 8
    # two processes write `big` in one DATAFLOW region: the single-writer rule fails
    assert [(d["channel"], d["writers"]) for d in fig.dataflow_violations] == [("top/big", 2)]


def _tiny(tmp_path, mode, model="tiny-cnn"):
    from bapipe.cli import main

    plan = tmp_path / "p.yaml"
    assert main(["plan", model, "4xU250-ring", "--mode", mode, "-o", str(plan)]) == 0
    return plan


def test_gen_keeps_a_build_that_passes_and_check_says_ok(tmp_path, capsys):
    from bapipe.cli import main

    plan = _tiny(tmp_path, "inference")
    assert main(["gen", str(plan), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "b"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and len(r["boards"]) == 4
    b = r["boards"][0]
    assert b["board_type"] == "U250" and b["usable"]["uram"] == 1280 and b["masters_per_bank"]


def test_tiny_cnn_training_build_passes_every_rule(tmp_path, capsys):
    """The planner's default tiny-cnn training plan (all of it on each of 4 data-parallel
    boards): gen keeps it without --allow-rule-violations and check passes every rule: the MVU
    weight copies' banks of a few words in LUTRAM (208 BRAM36 a board, was 1,428 with SLR2 at
    1,234 of 576), at most 15 masters a bank (15 on DDR[2], was 22), biases copied on chip (no
    m_axi read in an MVU loop)."""
    from bapipe.cli import main

    plan = _tiny(tmp_path, "train")
    assert main(["gen", str(plan), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "b"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and len(r["boards"]) == 4
    for b in r["boards"]:
        assert max(b["masters_per_bank"].values()) <= 15 and b["bram36"] <= b["usable"]["bram36"]
        assert b["ii_violations"] == 0 and b["dataflow_violations"] == 0
        assert all(t <= b["plan_seconds_per_sample"] for t in b["bank_seconds_per_sample"].values())
    k = r["kernels"]["stage0_bwd"]
    # the weight-gradient sums are written by the flush call, once an iteration; fc's matrix is read
    # where it lives by its row engine (fpga_models.bwd_tiles), not copied once a call
    assert k["m_axi_bytes_per_flush"]["dw_fc"] == 640 * 8 and "dw_fc" not in k["m_axi_bytes_per_sample"]
    assert "fc_w" not in k["m_axi_bytes_per_call"]


def test_gen_refuses_a_build_that_breaks_a_rule(tmp_path, capsys):
    from bapipe.cli import main

    # small-resnet's default training plan: 44 kernel interfaces on a bank of each board (docs/check.md)
    plan = _tiny(tmp_path, "train", str(Path(__file__).resolve().parent.parent / "examples/models/small-resnet.yaml"))
    capsys.readouterr()
    assert main(["gen", str(plan), "-o", str(tmp_path / "b"), "--strict-rules"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--strict-rules" in err[0] and "physical rules" in err[0]
    assert not (tmp_path / "b").exists()                       # no half-written build
    assert not list(tmp_path.glob(".b.gen-*"))
    assert main(["gen", str(plan), "-o", str(tmp_path / "b"), "--strict-rules", "--allow-rule-violations"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["gen", str(plan), "-o", str(tmp_path / "b")]) == 0   # the default: written, each board warned
    assert "breaks the physical rules" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out.splitlines()
    import yaml
    boards = sorted({b for st in yaml.safe_load(plan.read_text())["stages"] for b in st["boards"]})
    lines = [x for x in out if x.startswith("fpga")]   # one line a board of the plan, in its order
    assert [x.split()[0] for x in lines] == boards
    assert all("FAILS" in x for x in lines) and out[-1].startswith("rules failed:")


def test_check_of_a_folder_that_is_not_a_build(tmp_path, capsys):
    from bapipe.cli import main

    assert main(["check", str(tmp_path / "nothing")]) == 2
    assert "expected a folder written by `bapipe gen`" in capsys.readouterr().err


FLUSH_STEP = r'''
typedef long wsum_t;
void step(wsum_t dw[4096], int one, int flush) {
    if (flush) {
    write_loop:
        for (int k = 0; k < 4096; k++) {
#pragma HLS PIPELINE II=1
            dw[k] = k;
        }
    }
}
void top(wsum_t dw[4096], int n, int flush) {
#pragma HLS INTERFACE mode=m_axi port=dw offset=slave bundle=gmem
    for (int i = 0; i < n + (flush ? 1 : 0); i++) {
        const int one = i < n ? 1 : 0, last = i < n ? 0 : 1;
        step(dw, one, last);
    }
}
'''


def test_flush_step_is_paid_once_an_iteration_not_per_sample():
    """The backward kernels' loop of n sample steps and, with ``flush``, one more that writes the
    sums (stage_bwd.cpp.j2): ``last = i < n ? 0 : 1`` is 0 on every trip of a call without
    ``flush`` (its first and last trip agree), so the write loop is priced only in the flush call.
    vgg16's default build counted fc6-8's 989 MB of sums per sample on fpga3's DDR[0] (1.02 GB a
    sample: 53 ms against 25.8 ms planned, a false bandwidth failure)."""
    from bapipe.codegen.check.physical_rules import _port_traffic

    files = {"k/top.cpp": FLUSH_STEP}
    one, two, flush = (scan_kernel(files, "k/top.cpp", "top", n, f) for n, f in ((1, 0), (2, 0), (0, 1)))
    assert _port_traffic(one)[0].get("dw", 0.0) == 0.0 and _port_traffic(two)[0].get("dw", 0.0) == 0.0
    assert _port_traffic(flush)[0]["dw"] == 4096 * 8      # 4,096 64-bit sums written once
    # a call whose flush is not known (the whole scan: blocks, II) still sees the write loop
    whole = scan_kernel(files, "k/top.cpp", "top", 1, None)
    assert any(lp.label == "write_loop" for lp in whole.loops)


def test_vgg16_default_training_build_passes_every_rule_and_agrees_with_the_plan(tmp_path, capsys):
    """The planner's default vgg16 training plan on 4xU250-ring (issue 32 item 3): gen keeps it
    without --allow-rule-violations and every board passes every rule (main at fe25cbf: fpga1 and
    fpga2 at 1,300 and 1,542 URAM of 1,280, fpga3 at 1.02 GB a sample on DDR[0]); and (item 2)
    the plan's BRAM36, URAM and DSP of every stage's forward and backward kernel are within 10%
    of what check counts in the generated C++ (the issue's tolerance: the plan prices banks by
    fpga_models, check reads the declarations)."""
    import yaml

    from bapipe.cli import main

    plan = tmp_path / "p.yaml"
    assert main(["plan", "vgg16", "4xU250-ring", "-o", str(plan)]) == 0
    assert main(["gen", str(plan), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "b"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and [b["board"] for b in r["boards"]] == ["fpga0", "fpga1", "fpga2", "fpga3"]
    for b in r["boards"]:
        assert b["uram"] <= b["usable"]["uram"] and b["bram36"] <= b["usable"]["bram36"]
        assert all(t <= b["plan_seconds_per_sample"] for t in b["bank_seconds_per_sample"].values())
    stages = yaml.safe_load(plan.read_text())["stages"]
    for st in stages:
        res, k = st["resources"], st["index"]
        for kernel, bram, uram, dsp in ((f"stage{k}", "fwd_bram36", "fwd_uram", "dsp"),
                                        (f"stage{k}_bwd", "bwd_bram36", "bwd_uram", "bwd_dsp")):
            got = r["kernels"][kernel]
            for plan_v, check_v in ((res[bram], got["bram36"]), (res[uram], got["uram"]), (res[dsp], got["dsp"])):
                # 10%: issue 32 item 2's bound (the plan prices banks by fpga_models; check reads the C++)
                assert abs(plan_v - check_v) <= 0.1 * max(plan_v, check_v), (kernel, plan_v, check_v)
