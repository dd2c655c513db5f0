"""PipeDream's released optimizer as the peer: run it, read what it prints, replay it.

The optimizer is msr-fiddle/pipedream's optimizer/optimizer_graph_hierarchical.py (MIT
licence; not part of this repository). ``find_optimizer`` locates a checkout (the
``BAPIPE_PIPEDREAM`` environment variable or a given path: the repository root holding
``optimizer/`` and ``graph/``); ``run_optimizer`` runs it in a subprocess on a profiler
graph (graph.txt) with ``-n G H -b B1 B2`` and ``-o DIR``, where it writes the graph back
with every node's stage id (gpus=N.txt). It imports ``graphviz`` only to draw that graph as
a .dot file, which nothing here reads: a stand-in module with no-op methods is put first on
its path. ``PYTHONHASHSEED=0`` fixes its string-set orders (its antichain walk iterates sets
of node ids).

``parse_output`` reads its printout; ``replay`` recomputes every time it prints from the
imported profile with the formula of planner.peer_pipedream (the recurrence evaluated along
its plan) and the quantities its printout uses (prefix sums of the node times, the output
bytes of a prefix as its antichain walk counts them): figures printed with ``%f`` must match
as text, figures printed in full (``repr``) to a relative 1e-12. The optimizer itself does not
repeat its last digits: it sums each state's node times over a Python set of node objects,
whose order follows memory addresses, so two runs of one command print e.g.
0.6725350000000002 and 0.6725349999999999 (VGG-16's total).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .peer_pipedream import Level, Options, PeerInput, _allreduce, hier_value

ENV = "BAPIPE_PIPEDREAM"
SCRIPT = Path("optimizer") / "optimizer_graph_hierarchical.py"
#: the optimizer's imports besides numpy: graphviz draws the -o graph (not read here)
GRAPHVIZ_STUB = '''"""Stand-in for graphviz: PipeDream's optimizer draws its -o graph as .dot, unused here."""
class Digraph:
    def node(self, *a, **k): pass
    def edge(self, *a, **k): pass
    def render(self, *a, **k): pass
