"""Every generated v++ link config is consistent (issue 18 item 4, issue 16 item 5): each
stream_connect / sp / slr / connect endpoint names a kernel instance declared by an nk line
(or a platform interface), every sp bank exists on the board, every SLR index exists, every
AXI4-Stream port is connected once, m_axi arguments sharing a bundle share a bank, and the
network channels match on both boards (socket = TDEST within the XUP VNx socket table).

Builds are rendered in memory (codegen.package.project.render_files) from plans the planner makes."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from bapipe.errors import SpecError
from bapipe.models import load_model
from bapipe.codegen.design import netnames as nn
from bapipe.codegen.design.placement import Need, assign_banks, declared_bundles, place_units, placement_warnings
from bapipe.fpga_models.boards import get_board
from bapipe.yamlio import loads
from bapipe.fpga_models.cluster import load_cluster, parse_cluster


def _plan(model_name: str, cluster, **req):
    from bapipe.planner.planning import make_plan
    from bapipe.planner.search import Request
    model = load_model(model_name)
    out = make_plan(model, cluster, model_name, cluster.name, Request(**req))
    return out.plan, model


def _zero_weights(plan, model):
    """Weights of the right shapes, all zero: the link configs do not depend on their values and
    drawing VGG-16's 138 M weights takes ~40 s (codegen.design.context.make_weights draws the real ones)."""
    from bapipe.codegen.design.context import mvu_dims
    out = {}
    for st in plan.stages:
        for name in st.layers:
            l = model.layers[model.index[name]]
            if l.type in ("dense", "conv2d"):
                mh, mw = mvu_dims(l)
                shape = (mh, mw) if l.type == "dense" else (mh, l.in_shapes[0][0]) + tuple(l.attr["kernel"])
                out[name] = {"w": np.zeros(shape, dtype=np.int64), "b": np.zeros(mh, dtype=np.int64)}
            elif l.type == "batchnorm":
                s = l.in_shapes[0]
                ch = s[0] if len(s) == 3 else s[-1]
                out[name] = {"scale": np.ones(ch, dtype=np.int64), "shift": np.zeros(ch, dtype=np.int64)}
    return out


def render(plan, model, cluster):
    """(ctx, files) of the build, weights zero and the csim stimulus file empty (VGG-16's takes
    seconds to draw; nothing here reads it; the weight images are not among the files)."""
    import bapipe.codegen.hls.project as H
    from bapipe.codegen.design.lower import HLS_PASSES, lower
    from bapipe.codegen.package.project import render_files
    saved = H.csim_input
    H.csim_input = lambda *a, **k: b""
    try:
        ctx = lower(plan, model, cluster, passes=HLS_PASSES, weights=_zero_weights(plan, model)).project
        return ctx, render_files(ctx, plan.dumps(), cluster)
    finally:
        H.csim_input = saved


AURORA_CLUSTER = """
name: 3xU55C-aurora
topology: chain
boards: [{type: U55C, count: 3}]
link: {kind: aurora}
"""

#: (id, model, cluster, planner request): the zoo builds the tests generate, and a U280 and an
#: Aurora cluster (HBM banks, Aurora kernels)
SMALL_RESNET = str(Path(__file__).resolve().parent.parent / "examples" / "models" / "small-resnet.yaml")
BUILDS = [
    ("tiny-cnn", "tiny-cnn", "4xU250-ring", "0-3,4-6,7-9"),
    ("tiny-cnn-replicas", "tiny-cnn", "4xU250-ring", "0-4x2,5-9x2"),
    ("tiny-mlp", "tiny-mlp", "4xU250-ring", "0-1,2-3,4-6"),
    # cuts across both residual blocks: two tensors cross each cut (two channels a port)
    ("small-resnet", SMALL_RESNET, "4xU250-ring", "0-5,6-12,13-20"),
    ("tiny-cnn-u280", "tiny-cnn", "8xU280-ring", "0-3,4-6,7-9"),
    ("tiny-mlp-aurora", "tiny-mlp", AURORA_CLUSTER, "0-1,2-3,4-6"),
    # U250, U280 and a VCU118 (no Vitis platform: no cfg, its channels end at the U280's port)
    ("tiny-cnn-hetero", "tiny-cnn", "hetero-mix", "0-1,2-3,4-5,6-7,8-9"),
    # U200: four DDR banks over three SLRs (two in SLR1)
    ("tiny-cnn-u200", "tiny-cnn", "name: 3xU200\ntopology: chain\nboards: [{type: U200, count: 3}]\n", "0-3,4-6,7-9"),
]


