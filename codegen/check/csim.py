"""C-simulation: compile each generated stage with g++ and check it against the numpy reference.

The comparison is on raw integers. Because every kernel accumulates exactly and rounds
once with the same rule as fpga_models/fixedpoint.py (docs/codegen.md), the expected
difference is 0 LSB everywhere; a stage passes at <= ``tolerance_lsb`` (default 0).

Compiled binaries are cached by the sha256 of (compiler, flags, every source and header
they include), so an unchanged stage is never rebuilt. Cache folder: ``$BAPIPE_CSIM_CACHE``
or ``<build>/.cache``.
"""
from __future__ import annotations

import json
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bapipe.errors import SpecError
from bapipe.fpga_models import fixedpoint as fx

from bapipe.codegen.check import csim_bwd, jobs   # csim_bwd's functions looked up at call time: tests replace them
from bapipe.codegen.check.cxx_run import (Deadlock, Compiled, cache_dir, compile_sources, to_stream,
                                          _stream_shape, from_stream, random_input, load_weights,
                                          _check_streams, _run, run_binary, stage_macs, build_flags)


#: Budgets of `bapipe csim` (docs/codegen.md, "C-simulation budgets"); MACs per kernel run.
#: A stage above this many forward MACs per sample is "big": the whole pipeline runs on 1 sample
#: and its backward kernel is rebuilt with -DMB=1 (one sample of the micro-batch).
BIG_STAGE_MACS = 200_000_000
#: A kernel run above this many MACs is not run at all: reported as "skipped" with the reason
#: (~2-3 minutes at the measured ~1 ns per MAC of the int64 path).
RUN_LIMIT_MACS = 150_000_000_000


def _skip_row(name: str, reason: str) -> dict:
    return {"name": name, "passed": None, "max_abs_err_lsb": None, "compile_s": 0.0, "run_s": 0.0,
            "cached": False, "skipped": reason}


@dataclass
class _Run:
    """One C-simulation of a build: what every stage reads, and what the chain carries from
    one stage to the next."""

    build: Path
    model: Any
    fmt: Any
    rng: np.random.Generator
    cache: Path
    samples: int
    big: bool                       # VGG-sized stages: one sample, backward micro-batches of one
    tolerance_lsb: int
    tensors: dict[str, np.ndarray] = field(default_factory=dict)       # model-layout batches the C stages produced
    model_inputs: dict[str, np.ndarray] = field(default_factory=dict)  # what any stage was fed from outside
    all_params: dict[str, dict] = field(default_factory=dict)


def _read_build(build: Path) -> tuple[dict, Any]:
    """The build's host configuration and plan; a folder `bapipe gen` did not write, or whose
    plan.yaml changed since, is a SpecError."""
    from bapipe.plan import load_plan

    cfg_path = build / "host_config.json"
    if not cfg_path.exists():
        raise SpecError(str(build), None, "host_config.json", "expected a folder written by `bapipe gen`")
    try:
        cfg = json.loads(cfg_path.read_text())
        if not isinstance(cfg, dict) or not isinstance(cfg.get("stages"), list) or "format" not in cfg:
            raise ValueError("not a host configuration")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError(str(cfg_path), None, "(document)",
                        f"expected the JSON written by `bapipe gen` ({e}); re-run it") from None
    plan = load_plan(build / "plan.yaml")
    if cfg.get("plan_fingerprint") != plan.fingerprint():  # plan.yaml swapped or edited after gen
        raise SpecError(str(build / "plan.yaml"), None, "plan_fingerprint",
                        "expected the plan this folder was generated from; re-run `bapipe gen`")
    return cfg, plan


@dataclass
class _Kernel:
    """One stage's kernels as decided before any of them runs: the forward kernel's g++ flags or
    why it is skipped (the chain stops there), and the backward kernel's micro-batch, flags or
    skip, and its random micro-batch. Every random input is drawn up front in the order the
    stages used to run one after another (forward i, backward i, forward i + 1, ...), so the
    results are the same whichever kernels then run side by side."""

    st: dict
    layers: list
    fwd_flags: tuple[str, ...] = ()
    fwd_skip: str | None = None
    bwd_mb: int = 0
    bwd_macs: int = 0
    bwd_flags: tuple[str, ...] = ()
    bwd_skip: str | None = None
    bwd_draws: tuple[dict, dict] | None = None
    params: Any = None               # its weights (load_weights), read once by whoever needs them first
    lock: threading.Lock = field(default_factory=threading.Lock)

    def weights(self, run: _Run) -> dict:
        with self.lock:
            if self.params is None:
                self.params = load_weights(run.build, self.st, run.fmt)
            return self.params


