"""C-simulation: compile each generated stage with g++ and check it against the numpy reference.

The comparison is on raw integers. Because every kernel accumulates exactly and rounds
once with the same rule as fpga_models/fixedpoint.py (docs/codegen.md), the expected
difference is 0 LSB everywhere; a stage passes at <= ``tolerance_lsb`` (default 0).

Compiled binaries are cached by the sha256 of (compiler, flags, every source and header
they include), so an unchanged stage is never rebuilt. Cache folder: ``$BAPIPE_CSIM_CACHE``
or ``<build>/.cache``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bapipe import proc, toolchain
from bapipe.errors import SpecError
from fpga_models import fixedpoint as fx

CXXFLAGS = ["-std=c++14", "-O2", "-Wall", "-Werror",
            # the HLS pragmas are for Vitis; g++ would warn about every one of them
            "-Wno-unknown-pragmas",
            # Vitis loop labels name the loops in synthesis reports; g++ sees unused labels
            "-Wno-unused-label",
            # g++ -O2 raises these inside the vendor ap_private code after inlining it into
            # ours, where the -isystem exemption no longer reaches (#pragma GCC diagnostic
            # does not either); "vendor headers excepted" in practice means these two
            "-Wno-uninitialized", "-Wno-maybe-uninitialized"]


#: Every C-simulation build: the bounded streams, dataflow threads and loop counters of
#: bapipe_csim.h (docs/codegen.md, "Bounded C-simulation").
CSIM_FLAGS = ["-DBAPIPE_CSIM", "-pthread"] + (
    # testbench arrays of a big stage (vgg16 fc6's 4096 x 25088 weight-gradient sums, 822 MB)
    # pass the 2 GB the default code model addresses: the medium model puts large data apart
    ["-mcmodel=medium"] if platform.machine() in ("x86_64", "AMD64") else [])
#: Exit statuses of a csim binary (bapipe_csim.h): every process blocked / data left in a stream
DEADLOCK_EXIT, LEFTOVER_EXIT = 86, 87


class Deadlock(RuntimeError):
    """A csim run stopped because every process was blocked on a stream (the message names them)."""


@dataclass
class Compiled:
    """A built binary and how long building it took (0 when it came from the cache)."""

    path: Path
    compile_s: float
    cached: bool


def cache_dir(build: Path | None = None) -> Path:
    """Where compiled binaries are kept."""
    env = os.environ.get("BAPIPE_CSIM_CACHE")
    if env:
        return Path(env)
    return (build or Path("build")) / ".cache"


def _compiler() -> tuple[str, str]:
    cxx = toolchain.gxx()
    if cxx is None:
        raise SpecError(None, None, "g++", "C-simulation needs a C++ compiler (g++ on PATH or $CXX)")
    ver = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    return cxx, (ver[0] if ver else cxx)


def _ap_types() -> Path:
    d = toolchain.ap_types_dir()
    if d is None:
        raise SpecError(None, None, "hls4ml", "C-simulation needs the ap_types headers of the hls4ml wheel "
                        "(pip install hls4ml)")
    return d


def compile_sources(sources: list[Path], include_dirs: list[Path], cache: Path, name: str,
                    extra_flags: tuple[str, ...] = ()) -> Compiled:
    """g++ the sources into one binary, reusing a cached binary with the same content hash.

    ``extra_flags`` (e.g. ``-DMB=1``, ``-DBAPIPE_AP_MAC``) are part of the hash.
    """
    cxx, version = _compiler()
    ap = _ap_types()
    flags = [*CXXFLAGS, *CSIM_FLAGS, *extra_flags]
    # the csim-only hls_stream.h (bounded streams, bapipe_csim.h) goes before every other folder
    include_dirs = [d / "csim" for d in include_dirs if (d / "csim" / "hls_stream.h").is_file()] + list(include_dirs)
    h = hashlib.sha256()
    h.update(version.encode())
    h.update(" ".join(flags).encode())
    for src in sources:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    for d in include_dirs:  # our headers; the vendor headers are fixed by the wheel version
        for f in sorted(d.glob("*.h")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    key = h.hexdigest()[:24]
    out = cache / f"{name}-{key}"
    if out.exists():
        return Compiled(out, 0.0, True)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{name}-{key}.{os.getpid()}.tmp"
    cmd = [cxx, *flags, "-isystem", str(ap), *[f"-I{d}" for d in include_dirs], *map(str, sources),
           "-o", str(tmp)]
    t0 = time.perf_counter()
    try:   # g++ and its cc1plus in one process group: an interrupted csim stops them all
        r = proc.run(cmd, capture_output=True, text=True)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"g++ failed for {name}:\n{r.stderr[-4000:]}")
    os.replace(tmp, out)  # atomic: a parallel run never sees half a binary
    return Compiled(out, dt, False)


# ---------------------------------------------------------------- layouts

def to_stream(x: np.ndarray) -> np.ndarray:
    """(N, *shape) model layout -> (N, elements) in stream order (HWC for images)."""
    x = np.asarray(x, dtype=np.int64)
    if x.ndim == 4:
        x = x.transpose(0, 2, 3, 1)
    return x.reshape(len(x), -1)


def _stream_shape(model, port: dict) -> tuple[int, ...]:
    """The shape whose stream order a kernel port carries: a flatten's image (C, H, W) when the
    port's tensor is the flatten of one (the stream stays HWC across the cut and the next
    dense layer's columns are permuted to match, codegen.rtl_model.flatten_perm), else the
    tensor's own shape."""
    t = port["tensor"]
    layer = model.layers[model.index[t]] if t in model.index else None
    if layer is not None and layer.type == "flatten" and len(layer.in_shapes[0]) == 3:
        return tuple(layer.in_shapes[0])
    return tuple(port["shape"])


