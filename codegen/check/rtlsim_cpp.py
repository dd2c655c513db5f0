"""`bapipe rtlsim --engine cpp`: cluster_top under a plain C++ Verilator harness.

The cocotb testbench (codegen/check/rtlsim_tb.py) pays Python for every simulated cycle, far too
slow for the millions of cycles a VGG-16 pipeline needs. Here the harness is C++ rendered
from ``hls_templates/harness/rtlsim_main.cpp.j2``: input always valid back to back, sink
always ready, the same cycle numbering as the cocotb path, lanes passed through binary
files. The compiled simulation is cached under ``cache`` by the hash of the sources, the
harness and the flags (one builder per key, others wait on a file lock).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2
import numpy as np
from bapipe import hls_templates as templates

from bapipe import proc
HARNESS_VERSION = "1"
#: rising edges with rst high before the counted cycles (codegen/check/sim_tb.py start())
RESET_CYCLES = 5
#: cycles run after the last expected output beat to catch extra beats (codegen/check/rtlsim_tb.py)
TAIL_CYCLES = 10
#: long runs report progress on stderr every so many seconds
PROGRESS_S = 30.0
#: C++ optimisation of the verilated model: on a VGG-16 MVU (16 PEs of 192 lanes) -O1 builds in
#: 16 s against -O2's 20 s and runs as fast (198 k against 167 k busy cycles/s); -O0 runs 25x
#: slower (BAPIPE_VERILATOR_CXX_OPT overrides it: bapipe.toolchain.verilator_cxx_opt)
CXX_OPT = "-O1"
#: manifest files that are memory images for $readmemh, not Verilog
MEM_SUFFIXES = (".hex", ".mem")


@dataclass(frozen=True)
class Piece:
    """Bits [lane_shift, lane_shift+bits) of lane ``lane`` sit at bit ``word_shift`` of word ``word``."""

    lane: int
    word: int
    word_shift: int
    lane_shift: int
    bits: int

    @property
    def mask(self) -> str:
        """Hex mask of the piece's width."""
        return f"0x{(1 << self.bits) - 1:x}"


def port_ctype(width: int) -> str:
    """Verilator's C type of a port of ``width`` bits."""
    if width <= 8:
        return "CData"
    if width <= 16:
        return "SData"
    if width <= 32:
        return "IData"
    if width <= 64:
        return "QData"
    return f"VlWide<{(width + 31) // 32}>"


def lane_pieces(lanes: int, elem_w: int) -> list[Piece]:
    """How ``lanes`` lanes of ``elem_w`` bits map onto the port's storage words.

    Ports up to 64 bits are one 64-bit word; wider ports are VlWide arrays of 32-bit words,
    where a lane may straddle two (or more) words.
    """
    width = lanes * elem_w
    word_w = 64 if width <= 64 else 32
    pieces = []
    for lane in range(lanes):
        lo, hi = lane * elem_w, (lane + 1) * elem_w
        bit = lo
        while bit < hi:
            word = bit // word_w
            end = min(hi, (word + 1) * word_w)
            pieces.append(Piece(lane, word, bit - word * word_w, bit - lo, end - bit))
            bit = end
    return pieces


def harness_context(man: dict) -> dict:
    """Template context of the harness: port types and the lane-to-word pieces of both ports."""
    elem_w, in_lanes, out_lanes = int(man["elem_w"]), int(man["in_lanes"]), int(man["out_lanes"])
    if not 1 <= elem_w <= 64:
        raise ValueError(f"elem_w {elem_w} is outside 1..64")
    in_w, out_w = in_lanes * elem_w, out_lanes * elem_w
    pin, pout = lane_pieces(in_lanes, elem_w), lane_pieces(out_lanes, elem_w)
    in_word_c = "uint32_t" if in_w > 64 else port_ctype(in_w)
    in_words = [{"index": w, "ctype": in_word_c, "pieces": [p for p in pin if p.word == w]}
                for w in sorted({p.word for p in pin})]
    out_words = [{"index": w} for w in sorted({p.word for p in pout})]
    out_lanes_pieces = [{"lane": n, "pieces": [p for p in pout if p.lane == n]} for n in range(out_lanes)]
    return {"top": man["top"], "elem_w": elem_w, "in_lanes": in_lanes, "out_lanes": out_lanes,
            "in_width": in_w, "out_width": out_w, "in_ctype": port_ctype(in_w), "out_ctype": port_ctype(out_w),
            "in_wide": in_w > 64, "out_wide": out_w > 64, "in_words": in_words, "out_words": out_words,
            "out_lanes_pieces": out_lanes_pieces, "reset_cycles": RESET_CYCLES, "tail_cycles": TAIL_CYCLES,
            "progress_s": PROGRESS_S,
            "version": HARNESS_VERSION}


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=templates.loader("harness"), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def render_harness(man: dict) -> str:
    """C++ source of the harness for the manifest's top and port widths."""
    return _env().get_template("rtlsim_main.cpp.j2").render(**harness_context(man))