@lru_cache(maxsize=None)
def build(key: str):
    from bapipe.planner.cli_plan import parse_partition
    spec = {b[0]: b for b in BUILDS + [("vgg16", "vgg16", "4xU250-ring", None)]}[key]
    _id, model_name, cname, part = spec
    cluster = parse_cluster(loads(cname, "cluster.yaml"), "cluster.yaml") if "\n" in cname else load_cluster(cname)
    req = {"schedule": "interleaved"} if part is None else \
        {"partition": parse_partition(part, len(load_model(model_name).layers))}
    plan, model = _plan(model_name, cluster, **req)
    ctx, files = render(plan, model, cluster)
    return plan, model, cluster, ctx, files


# --- the cfg parser --------------------------------------------------------------------------


def parse_cfg(text: str) -> dict:
    """A v++ config: platform, and per [connectivity] key its values in order."""
    out = {"platform": None, "nk": [], "sp": [], "slr": [], "stream_connect": [], "connect": [], "other": []}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section is None and key == "platform":
            out["platform"] = value
        elif section == "[connectivity]" and key in out:
            out[key].append(value)
        else:
            out["other"].append(line)
    return out


def _train_kernel_names(s, last: int) -> list[str]:
    from bapipe.codegen.design.context import _train_kernel_names as names

    return names(s, last)


def check_cfg(text: str, board, ctx_board, sources: dict[str, str]) -> dict:
    """Assert the config is consistent; returns its parsed form with the instance table."""
    cfg = parse_cfg(text)
    assert cfg["platform"] == ctx_board.platform and cfg["other"] == []
    inst_kernel = {}
    for line in cfg["nk"]:
        kernel, count, insts = line.split(":")
        names = insts.split(".")
        assert int(count) == len(names), line
        for n in names:
            assert n not in inst_kernel, f"instance {n} declared twice"
            inst_kernel[n] = kernel
    # slr: declared instances, existing SLRs, once each
    pinned = {}
    for line in cfg["slr"]:
        inst, slr = line.split(":")
        assert inst in inst_kernel, line
        assert re.fullmatch(r"SLR\d+", slr) and int(slr[3:]) < len(board.slrs), line
        assert inst not in pinned
        pinned[inst] = int(slr[3:])
    # sp: declared instances, banks on the board (ranges too), one bank per bundle
    bank_of_bundle = {}
    for line in cfg["sp"]:
        ep, bank = line.rsplit(":", 1)
        inst, arg = ep.split(".")
        assert inst in inst_kernel, line
        m = re.fullmatch(r"(DDR|HBM)\[(\d+)(?::(\d+))?\]", bank)
        assert m, line
        lo, hi = int(m.group(2)), int(m.group(3) or m.group(2))
        assert lo <= hi and all(board.bank(f"{m.group(1)}[{k}]") is not None for k in range(lo, hi + 1)), line
        kernel = inst_kernel[inst]
        bundles = declared_bundles(sources.get(kernel, ""))
        assert arg in bundles, f"{line}: {kernel} declares no m_axi argument {arg}"
        key = (inst, bundles[arg])
        assert bank_of_bundle.setdefault(key, bank) == bank, f"{line}: bundle {key} is on {bank_of_bundle[key]}"
    # stream_connect: declared instances, each port driven / read once
    outs, ins = set(), set()
    for line in cfg["stream_connect"]:
        src, dst = line.split(":")
        for ep in (src, dst):
            inst, port = ep.split(".")
            assert inst in inst_kernel, f"{line}: {inst} has no nk line"
            assert port, line
        assert src not in outs and dst not in ins, f"{line}: port connected twice"
        outs.add(src)
        ins.add(dst)
    # connect (GT / clocks): one side an instance pin, the other the shell's interface
    gt_names = set()
    for q in range(board.network_ports):
        if board.name in nn.PLATFORM_GT:
            gt_names.update(nn.platform_gt(board.name, q))
    for line in cfg["connect"]:
        a, b = line.split(":")
        pins = [x for x in (a, b) if x.split("/")[0] in inst_kernel]
        shell = [x for x in (a, b) if x in gt_names]
        assert len(pins) == 1 and len(shell) == 1, line
    return {"cfg": cfg, "inst_kernel": inst_kernel, "pinned": pinned, "outs": outs, "ins": ins}


