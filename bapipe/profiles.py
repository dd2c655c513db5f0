"""Measured per-layer profiles (YAML or CSV): forward/backward time, activation and weight bytes.

The same four numbers PipeDream's profiler records per layer (forward and backward compute
time, activation size, parameter size), optionally per board type, so the planner can plan
from measurements instead of the analytic cost model. Formats are in docs/profiles.md.

YAML::

    model: vgg16            # informational
    batch: 64               # the samples each time was measured for (default 1)
    layers:                 # or  boards: {V100: {layers: [...]}, U250: {...}}
      - {name: conv1, fwd_ms: 1.2, bwd_ms: 2.5, activation_bytes: 205520896, param_bytes: 7168}

CSV (header row; ``#`` comments; optional ``board`` and ``batch`` columns)::

    layer,fwd_ms,bwd_ms,activation_bytes,param_bytes
    conv1,1.2,2.5,205520896,7168

Times may be given as ``fwd_s``/``fwd_ms``/``fwd_us`` (and ``bwd_*``); PipeDream's column
names (forward_compute_time and backward_compute_time in ms, activation_size,
parameter_size) are accepted too. Every layer of the model must appear exactly once.
"""
from __future__ import annotations

import csv
import difflib
import io
import json
import math
from pathlib import Path
from typing import Any

from .errors import SpecError
from .spec import Model
from .yamlio import Node, NodeList, load_file

#: accepted time fields and their factor to seconds
TIME_FIELDS = {"fwd": {"fwd_s": 1.0, "fwd_ms": 1e-3, "fwd_us": 1e-6, "forward_compute_time": 1e-3},
               "bwd": {"bwd_s": 1.0, "bwd_ms": 1e-3, "bwd_us": 1e-6, "backward_compute_time": 1e-3}}
#: accepted byte fields -> canonical name
BYTE_FIELDS = {"activation_bytes": "activation_bytes", "activation_size": "activation_bytes",
               "param_bytes": "param_bytes", "parameter_size": "param_bytes"}
NAME_FIELDS = ("name", "layer")
#: longest time a profile may give one layer for its batch (an hour: real layers take ms)
MAX_LAYER_S = 3600.0

Entry = dict[str, float]


class _Loc:
    """Where one record sits: file, line and a field prefix for messages."""

    def __init__(self, file: str, line: int | None, prefix: str, lines: dict[str, int] | None = None):
        self.file, self.line, self.prefix, self.lines = file, line, prefix, lines or {}

    def err(self, key: str | None, expected: str) -> SpecError:
        """A SpecError at ``key`` of this record (its own line when known)."""
        field = f"{self.prefix}.{key}" if key and self.prefix else (key or self.prefix or None)
        return SpecError(self.file, self.lines.get(key, self.line) if key else self.line, field, expected)


def _number(loc: _Loc, key: str, v: Any, integer: bool) -> float:
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise loc.err(key, f"expected a number, got {v.strip()!r}"[:120]) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise loc.err(key, f"expected a finite number, got {v!r}"[:120])
    if v < 0:
        raise loc.err(key, f"expected a number >= 0, got {v}")
    if integer:
        if v != int(v):
            raise loc.err(key, f"expected a whole number of bytes, got {v}")
        return int(v)
    return float(v)


def _entry(loc: _Loc, rec: dict[str, Any]) -> tuple[str, Entry]:
    """Validate one layer record (YAML mapping or CSV row) into canonical units."""
    names = [k for k in NAME_FIELDS if k in rec]
    if len(names) != 1 or not isinstance(rec[names[0]], str) or not rec[names[0]].strip():
        raise loc.err("name", "expected the layer's name (field 'name' or 'layer')")
    name = rec[names[0]].strip()
    out: Entry = {}
    for kind, fields in TIME_FIELDS.items():
        given = [k for k in fields if k in rec and rec[k] not in (None, "")]
        if len(given) != 1:
            raise loc.err(f"{kind}_s", f"expected exactly one of {', '.join(fields)}"
                                       + (f"; got {', '.join(given)}" if given else ""))
        k = given[0]
        out[f"{kind}_s"] = _number(loc, k, rec[k], False) * fields[k]
        if out[f"{kind}_s"] > MAX_LAYER_S:   # 1e300 ms once made a plan every later command refused
            raise loc.err(k, f"expected at most {MAX_LAYER_S:g} s for one layer on the profiled batch, "
                             f"got {out[f'{kind}_s']:g} s")
    for k, canon in BYTE_FIELDS.items():
        if k in rec and rec[k] not in (None, ""):
            if canon in out:
                raise loc.err(k, f"give {canon} once")
            out[canon] = _number(loc, k, rec[k], True)
    for canon in ("activation_bytes", "param_bytes"):
        if canon not in out:
            raise loc.err(canon, f"missing field '{canon}'")
    known = set(NAME_FIELDS) | set(BYTE_FIELDS) | {k for f in TIME_FIELDS.values() for k in f} | {"board", "batch"}
    extra = [k for k in rec if k not in known]
    if extra:
        raise loc.err(extra[0], f"unknown field '{extra[0]}'; expected name, fwd_s|fwd_ms|fwd_us, "
                                "bwd_s|bwd_ms|bwd_us, activation_bytes, param_bytes")
    return name, out