def verilator_flags(rtl_dir: Path, top: str, threads: int = 1, mem_dir: Path | None = None,
                    binary_images: bool = False) -> list[str]:
    """Verilator options of the build (everything but the source files and -Mdir).

    ``mem_dir``: where the MVUs' $readmemh images are (default ``rtl_dir``; a single-stage
    bench reads the main build's). ``binary_images``: the MVUs load their weights as raw bytes
    (:func:`binary_images`)."""
    from bapipe.toolchain import verilator_cxx_opt

    mem = Path(mem_dir if mem_dir is not None else rtl_dir).resolve()
    flags = ["--cc", "--exe", "--build", "-O3", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--top-module", top,
             "--prefix", "Vtop", "-CFLAGS", verilator_cxx_opt(CXX_OPT), "--build-jobs", "2",
             # $readmemh files of the MVUs are found through this absolute prefix
             f'+define+BAPIPE_MEM_DIR="{mem}/"', f"+incdir+{Path(rtl_dir).resolve()}"]
    if threads > 1:
        flags += ["--threads", str(int(threads))]
    if binary_images:   # the MVUs read raw weight words with $fread (mvu.v.j2, codegen.rtl.mem_images)
        flags.append("+define+BAPIPE_MEM_BIN")
    return flags


def binary_images(man: dict) -> bool:
    """Whether the build's MVUs load raw weight words (``$fread``): whole-byte elements. Verilator's
    ``$readmemh`` shifts a whole memory word once per hex digit, so VGG-16's fc6 image (50,176
    words of 32,768 bits, 411 MB of text) took minutes to load."""
    from bapipe.codegen.rtl.mem_images import BINARY_ELEM_W

    return int(man.get("elem_w", 0)) in BINARY_ELEM_W


def sources(man: dict) -> list[str]:
    """The manifest's files Verilator compiles: all but the $readmemh images (read at run time)."""
    return [n for n in man["files"] if not n.endswith(MEM_SUFFIXES)]


def build_key(rtl_dir: Path, man: dict, harness: str, flags: list[str]) -> str:
    """Hash of the sources, the harness and the flags: the compiled binary's cache key.

    Memory images are not part of it: the binary reads them from rtl_dir when it starts.
    """
    from bapipe.toolchain import verilator_bin

    h = hashlib.sha256()
    h.update(json.dumps([man["top"], flags, str(verilator_bin())]).encode())
    for name in sources(man):
        h.update(name.encode() + b"\0" + (Path(rtl_dir) / name).read_bytes() + b"\0")
    h.update(harness.encode())
    return h.hexdigest()[:16]


def compile_harness(rtl_dir: Path, man: dict, cache: Path, threads: int = 1) -> tuple[Path, float]:
    """Verilate and compile cluster_top with the harness (cached); (executable, compile seconds)."""
    from bapipe.toolchain import verilator_bin, wire_verilator, with_pch_makeflag

    harness = render_harness(man)
    mem_dir = Path(rtl_dir) / man["mem_dir"] if man.get("mem_dir") else None
    flags = verilator_flags(rtl_dir, man["top"], threads, mem_dir, binary_images(man))
    d = Path(cache).resolve() / f"cpp-{man['top']}-{build_key(rtl_dir, man, harness, flags)}"
    exe = d / "obj" / "Vtop"
    if exe.exists():
        return exe, 0.0
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # One builder per key: a concurrent `bapipe rtlsim` on the same build waits, then reuses it.
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            (d / "main.cpp").write_text(harness)
            env = with_pch_makeflag(wire_verilator(dict(os.environ)))
            cmd = [str(verilator_bin() / "verilator"), *flags, "-Mdir", str(d / "obj"), str(d / "main.cpp"),
                   *[str(Path(rtl_dir).resolve() / n) for n in sources(man)]]
            r = proc.run(cmd, env=env, capture_output=True, text=True)   # make, g++: one group
            (d / "build.log").write_text(" ".join(cmd) + "\n" + r.stdout + r.stderr)
            if r.returncode != 0 or not exe.exists():
                tail = [ln for ln in (r.stdout + r.stderr).splitlines() if "%Error" in ln or "error" in ln]
                raise RuntimeError(f"Verilator build of {man['top']} failed ({d / 'build.log'}): "
                                   f"{tail[0] if tail else 'exit ' + str(r.returncode)}")
    return exe, time.perf_counter() - t0