def check_build(ctx, files, cluster):
    boards = {cb.name: cb.board for cb in cluster.boards}
    sources = {}
    for s in ctx.stages:
        sources[s.name] = files[f"{s.name}/{s.name}.cpp"].decode()
        if s.bwd is not None:
            sources[s.bwd.name] = files[f"{s.name}/{s.bwd.name}.cpp"].decode()
        for k in _train_kernel_names(s, max(x.index for x in ctx.stages)):   # update, all-reduce, loss
            sources[k] = files[f"{s.name}/{k}.cpp"].decode()
    for m in ("mm2s", "s2mm"):
        sources[m] = files[f"common/{m}.cpp"].decode()
    pl = json.loads(files["placement.json"])
    parsed = {}
    for b in ctx.boards:
        if b.platform is None:
            continue
        text = files[f"link/{b.name}.cfg"].decode()
        p = check_cfg(text, boards[b.name], b, sources)
        parsed[b.name] = p
        units = {u["instance"]: u for u in pl["boards"][b.name]["units"]}
        # every instance has a placement; pinned ones carry the placement's SLR
        assert set(units) == set(p["inst_kernel"])
        for inst, u in units.items():
            assert p["pinned"].get(inst) == u["slr"]
        # every stage kernel's AXI4-Stream port is connected exactly once
        for s in ctx.stages:
            if b.name not in s.boards:
                continue
            for q in s.inputs:
                assert f"{s.name}_1.{q.name}" in p["ins"]
            for q in s.outputs:
                assert f"{s.name}_1.{q.name}" in p["outs"]
            if s.bwd is not None:
                for q in s.bwd.out_ports:
                    assert f"{s.bwd.name}_1.{q.name}" in p["outs"]
        # network glue: each QSFP28 port in use has its stack's kernels wired both ways
        for port in pl["boards"][b.name]["network"]:
            q, frm = port["qsfp"], nn.net_instance(port["qsfp"])
            assert p["inst_kernel"][frm] == nn.net_board_kernel(b.name, q) == port["kernel"]
            assert port["shape"] == nn.net_kernel(port["tx"], port["rx"])
            assert port["tx"] + port["rx"] <= nn.MAX_CHANNELS
            if port["stack"] == nn.VNX:
                nl = nn.vnx_netlayer_instance(q)
                assert f"{frm}.{nn.NET_LINE_OUT}" in p["outs"] and f"{nl}.{nn.VNX_FROM_APP}" in p["ins"]
                assert f"{nn.cmac_kernel(q)}.{nn.CMAC_RX}" in p["outs"]
            else:
                assert f"{nn.aurora_kernel(q)}.{nn.AURORA_RX}" in p["outs"]
            for k in range(port["tx"]):
                assert f"{frm}.{nn.net_tx_port(k)}" in p["ins"]
            for k in range(port["rx"]):
                assert f"{frm}.{nn.net_rx_port(k)}" in p["outs"]
    # channels: the same stream leaves one board's socket and arrives on the peer's
    for c in pl["channels"]:   # (a board without a Vitis platform, e.g. VCU118, has no cfg)
        src, dst = c["src"], c["dst"]
        if src["board"] in parsed:
            assert f"{src['kernel']}_1.{src['port']}" in parsed[src["board"]]["outs"]
            tx = f"{src['kernel']}_1.{src['port']}:{nn.net_instance(src['qsfp'])}.{nn.net_tx_port(src['socket'])}"
            assert tx in parsed[src["board"]]["cfg"]["stream_connect"]
        if dst["board"] in parsed:
            assert f"{dst['kernel']}_1.{dst['port']}" in parsed[dst["board"]]["ins"]
            nports = {p["qsfp"]: p for p in pl["boards"][dst["board"]]["network"]}
            rx = (f"{nn.net_instance(dst['qsfp'])}.{nn.net_rx_port(dst['socket'] - nports[dst['qsfp']]['tx'])}:"
                  f"{dst['kernel']}_1.{dst['port']}")
            assert rx in parsed[dst["board"]]["cfg"]["stream_connect"]
    sockets = [(c[e]["board"], c[e]["qsfp"], c[e]["socket"]) for c in pl["channels"] for e in ("src", "dst")]
    assert len(sockets) == len(set(sockets))
    return pl, parsed


# --- the Makefile and the packaged kernels behind every cfg ----------------------------------

#: kernels a link config may name that the build does not generate: the network stack below our
#: framing kernels (docs/network.md "What the user brings"), by kernel-name pattern -> the
#: Makefile variable of the folder they come from
EXTERNAL = {r"networklayer": "VNX", r"cmac_\d+": "VNX", r"aurora_\d+": "AURORA"}
DOCS = Path(__file__).resolve().parent.parent / "docs" / "network.md"


