"""Board catalog: figures match REFERENCES.md, derived peaks, overrides."""
import json

import pytest

from bapipe.errors import SpecError
from bapipe.yamlio import loads
from bapipe.fpga_models.boards import (BOARDS, FORMATS, RESOURCES, Board, bytes_per_element, get_board, on_chip_bytes,
                                with_overrides)


def test_formats_and_bytes():
    assert FORMATS == ("fixed16", "int8", "fp16", "bf16", "fp32")
    assert [bytes_per_element(f) for f in FORMATS] == [2, 1, 2, 2, 4]
    with pytest.raises(SpecError, match="unknown number format 'fp8'"):
        bytes_per_element("fp8")


def test_catalog_has_required_boards():
    for name in ("U250", "U280", "U55C", "VCU118", "ZCU102", "S10MX", "V100", "A100"):
        assert BOARDS[name].name == name
    assert {b.kind for b in BOARDS.values()} == {"fpga", "gpu"}


@pytest.mark.parametrize("name,lut,dsp,usable_dsp,bram,usable_bram,uram", [
    ("U250", 1_728_000, 12_288, 11_520, 2_688, 2_304, 1_280),
    ("U280", 1_303_680, 9_024, 8_496, 2_016, 1_752, 960),
    ("U55C", 1_303_680, 9_024, 8_496, 2_016, 1_752, 960),
    ("VCU118", 1_182_240, 6_840, 5_856, 2_160, 1_848, 960),
    ("ZCU102", 274_080, 2_520, 2_520, 912, 912, 0),
    ("U200", 1_182_240, 6_840, 5_856, 2_160, 1_848, 960),
    ("U50", 871_680, 5_952, 5_352, 1_344, 1_128, 640),
])
def test_fpga_figures_match_references(name, lut, dsp, usable_dsp, bram, usable_bram, uram):
    b = get_board(name)
    assert (b.lut, b.dsp, b.usable_dsp, b.bram36, b.usable_bram36, b.uram) == \
        (lut, dsp, usable_dsp, bram, usable_bram, uram)
    for res in ("lut", "ff", "dsp", "bram36", "uram"):
        assert 0 <= getattr(b, "usable_" + res) <= getattr(b, res)


def test_memory_and_network_figures():
    u250, u280, u55c = BOARDS["U250"], BOARDS["U280"], BOARDS["U55C"]
    # bandwidths are whole bytes per second, integers below 2**53: every sum and product exact
    assert u250.offchip_bytes == 64 * 2**30 and u250.offchip_bw_Bps == 76.8e9
    assert u280.offchip_bytes == 40 * 2**30 and u280.offchip_bw_Bps == 460e9 + 38.4e9
    assert u55c.offchip_bytes == 16 * 2**30 and u55c.offchip_bw_Bps == 460e9
    s10 = BOARDS["S10MX"]
    assert s10.offchip_bytes == 16 * 2**30 and s10.offchip_bw_Bps == 512e9 and s10.uram == 0
    assert s10.bram36 == 6_847 * 20 // 36  # M20K -> BRAM36 equivalents
    for name in ("U250", "U280", "U55C", "VCU118"):
        assert BOARDS[name].network_ports == 2 and BOARDS[name].port_bw_Bps == 11.9e9
        assert BOARDS[name].clock_hz == (300e6 if name != "VCU118" else 250e6)


def test_fpga_peak_flops_derivation():
    for b in BOARDS.values():
        if b.kind != "fpga":
            continue
        assert set(b.peak_flops) == set(b.dsp_per_mac) == set(FORMATS)
        for fmt, d in b.dsp_per_mac.items():
            # the catalog's formula, evaluated in the same order: the same roundings, exact
            assert b.peak_flops[fmt] == 2 * b.usable_dsp / d * b.clock_hz
    u250 = BOARDS["U250"]
    assert u250.dsp_per_mac["int8"] == 0.5  # 2 MACs per DSP48E2 (WP486)
    assert u250.dsp_per_mac["fixed16"] == 1.0
    # integers below 2**53 and a division by 1 or 0.5: exact
    assert u250.peak_flops["fixed16"] == 2 * 11_520 * 300e6  # 6.912 TFLOP/s
    assert u250.peak_flops["int8"] == 2 * u250.peak_flops["fixed16"]
    assert all(u250.dsp_per_mac[f] > 1 for f in ("fp16", "bf16", "fp32"))


