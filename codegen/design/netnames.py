"""Names of the network glue between boards: one home for the kernel, instance and port names
that the v++ link configs (codegen.design.placement, link.cfg.j2), the framing/credit RTL
(hls_templates/rtl/net_*.v.j2) and the packaged kernels share. Change a name here and every
side follows; never spell one of these strings elsewhere.

Per board and QSFP28 port ``p`` (0 or 1; docs/network.md):

    stage kernels --AXIS ch k--> bapipe_net_<p> --512-bit, TDEST=k, TLAST--> networklayer_<p> <--> cmac_<p> <--> GT
                  <--AXIS ch k--                <--                     --                                    (XUP VNx)
    stage kernels --AXIS ch k--> bapipe_net_<p> --512-bit, TDEST=k, TLAST--> aurora_<p> <--> GT               (Aurora)

Our framing/credit kernel (``bapipe_net``) packs each stage stream (channel ``k``) into 512-bit
beats, frames them with sequence numbers and returns credits, so the UDP stack below never
drops a frame for want of room. Channel ``k`` is the XUP VNx socket index carried in TDEST.
"""
from __future__ import annotations


from bapipe.fpga_models.engines import LINK_BEAT_BITS

#: network stacks a cluster's links may use (cluster ``link.kind``: ``aurora`` picks Aurora,
#: anything else between FPGA boards the XUP VNx UDP stack)
VNX = "vnx"
AURORA = "aurora"
STACKS = (VNX, AURORA)

#: AXI4-Stream data width between our framing kernel and the network layer (XUP VNx
#: NetLayers/README.md: 512-bit data, 64-bit keep, 16-bit dest, last)
LINE_BITS = LINK_BEAT_BITS
#: TDEST bits on that stream (XUP VNx: 16-bit dest = socket index)
DEST_BITS = 16
#: UDP sockets of one XUP VNx network layer (its socket table has 16 entries): the most
#: channels one port's framing kernel may carry
MAX_CHANNELS = 16

# --- our framing / credit kernel (RTL: "transport", hls_templates/rtl/net_*.v.j2) ----------


def net_kernel(tx: int, rx: int) -> str:
    """The framing kernel's name for ``tx`` outgoing and ``rx`` incoming stage channels
    (its port list depends on them, so each shape is its own packaged kernel)."""
    return f"bapipe_net_t{tx}r{rx}"


def net_board_kernel(board: str, port: int) -> str:
    """The Vitis kernel packaged for the framing instance of ``board``'s QSFP28 port ``port``
    (codegen.package.network.net_kernels): its stream widths, sample lengths and window sizes are that
    port's channels', so every board port is its own kernel (the RTL module inside is
    ``net_kernel(tx, rx)``'s shape, renamed ``<kernel>_core``)."""
    from bapipe.names import legal   # the one way a board name becomes an identifier

    return f"bapipe_net_{legal(board)}_q{port}"


def net_instance(port: int) -> str:
    """The framing kernel instance driving QSFP28 port ``port`` of a board."""
    return f"bapipe_net_{port}"


def net_tx_port(ch: int) -> str:
    """Framing kernel input from a stage (channel ``ch``, sent with TDEST = ``ch``)."""
    return f"s_axis_tx{ch}"


def net_rx_port(ch: int) -> str:
    """Framing kernel output to a stage (channel ``ch``, received with TDEST = ``ch``)."""
    return f"m_axis_rx{ch}"


#: framing kernel side facing the network stack: 512-bit frames out / in
NET_LINE_OUT = "m_axis_line"
NET_LINE_IN = "s_axis_line"

# --- XUP VNx (github.com/Xilinx/xup_vitis_network_example, config_files/connectivity_*.ini) ----

#: the UDP/IP network layer kernel (NetLayers/) and its streams
VNX_NETLAYER = "networklayer"
VNX_FROM_APP = "S_AXIS_sk2nl"      # application -> network layer (512-bit, TDEST = socket)
VNX_TO_APP = "M_AXIS_nl2sk"        # network layer -> application
VNX_FROM_ETH = "S_AXIS_eth2nl"     # CMAC -> network layer
VNX_TO_ETH = "M_AXIS_nl2eth"       # network layer -> CMAC