def _budget_note(macs: int) -> str:
    return f"{macs} MACs exceed the csim budget of {RUN_LIMIT_MACS} per kernel run"


def _plan_kernels(run: _Run, cfg: dict, stage_layers: dict) -> list[_Kernel]:
    """Every stage's _Kernel up to the first forward kernel over the budget; the forward inputs
    no earlier stage produces (fresh random samples) go to ``run.tensors``."""
    kernels, produced = [], set()
    for st in cfg["stages"]:
        k = _Kernel(st, stage_layers[st["kernel"]])
        kernels.append(k)
        fwd_macs, bwd_macs = stage_macs(k.layers)
        if fwd_macs * run.samples > RUN_LIMIT_MACS:
            k.fwd_skip = _budget_note(fwd_macs * run.samples)
            break   # later stages would have no inputs
        k.fwd_flags = build_flags(fwd_macs * run.samples)
        for p in st["inputs"]:
            t = p["tensor"]
            if t not in run.tensors and t not in produced:
                run.tensors[t] = random_input(run.rng, run.samples, tuple(p["shape"]), run.fmt)
                run.model_inputs[t] = run.tensors[t]
        produced.update(p["tensor"] for p in st["outputs"])
        if not st.get("backward"):
            continue
        k.bwd_mb = 1 if run.big and st["backward"]["microbatch"] > 1 else st["backward"]["microbatch"]
        k.bwd_macs = k.bwd_mb * bwd_macs
        if k.bwd_macs > RUN_LIMIT_MACS:
            k.bwd_skip = _budget_note(k.bwd_macs)
            continue
        k.bwd_flags = csim_bwd.backward_flags(st, k.bwd_macs, k.bwd_mb)
        k.bwd_draws = csim_bwd.draw_backward(run.rng, st, k.bwd_mb, run.fmt)
    return kernels


def _weights_file(build: Path, st: dict) -> Path | None:
    """What the testbench reads its weights from: none (embedded), else the stage's weight image."""
    return None if st["embedded_weights"] else build / st["weights_file"]


def _check_outputs(run: _Run, st: dict, layers, ins: list[np.ndarray], outs, params: dict, row: dict) -> None:
    """Compare the stage's outputs with numpy on the very inputs it got (raw integers: the
    largest difference in LSB); the outputs feed the next stages."""
    t0 = time.perf_counter()
    ref = fx.model_fwd(layers, {p["tensor"]: x for p, x in zip(st["inputs"], ins)}, params, run.fmt)
    row["numpy_s"] = round(time.perf_counter() - t0, 3)
    err = 0
    for p, o in zip(st["outputs"], outs):
        got = from_stream(o, _stream_shape(run.model, p)).reshape((len(o),) + tuple(p["shape"]))
        err = max(err, int(np.max(np.abs(got - ref[p["tensor"]]))) if got.size else 0)
        run.tensors[p["tensor"]] = got
    del ref
    row["max_abs_err_lsb"] = err
    row["passed"] = err <= run.tolerance_lsb


def _compile_forward(build: Path, st: dict, cache: Path, flags: tuple[str, ...]) -> Compiled:
    sdir = build / st["kernel"]
    return compile_sources([sdir / f"{st['kernel']}.cpp", sdir / f"tb_{st['kernel']}.cpp"], [sdir, build / "common"],
                           cache, st["kernel"], flags)


