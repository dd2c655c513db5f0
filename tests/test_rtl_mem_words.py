"""The MVU's memory images one word a line, its memories' storage and its adder tree's shape."""
from __future__ import annotations

import numpy as np

from bapipe.codegen.design import dataflow as rm
from bapipe.codegen.rtl.mem_words import buffer_style, mvu_word_files, rom_style, tree_stages, word_lines
from bapipe.codegen.rtl.memories import mvu_memory_files
from bapipe.codegen.rtl.pipeline import render_mvu
from bapipe.fpga_models.engines import mvu_fill, mvu_tree_stages
from bapipe.fpga_models.memory_blocks import bram18_units


def _spec(mw=12, mh=6, pe=3, simd=4):
    w = (np.arange(mh * mw).reshape(mh, mw) * 97 - 3000)
    return rm.MvuSpec("m", "fc", mw, mh, pe, simd, False, 16, 10, w, np.arange(mh) - 4)


def test_word_lines_are_the_element_lines_joined():
    """Line a of the word image = the PE*SIMD element lines of word a (codegen.rtl.memories,
    written independently element by element) joined: lane 0 leftmost."""
    spec = _spec()
    words, elems = mvu_word_files(spec), mvu_memory_files(spec)
    lanes = spec.pe * spec.simd
    el = elems["m_w.hex"].decode().split()
    assert words["m_w.hex"].decode().split() == ["".join(el[a * lanes:(a + 1) * lanes]) for a in range(spec.nf * spec.sf)]
    # word 1 = nf 0, sf 1: lane p*SIMD+i is W[p][4+i]; W[0][4] = 4*97-3000 = -2612 = 0xf5cc
    assert words["m_w.hex"].decode().split()[1][:4] == "f5cc"
    assert words["m_b.hex"] == b"fffcfffdfffe\nffff00000001\n"   # b = -4..1, PE 3 per line
    assert word_lines(np.array([[-1, 127]]), 8) == b"ff7f\n"


def test_storage_rule():
    """ROMs up to 64 words are LUTs (kernel_types.LUTRAM_WORDS, the HLS ROMs' rule), deeper ones
    block RAM, never URAM (no initial contents, UG573); buffers distributed or block."""
    assert [rom_style(n) for n in (1, 64, 65, 4096)] == ["logic", "logic", "block", "block"]
    assert [buffer_style(n) for n in (2, 64, 65)] == ["distributed", "distributed", "block"]
    text = render_mvu(_spec(mw=256 * 16, mh=8, pe=4, simd=16))   # 2 x 256 = 512 weight words
    assert '(* ram_style = "block" *) reg [64*ELEM_W-1:0] wmem' not in text   # declared with LANES
    assert '(* ram_style = "block" *) reg [LANES*ELEM_W-1:0] wmem [0:NF*SF-1];' in text
    # the yosys run of a 256x256 PE 4 SIMD 16 unit (docs/rtl.md) took 57 RAMB18E2, the Design's count
    assert bram18_units(4 * 16 * 16, 1024) == 57


def test_tree_stages_and_fill():
    """Up to 4 terms per registered stage: SIMD 1 none, 4 one, 5..16 two, 20 three; fill 4 + stages."""
    assert [mvu_tree_stages(s) for s in (1, 2, 4, 5, 16, 17, 20, 64, 2304)] == [0, 1, 1, 2, 2, 3, 3, 3, 6]
    assert tree_stages(20) == [{"k": 1, "n_in": 20, "n_out": 5, "full": 5, "rest": []},
                               {"k": 2, "n_in": 5, "n_out": 2, "full": 1, "rest": [4]},
                               {"k": 3, "n_in": 2, "n_out": 1, "full": 0, "rest": [0, 1]}]
    assert mvu_fill(1) == 4 and mvu_fill(20) == 7
    assert "FILL = 7 cycles" in render_mvu(_spec(mw=40, mh=6, pe=3, simd=20))