def from_stream(flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(N, elements) stream order -> (N, *shape) model layout."""
    n = len(flat)
    if len(shape) == 3:
        c, h, w = shape
        return np.asarray(flat).reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return np.asarray(flat).reshape((n,) + tuple(shape))


def random_input(rng: np.random.Generator, n: int, shape: tuple[int, ...], fmt: fx.Fmt, span: float = 2.0) -> np.ndarray:
    """Raw values uniform in [-span, span) (a range that exercises rounding without saturating everything)."""
    lim = int(span * (1 << fmt.frac))
    return rng.integers(-lim, lim, size=(n,) + tuple(shape), dtype=np.int64)


# ---------------------------------------------------------------- a generated project

def load_weights(build: Path, stage_cfg: dict, fmt: fx.Fmt) -> dict[str, dict[str, np.ndarray]]:
    """Per layer {w, b} or {scale, shift} from the stage's weights.bin (model layout)."""
    dt = np.dtype("<i2") if fmt.width > 8 else np.dtype("i1")
    # int32, not int64: VGG-16 has 138 M weights; the reference widens per layer as it goes
    wpath = build / stage_cfg["weights_file"]
    if not wpath.is_file():
        raise SpecError(str(wpath), None, "weights", "expected the weights file written by `bapipe gen`; re-run it")
    raw = np.fromfile(wpath, dtype=dt).astype(np.int32)
    need = max((w["offset"] + w["elements"] for w in stage_cfg["weights"]), default=0)
    if raw.size < need:  # truncated or from another plan: refuse rather than reshape garbage
        raise SpecError(str(wpath), None, "weights", f"expected at least {need * dt.itemsize} bytes, got "
                        f"{raw.size * dt.itemsize}; re-run `bapipe gen`")
    out: dict[str, dict[str, np.ndarray]] = {}
    for w in stage_cfg["weights"]:
        key = w["name"][len(_ident_prefix(w)):]
        arr = raw[w["offset"]:w["offset"] + w["elements"]].reshape(w["shape"])
        out.setdefault(w["layer"], {})[key] = arr
    return out


def _ident_prefix(w: dict) -> str:
    # weight arrays are named <ident>_<key>; the key is the part after the last underscore
    return w["name"].rsplit("_", 1)[0] + "_"


def _check_streams(name: str, stdout: str) -> None:
    """hls_stream.h returns T() on an empty read and only warns (on stdout): make it an error.

    A read of an empty stream or data left in one means the kernel's beat counts are wrong,
    which would hang the RTL even when the numbers happen to match.
    """
    bad = [l for l in stdout.splitlines() if l.startswith("WARNING: Hls::stream")]
    if bad:
        raise RuntimeError(f"{name}: stream protocol error: {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""))


def read_stats(path: Path) -> dict:
    """The counts a csim run wrote ($BAPIPE_CSIM_STATS): cycles, per stream depth/peak, per loop."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"cycles": None, "streams": {}, "loops": {}}


def _run(cmd: list[str], stats: Path, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Run a csim binary with $BAPIPE_CSIM_STATS set; a deadlock or leftover data raises."""
    env = {**os.environ, **(env or {}), "BAPIPE_CSIM_STATS": str(stats)}
    r = proc.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode in (DEADLOCK_EXIT, LEFTOVER_EXIT):
        line = next((l for l in r.stderr.splitlines() if l.startswith(("BAPIPE_DEADLOCK", "BAPIPE_LEFTOVER"))),
                    r.stderr.strip()[-500:])
        raise Deadlock(line)
    return r


def run_binary(binary: Path, inputs: list[np.ndarray], n: int, out_elems: list[int],
               weights: Path | None = None, stats_out: dict | None = None,
               env: dict | None = None) -> tuple[list[np.ndarray], np.ndarray, float]:
    """Run a stage testbench: inputs (N, elements) per port in stream order.

    The files are little-endian int32 (count, then values; see tb_<stage>_io.h). ``weights``:
    the stage's weights.bin, for kernels whose weights are m_axi arguments.
    Returns (outputs (N, elements) per port, the values written after them, run seconds);
    ``stats_out`` (when given) is filled with the run's counts (read_stats). Raises Deadlock
    when the run deadlocked. ``env``: extra environment of the run (BAPIPE_CSIM_CALL: tb_bwd).
    """
    with tempfile.TemporaryDirectory() as td:
        fin, fout = Path(td) / "in.bin", Path(td) / "out.bin"
        parts = [np.array([n], dtype="<i4")] + [np.asarray(a).reshape(-1).astype("<i4") for a in inputs]
        fin.write_bytes(b"".join(p.tobytes() for p in parts))
        cmd = [str(binary), str(fin), str(fout)] + ([str(weights)] if weights is not None else [])
        t0 = time.perf_counter()
        r = _run(cmd, Path(td) / "stats.json", env=env)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"{binary.name} exited {r.returncode}: {r.stderr[-2000:]}")
        _check_streams(binary.name, r.stdout)
        if stats_out is not None:
            stats_out.update(read_stats(Path(td) / "stats.json"))
        vals = np.fromfile(fout, dtype="<i4").astype(np.int64)
    outs, pos = [], 0
    for e in out_elems:
        outs.append(vals[pos:pos + n * e].reshape(n, e))
        pos += n * e
    return outs, vals[pos:], dt   # the tail: whatever follows the ports (backward: weight gradients)


#: Budgets of `bapipe csim` (docs/codegen.md, "C-simulation budgets"); MACs per kernel run.
#: Kernels up to AP_MAC_LIMIT simulate the acc_t arithmetic itself (-DBAPIPE_AP_MAC, ~8 ns per
#: MAC); bigger ones keep the same exact sum in a 64-bit integer (bapipe_layers.h, mac_t).
AP_MAC_LIMIT = 50_000_000
#: A stage above this many forward MACs per sample is "big": the whole pipeline runs on 1 sample
#: and its backward kernel is rebuilt with -DMB=1 (one sample of the micro-batch).
BIG_STAGE_MACS = 200_000_000
#: A kernel run above this many MACs is not run at all: reported as "skipped" with the reason
#: (~2-3 minutes at the measured ~1 ns per MAC of the int64 path).
RUN_LIMIT_MACS = 150_000_000_000
#: No -O1 for big kernels: once the weights are m_axi arguments g++ takes 2-6 s at -O2 for
#: every VGG-16/ResNet-50 kernel, and -O2 runs them up to 2x faster (docs/codegen.md).


def stage_macs(layers) -> tuple[int, int]:
    """(forward, backward-kernel) MACs per sample of a stage's layers; the backward kernel
    recomputes the forward, then runs input and weight gradients."""
    fwd = sum(l.fwd_macs for l in layers)
    return fwd, fwd + sum(l.bwd_in_macs + l.bwd_w_macs for l in layers)


def build_flags(macs: int) -> tuple[str, ...]:
    """Extra compiler flags of a kernel run of ``macs`` MACs (see AP_MAC_LIMIT)."""
    return ("-DBAPIPE_AP_MAC",) if macs <= AP_MAC_LIMIT else ()


def _skip_row(name: str, reason: str) -> dict:
    return {"name": name, "passed": None, "max_abs_err_lsb": None, "compile_s": 0.0, "run_s": 0.0,
            "cached": False, "skipped": reason}


def csim_project(build: str | Path, samples: int = 4, seed: int = 0, tolerance_lsb: int = 0) -> dict:
    """Compile and run every stage, chaining stage outputs into the next stage's inputs.

    Each stage is compared with numpy on the very inputs it got; the last stage's outputs
    are also compared with numpy run over the whole model from the first stage's inputs.
    Big plans run on one sample (BIG_STAGE_MACS); a kernel beyond RUN_LIMIT_MACS is reported
    as skipped (``"passed": null``, ``"skipped": reason``) and the project then does not pass.
    """
    from bapipe.plan import load_plan
    from bapipe.spec import load_model

    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise SpecError(None, None, "--samples", f"expected a positive integer, got {samples}")
    if seed < 0:  # numpy refuses negative seeds with a bare ValueError
        raise SpecError(None, None, "--seed", f"expected a non-negative integer, got {seed}")
    build = Path(build)
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
    model = load_model(plan.model)
    fmt = fx.get_fmt(cfg["format"]["name"])
    rng = np.random.default_rng(seed)
    cache = cache_dir(build)
    common = build / "common"
    stage_layers = {st["kernel"]: [model.layers[model.index[l["name"]]] for l in st["layers"]] for st in cfg["stages"]}
    big = max((stage_macs(ls)[0] for ls in stage_layers.values()), default=0) > BIG_STAGE_MACS
    if big:
        samples = 1   # VGG-sized stages: one sample through the whole pipeline

    tensors: dict[str, np.ndarray] = {}       # model-layout batches produced by the C stages
    model_inputs: dict[str, np.ndarray] = {}  # what the first stage (or any) was fed from outside
    all_params: dict[str, dict] = {}
    results = []
    chain_ok = True
    for st in cfg["stages"]:
        name = st["kernel"]
        sdir = build / name
        layers = stage_layers[name]
        fwd_macs, bwd_macs = stage_macs(layers)
        row = {"name": name, "passed": False, "max_abs_err_lsb": None, "compile_s": 0.0, "run_s": 0.0,
               "cached": False, "samples": samples, "macs": fwd_macs * samples,
               **_cycles(build, st, None, samples)}
        params = load_weights(build, st, fmt)
        all_params.update(params)
        if fwd_macs * samples > RUN_LIMIT_MACS:
            results.append({**_skip_row(name, f"{fwd_macs * samples} MACs exceed the csim budget of "
                                            f"{RUN_LIMIT_MACS} per kernel run"), **_cycles(build, st, None, samples)})
            chain_ok = False
            break   # later stages would have no inputs
        flags = build_flags(fwd_macs * samples)
        row["mac"] = "acc_t" if "-DBAPIPE_AP_MAC" in flags else "int64"
        comp = compile_sources([sdir / f"{name}.cpp", sdir / f"tb_{name}.cpp"], [sdir, common], cache, name, flags)
        row["compile_s"], row["cached"] = round(comp.compile_s, 3), comp.cached
        ins = []
        for p in st["inputs"]:
            t = p["tensor"]
            if t not in tensors:
                tensors[t] = random_input(rng, samples, tuple(p["shape"]), fmt)
                model_inputs[t] = tensors[t]
            ins.append(tensors[t])
        wfile = None if st["embedded_weights"] else build / st["weights_file"]
        if st.get("roms_file"):   # an engine kernel reads its banked weight arrays
            wfile = build / st["roms_file"]
        stats: dict = {}
        try:
            outs, _, row["run_s"] = run_binary(comp.path, [to_stream(x.reshape((len(x),) + _stream_shape(model, p)))
                                                           for p, x in zip(st["inputs"], ins)], samples,
                                               [p["elements"] for p in st["outputs"]], wfile, stats)
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0]
            row["deadlock"] = isinstance(e, Deadlock)
            results.append(row)
            chain_ok = False
            break   # later stages would have no inputs
        row["run_s"] = round(row["run_s"], 3)
        one: dict = {}
        if samples > 1:   # the same kernel on its first sample alone: the per-call fill, for the steady state
            run_binary(comp.path, [to_stream(x[:1].reshape((1,) + _stream_shape(model, p)))
                                   for p, x in zip(st["inputs"], ins)], 1,
                       [p["elements"] for p in st["outputs"]], wfile, one)
        row.update(_cycles(build, st, stats, samples, one))
        t0 = time.perf_counter()
        ref = fx.model_fwd(layers, {p["tensor"]: x for p, x in zip(st["inputs"], ins)}, params, fmt)
        row["numpy_s"] = round(time.perf_counter() - t0, 3)
        err = 0
        for p, o in zip(st["outputs"], outs):
            got = from_stream(o, _stream_shape(model, p)).reshape((len(o),) + tuple(p["shape"]))
            err = max(err, int(np.max(np.abs(got - ref[p["tensor"]]))) if got.size else 0)
            tensors[p["tensor"]] = got
        del ref
        row["max_abs_err_lsb"] = err
        row["passed"] = err <= tolerance_lsb
        results.append(row)
        if st.get("backward"):
            mb = st["backward"]["microbatch"]
            if big and mb > 1:
                mb = 1
            if mb * bwd_macs > RUN_LIMIT_MACS:
                results.append({**_skip_row(st["backward"]["kernel"], f"{mb * bwd_macs} MACs exceed the csim "
                                                f"budget of {RUN_LIMIT_MACS} per kernel run"), **_NO_BWD_CYCLES})
                continue
            from .csim_bwd import csim_backward as csim_bwd_kernel   # the streaming backward kernel
            results.append(csim_bwd_kernel(build, st, model, params, fmt, rng, cache, tolerance_lsb, mb=mb,
                                           macs=mb * bwd_macs))

    model_err = None
    fwd_rows = [r for r in results if not r["name"].endswith("_bwd")]
    if chain_ok and fwd_rows and all(r.get("max_abs_err_lsb") is not None for r in fwd_rows) \
            and len(fwd_rows) == len(cfg["stages"]):
        first = cfg["stages"][0]["layers"][0]["name"]
        last = cfg["stages"][-1]
        lo = model.index[first]
        hi = model.index[last["layers"][-1]["name"]]
        full = fx.model_fwd(model.layers[lo:hi + 1], dict(model_inputs), all_params, fmt)
        model_err = max(int(np.max(np.abs(tensors[p["tensor"]] - full[p["tensor"]]))) for p in last["outputs"])
    skipped = [r["name"] for r in results if r.get("skipped")]
    deadlocks = [f"{r['name']}: {r['error']}" for r in results if r.get("deadlock")]
    passed = (bool(results) and not skipped and chain_ok and all(r["passed"] for r in results)
              and (model_err is None or model_err <= tolerance_lsb))
    return {"stages": results, "passed": passed, "samples": samples, "model_max_abs_err_lsb": model_err,
            "format": fmt.name, "cache": str(cache), "skipped": skipped, "deadlocks": deadlocks}


#: backward kernels have no cycle count yet (issue #16 counts loop iterations in csim)
_NO_BWD_CYCLES = {"cycles_per_sample": None, "plan_cycles_per_sample": None,
                  "cycles_source": "not counted for backward kernels yet"}


def port_adapter(process: str, kernel: str) -> bool:
    """A process that only moves the kernel's input at its port's width: the width converter
    fed straight by the port (``<kernel>/width_conv(in<k>, ...)``, or by the port's stash tap
    ``in<k>_st``) and that tap (``<kernel>/stash_write(in<k>, ...)``, the training forward
    writing its input's stash). The Design's stage bench has neither (it feeds the stage at its
    first engine's width, codegen.design.stage_bench_files; design.json has no stashes), the
    link's width being the link's affair. The engines' region is ``<kernel>`` itself or, when the
    kernel first copies its weights on chip (codegen.hls_weights.load_weights_once),
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

    from .design import plan_cycles_per_sample

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
    from .context import format_ctx
    from .hls import environment

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
