"""Views of a simulation: Chrome trace-event JSON (Perfetto, chrome://tracing) and a Gantt PNG.

Both read only a ``SimResult``'s records, so they show exactly what was simulated.
"""
from __future__ import annotations

import json
from pathlib import Path

COLOURS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452", "allreduce": "#C44E52", "stall": "#BBBBBB",
           "transfer": "#8172B3"}


def trace_events(result) -> dict:
    """The trace as a dict: one process for boards (a thread per board), one for links.

    Ops are complete ("X") events named like ``F3`` / ``B3.1`` (micro-batch . chunk);
    times are microseconds. Memory per device is a counter track.
    """
    ev: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "boards"}},
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "links"}},
        {"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "memory"}},
    ]
    rows: list[tuple[int, str]] = []  # (device, board) per thread id
    for d, boards in enumerate(result.device_boards):
        for b in boards:
            rows.append((d, b))
    for tid, (d, b) in enumerate(rows):
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": f"{b} (stage pos {d})"}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
    tids_of: dict[int, list[int]] = {}
    for tid, (d, _) in enumerate(rows):
        tids_of.setdefault(d, []).append(tid)
    us = 1e6
    for d, kind, mb, chunk, t0, t1 in result.ops:
        name = f"{kind}{mb}" + (f".{chunk}" if chunk else "")
        for tid in tids_of[d]:
            ev.append({"name": name, "cat": kind, "ph": "X", "pid": 0, "tid": tid, "ts": t0 * us,
                       "dur": (t1 - t0) * us, "args": {"microbatch": mb, "chunk": chunk}})
    for d, t0, t1 in result.stalls:
        for tid in tids_of[d]:
            ev.append({"name": "stall", "cat": "stall", "ph": "X", "pid": 0, "tid": tid, "ts": t0 * us,
                       "dur": (t1 - t0) * us})
    link_tid: dict[str, int] = {}
    for ln in result.links:
        link_tid[ln.name] = len(link_tid)
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": link_tid[ln.name], "args": {"name": ln.name}})
    for name, t0, t1, label in result.transfers:
        ev.append({"name": str(label), "cat": "transfer", "ph": "X", "pid": 1, "tid": link_tid[name],
                   "ts": t0 * us, "dur": (t1 - t0) * us})
    for stage, it, t0, t1 in result.allreduces:
        ev.append({"name": f"allreduce stage {stage} it {it}", "cat": "allreduce", "ph": "X", "pid": 1,
                   "tid": len(link_tid), "ts": t0 * us, "dur": (t1 - t0) * us})
    if result.allreduces:
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": len(link_tid), "args": {"name": "all-reduce"}})
    for d, steps in enumerate(result.memory):
        for t, nbytes in steps:
            ev.append({"name": f"memory pos {d}", "ph": "C", "pid": 2, "tid": 0, "ts": t * us,
                       "args": {"bytes": nbytes}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"model": result.plan_model, "cluster": result.plan_cluster, "schedule": result.schedule,
                          "iteration_time_s": result.iteration_time_s}}