def parse_makefile(text: str) -> dict:
    """Variables and rules (target -> prerequisites, recipe lines) of a generated Makefile."""
    rules, variables, last = {}, {}, None
    for raw in text.splitlines():
        if raw.startswith("\t"):
            assert last is not None, raw
            for t in last:
                rules[t]["recipe"].append(raw[1:])
            continue
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z_]+)\s*(\?=|:=|=)\s*(.*)", line)
        if m:
            variables[m.group(1)] = m.group(3)
            last = None
            continue
        targets, _, deps = line.partition(":")
        assert _, raw
        last = targets.split()
        for t in last:
            assert t not in rules, f"rule for {t} twice"
            rules[t] = {"deps": deps.split(), "recipe": []}
    return {"vars": variables, "rules": rules}


def verilog_ports(text: str, module: str) -> dict[str, tuple[str, int]]:
    """name -> (input | output, width) of ``module``'s port list (ANSI style, as generated)."""
    m = re.search(rf"^module {module} \((.*?)\n\);", text, re.S | re.M)
    assert m, f"no module {module}"
    out = {}
    for d, msb, name in re.findall(r"^\s*(input|output)\s+wire\s*(?:\[(\d+):0\])?\s*(\w+)", m.group(1), re.M):
        out[name] = (d, int(msb) + 1 if msb else 1)
    return out


