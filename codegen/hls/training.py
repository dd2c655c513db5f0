"""The update, all-reduce and loss kernels' files (codegen.design.train_kernels decides them):
kernel, testbench, HLS script and config per kernel, through the project renderer's ``put``."""
from __future__ import annotations

from bapipe.codegen.design.train_kernels import LossCtx


def render(sc, put, c_hdr: str, h_hdr: str, part: str, clock_ns: float) -> dict[str, bytes]:
    """Write the stage's update (and all-reduce) kernel, testbench and Vitis HLS scripts through
    codegen.hls's ``put``; returns the other files they need (none: their testbenches make their
    own pattern when run without arguments, so a VGG-sized stage writes no stimulus of its
    138 M weights)."""
    u = sc.update
    if u is None:
        return {}
    d = sc.name
    kernels = [(u.name, "tb_update.cpp.j2", "stage_update.cpp.j2", "update")]
    if u.replicas > 1:   # the ring all-reduce between the stage's replicas
        kernels.append((u.allreduce_name, "tb_allreduce.cpp.j2", "stage_allreduce.cpp.j2", "allreduce"))
    for top, tb, tpl, tag in kernels:
        put(f"{d}/{top}.cpp", tpl, header=c_hdr, s=sc, u=u)
        put(f"{d}/tb_{top}.cpp", tb, header=c_hdr, s=sc, u=u)
        # no stimulus files: without arguments the testbenches run their own pattern (and check it)
        kw = dict(header=h_hdr, top=top, kernel_file=f"{top}.cpp", tb_file=f"tb_{top}.cpp", part=part,
                  clock_ns=clock_ns, stim="", stim_files=[])
        put(f"{d}/run_hls_{tag}.tcl", "run_hls.tcl.j2", tcl_name=f"run_hls_{tag}.tcl", **kw)
        put(f"{d}/hls_config_{tag}.cfg", "hls_config.cfg.j2", cfg_name=f"hls_config_{tag}.cfg", **kw)
    return {}


# ---------------------------------------------------------------- the loss kernel


def render_loss(loss: LossCtx | None, put, c_hdr: str, h_hdr: str, part: str, clock_ns: float) -> None:
    """The loss kernel, its testbench and Vitis HLS scripts (in the last stage's folder)."""
    if loss is None:
        return
    d, top = loss.stage, loss.name
    put(f"{d}/{top}.cpp", "loss.cpp.j2", header=c_hdr, l=loss)
    put(f"{d}/tb_{top}.cpp", "tb_loss.cpp.j2", header=c_hdr, l=loss)
    kw = dict(header=h_hdr, top=top, kernel_file=f"{top}.cpp", tb_file=f"tb_{top}.cpp", part=part,
              clock_ns=clock_ns, stim="", stim_files=[])
    put(f"{d}/run_hls_loss.tcl", "run_hls.tcl.j2", tcl_name="run_hls_loss.tcl", **kw)
    put(f"{d}/hls_config_loss.cfg", "hls_config.cfg.j2", cfg_name="hls_config_loss.cfg", **kw)