def default_max_idle(man: dict) -> int:
    """Deadlock guard: generous against the pipeline fill (boards + 1 sample intervals, twice over)."""
    pred = float(man.get("predicted_cycles_per_sample") or 0)
    return int(100_000 + 2 * (len(man.get("boards", ())) + 1) * pred)


def simulate_cpp(rtl_dir: Path, man: dict, x_stream: np.ndarray, cache: Path, threads: int = 1,
                 max_idle_cycles: int | None = None) -> dict:
    """Run ``man['top']`` on the input rows (N, in_elems) under the C++ harness.

    Returns the cocotb path's result dict: outputs (signed, in order), in_cycles (cycle of
    every input beat), out_cycles (cycle of every output beat), overflow, sim_cycles,
    wall_s (reset and cycles, after the weight images are loaded), extra_beats, compile_s (0
    when the binary was cached).
    Raises RuntimeError when no beat moves on either port for ``max_idle_cycles`` cycles
    before every output arrived (default: :func:`default_max_idle`).
    """
    rtl_dir = Path(rtl_dir)
    from bapipe.codegen.rtl.mem_images import ensure_memories, image_plusargs

    exe, compile_s = compile_harness(rtl_dir, man, Path(cache), threads)
    # the MVUs' images, from the stages' weight images (first run; a bench reads the main build's);
    # with raw bytes, most MVUs read their slice of the stage image in place (the plusargs)
    mem_dir = Path(rtl_dir) / man["mem_dir"] if man.get("mem_dir") else Path(rtl_dir)
    ensure_memories(mem_dir, binary_images(man))
    plusargs = image_plusargs(mem_dir) if binary_images(man) else []
    in_lanes, out_lanes = int(man["in_lanes"]), int(man["out_lanes"])
    flat = np.asarray(x_stream, dtype=np.int64).reshape(-1)
    n_in = -(-flat.size // in_lanes)
    words = np.zeros(n_in * in_lanes, dtype="<i8")
    words[:flat.size] = flat          # a short last beat is padded with zero lanes
    n_out_elems = len(x_stream) * int(man["out_elems"])
    n_out = -(-n_out_elems // out_lanes)
    idle = default_max_idle(man) if max_idle_cycles is None else int(max_idle_cycles)
    with tempfile.TemporaryDirectory(prefix="bapipe-rtlsim-") as tmp:
        tmp = Path(tmp)
        words.tofile(tmp / "in.bin")
        # stderr passes through: long runs print a progress line every PROGRESS_S seconds
        r = proc.run([str(exe), str(tmp / "in.bin"), str(n_in), str(tmp), str(n_out), str(idle), *plusargs],
                           cwd=rtl_dir, stdout=subprocess.PIPE, text=True)
        if not (tmp / "result.json").exists():
            msg = r.stdout.strip().splitlines()
            how = f"was killed by signal {-r.returncode}" if r.returncode < 0 else f"exited {r.returncode}"
            raise RuntimeError(f"the C++ RTL simulation {how}" + (f": {msg[-1]}" if msg else ""))
        res = json.loads((tmp / "result.json").read_text())
        if res["status"] == "deadlock":
            raise RuntimeError(f"RTL simulation stuck: no beat moved for {idle} cycles, stopped at cycle "
                               f"{res['cycle']} with {res['out_beats']} of {n_out} output beats and "
                               f"{res['in_beats']} of {n_in} input beats")
        if res["status"] == "finish":
            said = [ln for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("- ")]
            raise RuntimeError(f"the RTL called $finish at cycle {res['cycle']} after {res['out_beats']} of "
                               f"{n_out} output beats" + (f": {said[-1].strip()}" if said else ""))
        out = np.fromfile(tmp / "out.bin", dtype="<i8")[:n_out_elems]
        in_cycles = np.fromfile(tmp / "in_cycles.bin", dtype="<i8")
        out_cycles = np.fromfile(tmp / "out_cycles.bin", dtype="<i8")
    return {"outputs": out.tolist(), "in_cycles": in_cycles.tolist(), "out_cycles": out_cycles.tolist(),
            "overflow": int(res["overflow"]), "sim_cycles": int(res["sim_cycles"]), "wall_s": float(res["wall_s"]),
            "extra_beats": bool(res["extra_beats"]), "compile_s": compile_s}
