"""C-simulation of a stage's backward kernel (codegen.design.backward): one random micro-batch, checked
against the training arithmetic (fpga_models.train_fixed.layers_bwd: input gradients in G 16[12],
exact weight-gradient sums), cycles counted in the run against the plan's.

The stashes the kernel reads (each layer's forward input) come from the fixed-point forward of
the same random stage inputs, so the kernel and the reference see the very same activations.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models import train_fixed as tfx

#: a weight-gradient array's kind (host_config) -> its key in fpga_models.train_fixed (others,
#: batchnorm's scale and shift, are their own key)
KEY = {"dw": "w", "db": "b"}
#: MACs of a backward run up to which csim runs the micro-batch a second time, one sample a
#: call, to leave the call's fill out of the per-sample figure (steady_per_sample). Above it
#: (small-resnet's 212 M: 27 s a run) the call's own count stands, fill included: there 4
#: cycles of the micro-batch's 49,156 (0.008%).
STEADY_RUN_MACS = 50_000_000


def kernel_layout(a: np.ndarray) -> np.ndarray:
    """A layer array in the kernels' layout: conv weights (O, C, kh, kw) as the MVU matrix."""
    return fx.conv_weight_matrix(a) if np.ndim(a) == 4 else np.asarray(a)


def weight_sums(tail: np.ndarray, grads: list[dict]) -> list[np.ndarray]:
    """The exact weight-gradient sums a backward testbench wrote after its ports (int64 as two
    int32 words, low first), one flat array per host_config ``weight_grads`` entry."""
    words = np.asarray(tail[:2 * sum(a["elements"] for a in grads)], dtype=np.int64)
    sums = (words[1::2] << 32) | (words[0::2] & 0xFFFFFFFF)
    out, pos = [], 0
    for a in grads:
        out.append(sums[pos:pos + a["elements"]])
        pos += a["elements"]
    return out


