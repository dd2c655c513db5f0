"""Board-ready network kernels: every framing/credit kernel a link config names, packaged as a
Vitis RTL kernel, and the external network kernels (XUP VNx, Aurora) each board's link needs.

The placement pass (``codegen.design.placement.network``) gives each QSFP28 port in use its channels
(socket k < T: outgoing, T + j: incoming) and the kernel name ``netnames.net_board_kernel``.
Here each port's kernel is sized from its channels: the stage port's width at the kernel's
edge (HLS: the Design's lanes, ``StageCtx.port_lanes``; RTL kernels: one element a beat; the
backward kernels' ``BPort.lanes``), its words per sample, and the link's line rate and
latency at the cluster's clock (``codegen.design.dataflow.make_link``, the sizing of
``codegen.design.links.transport``, as rtlsim's transport is sized). Files, per kernel under
``net/<kernel>/``: the Vitis top (``kernel_net.v.j2``: ap_clk, ap_rst_n, AXI4-Stream only,
ap_ctrl_none), the core (``codegen.rtl.net_port.render_net_port`` renamed ``<kernel>_core``), kernel.xml,
package_xo.tcl and sources.json; the transport modules they share under ``net/common/``.

External kernels (not generated; docs/network.md "What the user brings"): XUP VNx's
``networklayer`` and ``cmac_<i>`` .xo files and IP repositories, as its top Makefile builds and
links them (github.com/Xilinx/xup_vitis_network_example, Makefile: ``NetLayers/_x.<xsa>/
networklayer.xo``, ``Ethernet/_x.<xsa>/cmac_<i>.xo``, ``--user_ip_repo_paths Ethernet/cmac``
and ``NetLayers/100G-fpga-network-stack-core/synthesis_results_{HMB,noHMB}``), and the Aurora
64B/66B kernel of AMD's Vitis-Tutorials 08-alveo_aurora_kernel packaged as ``aurora_<q>``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from bapipe.errors import SpecError

from bapipe.codegen.design import netnames as nn
from bapipe.codegen.design.links import TransportSpec

NET_DIR = "net"
COMMON = f"{NET_DIR}/common"
#: the transport modules a framing core instantiates (net_port -> net_send / net_recv -> ...)
MODULES = ("axis_width_conv", "net_pack", "net_tx", "net_send", "net_rx", "net_unpack", "net_recv")
VENDOR = "bapipe.org"

#: Makefile variables naming where the user's external kernels live (docs/network.md)
VNX_VAR = "VNX"
AURORA_VAR = "AURORA"
#: XUP VNx's network-layer IP repository per board type (its Makefile: u250 -> noHMB, u280/u50 ->
#: HMB; U55C is an HBM board like the U280 [verify against the VNx release used])
VNX_HLS_REPO = {"U250": "noHMB", "U200": "noHMB", "U280": "HMB", "U55C": "HMB", "U50": "HMB"}


@dataclass(frozen=True)
class NetChannel:
    """One stage stream through a framing kernel: its socket and what it carries."""

    socket: int
    what: str                  # "<board>:<kernel>.<port> -> <board>:<kernel>.<port>"
    spec: TransportSpec


@dataclass(frozen=True)
class NetKernel:
    """One packaged framing kernel (one board's QSFP28 port)."""

    name: str
    board: str
    board_type: str
    qsfp: int
    stack: str
    towards: str
    tx: tuple[NetChannel, ...]
    rx: tuple[NetChannel, ...]

    @property
    def shape(self) -> str:
        return nn.net_kernel(len(self.tx), len(self.rx))

    @property
    def dir(self) -> str:
        return f"{NET_DIR}/{self.name}"

    @property
    def xo(self) -> str:
        """The .xo the Makefile builds and links (Makefile-relative)."""
        return f"{self.dir}/{self.name}.xo"

    @property
    def ports(self) -> list[dict]:
        """kernel.xml's stream ports, in argument order (XRT's indices): stage channels out of
        the board, into it, then the line to and from the network stack."""
        return ([{"port": nn.net_tx_port(k), "mode": "read_only", "width": c.spec.stage_w, "line": False}
                 for k, c in enumerate(self.tx)]
                + [{"port": nn.net_rx_port(j), "mode": "write_only", "width": c.spec.stage_w, "line": False}
                   for j, c in enumerate(self.rx)]
                + [{"port": nn.NET_LINE_OUT, "mode": "write_only", "width": nn.LINE_BITS, "line": True},
                   {"port": nn.NET_LINE_IN, "mode": "read_only", "width": nn.LINE_BITS, "line": True}])

    @property
    def args(self) -> list[dict]:
        """kernel.xml's arguments: one per stream port, named as the port (the link configs'
        stream_connect names these)."""
        out = []
        for i, p in enumerate(self.ports):
            t = (f"stream&lt;ap_axiu&lt;{nn.LINE_BITS}, 0, 0, {nn.DEST_BITS}&gt;&gt;&amp;" if p["line"]
                 else f"stream&lt;ap_uint&lt;{p['width']}&gt;&gt;&amp;")
            out.append({"name": p["port"], "qualifier": 4, "id": i, "port": p["port"], "size": "0x0",
                        "offset": "0x0", "type": t})
        return out


def port_lanes(ctx, kernel: str, port: str, engines: str) -> int:
    """Elements per beat on a stage kernel's stream port as the packaged kernel streams it."""
    for s in ctx.stages:
        if s.name == kernel:
            p = next(q for q in s.inputs + s.outputs if q.name == port)
            return 1 if engines == "rtl" else s.port_lanes(p)
        if s.bwd is not None and s.bwd.name == kernel:
            return next(q for q in s.bwd.in_ports + s.bwd.out_ports if q.name == port).lanes
        u = getattr(s, "update", None)
        if u is not None and u.replicas > 1 and u.allreduce_name == kernel and port in ("ring_in", "ring_out"):
            return u.ring_lanes(ctx.fmt.width)   # one 64-bit sum a beat (codegen.design.train_kernels)
    raise KeyError(f"{kernel}.{port}: no such stage kernel port")


def channel_spec(ctx, cluster, c: dict, engines: str, clock_hz: float) -> tuple[TransportSpec, TransportSpec]:
    """The transport of placement channel ``c`` (design.json ``placement.channels``) as the sending
    and the receiving kernel see it (``channel_transports``), from the two stage ports' lanes
    and the link between the two boards at ``clock_hz``."""
    from bapipe.codegen.design.dataflow import make_link

    src, dst = c["src"], c["dst"]
    lanes = port_lanes(ctx, src["kernel"], src["port"], engines)
    lanes_in = port_lanes(ctx, dst["kernel"], dst["port"], engines)
    a, b = src["board"], dst["board"]
    link = make_link(a, b, cluster.path_bandwidth(a, b), cluster.path_latency(a, b), clock_hz,
                     nn.LINE_BITS // 8)
    what = f"{src['board']}:{src['kernel']}.{src['port']} -> {dst['board']}:{dst['kernel']}.{dst['port']}"
    return channel_transports(link, lanes, lanes_in, ctx.fmt.width, c["elements"], what)


def channel_transports(link, lanes_out: int, lanes_in: int, elem_w: int, elements: int,
                       what: str = "channel") -> tuple[TransportSpec, TransportSpec]:
    """(sending end, receiving end) of a channel carrying ``elements`` per sample from a port of
    ``lanes_out`` elements a beat to one of ``lanes_in``: one sizing for both ends (the sender's
    credits are the receiver's buffer). Equal lanes: the forward rtlsim's transport
    (``rtl_link.transport``). Otherwise the packed word is the largest that divides both stage
    words (net_send cuts the producer's words into it, net_recv joins them into the consumer's),
    so the elements arrive in order at the consumer's width."""
    from bapipe.codegen.design.links import transport

    if elements % lanes_out or elements % lanes_in:
        raise SpecError(None, None, "placement.channels",
                        f"expected {what} to carry whole beats: {elements} elements a sample, "
                        f"{lanes_out} lanes out, {lanes_in} in")
    tx = transport(link, lanes_out, elem_w, elements // lanes_out)
    if lanes_in == lanes_out:
        return tx, tx
    g = math.gcd(tx.data_w, lanes_in * elem_w)
    tx = replace(tx, data_w=g, sample_words=tx.sample_words * (tx.data_w // g))
    return tx, replace(tx, stage_w=lanes_in * elem_w)


def net_kernels(ctx, cluster, placement: dict, engines: str) -> list[NetKernel]:
    """Every framing kernel of the boards with a Vitis platform, in board then port order."""
    if cluster is None:
        return []
    clock = min(cb.board.clock_hz for cb in cluster.boards)   # as rtl_model.build_pipeline's links
    specs = [channel_spec(ctx, cluster, c, engines, clock) for c in placement["channels"]]
    out = []
    for b in ctx.boards:
        if b.platform is None:
            continue
        for port in placement["boards"][b.name]["network"]:
            q = port["qsfp"]

            def ends(end: str) -> list[NetChannel]:
                got = []
                for c, sp in zip(placement["channels"], specs):
                    e = c[end]
                    if e["board"] == b.name and e["qsfp"] == q:
                        s, d = c["src"], c["dst"]
                        got.append(NetChannel(e["socket"], f"{s['board']}:{s['kernel']}.{s['port']} -> "
                                                           f"{d['board']}:{d['kernel']}.{d['port']}",
                                              sp[0] if end == "src" else sp[1]))
                return sorted(got, key=lambda x: x.socket)

            tx, rx = ends("src"), ends("dst")
            assert [c.socket for c in tx + rx] == list(range(len(tx) + len(rx))), (b.name, q)
            out.append(NetKernel(port["kernel"], b.name, placement["boards"][b.name]["board_type"], q,
                                 port["stack"], port["towards"], tuple(tx), tuple(rx)))
    return out


def net_kernel_files(kernels: list[NetKernel], plan_fingerprint: str) -> dict[str, str]:
    """path -> text of every packaged framing kernel and the transport modules they share."""
    from bapipe.codegen.package.kernels import _part
    from bapipe.codegen.rtl.env import GENERATOR_VERSION, render_template
    from bapipe.codegen.rtl.net_port import render_net_port

    if not kernels:
        return {}
    plan_hash = plan_fingerprint[:16]
    files = {f"{COMMON}/{m}.v": render_template(m, plan_hash) for m in MODULES}
    for k in kernels:
        core = f"{k.name}_core"
        _m, files[f"{k.dir}/{core}.v"] = render_net_port([c.spec for c in k.tx], [c.spec for c in k.rx],
                                                         plan_hash, module=core)
        files[f"{k.dir}/{k.name}.v"] = render_template(
            "kernel_net", plan_hash, kernel=k.name, board=k.board, qsfp=k.qsfp, stack=k.stack, towards=k.towards,
            core=core, shape=k.shape,
            tx=[{"k": i, "what": c.what, "stage_w": c.spec.stage_w, "sample_words": c.spec.sample_words}
                for i, c in enumerate(k.tx)],
            rx=[{"j": j, "socket": c.socket, "what": c.what, "stage_w": c.spec.stage_w,
                 "sample_words": c.spec.sample_words} for j, c in enumerate(k.rx)])
        sources = [f"../common/{m}.v" for m in MODULES] + [f"{core}.v", f"{k.name}.v"]
        what = dict(what=f"the framing/credit transport of board {k.board}, QSFP28 port {k.qsfp}",
                    control="ap_ctrl_none")
        env = dict(version=GENERATOR_VERSION, plan_hash=plan_hash, name=k.name, index=k.qsfp)
        ports = [{"port": p["port"], "mode": p["mode"], "width": p["width"]} for p in k.ports]
        files[f"{k.dir}/kernel.xml"] = _render("kernel.xml.j2", vlnv=f"{VENDOR}:kernel:{k.name}:1.0", ports=ports,
                                               args=k.args, **what, **env)
        files[f"{k.dir}/package_xo.tcl"] = _render(
            "package_xo.tcl.j2", part=_part(k.board_type), xo_path=f"./{k.name}.xo", sources=sources, memories=[],
            vendor=VENDOR, ports=ports, registers=[], here=k.dir, plan_fingerprint=plan_fingerprint, **what, **env)
        files[f"{k.dir}/sources.json"] = json.dumps({"kernel": k.name, "top": k.name, "sources": sources,
                                                     "channels": {"tx": [c.what for c in k.tx],
                                                                  "rx": [c.what for c in k.rx]}}, indent=1) + "\n"
    return files


def _render(template: str, **ctx) -> str:
    from bapipe.codegen.rtl.env import rtl_env

    return rtl_env().get_template(template).render(**ctx)


def external_objects(board_type: str, platform: str, network: list[dict]) -> tuple[list[str], list[str]]:
    """(the external .xo files, the --user_ip_repo_paths) a board's v++ link needs, as Makefile
    words (``$(VNX)``, ``$(AURORA)``: folders the user points at)."""
    xsa = platform.rsplit("/", 1)[-1].removesuffix(".xpfm")
    xo, repos = [], []
    vnx = [p for p in network if p["stack"] == nn.VNX]
    if vnx:
        xo.append(f"$({VNX_VAR})/NetLayers/_x.{xsa}/{nn.VNX_NETLAYER}.xo")
        xo += [f"$({VNX_VAR})/Ethernet/_x.{xsa}/{nn.cmac_kernel(p['qsfp'])}.xo" for p in vnx]
        repos += [f"$({VNX_VAR})/Ethernet/cmac",
                  f"$({VNX_VAR})/NetLayers/100G-fpga-network-stack-core/synthesis_results_"
                  f"{VNX_HLS_REPO.get(board_type, 'noHMB')}"]
    xo += [f"$({AURORA_VAR})/{xsa}/{nn.aurora_kernel(p['qsfp'])}.xo" for p in network if p["stack"] == nn.AURORA]
    return xo, repos


def link_objects(ctx, placement: dict, kernels: list[NetKernel]) -> dict[str, dict]:
    """Per board with a platform: the framing kernels' .xo files (built by the Makefile), the
    external ones and the IP repositories its ``v++ -l`` takes."""
    out = {}
    for b in ctx.boards:
        if b.platform is None:
            continue
        pb = placement["boards"][b.name]
        ext, repos = external_objects(pb["board_type"], b.platform, pb["network"])
        out[b.name] = {"net": [k.xo for k in kernels if k.board == b.name], "external": ext, "repos": repos}
    return out


def makefile_context(kernels: list[NetKernel]) -> list[dict]:
    """The Makefile's rule per framing kernel: target, prerequisites, folder."""
    return [{"name": k.name, "xo": k.xo, "dir": k.dir,
             "deps": [f"{k.dir}/{f}" for f in (f"{k.name}.v", f"{k.name}_core.v", "kernel.xml", "package_xo.tcl")]
             + [f"{COMMON}/{m}.v" for m in MODULES]} for k in kernels]


__all__ = ["NetKernel", "net_kernels", "net_kernel_files", "link_objects", "external_objects", "makefile_context"]
