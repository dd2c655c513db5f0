"""Compile and run generated C++ for C-simulation: g++ flags, the content-hashed binary cache,
the stream layout of tensors, stimulus, the run with its statistics and the deadlock check.
codegen.check.csim (forward kernels), csim_bwd and csim_train share these."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bapipe import proc, toolchain
from bapipe.errors import SpecError
from bapipe.fpga_models import fixedpoint as fx

CXXFLAGS = ["-std=c++14", "-O2", "-Wall", "-Werror",
            # the HLS pragmas are for Vitis; g++ would warn about every one of them
            "-Wno-unknown-pragmas",
            # Vitis loop labels name the loops in synthesis reports; g++ sees unused labels
            "-Wno-unused-label",
            # g++ -O2 raises these inside the vendor ap_private code after inlining it into
            # ours, where the -isystem exemption no longer reaches (#pragma GCC diagnostic
            # does not either); "vendor headers excepted" in practice means these two
            "-Wno-uninitialized", "-Wno-maybe-uninitialized"]


#: Every C-simulation build: the bounded streams, dataflow processes (coroutines of one thread)
#: and loop counters of bapipe_csim.h (docs/codegen.md, "Bounded C-simulation").
CSIM_FLAGS = ["-DBAPIPE_CSIM"] + (
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
    if r.returncode != 0:   # also a g++ killed in another thread (proc.stop_all) mid-link
        tmp.unlink(missing_ok=True)
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
    dense layer's columns are permuted to match, codegen.design.dataflow.flatten_perm), else the
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
    """Per layer {w, b} or {scale, shift} (model layout) from the stage's weight image
    (codegen.design.weight_image: each array where host_config.json says it lies, unfolded)."""
    from bapipe.codegen.design.weight_image import read_model

    dt = np.dtype(stage_cfg.get("weights_dtype") or ("<i2" if fmt.width > 8 else "i1"))
    wpath = build / stage_cfg["weights_file"]
    if not wpath.is_file():
        raise SpecError(str(wpath), None, "weights", "expected the weights file written by `bapipe gen`; re-run it")
    need = max((w["offset"] + w["elements"] for w in stage_cfg["weights"]), default=0) * dt.itemsize
    if wpath.stat().st_size < need:  # truncated or from another plan: refuse rather than reshape garbage
        raise SpecError(str(wpath), None, "weights", f"expected at least {need} bytes, got "
                        f"{wpath.stat().st_size}; re-run `bapipe gen`")
    out: dict[str, dict[str, np.ndarray]] = {}
    for w in stage_cfg["weights"]:
        # int32, not int64: VGG-16 has 138 M weights; the reference widens per layer as it goes
        out.setdefault(w["layer"], {})[w["key"]] = read_model(build, w).astype(np.int32)
    return out


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
    the stage's weight image, for kernels whose weights are m_axi arguments.
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
#: No -O1 for big kernels: once the weights are m_axi arguments g++ takes 2-6 s at -O2 for
#: every VGG-16/ResNet-50 kernel, and -O2 runs them up to 2x faster (docs/codegen.md). Above
#: AP_MAC_LIMIT they build at -O3 (BIG_OPT): g++ vectorizes the engines' lane arrays once
#: bapipe_csim.h has taken ap_private's volatile re-normalization out (vgg16 stage1_bwd: 33.4 ->
#: 15.7 s a run for 8.2 -> 9.7 s of g++); small kernels, whose compile is the cost, stay at -O2.
BIG_OPT = "-O3"


def stage_macs(layers) -> tuple[int, int]:
    """(forward, backward-kernel) MACs per sample of a stage's layers; the backward kernel
    recomputes the forward, then runs input and weight gradients."""
    fwd = sum(l.fwd_macs for l in layers)
    return fwd, fwd + sum(l.bwd_in_macs + l.bwd_w_macs for l in layers)


def build_flags(macs: int) -> tuple[str, ...]:
    """Extra compiler flags of a kernel run of ``macs`` MACs (see AP_MAC_LIMIT, BIG_OPT)."""
    return ("-DBAPIPE_AP_MAC",) if macs <= AP_MAC_LIMIT else (BIG_OPT,)