'''
#: the relative agreement asked of figures the optimizer prints in full (see the module docstring)
FULL_REL = 1e-12


def find_optimizer(path: str | None = None) -> Path | None:
    """The checkout holding optimizer/optimizer_graph_hierarchical.py: ``path``, else
    $BAPIPE_PIPEDREAM; None when neither holds it."""
    for cand in (path, os.environ.get(ENV)):
        if cand and (Path(cand) / SCRIPT).is_file() and (Path(cand) / "graph" / "graph.py").is_file():
            return Path(cand).resolve()
    return None


def run_optimizer(root: Path, graph: Path, levels: list[Level], out_dir: Path, opts: Options) -> tuple[str, Path]:
    """Run the released optimizer on ``graph`` for two levels (boards a host, hosts): its
    stdout and the graph it writes back with stage ids."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stub = out_dir / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "graphviz.py").write_text(GRAPHVIZ_STUB, encoding="utf-8")
    cmd = [sys.executable, SCRIPT.name, "-f", str(Path(graph).resolve()),
           "-n", *(str(lv.units) for lv in levels), "-b", *(repr(float(lv.bandwidth)) for lv in levels),
           "-o", str(out_dir.resolve())]
    if opts.acr is not None:
        cmd += ["--activation_compression_ratio", repr(float(opts.acr))]
    if opts.fewer:
        cmd.append("--use_fewer_machines")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub), str(root)]), PYTHONHASHSEED="0")
    res = subprocess.run(cmd, cwd=root / "optimizer", env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"PipeDream's optimizer failed ({res.returncode}): {res.stderr.strip()[-300:]}")
    total = 1
    for lv in levels:
        total *= lv.units
    return res.stdout, out_dir / f"gpus={total}.txt"


@dataclass
class Block:
    """One call of the optimizer's analysis: a range split at one level."""

    prints: list = field(default_factory=list)   # (units, compute, dp, pp or None) as printed, text
    lines: list = field(default_factory=list)    # (start state, end state, time text, units)


@dataclass
class Printout:
    """What the optimizer printed (times as the text it printed)."""

    states: int
    levels: list            # top level first: [Block, ...] per level
    single: str             # "Time taken by single-stage pipeline"
    pipeline: str           # "Time per stage in pipeline"
    speedups: list          # the three "Throughput increase" figures


_STAGE = re.compile(r"Compute time = ([\d.]+), Data-parallel communication time = ([\d.]+)"
                    r"(?:, Pipeline-parallel communication time = ([\d.]+))?\.\.\.")
_LINE = re.compile(r"\((\d+), (\d+)\) (\S+) (\d+)$")


def parse_output(text: str) -> Printout:
    """The optimizer's printout (verbose, with its configuration), the matrices it dumps skipped."""
    states = int(re.search(r"Total number of states: (\d+)", text).group(1))
    levels: list = []
    block = None
    used = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Level "):
            levels.append([])
            block = None
        elif line.startswith("Number of machines used:"):
            used = int(re.search(r"(\d+)", line).group(1))
            if block is None:
                block = Block()
                levels[-1].append(block)
        elif _STAGE.match(line):
            m = _STAGE.match(line)
            block.prints.append((used, m.group(1), m.group(2), m.group(3)))
        elif _LINE.match(line) and levels:
            m = _LINE.match(line)
            block.lines.append((int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))))
        elif line.startswith("Number of machines in budget not used"):
            pass
        elif line.startswith("(Split start"):
            pass
        elif line == "" and block is not None and block.lines:
            block = None
    single = re.search(r"Time taken by single-stage pipeline: (\S+)", text).group(1)
    pipeline = re.search(r"Time per stage in pipeline: (\S+)", text).group(1)
    speed = re.findall(r"Throughput increase[^:]*: (\S+)", text)
    return Printout(states, levels, single, pipeline, speed)


def stage_ranges(model, stage_of: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) layer of every stage id, in the model's layer order (a graph the optimizer
    wrote imports stage by stage: bapipe.profiles)."""
    out: dict[int, list[int]] = {}
    for k, l in enumerate(model.layers):
        out.setdefault(stage_of[l.name], []).append(k)
    rng = [(min(v), max(v)) for _s, v in sorted(out.items())]
    if any(b - a + 1 != len(out[s]) for s, (a, b) in zip(sorted(out), rng)):
        raise ValueError("a stage of the optimizer's plan is not a contiguous layer range")
    return rng


def stage_ids(graph_text: str) -> dict[str, int]:
    """{node: stage id} of a graph the optimizer wrote."""
    out = {}
    for line in graph_text.splitlines():
        if line and not line.startswith("\t"):
            parts = line.split(" -- ")
            if len(parts) > 3 and parts[3].startswith("stage_id="):
                out[parts[0].strip()] = int(parts[3].split("=")[1])
    return out


def plan_of(out: Printout, ranges: list[tuple[int, int]]):
    """The optimizer's two-level plan in layer indices: planner.peer_pipedream.hier_value's
    ``top`` (top-level stages (first, last, hosts, [(first, last, boards a host)])). The
    lower level's stages, in print order, are the stage ids 0, 1, ... of its -o graph."""
    top_lines = [ln for b in out.levels[0] for ln in b.lines]
    low_blocks = out.levels[1]
    if len(low_blocks) != len(top_lines):
        raise ValueError("the printout's two levels do not match")
    top, k = [], 0
    for (_a, _b, _t, h), blk in zip(top_lines, low_blocks):
        parts = []
        for _a2, _b2, _t2, g in blk.lines:
            parts.append((ranges[k][0], ranges[k][1], g))
            k += 1
        top.append((parts[0][0], parts[-1][1], h, parts))
    return top


def boards_of_plan(top, units: int) -> list[tuple[int, int, int]]:
    """Flat stages (first, last, board indices host-major) of a two-level plan: top-level
    stages take hosts in order, their stages slots in order on each of them (as the
    optimizer's plan lays them out)."""
    flat = []
    host = 0
    for _f, _l, h, parts in top:
        slot = 0
        for f, l, g in parts:
            flat.append((f, l, tuple(x * units + slot + y for x in range(host, host + h) for y in range(g))))
            slot += g
        host += h
    return flat


@dataclass
class Prefix:
    """The optimizer's per-state figures at the plan's stage boundaries (prefixes of the
    layer order): compute seconds, parameter bytes and output bytes of layers 0..k."""

    compute: list
    params: list
    out_bytes: list


def prefixes(model, prof: dict) -> Prefix:
    """Prefix sums in layer order and, per prefix, the bytes the optimizer's state carries
    out: the activations of its antichain (the prefix's maximal layers) and of every layer
    that, for some antichain layer a, precedes a and feeds a layer that neither precedes a
    nor is a (its augmented antichain; for a one-layer antichain, exactly the layers whose
    outputs leave the prefix)."""
    names = [l.name for l in model.layers]
    idx = {n: k for k, n in enumerate(names)}
    succ: dict[str, list[str]] = {n: [] for n in names}
    for l in model.layers:
        for t in l.inputs:
            if t in succ:
                succ[t].append(l.name)
    preds: dict[str, set] = {}
    for l in model.layers:   # layer order is topological
        s = set()
        for t in l.inputs:
            if t in idx:
                s.add(t)
                s |= preds[t]
        preds[l.name] = s
    comp, par, outb = [], [], []
    c = p = 0.0
    for k, l in enumerate(model.layers):
        c += prof[l.name]["fwd_s"] + prof[l.name]["bwd_s"]
        p += prof[l.name]["param_bytes"]
        comp.append(c)
        par.append(p)
        inside = set(names[:k + 1])
        anti = [n for n in names[:k + 1] if not any(s in inside for s in succ[n])]
        extra = set()
        for a in anti:
            for q in preds[a]:
                if any(o not in preds[a] and o != a for o in succ[q]):
                    extra.add(q)
        outb.append(float(sum(prof[n]["activation_bytes"] for n in list(extra) + anti)))
    return Prefix(comp, par, outb)


def _block_prints(pre: Prefix, blk_ranges, bw: float, opts: Options) -> list:
    """What one analysis call prints per stage, last stage first (as it walks its splits
    back): (units, compute, dp, pp or None), with the released code's readings: its first
    stage prints the prefix from layer 0 (compute and parameters read off the state at the
    stage's end), its last stage stops one state early."""
    out = []
    for k in range(len(blk_ranges) - 1, -1, -1):
        f, l, n = blk_ranges[k]
        if k == len(blk_ranges) - 1:
            # the walk starts one state early (its first "previous split" is the range's end
            # minus one, then read one state back): the last stage is printed up to the state
            # before its end (Python's index -1, the model's last state, for a one-state range)
            l = l - 1
        if k > 0:
            comp = pre.compute[l] - pre.compute[f - 1]
            par = pre.params[l] - pre.params[f - 1]
            dp = (4 * (n - 1) * par) / (bw * n)
            pin = (2.0 * pre.out_bytes[f - 1] * (1.0 / float(n))) / bw
            pout = (2.0 * pre.out_bytes[l] * (1.0 / float(n))) / bw
            if opts.acr is not None:
                pin, pout = pin / opts.acr, pout / opts.acr
            else:
                pin = pout = 0.0
            out.append((n, comp / n, dp / n, max(pin, pout)))
        else:
            comp, par = pre.compute[l], pre.params[l]
            dp = (4 * (n - 1) * par) / (bw * n)
            out.append((n, comp / n, dp / n, None))
    return out


def _close(printed: str, ours: float) -> bool:
    """A full figure: within FULL_REL, or 1e-15 s absolute (a difference of two equal sums
    the optimizer prints as 1.1102230246251565e-16)."""
    return abs(float(printed) - ours) <= FULL_REL * abs(float(printed)) + 1e-15


def _same_text(printed: str, ours: float) -> bool:
    """A %f figure: the same text, or ours within FULL_REL of a value printing as it (a sum
    landing on a rounding boundary: 0.0042255 prints 0.004225 or 0.004226 by its last ulp)."""
    return any(printed == f"{ours * (1 + e):f}" for e in (0.0, FULL_REL, -FULL_REL))


def replay(out: Printout, top, model, prof: dict, inp: PeerInput, levels: list[Level], opts: Options) -> list[dict]:
    """Every time the optimizer printed, recomputed: [{what, printed, ours, ok}] (``ok``: the
    same text for %f figures, within FULL_REL for full ones)."""
    pre = prefixes(model, prof)
    rows = []

    def add(what, printed, ours, full):
        ok = _close(printed, ours) if full else _same_text(printed, ours)
        rows.append({"what": what, "printed": printed, "ours": ours, "ok": ok})

    # top level: one analysis of the whole model over the hosts
    tparts = [(f, l, h) for f, l, h, _p in top]
    blocks = [(0, tparts, levels[1].bandwidth, [b for b in out.levels[0]])]
    for (f, l, h, parts), blk in zip(top, out.levels[1]):
        blocks.append((1, parts, levels[0].bandwidth, [blk]))
    for lvl, parts, bw, blks in blocks:
        printed = [p for b in blks for p in b.prints]
        lines = [ln for b in blks for ln in b.lines]
        mine = _block_prints(pre, parts, bw, opts)
        name = "top" if lvl == 0 else f"level 1, layers {parts[0][0]}-{parts[-1][1]}"
        if len(printed) != len(mine):
            rows.append({"what": f"{name}: stage count", "printed": str(len(printed)), "ours": len(mine), "ok": False})
            continue
        for (n, c, d, p), (n2, c2, d2, p2) in zip(printed, mine):
            add(f"{name}: compute / {n}", c, c2, False)
            add(f"{name}: data-parallel / {n}", d, d2, False)
            if p is not None:
                add(f"{name}: pipeline-parallel / {n}", p, p2 if p2 is not None else -1.0, False)
        for (a, b, t, r), (f, l, g) in zip(lines, parts):
            ours = pre.compute[l] - (pre.compute[f - 1] if f > 0 else 0.0)
            add(f"{name}: ({a}, {b}) compute", t, ours, True)
    total, W = pre.compute[-1], pre.params[-1]
    add("single-stage pipeline", out.single, total, True)
    value = hier_value(inp, levels, top, opts)
    add("time per stage in pipeline", out.pipeline, value, True)
    dp_t, within = total, 1
    for lv in levels:
        dp_t = sum([dp_t, _allreduce(W, lv.units, lv.bandwidth) / within]) / lv.units
        within = lv.units
    for k, (what, v) in enumerate(zip(("throughput vs one machine", "data parallel vs one machine",
                                        "throughput vs data parallel"), (total / value, total / dp_t, dp_t / value))):
        add(what, out.speedups[k], v, True)
    return rows