def steady_per_sample(c_mb: int, c_k: int | None, mb: int, k: int = 1) -> tuple[float, float | None]:
    """(cycles per sample in steady state, fill cycles per call) of a backward kernel from its
    micro-batch counted as one call (``c_mb`` = mb x S + F) and as mb / k calls of ``k`` samples
    (``c_k`` = mb / k x (k x S + F)): F = (c_k - c_mb) / (mb / k - 1), S = (c_mb - F) / mb; what the
    plan's per-sample figure counts (a dataflow stage's slowest layer, a time-multiplexed
    stage's turns with their per-sample fills). One sample or no second run: (c_mb / mb, None).
    k = mb / 2 keeps both runs to whole chunks of a tiled engine (fpga_models.bwd_tiles: a call
    pads its last chunk of P vectors), which one-sample calls would not."""
    if c_k is None or mb < 2 or mb % k or mb == k:
        return c_mb / mb, None
    fill = (c_k - c_mb) / (mb // k - 1)
    return (c_mb - fill) / mb, fill


def second_call_samples(mb: int) -> int:
    """Samples a call of the steady-state run: half the micro-batch when it divides, else one."""
    return mb // 2 if mb % 2 == 0 else 1


def plan_figures(build: Path, st: dict, model) -> dict:
    """The plan's backward cycles of the stage (codegen.design.backward.plan_bwd_cycles)."""
    from bapipe.plan import load_plan
    from bapipe.fpga_models.boards import get_board

    from bapipe.codegen.design.backward import plan_bwd_cycles

    plan = load_plan(Path(build) / "plan.yaml")
    pos = next((i for i, x in enumerate(plan.stages) if x.index == st.get("index")), None)
    if pos is None:
        return {}
    return plan_bwd_cycles(plan, model, pos, get_board(plan.stages[pos].board_type))


def backward_flags(st: dict, macs: int, mb: int | None = None) -> tuple[str, ...]:
    """g++ flags of stage ``st``'s backward kernel run on ``mb`` samples (None: its micro-batch)
    of ``macs`` MACs: cxx_run.build_flags, and ``-DMB=mb`` below the kernel's micro-batch."""
    from bapipe.codegen.check.cxx_run import build_flags

    kernel_mb = st["backward"]["microbatch"]
    mb = kernel_mb if mb is None else mb
    return build_flags(macs) + ((f"-DMB={mb}",) if mb != kernel_mb else ())


def compile_backward(build: Path, st: dict, cache: Path, flags: tuple[str, ...]):
    """The stage's backward kernel and its testbench compiled (cxx_run.compile_sources: cached)."""
    from bapipe.codegen.check.cxx_run import compile_sources

    name, sdir = st["backward"]["kernel"], build / st["kernel"]
    return compile_sources([sdir / f"{name}.cpp", sdir / f"tb_{name}.cpp"], [sdir, build / "common"], cache, name,
                           flags)


def draw_backward(rng: np.random.Generator, st: dict, mb: int, fmt: fx.Fmt) -> tuple[dict, dict]:
    """The random micro-batch of a backward run: (stage inputs, output gradients) by tensor,
    drawn from ``rng`` in this order."""
    from bapipe.codegen.check.cxx_run import random_input

    xs = {p["tensor"]: random_input(rng, mb, tuple(p["shape"]), fmt) for p in st["inputs"]}
    dys = {p["tensor"]: random_input(rng, mb, tuple(p["shape"]), fmt, span=1.0) for p in st["backward"]["inputs"]}
    return xs, dys


def csim_backward(build: Path, st: dict, model, params: dict, fmt: fx.Fmt, rng: np.random.Generator | None,
                  cache: Path, tolerance_lsb: int = 0, mb: int | None = None, macs: int = 0,
                  comp=None, draws: tuple[dict, dict] | None = None) -> dict:
    """Compile and run the backward kernel of stage ``st`` (its host_config entry) on one random
    micro-batch; compare input gradients and the exact weight-gradient sums with
    fpga_models.train_fixed.layers_bwd (bit for bit: the sums are 64-bit integers).

    ``mb`` below the kernel's micro-batch rebuilds it with ``-DMB=mb`` (big stages).
    ``comp`` (cxx_run.Compiled): the kernel already compiled with backward_flags; ``draws``:
    the micro-batch already drawn (draw_backward; ``rng`` is then not used).
    Returns the csim row: passed, max_abs_err_lsb, cycles per sample counted in the run and the
    plan's (steady state; per micro-batch beside them), streams' peak occupancy.
    """
    from bapipe.codegen.check.cxx_run import Deadlock, from_stream, run_binary, to_stream

    b = st["backward"]
    name = b["kernel"]
    kernel_mb = b["microbatch"]
    mb = kernel_mb if mb is None else mb
    flags = backward_flags(st, macs, mb)
    if comp is None:
        comp = compile_backward(build, st, cache, flags)
    layers = [model.layers[model.index[l["name"]]] for l in st["layers"]]
    xs, dys = draws if draws is not None else draw_backward(rng, st, mb, fmt)
    acts = fx.model_fwd(layers, xs, params, fmt)
    feed = [to_stream(acts[s["tensor"]]) for s in b["stashes"]] + [to_stream(dys[p["tensor"]]) for p in b["inputs"]]
    counts = [p["elements"] for p in b["outputs"]]
    row = {"name": name, "passed": False, "max_abs_err_lsb": None, "compile_s": round(comp.compile_s, 3),
           "run_s": 0.0, "cached": comp.cached, "samples": mb, "macs": macs,
           "mac": "acc_t" if "-DBAPIPE_AP_MAC" in flags else "int64",
           "onchip_bytes": b.get("onchip_bytes")}
    if mb != kernel_mb:
        row["note"] = f"micro-batch {mb} of the kernel's {kernel_mb} (-DMB={mb}): the csim run-time budget"
    plan = plan_figures(build, st, model)
    row.update({"cycles_per_sample": None, "plan_cycles_per_sample": plan.get("per_sample"),
                "cycles_per_microbatch": None, "plan_cycles_per_microbatch": plan.get("microbatch"),
                "cycles_source": "counted in C-simulation: loop trips x II + entries x pipeline depth, max over "
                                 "DATAFLOW processes (BAPIPE_LOOP/BAPIPE_TRIP); per sample in steady state "
                                 "(the micro-batch as one call and as calls of half of it: the call's fill "
                                 "left out); plan per sample: the slowest layer's backward cycles (dataflow "
                                 "steady state), the micro-batch's over its samples (time-multiplexed)"})
    wfile = None if st["embedded_weights"] else build / st["weights_file"]
    stats: dict = {}
    try:
        outs, tail, run_s = run_binary(comp.path, feed, mb, counts, wfile, stats)
    except (RuntimeError, Deadlock) as e:
        row["error"] = str(e).splitlines()[0]
        return row
    row["run_s"] = round(run_s, 3)
    trailer, tail = tail[-4:], tail[:-4]
    c_mb = int(trailer[0]) & 0xFFFFFFFF | int(trailer[1]) << 32
    c_flush = int(trailer[2]) & 0xFFFFFFFF | int(trailer[3]) << 32
    if stats.get("cycles") is not None:
        assert c_mb + c_flush == stats["cycles"], (c_mb, c_flush, stats["cycles"])
        row["cycles_per_microbatch"] = c_mb
        c_one = None
        k = second_call_samples(mb)
        if 1 < mb and macs <= STEADY_RUN_MACS:   # the same micro-batch k samples a call: its fill per call
            _, tail1, _ = run_binary(comp.path, feed, mb, counts, wfile, {}, env={"BAPIPE_CSIM_CALL": str(k)})
            c_one = int(tail1[-4]) & 0xFFFFFFFF | int(tail1[-3]) << 32
        row["cycles_per_sample"], row["fill_cycles_per_call"] = steady_per_sample(c_mb, c_one, mb, k)
        row["call_cycles_per_sample"] = c_mb / mb
        row["flush_cycles"] = c_flush   # dW/db out once per iteration (the plan prices no gradient egress)
    row["streams"] = {k: {"depth": v["depth"], "peak": v["peak"]} for k, v in sorted((stats.get("streams") or {}).items())}
    # per engine function, its cycles over the run (micro-batch + flush) per sample: the bottleneck
    row["processes"] = {k: v / mb for k, v in sorted((stats.get("processes") or {}).items())}
    t0 = time.perf_counter()
    g, wg = tfx.layers_bwd(layers, acts, dys, params, tfx.get_formats(fmt.name))
    row["numpy_s"] = round(time.perf_counter() - t0, 3)
    err = 0
    for p, o in zip(b["outputs"], outs):
        err = max(err, int(np.max(np.abs(from_stream(o, tuple(p["shape"])) - g[p["tensor"]]))))
    for a, got in zip(b["weight_grads"], weight_sums(tail, b["weight_grads"])):
        ref = kernel_layout(wg[a["layer"]][KEY.get(a["kind"], a["kind"])])   # batchnorm: scale / shift
        err = max(err, int(np.max(np.abs(got - ref.reshape(-1)))) if got.size == ref.size else 1 << 30)
    row["max_abs_err_lsb"] = err
    row["passed"] = err <= tolerance_lsb
    return row