def check_kernel_files(files: dict[str, str], d: str, name: str) -> dict:
    """A packaged RTL kernel under folder ``d``: kernel.xml against the Verilog top's ports (both
    parsed), the package_xo script against both, every source present. Returns kernel.xml's
    stream ports (name -> {mode, width}) and its argument names."""
    import xml.etree.ElementTree as ET
    k = ET.fromstring(files[f"{d}/kernel.xml"]).find("kernel")
    assert k.get("name") == name
    control = k.get("hwControlProtocol")
    assert control in ("ap_ctrl_hs", "ap_ctrl_none")
    xml_ports = {p.get("name"): p.attrib for p in k.find("ports")}
    v = verilog_ports(files[f"{d}/{name}.v"], name)
    assert v.pop("ap_clk") == ("input", 1) and v.pop("ap_rst_n") == ("input", 1)
    hs = control == "ap_ctrl_hs"
    assert ("s_axi_control" in xml_ports) == hs and (k.get("interrupt") == "true") == hs
    if hs:
        assert xml_ports["s_axi_control"]["portType"] == "addressable"
        assert v.pop("interrupt") == ("output", 1)
        axil = [n for n in v if n.startswith("s_axi_control_")]
        assert {n.split("_")[-1] for n in axil} >= {"awaddr", "awvalid", "awready", "wdata", "wstrb", "wvalid",
                                                   "wready", "bresp", "bvalid", "bready", "araddr", "arvalid",
                                                   "arready", "rdata", "rresp", "rvalid", "rready"}
        for n in axil:
            v.pop(n)
    streams = {}
    for pname, p in xml_ports.items():
        if p["portType"] != "stream":
            continue
        w = int(p["dataWidth"])
        into = p["mode"] == "read_only"
        assert p["mode"] in ("read_only", "write_only")
        i, o = ("input", "output") if into else ("output", "input")
        assert v.pop(f"{pname}_tdata") == (i, w), pname
        assert v.pop(f"{pname}_tvalid") == (i, 1) and v.pop(f"{pname}_tready") == (o, 1), pname
        for side, bits in (("tkeep", w // 8), ("tdest", nn.DEST_BITS), ("tlast", 1)):
            if f"{pname}_{side}" in v:
                assert v.pop(f"{pname}_{side}") == (i, bits), (pname, side)
        streams[pname] = {"mode": p["mode"], "width": w}
    assert not v, f"{name}: Verilog ports outside every kernel.xml interface: {sorted(v)}"
    args = sorted(k.find("args"), key=lambda a: int(a.get("id")))
    assert [int(a.get("id")) for a in args] == list(range(len(args)))
    assert all(a.get("port") in xml_ports for a in args)
    assert {a.get("port") for a in args} >= set(streams)
    tcl = files[f"{d}/package_xo.tcl"]
    src = json.loads(files[f"{d}/sources.json"])
    assert src["top"] == name and f"set_property top {name} " in tcl and f"-kernel_name {name} " in tcl
    assert f"vitis_drc {{ctrl_protocol {control}}}" in tcl and "-kernel_xml ./kernel.xml" in tcl
    assert ("-busif s_axi_control -clock ap_clk" in tcl) == hs
    for pname in streams:
        assert f"ipx::associate_bus_interfaces -busif {pname} -clock ap_clk $core" in tcl
    for f in src["sources"]:
        norm = "/".join(_norm(f"{d}/{f}".split("/")))
        assert norm in files, f"{name}: source {f} is not in the build"
        assert f"    {f} \\" in tcl
    return {"streams": streams, "args": [a.get("name") for a in args], "control": control}


def _norm(parts: list[str]) -> list[str]:
    out = []
    for p in parts:
        if p == "..":
            out.pop()
        elif p not in (".", ""):
            out.append(p)
    return out


def hls_port_bits(source: str, kernel: str, elem_w: int) -> dict[str, int]:
    """Stream port -> bits a beat, read off an HLS kernel's top function signature."""
    from bapipe.fpga_models.allreduce import WORD_BITS

    m = re.search(rf"^void {kernel}\((.*?)\) {{", source, re.S | re.M)
    assert m, kernel
    out = {}
    for typ, name in re.findall(r"hls::stream<([^&]*?)\s*>\s*&(\w+)", m.group(1)):
        lanes = re.fullmatch(r"bapipe::b?vec<(\d+)>\s*", typ)
        # bapipe::ring_t: the all-reduce's word (fpga_models.allreduce.WORD_BITS, bapipe_update.h)
        out[name] = WORD_BITS if typ.strip() == "bapipe::ring_t" else (int(lanes.group(1)) if lanes else 1) * elem_w
    return out


def check_makefile(ctx, files, parsed: dict) -> dict:
    """Every kernel an nk line declares has its .xo among the board's link prerequisites, and that
    .xo is built by a rule of the Makefile or is a documented external kernel (with the rule that
    says where it comes from); every packaged kernel's rule takes generated files only."""
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in files.items()}
    mk = parse_makefile(text["Makefile"])
    rules, docs = mk["rules"], DOCS.read_text(encoding="utf-8")
    section = docs.split("### What the user brings", 1)[1].split("\n## ", 1)[0]
    built, externals = set(), set()
    for b in ctx.boards:
        if b.platform is None:
            continue
        rule = rules[b.xclbin]
        assert any(f"--config link/{b.name}.cfg" in r and "-o $@ $^" in r for r in rule["recipe"]), rule
        xo = {Path(dep).name.removesuffix(".xo"): dep for dep in rule["deps"]}
        assert len(xo) == len(rule["deps"]) and all(d.endswith(".xo") for d in rule["deps"]), rule["deps"]
        declared = {line.split(":")[0] for line in parsed[b.name]["cfg"]["nk"]}
        assert set(xo) == declared, f"{b.name}: links {sorted(xo)}, its cfg declares {sorted(declared)}"
        for kernel, dep in xo.items():
            if dep in rules:                       # built here: from generated files only
                assert rules[dep]["recipe"], dep
                for pre in rules[dep]["deps"]:
                    assert pre in text, f"{dep} needs {pre}, which gen does not write"
                built.add(dep)
                continue
            var = next((v for pat, v in EXTERNAL.items() if re.fullmatch(pat, kernel)), None)
            assert var is not None, f"{b.name}: {dep} is neither built nor a known external kernel"
            assert dep.startswith(f"$({var})/") and var in mk["vars"], dep
            missing = rules[f"$({var})/%.xo"]["recipe"]
            assert any("exit 2" in r and "docs/network.md" in r for r in missing)
            assert f"`{re.sub(r'_[0-9]+$', '', kernel)}" in section, f"{kernel}: not in docs/network.md"
            if var == "VNX":   # its IP repositories go to the link, as XUP VNx's own Makefile passes them
                assert any("--user_ip_repo_paths $(VNX)/Ethernet/cmac" in r and
                           "--user_ip_repo_paths $(VNX)/NetLayers/100G-fpga-network-stack-core/synthesis_results_"
                           in r for r in rule["recipe"])
            externals.add(kernel)
    # every framing kernel packaged is linked (by its board alone)
    for t, r in rules.items():
        if t.startswith("net/") and t.endswith(".xo"):
            assert t in built, f"{t} is packaged but no board links it"
    return {"built": built, "externals": externals, "rules": rules}


def check_net_kernels(ctx, files, parsed: dict, bits: dict | None = None) -> int:
    """Every framing kernel a cfg declares: its files are consistent (check_kernel_files), every
    stream_connect names one of its kernel.xml arguments, and a stage stream meets a port of the
    stage port's width (``bits``: kernel -> port -> bits; by default read off the HLS kernels'
    C++ signatures). Returns the number of framing kernels checked."""
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in files.items()}
    if bits is None:
        ew, bits = ctx.fmt.width, {}
        for s in ctx.stages:
            bits[s.name] = hls_port_bits(text[f"{s.name}/{s.name}.cpp"], s.name, ew)
            if s.bwd is not None:
                bits[s.bwd.name] = hls_port_bits(text[f"{s.name}/{s.bwd.name}.cpp"], s.bwd.name, ew)
            for k in _train_kernel_names(s, max(x.index for x in ctx.stages)):   # update, all-reduce, loss
                bits[k] = hls_port_bits(text[f"{s.name}/{k}.cpp"], k, ew)
    n = 0
    for b, p in parsed.items():
        info = {}
        for inst, kernel in p["inst_kernel"].items():
            if kernel.startswith("bapipe_net_"):
                info[inst] = check_kernel_files(text, f"net/{kernel}", kernel)
                n += 1
        for line in p["cfg"]["stream_connect"]:
            src, dst = (ep.split(".") for ep in line.split(":"))
            for (inst, arg), (oinst, oarg), mode in ((src, dst, "write_only"), (dst, src, "read_only")):
                if inst not in info:
                    continue
                assert arg in info[inst]["args"], f"{line}: {arg} is no argument of {p['inst_kernel'][inst]}"
                port = info[inst]["streams"][arg]
                assert port["mode"] == mode, line
                other = p["inst_kernel"][oinst]
                if other in bits:
                    assert port["width"] == bits[other][oarg], f"{line}: {port['width']} vs {bits[other][oarg]} bits"
                elif other not in {k for k in p["inst_kernel"].values() if k.startswith("bapipe_net_")}:
                    assert port["width"] == nn.LINE_BITS, line   # the network stack's 512-bit side
    return n