def write_trace(result, path: str | Path) -> Path:
    """Write the Chrome trace-event JSON of ``result`` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace_events(result), separators=(",", ":")), encoding="utf-8")
    return path


#: file suffix -> matplotlib format of the Gantt chart (the suffix names what is written)
GANTT_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def gantt_format(path: str | Path) -> str:
    """The chart format named by ``path``'s suffix; SpecError for any other suffix.

    Writing PNG bytes into ``chart.pdf`` would be a silent wrong answer, so a suffix that
    is not one of GANTT_FORMATS is refused rather than guessed.
    """
    from bapipe.errors import SpecError

    fmt = GANTT_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise SpecError(str(path), None, "--gantt",
                        f"expected a file name ending {', '.join(GANTT_FORMATS)} (the suffix sets the format)")
    return fmt


def write_gantt(result, path: str | Path, max_labels: int = 600) -> Path:
    """Write a Gantt chart (PNG, PDF or SVG by suffix): one row per board, ops coloured by
    kind, labelled by micro-batch; below them one row per directed link that carried
    something (activations and gradients purple, ring all-reduce steps red) and one
    all-reduce row (each stage's ring from its start to its end).

    Labels are drawn only when there are at most ``max_labels`` ops (else they would
    overlap into noise); stalls are grey, all-reduces red on every board of their stage.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(path))
    fmt = gantt_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[int, str]] = [(d, b) for d, boards in enumerate(result.device_boards) for b in boards]
    link_rows = link_rows_of(result)
    rows_of: dict[int, list[int]] = {}
    for r, (d, _) in enumerate(rows):
        rows_of.setdefault(d, []).append(r)
    span = result.makespan_s or 1.0
    scale, unit = _time_unit(span)
    nrows = len(rows) + len(link_rows)
    height = min(40.0, 1.2 + 0.45 * nrows)
    fig, ax = plt.subplots(figsize=(14, height), dpi=100)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for d, kind, mb, chunk, t0, t1 in result.ops:
        for r in rows_of[d]:
            bars.setdefault((r, kind), []).append((t0 * scale, (t1 - t0) * scale))
    for d, t0, t1 in result.stalls:
        for r in rows_of[d]:
            bars.setdefault((r, "stall"), []).append((t0 * scale, (t1 - t0) * scale))
    for (r, kind), spans in sorted(bars.items()):
        ax.broken_barh(spans, (r - 0.4, 0.8), facecolors=COLOURS.get(kind, "#888888"),
                       edgecolor="white" if len(result.ops) < 4000 else "none", linewidth=0.3)
    for r, spans in enumerate(link_rows.values(), start=len(rows)):
        for kind, items in spans.items():
            ax.broken_barh([(t0 * scale, (t1 - t0) * scale) for t0, t1 in items], (r - 0.4, 0.8),
                           facecolors=COLOURS[kind], edgecolor="none")
    board_row = {b: r for r, (_, b) in enumerate(rows)}
    # an all-reduce involves the boards of its stage: a thin red bar along their rows
    for stage, it, t0, t1 in result.allreduces:
        for b in result.stage_boards.get(stage, []):
            if b in board_row:
                r = board_row[b]
                ax.broken_barh([(t0 * scale, (t1 - t0) * scale)], (r + 0.25, 0.15), facecolors=COLOURS["allreduce"])
    if len(result.ops) <= max_labels:
        for d, kind, mb, chunk, t0, t1 in result.ops:
            w = (t1 - t0) * scale
            if w <= 0:
                continue
            label = f"{mb}" + (f".{chunk}" if chunk else "")
            for r in rows_of[d]:
                ax.text((t0 * scale) + w / 2, r, label, ha="center", va="center", fontsize=6, color="white",
                        clip_on=True)
    ax.set_yticks(range(nrows))
    ax.set_yticklabels([f"{b} [{d}]" for d, b in rows] + list(link_rows), fontsize=7 if nrows > 16 else 9)
    ax.set_ylim(nrows - 0.5, -0.5)
    ax.set_xlim(0, span * scale)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{result.plan_model} on {result.plan_cluster}: {result.schedule}, m={result.microbatches}, "
                 f"{result.iterations} iteration(s), {result.iteration_time_s * scale:.4g} {unit}/iteration, "
                 f"bubble {result.bubble_busiest:.1%} (busiest board idle)", fontsize=10)
    handles = [Patch(color=COLOURS[k], label=k) for k in ("F", "B", "W", "stall", "allreduce", "transfer")
               if k in {kk for (_, kk) in bars} or (k == "allreduce" and result.allreduces)
               or (k == "transfer" and any("transfer" in v for v in link_rows.values()))]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.002, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    try:
        # format given so matplotlib writes exactly `path`, in the format its suffix names
        fig.savefig(path, format=fmt)
    finally:
        plt.close(fig)
    return path


def link_rows_of(result) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The Gantt chart's rows below the boards: per directed link that carried something (in
    the order the simulation first used it) its transfers ("transfer") and ring steps
    ("allreduce") as (start, end) spans, then one "all-reduce" row of the stages' rings."""
    rows: dict[str, dict[str, list]] = {f"link {ln.name}": {} for ln in result.links if ln.transfers}
    for name, t0, t1, label in result.transfers:
        kind = "allreduce" if str(label).startswith("allreduce") else "transfer"
        rows.setdefault(f"link {name}", {}).setdefault(kind, []).append((t0, t1))
    rows = {k: v for k, v in rows.items() if v}
    if result.allreduces:
        rows["all-reduce"] = {"allreduce": [(t0, t1) for _stage, _it, t0, t1 in result.allreduces]}
    return rows


def _time_unit(span_s: float) -> tuple[float, str]:
    """A readable unit for the x axis."""
    if span_s >= 1.0:
        return 1.0, "s"
    if span_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"