def vnx_netlayer_instance(port: int) -> str:
    """Network layer instance of QSFP28 port ``port``."""
    return f"networklayer_{port}"


def cmac_kernel(port: int) -> str:
    """The 100G CMAC kernel of QSFP28 port ``port`` (XUP VNx packages one per interface:
    cmac_0, cmac_1); its instance has the same name."""
    return f"cmac_{port}"


CMAC_RX = "M_AXIS"                 # CMAC -> network layer
CMAC_TX = "S_AXIS"                 # network layer -> CMAC
#: CMAC's free-running clock pin (XUP VNx post_sys_link.tcl connects it)
CMAC_FREERUN = "clk_gt_freerun"


def cmac_gt(port: int) -> str:
    """CMAC kernel's GT serial interface (XUP VNx Ethernet/package_cmac.tcl: gt_serial_port<i>)."""
    return f"gt_serial_port{port}"


def cmac_refclk(port: int) -> str:
    """CMAC kernel's GT reference clock interface (package_cmac.tcl: gt_refclk<i>)."""
    return f"gt_refclk{port}"


# --- Aurora 64B/66B (AMD Vitis-Tutorials 08-alveo_aurora_kernel, PG074) ------------------------


def aurora_kernel(port: int) -> str:
    """The Aurora 64B/66B kernel of QSFP28 port ``port`` (4 lanes, 512-bit user streams);
    its instance has the same name."""
    return f"aurora_{port}"


AURORA_TX = "tx_axis"
AURORA_RX = "rx_axis"
AURORA_GT = "gt_port"
AURORA_REFCLK = "gt_refclk"
AURORA_INIT_CLK = "init_clk"

# --- the platform side of the GT connections (Alveo shells; `platforminfo --verbose`) ---------

#: per board type: (GT quad interface of port p, its reference clock, the free-running clock),
#: as str.format templates of ``p``. U250/U200 gen3x16 shells name the QSFP28 cages
#: io_gt_qsfp_0<p>; U280/U55C gen3x16 shells io_gt_qsfp<p>_00 (XUP VNx post_sys_link.tcl's
#: two platform branches). The free-running clock per platform as VNx's post_sys_link.tcl has
#: it ("U280 -> frc0 (50 MHz), U250 -> frc1 (100 MHz), U50 -> frc2, U55c -> frc2"): U280 the
#: shell's clk_gt_freerun port, U250 ii_level1_wire/ulp_m_aclk_freerun_ref_00, U50/U55C
#: ii_level0_wire/ulp_m_aclk_freerun_ref_00; U200 as U250 (same xdma shell family) [verify].
PLATFORM_GT = {
    "U250": ("io_gt_qsfp_0{p}", "io_clk_qsfp_refclka_0{p}", "ii_level1_wire/ulp_m_aclk_freerun_ref_00"),
    "U200": ("io_gt_qsfp_0{p}", "io_clk_qsfp_refclka_0{p}", "ii_level1_wire/ulp_m_aclk_freerun_ref_00"),
    "U280": ("io_gt_qsfp{p}_00", "io_clk_qsfp{p}_refclka_00", "clk_gt_freerun"),
    "U55C": ("io_gt_qsfp{p}_00", "io_clk_qsfp{p}_refclka_00", "ii_level0_wire/ulp_m_aclk_freerun_ref_00"),
    "U50": ("io_gt_qsfp_0{p}", "io_clk_qsfp_refclka_0{p}", "ii_level0_wire/ulp_m_aclk_freerun_ref_00"),
}


def platform_gt(board_type: str, port: int) -> tuple[str, str, str]:
    """(GT interface, reference clock, free-running clock) of QSFP28 ``port`` on the board's shell."""
    gt, ref, frc = PLATFORM_GT[board_type]
    return gt.format(p=port), ref.format(p=port), frc