@pytest.mark.xdist_group("placement_builds")  # one worker renders each build once
@pytest.mark.slow  # each build: a planner run and an in-memory render (~1 s)
@pytest.mark.parametrize("key", [b[0] for b in BUILDS])
def test_link_configs_consistent(key):
    plan, model, cluster, ctx, files = build(key)
    pl, parsed = check_build(ctx, files, cluster)
    mk = check_makefile(ctx, files, parsed)
    ports = sum(len(pl["boards"][b]["network"]) for b in parsed)
    assert check_net_kernels(ctx, files, parsed) == ports == len([t for t in mk["built"] if t.startswith("net/")])
    if len({b for s in ctx.stages for b in s.boards}) > 1:
        assert pl["channels"], "a multi-board build has network channels"
    if key == "tiny-cnn-u280":
        banks = [l.rsplit(":", 1)[1] for p in parsed.values() for l in p["cfg"]["sp"]]
        assert banks and all(b.startswith("HBM[") for b in banks)
        # the backward kernels (stashes and gradients in HBM) sit in SLR0, next to the HBM
        assert all(p["pinned"][f"{s.bwd.name}_1"] == 0 for s in ctx.stages for b, p in parsed.items()
                   if b in s.boards)
    if key == "tiny-mlp-aurora":
        assert {c["stack"] for c in pl["channels"]} == {nn.AURORA}
        assert all(nn.VNX_NETLAYER not in p["inst_kernel"].values() for p in parsed.values())


@pytest.mark.xdist_group("placement_builds")  # one worker renders each build once
@pytest.mark.soak  # the planner's VGG-16 plan rendered in memory: ~25 s (build_project lowers and banks
# 138 M weights; shared with test_onchip_bytes): make test-all
def test_link_configs_consistent_vgg16():
    plan, model, cluster, ctx, files = build("vgg16")
    pl, parsed = check_build(ctx, files, cluster)
    check_makefile(ctx, files, parsed)
    check_net_kernels(ctx, files, parsed)
    # the interleaved plan puts two stages (four kernels) on each board; the planner folds each
    # stage within 1/6 of the capped 9,216 DSP (fpga_models.allocate.engine_share: 2 stages x
    # forward + input-gradient + weight-gradient arrays): 1,536 DSP forward, 3,072 backward per
    # stage, 9,216 per board (before the rule: 4 x 9,216 = 36,864 DSP of 11,520)
    for b in pl["boards"].values():
        arrays = [u for u in b["units"] if re.fullmatch(r"stage\d+(_bwd)?", u["kernel"])]
        need = sorted(u["need"]["dsp"] for u in arrays)
        assert need == [1_536, 1_536, 3_072, 3_072]
        # the update, all-reduce and loss kernels take no DSP: their products are bound to fabric
        # (bapipe_update.h sgd_step, loss.cpp BIND_OP impl=fabric)
        assert all(u["need"]["dsp"] == 0 for u in b["units"] if u["kernel"].startswith("stage") and u not in arrays)
        assert sum(need) <= 11_520 * plan.utilisation_cap
    # on-chip memory fits too since the frame buffers beyond a kernel's share go off chip
    # (fpga_models.allocate.frames_offchip; fpga0/fpga1 needed 69,150,078 bytes of 57,802,752
    # at 881e875): every board placed whole, gen no longer warns (it would refuse)
    assert all(b["oversubscribed"] is None for b in pl["boards"].values())
    for b in pl["boards"].values():
        assert sum(u["need"]["onchip_bytes"] for u in b["units"]) <= 57_802_752
    assert placement_warnings(pl) == []