def _check_layers(model: Model, file: str, records: list[tuple[_Loc, str, Entry]], where: _Loc) -> dict[str, Entry]:
    """Every model layer exactly once; nothing else. Returns entries in model order."""
    seen: dict[str, Entry] = {}
    for loc, name, e in records:
        if name not in model.index:
            close = difflib.get_close_matches(name, list(model.index), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise loc.err("name", f"'{name}' is not a layer of model '{model.name}'{hint}")
        if name in seen:
            raise loc.err("name", f"layer '{name}' is profiled twice")
        seen[name] = e
    missing = [l.name for l in model.layers if l.name not in seen]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise where.err(None, f"no measurement for layer(s) {', '.join(missing[:3])}{more} of model "
                              f"'{model.name}' ({len(model.layers)} layers)")
    return {l.name: seen[l.name] for l in model.layers}


def _yaml_boards(doc: Any, file: str, require_batch: bool = False) -> tuple[dict[str | None, tuple[list, _Loc]], int]:
    if not isinstance(doc, Node):
        raise SpecError(file, None, None, "expected a mapping with 'layers' or 'boards'")
    allowed = {"model", "source", "batch", "layers", "boards", "description"}
    for k in doc:
        if k not in allowed:
            raise doc.error(k, f"unknown field '{k}'; expected one of {', '.join(sorted(allowed))}")
    if require_batch and "batch" not in doc:
        # a silent batch 1 would scale a batch-64 profile's times 64x when planning
        raise SpecError(file, None, "batch", "missing: the samples each time was measured for (e.g. batch: 64)")
    batch = doc.get("batch", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise doc.error("batch", f"expected an integer >= 1, got {batch!r}")
    if ("layers" in doc) == ("boards" in doc):
        raise doc.error(None, "give either 'layers' (one profile) or 'boards' (one profile per board type)")
    out: dict[str | None, tuple[list, _Loc]] = {}
    if "layers" in doc:
        out[None] = (doc["layers"], _Loc(file, doc.line_of("layers"), "layers"))
    else:
        boards = doc["boards"]
        if not isinstance(boards, Node) or not boards:
            raise doc.error("boards", "expected a mapping of board type -> {layers: [...]}")
        for b, v in boards.items():
            if not isinstance(v, Node) or set(v) != {"layers"}:
                raise boards.error(b, "expected a mapping with only 'layers'")
            out[b] = (v["layers"], _Loc(file, v.line_of("layers"), f"boards.{b}.layers"))
    return out, batch


def _from_yaml(path: Path, model: Model, require_batch: bool = False) -> tuple[dict[str | None, dict[str, Entry]], int]:
    file = str(path)
    doc = load_file(path)
    boards, batch = _yaml_boards(doc, file, require_batch)
    result = {}
    for b, (items, where) in boards.items():
        if not isinstance(items, NodeList) or not items:
            raise where.err(None, "expected a non-empty list of layer records")
        recs = []
        for i, it in enumerate(items):
            line = items.lines[i] if i < len(items.lines) else items.line
            loc = _Loc(file, line, f"{where.prefix}[{i}]")
            if not isinstance(it, Node):
                raise loc.err(None, "expected a mapping {name, fwd_s, bwd_s, activation_bytes, param_bytes}")
            loc.line, loc.lines = it.line or line, it.lines
            name, e = _entry(loc, dict(it))
            recs.append((loc, name, e))
        result[b] = _check_layers(model, file, recs, where)
    return result, batch


def _from_csv(path: Path, model: Model, require_batch: bool = False) -> tuple[dict[str | None, dict[str, Entry]], int]:
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(file, None, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(file, None, None, f"cannot read file ({type(e).__name__})") from None
    rows = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip() and not line.lstrip().startswith("#")]
    if not rows:
        raise SpecError(file, None, None, "expected a header row and one row per layer")
    header_line, header = rows[0]
    cols = [c.strip() for c in next(csv.reader(io.StringIO(header)))]
    if len(set(cols)) != len(cols):
        raise SpecError(file, header_line, "header", "duplicate column")
    if require_batch and "batch" not in cols:
        raise SpecError(file, header_line, "batch", "missing column: the samples each time was measured for")
    per_board: dict[str | None, list] = {}
    batches: set[int] = set()
    for line, text_row in rows[1:]:
        vals = next(csv.reader(io.StringIO(text_row)))
        if len(vals) != len(cols):
            raise SpecError(file, line, "row", f"expected {len(cols)} values ({', '.join(cols)}), got {len(vals)}")
        rec = {c: v.strip() for c, v in zip(cols, vals)}
        loc = _Loc(file, line, "")
        if "batch" in rec:
            b = _number(loc, "batch", rec["batch"], True)
            if b < 1:
                raise loc.err("batch", "expected an integer >= 1")
            batches.add(int(b))
        board = rec.get("board") or None
        name, e = _entry(loc, rec)
        per_board.setdefault(board, []).append((loc, name, e))
    if not per_board:
        raise SpecError(file, header_line, None, "expected one row per layer after the header")
    if len(batches) > 1:
        raise SpecError(file, None, "batch", f"expected one batch size for the whole file, got {sorted(batches)}")
    if None in per_board and len(per_board) > 1:
        raise SpecError(file, per_board[None][0][0].line, "board", "either every row names a board or none does")
    where = _Loc(file, header_line, "")
    return {b: _check_layers(model, file, recs, where) for b, recs in per_board.items()}, (batches.pop() if batches else 1)


def load_profiles(path: str, model: Model, batch: int | None = None,
                  require_batch: bool = False) -> dict[str | None, dict[str, Entry]]:
    """Every board's profile: {board type or None (any board): {layer: {fwd_s, bwd_s, activation_bytes,
    param_bytes}}}, layers in model order. With ``batch``, times and activation bytes are scaled
    linearly from the file's batch to ``batch`` samples (an approximation: docs/profiles.md).
    ``require_batch``: a file that does not say its batch is an error (the planner's use),
    instead of meaning batch 1."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        result, file_batch = _from_yaml(p, model, require_batch)
    elif p.suffix.lower() == ".csv":
        result, file_batch = _from_csv(p, model, require_batch)
    else:
        raise SpecError(str(path), None, "--profile", "expected a .yaml, .yml or .csv profile")
    if batch is not None and batch != file_batch:
        f = batch / file_batch
        result = {b: {n: {"fwd_s": e["fwd_s"] * f, "bwd_s": e["bwd_s"] * f,
                          "activation_bytes": int(round(e["activation_bytes"] * f)), "param_bytes": e["param_bytes"]}
                      for n, e in prof.items()} for b, prof in result.items()}
    return result


def load_profile(path: str, model: Model, board: str | None = None, batch: int | None = None,
                 require_batch: bool = False) -> dict[str, Entry]:
    """One profile: {layer: {fwd_s, bwd_s, activation_bytes, param_bytes}} in model order.

    A file without boards serves every board. A file with boards needs ``board`` (unless it
    has exactly one); naming a board it lacks is a SpecError listing the ones it has.
    ``require_batch`` as in :func:`load_profiles` (every command line reads with it: `bapipe
    profile` and `bapipe plan` take a file by the same rule).
    """
    all_ = load_profiles(path, model, batch, require_batch)
    if None in all_:
        return all_[None]
    if board is None:
        if len(all_) == 1:
            return next(iter(all_.values()))
        raise SpecError(str(path), None, "boards", f"the profile has boards {', '.join(all_)}; say which one")
    if board not in all_:
        raise SpecError(str(path), None, "boards", f"no profile for board type '{board}'; it has {', '.join(all_)}")
    return all_[board]


# --- PipeDream profiler output (graph.txt) -------------------------------------------------
#: one node line: "nodeK -- Description -- forward_compute_time=F, backward_compute_time=B,
#: activation_size=A, parameter_size=P[ -- stage_id=S]" (times in ms, sizes in bytes for
#: the profiled batch); edge lines start with a tab: "\tnodeA -- nodeB"
_PD_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def _pd_node(file: str, line: int, text: str) -> tuple[str, str, dict[str, float]]:
    parts = [x.strip() for x in text.split(" -- ")]
    if len(parts) < 3:
        raise SpecError(file, line, "node", "expected 'nodeK -- Description -- forward_compute_time=..., "
                                            "backward_compute_time=..., activation_size=..., parameter_size=...'")
    vals: dict[str, float] = {}
    for item in parts[2].split(","):
        k, _, v = item.strip().partition("=")
        if k in _PD_FIELDS:
            try:
                # a node with several outputs lists their sizes, "[a; b; c]": their sum
                parts_v = v.strip().strip("[]").split(";") if k == "activation_size" else [v]
                vals[k] = sum(float(x) for x in parts_v)
            except ValueError:
                raise SpecError(file, line, k, f"expected a number, got {v!r}") from None
            if not math.isfinite(vals[k]) or vals[k] < 0:
                raise SpecError(file, line, k, f"expected a finite number >= 0, got {v}")
    missing = [k for k in _PD_FIELDS if k not in vals]
    if missing:
        raise SpecError(file, line, missing[0], f"missing field '{missing[0]}'")
    if len(parts) > 3:   # the optimizer's output graph (-o DIR: gpus=N.txt) adds " -- stage_id=S"
        k, _, v = parts[3].partition("=")
        if k.strip() != "stage_id" or not v.strip().isdigit():
            raise SpecError(file, line, "stage_id", f"expected 'stage_id=<integer>', got {parts[3]!r}"[:120])
        vals["stage_id"] = int(v)
    return parts[0], parts[1], vals


def _check_batch(file: str, batch) -> None:
    """A profile's batch size: an integer >= 1 (the profiler files do not record it)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecError(file, None, "batch", f"expected the profiled batch size (an integer >= 1), got {batch!r}")


def _read_text(path) -> str:
    """A profiler file's text, or one line naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), None, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), None, None, f"cannot read file ({type(e).__name__})") from None

def import_pipedream_graph(path: str, batch: int, bytes_per_element: int = 4,
                           name: str | None = None) -> tuple[str, str]:
    """PipeDream's profiler graph (graph.txt) -> (model YAML text, profile YAML text).

    Every node but the inputs becomes an ``opaque`` layer (its per-sample output size from
    activation_size / batch / ``bytes_per_element``, its parameters from parameter_size)
    reading its graph predecessors, in a deterministic topological order (node number on
    ties). Input nodes become model inputs and carry no compute (their profiled time is
    data loading). The profile keeps the measured times and bytes as given, for ``batch``
    samples. ``batch`` is required: graph.txt does not record it.
    """
    file = str(path)
    _check_batch(file, batch)
    nodes, edges = _pd_read(file, _read_text(path))
    preds, succs = _pd_wire(file, nodes, edges)
    inputs, order = _pd_order(file, nodes, preds, succs)
    model_text, prof_text = _pd_texts(Path(path), nodes, preds, inputs, order, batch, bytes_per_element,
                                      name or Path(path).stem)
    _check_pair(file, model_text, prof_text)
    return model_text, prof_text


def _pd_read(file: str, text: str) -> tuple[dict, list]:
    """graph.txt's node lines ({id: (description, fields, line)}) and edge lines ([(a, b, line)])."""
    nodes: dict[str, tuple[str, dict[str, float], int]] = {}
    edges: list[tuple[str, str, int]] = []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        if raw.startswith("\t") or raw.startswith("    "):
            a, sep, b = raw.strip().partition(" -- ")
            if not sep or not a or not b:
                raise SpecError(file, i, "edge", f"expected '<tab>nodeA -- nodeB', got {raw.strip()!r}"[:120])
            edges.append((a.strip(), b.strip(), i))
            continue
        nid, desc, vals = _pd_node(file, i, raw)
        if nid in nodes:
            raise SpecError(file, i, "node", f"node '{nid}' is listed twice")
        nodes[nid] = (desc, vals, i)
    if not nodes:
        raise SpecError(file, None, None, "expected node lines 'nodeK -- Description -- forward_compute_time=...'")
    return nodes, edges


def _pd_wire(file: str, nodes: dict, edges: list) -> tuple[dict, dict]:
    """Each node's predecessors and successors; unused outputs of a multi-output node (a sink
    "__getitem__(k)", e.g. an LSTM's final state) are dropped from ``nodes``, as PipeDream's
    optimizer drops them (nothing reads them)."""
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b, line in edges:
        for x in (a, b):
            if x not in nodes:
                raise SpecError(file, line, "edge", f"'{x}' is not a node of the graph")
        preds[b].append(a)
        succs[a].append(b)
    for n in [n for n in nodes if not succs[n] and nodes[n][0].startswith("__getitem__") and preds[n]]:
        for a in preds[n]:
            succs[a].remove(n)
        del nodes[n], preds[n], succs[n]
    return preds, succs


def _pd_order(file: str, nodes: dict, preds: dict, succs: dict) -> tuple[list, list]:
    """The model inputs and every node in a deterministic topological order (Kahn's algorithm,
    stage id then node number first)."""
    def key(n: str) -> tuple:
        # a graph the optimizer wrote (stage ids) is ordered stage by stage, so that each of
        # its stages is a contiguous layer range (a stage is a downset minus the previous
        # ones, so every predecessor sits in the same or an earlier stage)
        digits = "".join(ch for ch in n if ch.isdigit())
        return (nodes[n][1].get("stage_id", 0), int(digits) if digits else 0, n)

    # model inputs: Input nodes, and sources that do no work and hold no weights (GNMT's
    # initial "hidden" state): PipeDream's optimizer gives both no compute
    def _free(n: str) -> bool:
        v = nodes[n][1]
        return v["forward_compute_time"] == v["backward_compute_time"] == v["parameter_size"] == 0
    inputs = sorted((n for n in nodes if not preds[n] and (
        nodes[n][0].split("(")[0].strip().lower().startswith("input") or _free(n))), key=key)
    if not inputs:
        raise SpecError(file, None, "Input", "expected an Input node (a node described 'Input' with no predecessor)")
    indeg = {n: len(preds[n]) for n in nodes}
    ready = sorted((n for n in nodes if indeg[n] == 0), key=key)
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
                ready.sort(key=key)
    if len(order) != len(nodes):
        raise SpecError(file, None, "edge", "the graph has a cycle")
    stray = [n for n in order if not preds[n] and n not in inputs]
    if stray:
        raise SpecError(file, nodes[stray[0]][2], "node", f"'{stray[0]}' has no predecessor and is not an Input node")
    return inputs, order


def _pd_texts(path: Path, nodes: dict, preds: dict, inputs: list, order: list, batch: int,
              bytes_per_element: int, mname: str) -> tuple[str, str]:
    """The model YAML (inputs, one opaque layer a node) and the profile YAML (measured times
    and bytes as PipeDream recorded them) of an ordered graph."""
    def elems(nbytes: float) -> int:
        return max(1, int(round(nbytes / batch / bytes_per_element)))

    # names are data: quoted as JSON strings (valid YAML), so a node id such as 'true', 'null',
    # '12' or 'a: b' stays the string it is instead of becoming a bool, None, int or mapping
    q = json.dumps
    mlines = [f"# imported from PipeDream profiler output {path.name} (batch {batch}, "
              f"{bytes_per_element} bytes per element) by bapipe.profiles.import_pipedream_graph",
              f"name: {q(mname)}", "inputs:"]
    for n in inputs:
        mlines.append(f"  - {{name: {q(n)}, shape: [{elems(nodes[n][1]['activation_size'])}]}}")
    mlines.append("layers:")
    plines = [f"# measured times and bytes from {path.name}, as PipeDream recorded them",
              f"model: {q(mname)}", f"batch: {batch}", "layers:"]
    for n in order:
        if n in inputs:
            continue
        desc, v, _line = nodes[n]
        params = int(round(v["parameter_size"] / bytes_per_element))
        # the per-sample fwd_s/bwd_s of the opaque layer are informational: the profile's
        # measured times (for the whole batch) are what the planner uses
        mlines.append(f"  - {{name: {q(n)}, type: opaque, inputs: [{', '.join(map(q, preds[n]))}], "
                      f"shape: [{elems(v['activation_size'])}], params: {params}, "
                      f"fwd_s: {v['forward_compute_time'] * 1e-3 / batch:.6g}, "
                      f"bwd_s: {v['backward_compute_time'] * 1e-3 / batch:.6g}}}  # {desc}")
        plines.append(f"  - {{name: {q(n)}, fwd_ms: {v['forward_compute_time']:g}, "
                      f"bwd_ms: {v['backward_compute_time']:g}, activation_bytes: {int(round(v['activation_size']))}, "
                      f"param_bytes: {int(round(v['parameter_size']))}}}")
    return "\n".join(mlines) + "\n", "\n".join(plines) + "\n"


def _check_pair(file: str, model_text: str, prof_text: str) -> None:
    """Read the written pair back as `bapipe plan` will: what it would refuse is refused now,
    naming the graph file, instead of an import that writes files the planner rejects."""
    import tempfile

    from .spec import model_from_text

    try:
        model = model_from_text(model_text, file)
        with tempfile.TemporaryDirectory(prefix="bapipe-pd-") as d:
            (Path(d) / "profile.yaml").write_text(prof_text, encoding="utf-8")
            load_profiles(str(Path(d) / "profile.yaml"), model, batch=1, require_batch=True)
    except SpecError as e:
        raise SpecError(file, None, "graph", f"imports as a model the planner refuses: {e.expected}"[:400]) from None


# --- PyTorch profiler per-module table (CSV) -------------------------------------------------
#: the columns of the table docs/profiles.md's snippet writes from torch.profiler's key_averages()
TORCH_COLUMNS = ("name", "calls", "cpu_time_total_us", "device_time_total_us")
#: record_function labels the snippet puts around each module's forward and backward
TORCH_LABELS = {"bapipe.fwd.": "fwd", "bapipe.bwd.": "bwd"}
#: layer types with no work of their own (views): a table may leave them out (0 s)
VIEW_TYPES = frozenset({"flatten", "reshape"})


def import_torch_table(path: str, model: Model, batch: int, clock: str = "device",
                       bytes_per_element: int = 4) -> str:
    """A PyTorch profiler per-module table (CSV, docs/profiles.md) -> profile YAML text.

    Rows labelled ``bapipe.fwd.<layer>`` / ``bapipe.bwd.<layer>`` give each layer's time per
    call: total / calls of the ``clock`` column (``device``: device_time_total_us, what a GPU
    spent; ``cpu``: cpu_time_total_us). Other rows (aten ops) are ignored. Every layer of
    ``model`` needs both rows, except views (flatten, reshape: 0 s). The table records no
    sizes, so bytes are the model's: activation_bytes = output elements x batch x
    ``bytes_per_element``, param_bytes = parameters x ``bytes_per_element``. ``batch``: the
    samples each call processed (required; the table does not record it)."""
    file = str(path)
    _check_batch(file, batch)
    if clock not in ("device", "cpu"):
        raise SpecError(file, None, "clock", f"expected device or cpu, got {clock!r}")
    text = _read_text(path)
    rows = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not rows:
        raise SpecError(file, None, None, f"expected a header row ({','.join(TORCH_COLUMNS)}) and one row per label")
    hline, header = rows[0]
    cols = [c.strip() for c in next(csv.reader(io.StringIO(header)))]
    missing = [c for c in TORCH_COLUMNS if c not in cols]
    if missing:
        raise SpecError(file, hline, "header", f"missing column '{missing[0]}'; expected {','.join(TORCH_COLUMNS)}")
    col = f"{clock}_time_total_us"
    times: dict[tuple[str, str], float] = {}
    for line, raw in rows[1:]:
        vals = next(csv.reader(io.StringIO(raw)))
        if len(vals) != len(cols):
            raise SpecError(file, line, "row", f"expected {len(cols)} values ({', '.join(cols)}), got {len(vals)}")
        rec = {c: v.strip() for c, v in zip(cols, vals)}
        kind = next((k for p, k in TORCH_LABELS.items() if rec["name"].startswith(p)), None)
        if kind is None:
            continue
        loc = _Loc(file, line, "")
        layer = rec["name"].split(".", 2)[2]
        if layer not in model.index:
            close = difflib.get_close_matches(layer, list(model.index), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise loc.err("name", f"'{layer}' is not a layer of model '{model.name}'{hint}")
        if (layer, kind) in times:
            raise loc.err("name", f"'{rec['name']}' appears twice")
        calls = _number(loc, "calls", rec["calls"], True)
        if calls < 1:
            raise loc.err("calls", "expected at least 1 call")
        total = _number(loc, col, rec[col], False)
        if total == 0 and clock == "device":
            raise loc.err(col, "is 0: no device time was recorded (a CPU run?); import with --clock cpu")
        times[(layer, kind)] = total / calls * 1e-6
    lines = [f"# measured by torch.profiler ({clock} time per call) in {Path(path).name}; bytes from the model "
             f"({bytes_per_element} bytes per element); imported by bapipe.profiles.import_torch_table",
             f"model: {model.name}", f"batch: {batch}", "layers:"]
    for l in model.layers:
        got = [(l.name, k) in times for k in ("fwd", "bwd")]
        if not all(got) and not (l.type in VIEW_TYPES and not any(got)):
            what, label = ("forward", "fwd") if not got[0] else ("backward", "bwd")
            raise SpecError(file, None, "name", f"no {what} row 'bapipe.{label}.{l.name}' for layer "
                                                f"'{l.name}' of model '{model.name}' (only flatten/reshape views "
                                                f"may be left out)")
        f_s, b_s = times.get((l.name, "fwd"), 0.0), times.get((l.name, "bwd"), 0.0)
        lines.append(f"  - {{name: {l.name}, fwd_s: {f_s:.9g}, bwd_s: {b_s:.9g}, "
                     f"activation_bytes: {l.out_elems * batch * bytes_per_element}, "
                     f"param_bytes: {l.params * bytes_per_element}}}")
    return "\n".join(lines) + "\n"


def main_torch(argv: list[str]) -> int:
    """``python -m bapipe.profiles torch-table TABLE.csv --model MODEL --batch 64 -o profile.yaml``."""
    import argparse
    import sys

    from .models import load_model

    ap = argparse.ArgumentParser(prog="python -m bapipe.profiles torch-table",
                                 description="import a PyTorch profiler per-module table (CSV) as a profile")
    ap.add_argument("table", help="CSV written by the snippet in docs/profiles.md")
    ap.add_argument("--model", required=True, help="the model the labels name (zoo name, .yaml or .onnx)")
    ap.add_argument("--batch", type=int, required=True, help="the samples each profiled call processed")
    ap.add_argument("--clock", choices=("device", "cpu"), default="device",
                    help="which time column to read (default: device)")
    ap.add_argument("--bytes-per-element", type=int, default=4, help="bytes of one tensor element (default 4)")
    ap.add_argument("-o", "--output", required=True, help="profile YAML to write")
    args = ap.parse_args(argv)
    try:
        text = import_torch_table(args.table, load_model(args.model), args.batch, args.clock, args.bytes_per_element)
        Path(args.output).write_text(text, encoding="utf-8")
    except SpecError as e:
        print(f"python -m bapipe.profiles torch-table: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"python -m bapipe.profiles torch-table: {args.output}: -o: cannot write ({e.strerror or e})",
              file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bapipe.profiles graph.txt --batch 64 -o DIR``: write DIR/model.yaml and
    DIR/profile.yaml (then ``bapipe plan DIR/model.yaml CLUSTER --profile DIR/profile.yaml``).
    ``python -m bapipe.profiles torch-table ...``: see :func:`main_torch`."""
    import argparse
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["torch-table"]:
        return main_torch(argv[1:])

    ap = argparse.ArgumentParser(prog="python -m bapipe.profiles",
                                 description="import PipeDream profiler output (graph.txt) as a model + profile pair")
    ap.add_argument("graph")
    ap.add_argument("--batch", type=int, required=True, help="the batch size the graph was profiled with")
    ap.add_argument("--bytes-per-element", type=int, default=4)
    ap.add_argument("-o", "--output", required=True, help="directory for model.yaml and profile.yaml")
    args = ap.parse_args(argv)
    out = Path(args.output)
    try:
        if out.exists() and not out.is_dir():
            raise SpecError(args.output, None, "-o", "expected a folder for model.yaml and profile.yaml, got a file")
        model_text, prof_text = import_pipedream_graph(args.graph, args.batch, args.bytes_per_element)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.yaml").write_text(model_text, encoding="utf-8")
        (out / "profile.yaml").write_text(prof_text, encoding="utf-8")
    except SpecError as e:
        print(f"python -m bapipe.profiles: {e}", file=sys.stderr)
        return 2
    except OSError as e:   # the folder cannot be made or written
        print(f"python -m bapipe.profiles: {args.output}: -o: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"wrote {out / 'model.yaml'} and {out / 'profile.yaml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