def _forward_stage(run: _Run, k: _Kernel, comp: Compiled | None) -> tuple[dict, dict]:
    """Run one compiled forward stage on its inputs (then on its first sample alone, for the
    steady-state cycles) and check it: (its row, its weights). A row with ``skipped`` or
    ``error`` ends the chain."""
    st, layers, build, samples = k.st, k.layers, run.build, run.samples
    name = st["kernel"]
    fwd_macs, _ = stage_macs(layers)
    row = {"name": name, "passed": False, "max_abs_err_lsb": None, "compile_s": 0.0, "run_s": 0.0,
           "cached": False, "samples": samples, "macs": fwd_macs * samples,
           **_cycles(build, st, None, samples)}
    params = k.weights(run)
    run.all_params.update(params)
    if k.fwd_skip:
        return {**_skip_row(name, k.fwd_skip), **_cycles(build, st, None, samples)}, params
    row["mac"] = "acc_t" if "-DBAPIPE_AP_MAC" in k.fwd_flags else "int64"
    row["compile_s"], row["cached"] = round(comp.compile_s, 3), comp.cached
    ins = [run.tensors[p["tensor"]] for p in st["inputs"]]
    wfile = _weights_file(build, st)
    out_elems = [p["elements"] for p in st["outputs"]]
    stats: dict = {}
    try:
        outs, _, row["run_s"] = run_binary(comp.path, [to_stream(x.reshape((len(x),) + _stream_shape(run.model, p)))
                                                       for p, x in zip(st["inputs"], ins)], samples,
                                           out_elems, wfile, stats)
    except RuntimeError as e:
        row["error"] = str(e).splitlines()[0]
        row["deadlock"] = isinstance(e, Deadlock)
        return row, params
    row["run_s"] = round(row["run_s"], 3)
    one: dict = {}
    if samples > 1:   # the same kernel on its first sample alone: the per-call fill, for the steady state
        run_binary(comp.path, [to_stream(x[:1].reshape((1,) + _stream_shape(run.model, p)))
                               for p, x in zip(st["inputs"], ins)], 1, out_elems, wfile, one)
    row.update(_cycles(build, st, stats, samples, one))
    _check_outputs(run, st, layers, ins, outs, params, row)
    return row, params


def _backward_row(run: _Run, k: _Kernel, comp: Compiled | None) -> dict:
    """The stage's streaming backward kernel (codegen.check.csim_bwd) on its micro-batch, or a
    skipped row beyond the csim budget."""
    if k.bwd_skip:
        return {**_skip_row(k.st["backward"]["kernel"], k.bwd_skip), **_NO_BWD_CYCLES}
    return csim_bwd.csim_backward(run.build, k.st, run.model, k.weights(run), run.fmt, None, run.cache,
                                  run.tolerance_lsb, mb=k.bwd_mb, macs=k.bwd_macs, comp=comp, draws=k.bwd_draws)


class _Jobs:
    """The run's jobs on the machine's cores (codegen.check.jobs): every kernel's compile, the
    forward chain (the caller's thread: each stage waits for the one before it) and the
    backward kernels beside it, which leave a core to the chain while it runs."""

    #: priorities (lower first): the chain's forward runs, forward compiles, backward compiles,
    #: backward runs (the biggest first)
    FWD_RUN, FWD_COMPILE, BWD_COMPILE, BWD_RUN = 0, 1, 2, 3

    def __init__(self, run: _Run, kernels: list[_Kernel], pool: ThreadPoolExecutor):
        n = jobs.cores()
        self.run = run
        self.slots, self.side = jobs.Slots(n), jobs.Slots(max(1, n - 1))
        self.dropped: set[tuple[str, int]] = set()   # jobs no row needs any more (the chain ended before them)
        self.futures: dict[tuple[str, int], Future] = {}
        for i, k in enumerate(kernels):
            if not k.fwd_skip:
                self.futures["fwd_compile", i] = pool.submit(
                    self._compile, ("fwd_compile", i), (self.FWD_COMPILE, i), False, _compile_forward,
                    run.build, k.st, run.cache, k.fwd_flags)
        for i, k in enumerate(kernels):
            if k.bwd_draws is not None:
                self.futures["bwd_compile", i] = pool.submit(
                    self._compile, ("bwd_compile", i), (self.BWD_COMPILE, -k.bwd_macs, i), True,
                    csim_bwd.compile_backward, run.build, k.st, run.cache, k.bwd_flags)
                self.futures["bwd", i] = pool.submit(self._backward, i, k)

    def _compile(self, key: tuple[str, int], priority: tuple, side: bool, fn, *args) -> Compiled | None:
        with self.side.hold(priority) if side else nullcontext(), self.slots.hold(priority):
            return None if key in self.dropped else fn(*args)

    def _backward(self, i: int, k: _Kernel) -> dict | None:
        comp = self.futures["bwd_compile", i].result()
        priority = (self.BWD_RUN, -k.bwd_macs, i)
        with self.side.hold(priority), self.slots.hold(priority):
            return None if ("bwd", i) in self.dropped else _backward_row(self.run, k, comp)

    def forward(self, i: int, k: _Kernel) -> tuple[dict, dict]:
        """Forward stage i (the chain's next), once compiled, on a core of its own."""
        comp = self.futures["fwd_compile", i].result() if ("fwd_compile", i) in self.futures else None
        with self.slots.hold((self.FWD_RUN, i)):
            return _forward_stage(self.run, k, comp)

    def backward(self, i: int, k: _Kernel) -> dict | Future:
        """Stage i's backward row: a skipped row, or the future of its run."""
        return self.futures["bwd", i] if ("bwd", i) in self.futures else _backward_row(self.run, k, None)

    def chain_ended(self, last: int, whole: bool) -> None:
        """The chain ended at stage ``last``: what no row needs is dropped (when it ended early),
        and the backward kernels may take every core."""
        for key, f in self.futures.items():
            if not whole and key[1] >= last + (key[0] == "fwd_compile"):
                self.dropped.add(key)
                f.cancel()
        self.side.grow(1)

    def stop(self) -> None:
        """An error or a signal: nothing not yet begun begins."""
        self.dropped.update(self.futures)
        for f in self.futures.values():
            f.cancel()
        self.slots.stop()
        self.side.stop()