# --- the placement pass on its own -------------------------------------------------------------


def test_units_spread_over_slrs_and_span_when_too_big():
    u250 = get_board("U250")
    units = [(f"k{i}", Need(2_000, 0, 0, 100_000)) for i in range(4)]
    placed = place_units(u250, units, {})
    assert sorted(placed[f"k{i}"]["slr"] for i in range(4)) == [0, 1, 2, 3]   # 2,000 + 2,000 > 2,880
    # 9,216 DSP (a VGG stage's budget) fits no SLR of 2,880: it spans four adjacent ones
    big = place_units(u250, [("big", Need(9_216, 0, 0, 0))], {})["big"]
    assert big["slr"] is None and big["spans"] == [0, 1, 2, 3]
    # 6,000 DSP: three SLRs (2,880 x 2 = 5,760 < 6,000)
    assert place_units(u250, [("m", Need(6_000, 0, 0, 0))], {})["m"]["spans"] == [0, 1, 2]
    over = place_units(u250, [("a", Need(9_216, 0, 0, 0)), ("b", Need(9_216, 0, 0, 0))], {})
    assert over["a"]["spans"] == [0, 1, 2, 3] and over["b"].get("unplaced")
    # a unit near its HBM (SLR0 of a U280) goes there even though SLR1 and SLR2 have more DSP
    u280 = get_board("U280")
    assert place_units(u280, [("h", Need(100, 0, 0, 0)), ("f", Need(100, 0, 0, 0))], {}, {"h": 0}) \
        == {"f": {"slr": 1, "spans": [1], "need": Need(100, 0, 0, 0).to_dict()},
            "h": {"slr": 0, "spans": [0], "need": Need(100, 0, 0, 0).to_dict()}}
    # on-chip bytes: whole URAMs for the bulk, BRAM36 for the rest (36,864 + 2 x 4,608 >= 40,000)
    one = place_units(u250, [("x", Need(0, 0, 0, 40_000))], {})["x"]
    assert (one["need"]["uram"], one["need"]["bram36"]) == (1, 1)


def test_banks_by_bundle_and_board():
    u250, u280 = get_board("U250"), get_board("U280")
    ports = [("k_1", "a", 100), ("k_1", "b", 100), ("k_1", "c", 10), ("k_1", "d", 10)]
    by_bytes = assign_banks(u250, ports, {"k_1": 0})
    assert [p["bank"] for p in by_bytes] == ["DDR[0]", "DDR[1]", "DDR[2]", "DDR[3]"]
    shared = assign_banks(u250, ports, {"k_1": 0}, {("k_1", "c"): "g", ("k_1", "d"): "g"})
    assert shared[2]["bank"] == shared[3]["bank"] and shared[2]["bundle"] == "g"
    hbm = assign_banks(u280, [("k_1", "w", 300 * 2**20), ("k_1", "v", 1)], {"k_1": 1})
    assert [p["bank"] for p in hbm] == ["HBM[0:1]", "HBM[2]"]   # 300 MiB > one 256 MiB pseudo-channel
    text = ("#pragma HLS INTERFACE mode=m_axi port=w offset=slave bundle=gmem_w depth=4\n"
            "#pragma HLS INTERFACE m_axi port=v offset=slave\n#pragma HLS INTERFACE mode=axis port=in0\n")
    assert declared_bundles(text) == {"w": "gmem_w", "v": "gmem"}