def test_gpu_figures():
    v, a = BOARDS["V100"], BOARDS["A100"]
    assert v.peak_flops["fp32"] == 15.7e12 and v.peak_flops["fp16"] == 125e12 and "bf16" not in v.peak_flops
    assert a.peak_flops == {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12, "int8": 624e12}
    assert v.network_ports * v.port_bw_Bps == 150e9  # NVLink2 per direction, aggregated
    assert v.dsp == v.usable_dsp == 0 and v.dsp_per_mac == {} and on_chip_bytes(v) == 0


def test_on_chip_bytes():
    assert on_chip_bytes(BOARDS["U250"]) == 2_304 * 4608 + 1_280 * 36864
    assert on_chip_bytes(BOARDS["ZCU102"]) == 912 * 4608


def test_get_board_unknown():
    with pytest.raises(SpecError) as e:
        get_board("U999")
    assert str(e.value).startswith("command line: board: unknown board type 'U999'; expected one of U250, U280")
    with pytest.raises(SpecError):
        get_board(None)  # not a KeyError/TypeError


def test_to_dict_is_json():
    d = BOARDS["U250"].to_dict()
    json.dumps(d)
    assert d["usable_dsp"] == 11_520 and d["dsp_per_mac"]["int8"] == 0.5 and isinstance(d["sources"], list)
    assert set(d) == {f for f in Board.__dataclass_fields__}


def test_boards_are_hashable_and_frozen():
    b = BOARDS["U250"]
    assert hash(b) == hash(get_board("U250"))
    with pytest.raises(TypeError):
        b.dsp_per_mac["int8"] = 1.0  # type: ignore[index]


def test_with_overrides():
    node = loads("clock_hz: 2.5e+8\nusable_dsp: 10000\ndsp_per_mac: {fp32: 4}\n", "ov.yaml")
    b = with_overrides(BOARDS["U250"], node)
    assert b.clock_hz == 250e6 and b.usable_dsp == 10_000
    assert b.dsp_per_mac["fp32"] == 4 and b.dsp_per_mac["int8"] == 0.5
    assert b.peak_flops["fp32"] == 2 * 10_000 / 4 * 250e6   # integers below 2**53: exact
    assert BOARDS["U250"].clock_hz == 300e6  # catalog untouched
    # YAML 1.1 would read 12e9 (no dot) as a string; bapipe.yamlio reads it as a float
    assert with_overrides(BOARDS["U250"], loads("pcie_bw_Bps: 12e9\n")).pcie_bw_Bps == 12e9
    g = with_overrides(BOARDS["V100"], loads("peak_flops: {fp32: 14.0e+12}\n"))
    assert g.peak_flops["fp32"] == 14e12 and g.peak_flops["fp16"] == 125e12


@pytest.mark.parametrize("text,expected", [
    ("foo: 1\n", "ov.yaml:1: foo: unknown board field 'foo'"),
    ("dsp: -1\n", "ov.yaml:1: dsp: expected an integer >= 0, got -1"),
    ("dsp: many\n", "ov.yaml:1: dsp: expected an integer, got the string 'many'"),
    ("clock_hz: 0\n", "ov.yaml:1: clock_hz: expected a number > 0"),
    ("clock_hz: [1]\n", "ov.yaml:1: clock_hz: expected a finite number, got a list"),
    ("\nusable_dsp: 20000\n", "ov.yaml:2: usable_dsp: expected usable_dsp (20000) <= dsp (12288)"),
    ("dsp_per_mac: {fp8: 1}\n", "ov.yaml:1: dsp_per_mac.fp8: unknown number format 'fp8'"),
    ("dsp_per_mac: 3\n", "ov.yaml:1: dsp_per_mac: expected a mapping"),
    ("peak_flops: {fp32: 1.0e+12}\n", "ov.yaml:1: peak_flops: an FPGA's peak_flops is derived"),
    ("description: null\n", "ov.yaml:1: description: expected a non-empty string, got nothing"),
])
def test_with_overrides_errors(text, expected):
    with pytest.raises(SpecError) as e:
        with_overrides(BOARDS["U250"], loads(text, "ov.yaml"))
    assert str(e.value).startswith(expected), str(e.value)


def test_with_overrides_not_a_mapping():
    with pytest.raises(SpecError, match="expected a mapping of board fields, got a list"):
        with_overrides(BOARDS["U250"], loads("[1, 2]\n"))


def test_yaml_reads_exponent_floats_everywhere():
    """Model, cluster and plan files read `12e9`, `-3E2`, `1.5e-3` as floats (YAML 1.2 style);
    things that only look alike stay strings."""
    from bapipe.yamlio import loads
    d = loads("a: 12e9\nb: -3E2\nc: 1.5e-3\nd: 12\ne: 1e\nf: e9\ng: 1_000\n")
    assert d == {"a": 12e9, "b": -300.0, "c": 1.5e-3, "d": 12, "e": "1e", "f": "e9", "g": 1000}
    assert isinstance(d["a"], float) and isinstance(d["d"], int)