def _run_stages(run: _Run, cfg: dict, stage_layers: dict) -> tuple[list[dict], bool]:
    """Every stage in order (its backward kernel after it), each fed what the one before
    produced: (rows, whether the chain ran to the end). Compiles and backward kernels run
    beside the chain (_Jobs); the rows and numbers are those of running them one by one."""
    kernels = _plan_kernels(run, cfg, stage_layers)
    results: list = []
    with ThreadPoolExecutor(max_workers=3 * len(kernels) + 1) as pool:
        js = _Jobs(run, kernels, pool)
        try:
            last, whole = len(kernels) - 1, True
            for i, k in enumerate(kernels):
                row, _ = js.forward(i, k)
                results.append(row)
                if row.get("skipped") or "error" in row:
                    last, whole = i, False   # later stages would have no inputs
                    break
                if k.st.get("backward"):
                    results.append(js.backward(i, k))
            js.chain_ended(last, whole)
            results = [r.result() if isinstance(r, Future) else r for r in results]
        except BaseException:
            js.stop()
            raise
    return results, whole


def _model_error(run: _Run, cfg: dict, results: list[dict], chain_ok: bool) -> int | None:
    """The last stage's outputs against numpy run over the whole model from the first
    stage's inputs, in LSB; None unless every forward stage ran."""
    fwd_rows = [r for r in results if not r["name"].endswith("_bwd")]
    if not (chain_ok and fwd_rows and all(r.get("max_abs_err_lsb") is not None for r in fwd_rows)
            and len(fwd_rows) == len(cfg["stages"])):
        return None
    model = run.model
    first = cfg["stages"][0]["layers"][0]["name"]
    last = cfg["stages"][-1]
    lo = model.index[first]
    hi = model.index[last["layers"][-1]["name"]]
    full = fx.model_fwd(model.layers[lo:hi + 1], dict(run.model_inputs), run.all_params, run.fmt)
    return max(int(np.max(np.abs(run.tensors[p["tensor"]] - full[p["tensor"]]))) for p in last["outputs"])


def csim_project(build: str | Path, samples: int = 4, seed: int = 0, tolerance_lsb: int = 0) -> dict:
    """Compile and run every stage, chaining stage outputs into the next stage's inputs.

    Each stage is compared with numpy on the very inputs it got; the last stage's outputs
    are also compared with numpy run over the whole model from the first stage's inputs.
    Big plans run on one sample (BIG_STAGE_MACS); a kernel beyond RUN_LIMIT_MACS is reported
    as skipped (``"passed": null``, ``"skipped": reason``) and the project then does not pass.
    """
    from bapipe.models import load_model

    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise SpecError(None, None, "--samples", f"expected a positive integer, got {samples}")
    if seed < 0:  # numpy refuses negative seeds with a bare ValueError
        raise SpecError(None, None, "--seed", f"expected a non-negative integer, got {seed}")
    build = Path(build)
    cfg, plan = _read_build(build)
    model = load_model(plan.model)
    fmt = fx.get_fmt(cfg["format"]["name"])
    rng = np.random.default_rng(seed)
    cache = cache_dir(build)
    stage_layers = {st["kernel"]: [model.layers[model.index[l["name"]]] for l in st["layers"]] for st in cfg["stages"]}
    big = max((stage_macs(ls)[0] for ls in stage_layers.values()), default=0) > BIG_STAGE_MACS
    run = _Run(build, model, fmt, rng, cache, 1 if big else samples, big, tolerance_lsb)
    results, chain_ok = _run_stages(run, cfg, stage_layers)
    model_err = _model_error(run, cfg, results, chain_ok)
    skipped = [r["name"] for r in results if r.get("skipped")]
    deadlocks = [f"{r['name']}: {r['error']}" for r in results if r.get("deadlock")]
    passed = (bool(results) and not skipped and chain_ok and all(r["passed"] for r in results)
              and (model_err is None or model_err <= tolerance_lsb))
    return {"stages": results, "passed": passed, "samples": run.samples, "model_max_abs_err_lsb": model_err,
            "format": fmt.name, "cache": str(cache), "skipped": skipped, "deadlocks": deadlocks}