def test_stage_bigger_than_its_board_is_refused(tmp_path, capsys):
    """A folding whose MVU needs more DSP than the board has: gen refuses it in one line, exit 2,
    and writes nothing."""
    from bapipe.cli import main
    from handplan import make_plan
    path = tmp_path / "wide.yaml"
    path.write_text("name: wide\ninput: [1024]\nlayers:\n  - {name: fc1, type: dense, units: 1024}\n"
                    "  - {name: fc2, type: dense, units: 10}\n")
    # 64 x 256 = 16,384 MACs a cycle: 16,384 DSP48E2 at 16 bits, a U250 has 11,520 usable
    plan, model, cluster = make_plan(str(path), "4xU250-ring", cuts=(0,), mode="inference",
                                     folding={"fc1": (64, 256)})
    with pytest.raises(SpecError) as e:
        render(plan, model, cluster)
    msg = str(e.value)
    assert "\n" not in msg and "stages[0].folding" in msg and "16,384 DSP" in msg and "11,520 usable" in msg
    plan.save(str(tmp_path / "wide_plan.yaml"))
    capsys.readouterr()
    assert main(["gen", str(tmp_path / "wide_plan.yaml"), "-o", str(tmp_path / "out"), "--allow-rule-violations"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [f"{tmp_path / 'wide_plan.yaml'}: {msg.split(': ', 1)[1]}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # two in-memory renders of tiny-mlp (~1 s)
def test_link_configs_and_placement_are_deterministic():
    from bapipe.planner.cli_plan import parse_partition
    cluster = load_cluster("4xU250-ring")
    plan, model = _plan("tiny-mlp", cluster, partition=parse_partition("0-1,2-3,4-6", 7))
    a = render(plan, model, cluster)[1]
    b = render(plan, model, cluster)[1]
    keys = [k for k in a if k.startswith("link/") or k == "placement.json"]
    assert len(keys) == 4 and all(a[k] == b[k] for k in keys)


@pytest.mark.xdist_group("placement_builds")
@pytest.mark.slow  # one planner run and in-memory render (~1 s, shared with the test above)
def test_checks_catch_what_a_link_would_trip_on():
    """The Makefile and kernel checks fail on the mistakes they exist for."""
    plan, model, cluster, ctx, files = build("tiny-mlp")
    pl, parsed = check_build(ctx, files, cluster)
    k = "bapipe_net_fpga1_q0"
    xo = f"net/{k}/{k}.xo"

    def broken(path: str, old: str, new: str) -> dict:
        text = files[path].decode()
        assert old in text, (path, old)
        return {**files, path: text.replace(old, new, 1).encode()}

    cases = [
        # the board forgets to link its framing kernel; the cfg still declares it
        (check_makefile, broken("Makefile", f" {xo} ", " "), "its cfg declares"),
        # the packaging rule needs a file gen does not write
        (check_makefile, broken("Makefile", f"{xo}: net/{k}/{k}.v ", f"{xo}: net/{k}/{k}.sv "), "does not write"),
        # kernel.xml and the Verilog top disagree on a stream's width
        (check_net_kernels, broken(f"net/{k}/kernel.xml", 'dataWidth="512"', 'dataWidth="256"'), "256"),
        # a Verilog port no interface covers
        (check_net_kernels, broken(f"net/{k}/{k}.v", "    input  wire           ap_rst_n,\n",
                                   "    input  wire           ap_rst_n,\n    output wire           busy,\n"),
         "outside every kernel.xml interface"),
    ]
    for check, bad, why in cases:
        with pytest.raises(AssertionError, match=why):
            check(ctx, bad, parsed)


def test_channel_widths_meet_at_their_common_divisor():
    """A consumer port taking other lanes a beat than its producer's: the packed word is the
    largest dividing both stage words, cut by the sender and joined by the receiver."""
    from fractions import Fraction
    from bapipe.codegen.package.network import channel_transports
    from bapipe.codegen.design.dataflow import make_link
    link = make_link("a", "b", 1.19e10, 0.5e-6, 3e8, 64)          # 4xU250-ring's links at 300 MHz
    same = channel_transports(link, 8, 8, 16, 96)
    assert same[0] is same[1] and same[0].data_w == same[0].stage_w == 128 and same[0].sample_words == 12
    tx, rx = channel_transports(link, 8, 12, 16, 96)             # 128-bit words in, 192-bit words out
    assert (tx.stage_w, tx.data_w, rx.stage_w, rx.data_w) == (128, 64, 192, 64)
    assert tx.sample_words == rx.sample_words == 96 * 16 // 64 and tx.words == rx.words == 480 // 64
    assert (tx.window, tx.timeout) == (rx.window, rx.timeout) == (196, 344)   # docs/network.md's example
    assert Fraction(tx.bw_num, tx.bw_den) == Fraction(119, 3)
    tx, rx = channel_transports(link, 2, 1, 16, 512)             # small-resnet / tiny-cnn backward: 32 -> 16 bits
    assert (tx.data_w, rx.stage_w, tx.slices) == (16, 16, 2)
    with pytest.raises(SpecError, match="whole beats"):
        channel_transports(link, 8, 12, 16, 100)