# --- per-SLR resources and memory banks (issue 16) ---------------------------------------------

@pytest.mark.parametrize("name", [n for n, b in BOARDS.items() if b.kind == "fpga"])
def test_slr_sums_equal_board_totals(name):
    b = BOARDS[name]
    assert b.slrs and [s.index for s in b.slrs] == list(range(len(b.slrs)))
    for res in RESOURCES:
        for key in (res, "usable_" + res):
            assert sum(getattr(s, key) for s in b.slrs) == getattr(b, key), key
        for s in b.slrs:
            assert 0 <= getattr(s, "usable_" + res) <= getattr(s, res)
    # integers: the banks' bytes add up exactly; bandwidths are sums of <= 34 floats of whole
    # bytes/s (or x/32 of them): within 1 B/s of the board's figure
    assert sum(k.bytes for k in b.banks) == b.offchip_bytes
    assert abs(sum(k.bw_Bps for k in b.banks) - b.offchip_bw_Bps) <= 1.0
    assert all(0 <= k.slr < len(b.slrs) for k in b.banks)
    assert len({k.name for k in b.banks}) == len(b.banks)


def test_slr_and_bank_figures():
    u250, u280, u55c = BOARDS["U250"], BOARDS["U280"], BOARDS["U55C"]
    assert [s.usable_dsp for s in u250.slrs] == [2_880] * 4 and [s.dsp for s in u250.slrs] == [3_072] * 4
    assert [(k.name, k.slr, k.bytes) for k in u250.banks] == [(f"DDR[{i}]", i, 16 * 2**30) for i in range(4)]
    assert [s.usable_dsp for s in u280.slrs] == [2_736, 2_880, 2_880]
    assert [s.usable_bram36 for s in u280.slrs] == [600, 576, 576]
    hbm = [k for k in u280.banks if k.kind == "hbm"]
    assert [k.name for k in hbm] == [f"HBM[{i}]" for i in range(32)] and {k.slr for k in hbm} == {0}
    assert hbm[0].bytes == 256 * 2**20 and hbm[0].bw_Bps == 14.375e9
    assert [(k.name, k.slr) for k in u280.banks if k.kind == "ddr"] == [("DDR[0]", 0), ("DDR[1]", 1)]
    assert [k.name for k in u55c.banks] == [f"HBM[{i}]" for i in range(32)] and u55c.banks[0].bytes == 2**29
    assert u250.bank("DDR[3]").slr == 3 and u250.bank("HBM[0]") is None
    assert (u250.qsfp_slr, u280.qsfp_slr) == (2, 2)   # XUP VNx connectivity files: slr=cmac_0:SLR2
    u200, u50 = BOARDS["U200"], BOARDS["U50"]
    assert [(k.name, k.slr) for k in u200.banks] == [("DDR[0]", 0), ("DDR[1]", 1), ("DDR[2]", 1), ("DDR[3]", 2)]
    assert len(u50.slrs) == 2 and [k.name for k in u50.banks] == [f"HBM[{i}]" for i in range(32)]
    assert u50.network_ports == 1 and u50.qsfp_slr == 1
    # one SLR's usable on-chip RAM: 576 BRAM36 x 4,608 B + 320 URAM x 36,864 B
    assert u250.slrs[0].on_chip_bytes == 576 * 4608 + 320 * 36864
    for g in ("V100", "A100"):
        assert BOARDS[g].slrs == () and BOARDS[g].banks == ()
    d = u280.to_dict()
    json.dumps(d)
    assert d["slrs"][0]["usable_dsp"] == 2_736 and d["banks"][-1] == {"name": "DDR[1]", "kind": "ddr",
                                                                       "bytes": 16 * 2**30, "bw_Bps": 19.2e9, "slr": 1}


def test_overrides_rescale_slrs_and_banks():
    b = with_overrides(BOARDS["U280"], loads("usable_dsp: 8000\noffchip_bytes: 1000\n"))
    assert sum(s.usable_dsp for s in b.slrs) == 8_000 and sum(s.dsp for s in b.slrs) == 9_024
    # 8000 in proportion to 2736 : 2880 : 2880 = 2576.27, 2711.86, 2711.86; largest remainders round up
    assert [s.usable_dsp for s in b.slrs] == [2_576, 2_712, 2_712]
    assert sum(k.bytes for k in b.banks) == 1_000
    assert BOARDS["U280"].slrs[0].usable_dsp == 2_736  # catalog untouched