#: backward kernels have no cycle count yet (issue #16 counts loop iterations in csim)
_NO_BWD_CYCLES = {"cycles_per_sample": None, "plan_cycles_per_sample": None,
                  "cycles_source": "not counted for backward kernels yet"}


def port_adapter(process: str, kernel: str) -> bool:
    """A process that only moves the kernel's input at its port's width: the width converter
    fed straight by the port (``<kernel>/width_conv(in<k>, ...)``, or by the port's stash tap
    ``in<k>_st``) and that tap (``<kernel>/stash_write(in<k>, ...)``, the training forward
    writing its input's stash). The Design's stage bench has neither (it feeds the stage at its
    first engine's width, codegen.rtl.benches.stage_bench_files; design.json has no stashes), the
    link's width being the link's affair. The engines' region is ``<kernel>`` itself or, when the
    kernel first copies its weights on chip (codegen.design.weight_memory.load_weights_once),
    ``<kernel>_engines``."""
    k = re.escape(kernel) + "(?:_engines)?"
    return bool(re.match(rf"{k}/width_conv\(in\d+(_st)?,", process) or re.match(rf"{k}/stash_write\(in\d+,", process))


def alone_cycles(stats: dict, kernel: str) -> float | None:
    """The kernel's counted cycles as the Design's stage figure (``design_cycles_per_sample``)
    defines them: the top DATAFLOW region's slowest process but the port adapters
    (:func:`port_adapter`); the whole count when the kernel has none."""
    if not stats or stats.get("cycles") is None:
        return None
    procs = stats.get("processes") or {}
    if not any(port_adapter(k, kernel) for k in procs):
        return float(stats["cycles"])
    top = [v for k, v in procs.items()
           if k.startswith((kernel + "/", kernel + "_engines/")) and not port_adapter(k, kernel)]
    return float(max(top)) if top else float(stats["cycles"])


def steady_cycles(total_n: float | None, total_1: float | None, n: int) -> float | None:
    """Cycles per sample in steady state from two runs of the same kernel, on ``n`` samples and
    on one: each further sample's cycles, the per-call fill (pipeline depths, window
    generators' start-up) left out, as the plan's ``fwd_interval`` counts them. One sample
    (big plans) or a failed run: the whole count per sample."""
    if total_n is None:
        return None
    if n < 2 or total_1 is None:
        return total_n / n
    return (total_n - total_1) / (n - 1)


def _cycles(build: Path, st: dict, stats: dict | None, samples: int, one: dict | None = None) -> dict:
    """The kernel's forward cycles per sample counted in C-simulation (bapipe_csim.h: per
    process the sum over its pipelined loops of trips x II + entries x depth, the max over the
    processes of a DATAFLOW region) beside the plan's (plan.yaml fwd_interval), and each
    declared-depth stream's peak occupancy. Before the run (or when it failed): None.

    ``cycles_per_sample``: steady state (:func:`steady_cycles`, ``one``: the stats of the run on
    the first sample alone) of the kernel as the Design's stage bench runs it (:func:`alone_cycles`);
    ``call_cycles_per_sample``: the n-sample call's whole count over n, port adapters included
    (what one call costs; the Design's ``pipeline_cycles_per_sample`` when the port is narrower)."""
    from bapipe.plan import load_plan

    from bapipe.codegen.design.record import plan_cycles_per_sample

    from bapipe.names import name_map, restore

    plan = load_plan(Path(build) / "plan.yaml")
    pos = next((i for i, x in enumerate(plan.stages) if x.index == st.get("index")), None)
    kernel = st.get("kernel", "")
    call = None if not stats or stats.get("cycles") is None else stats["cycles"] / samples
    counted = steady_cycles(alone_cycles(stats, kernel), alone_cycles(one, kernel), samples)
    # streams and processes are named after C identifiers: report the model's layer names
    ids = {k: v for k, v in name_map(dict.fromkeys(l["name"] for l in st.get("layers", []))).items() if k != v}
    return {"cycles_per_sample": counted, "call_cycles_per_sample": call,
            "plan_cycles_per_sample": plan_cycles_per_sample(plan, pos) if pos is not None else None,
            "cycles_source": "counted in C-simulation: loop trips x II + entries x pipeline depth, "
                             "max over DATAFLOW processes (BAPIPE_LOOP/BAPIPE_TRIP); per sample in "
                             "steady state (n samples minus 1 sample, over n - 1), input-port width "
                             "converters left out as in the Design's stage bench",
            "streams": {restore(k, ids): {"depth": v["depth"], "peak": v["peak"]}
                        for k, v in sorted(((stats or {}).get("streams") or {}).items())},
            "processes": {restore(k, ids): v / samples
                          for k, v in sorted(((stats or {}).get("processes") or {}).items())}}


def clean_cache(build: Path) -> None:
    """Remove the compile cache (``make clean`` does not touch it)."""
    shutil.rmtree(cache_dir(build), ignore_errors=True)


# ---------------------------------------------------------------- layer harness (tests)

@dataclass
class HarnessIO:
    """One array or stream of a harness case: C name, dims (arrays), raw data (inputs) or count."""

    name: str
    count: int
    dims: str = ""
    data: np.ndarray | None = None


@dataclass
class HarnessCase:
    """One library call with its inputs; outputs are read back in declaration order."""

    name: str
    call: str
    repeat: int
    in_arrays: list[HarnessIO]
    in_streams: list[HarnessIO]
    out_streams: list[HarnessIO]
    out_arrays: list[HarnessIO]


def run_harness(cases: list[HarnessCase], fmt: str, workdir: Path, cache: Path | None = None,
                name: str = "harness", ap_mac: bool = True) -> tuple[list[list[np.ndarray]], Compiled, float]:
    """Render all cases into one translation unit, compile once (cached), run once.

    ``ap_mac``: simulate the acc_t arithmetic synthesis uses (-DBAPIPE_AP_MAC); False tests the
    64-bit integer MAC path big stages run with.

    Returns per case the outputs (streams then arrays, flat raw ints), the compile record
    and the run time.
    """
    from bapipe.codegen.design.context import format_ctx
    from bapipe.codegen.hls.project import environment

    env = environment()
    fctx = format_ctx(fmt)
    workdir = Path(workdir)
    common = workdir / "common"
    common.mkdir(parents=True, exist_ok=True)
    hdr = "// bapipe csim layer harness"
    files = {
        common / "bapipe_types.h": env.get_template("bapipe_types.h.j2").render(fmt=fctx, header=hdr),
        common / "bapipe_layers.h": env.get_template("bapipe_layers.h.j2").render(fmt=fctx, header=hdr),
        common / "bapipe_csim.h": env.get_template("bapipe_csim.h.j2").render(fmt=fctx, header=hdr),
        common / "bapipe_engines.h": env.get_template("bapipe_engines.h.j2").render(fmt=fctx, header=hdr),
        common / "csim" / "hls_stream.h": env.get_template("hls_stream_csim.h.j2").render(fmt=fctx, header=hdr),
        workdir / f"{name}.cpp": env.get_template("harness.cpp.j2").render(fmt=fctx, header=hdr, cases=cases),
    }
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    comp = compile_sources([workdir / f"{name}.cpp"], [common], cache or (workdir / ".cache"), name,
                           ("-DBAPIPE_AP_MAC",) if ap_mac else ())
    feed = []
    for c in cases:
        for io in c.in_arrays + c.in_streams:
            feed.append("\n".join(map(str, np.asarray(io.data, dtype=np.int64).reshape(-1).tolist())))
    t0 = time.perf_counter()
    r = _run([str(comp.path)], workdir / f"{name}.stats.json", input="\n".join(feed) + "\n")
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"harness exited {r.returncode}: {r.stderr[-2000:]}")
    _check_streams(name, r.stdout)
    vals = np.array(r.stdout.split(), dtype=np.int64)
    outs, pos = [], 0
    for c in cases:
        co = []
        for io in c.out_streams + c.out_arrays:
            co.append(vals[pos:pos + io.count])
            pos += io.count
        outs.append(co)
    if pos != len(vals):
        raise RuntimeError(f"harness printed {len(vals)} values, expected {pos}")
    return outs, comp, dt
