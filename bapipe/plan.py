"""plan.yaml: the one artefact the simulator, codegen, RTL and host driver all read.

The planner writes it; nobody downstream re-derives a decision made here (folding,
partition, schedule, micro-batching, replication). ``load_plan`` validates a file and
names the field on any mistake.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .schedules import SCHEDULES
from .yamlio import Fields, Node, load_file

PLAN_VERSION = 1
MODES = ("train", "inference")
STYLES = ("dataflow", "time-multiplexed", "gpu")
FORMATS = ("fixed16", "int8", "fp16", "bf16", "fp32")


@dataclass
class Folding:
    """Parallelism of one layer's engine on its board: PE output rows x SIMD input lanes of a
    matrix-vector unit (FINN), or ``lanes`` elements a cycle of an element-wise engine."""

    pe: int = 1
    simd: int = 1
    lanes: int | None = None        # element-wise engines only (plan.yaml: {lanes: n})

    @property
    def ew_lanes(self) -> int:
        """Elements an element-wise engine takes a cycle: ``lanes`` (older plans: pe x simd)."""
        return self.lanes if self.lanes is not None else self.pe * self.simd

    def to_yaml(self) -> dict:
        """{lanes} for element-wise engines, {pe, simd} for matrix-vector units."""
        return {"lanes": self.lanes} if self.lanes is not None else {"pe": self.pe, "simd": self.simd}


@dataclass
class Stage:
    """A contiguous run of layers on one or more boards.

    ``boards`` holds every board of the stage: ``replicas`` data-parallel copies, each a
    mesh of ``prod(mesh)`` boards (intra-layer parallel); boards[r*mesh_size:(r+1)*mesh_size]
    is replica r. With an interleaved schedule a board appears in several stages (chunks).
    Times are per micro-batch on one replica.
    """

    index: int
    layers: list[str]
    first: int                      # position of the first layer in the model
    last: int                       # position of the last layer (inclusive)
    boards: list[str]
    board_type: str
    replicas: int = 1
    mesh: list[int] = field(default_factory=lambda: [1])
    layout: str | None = None       # resharding layout of the stage's output on its mesh
    chunk: int = 0                  # interleaved: model chunk held by the device
    device: int = 0                 # pipeline position (0..p-1) that runs this stage
    style: str = "dataflow"
    folding: dict[str, Folding] = field(default_factory=dict)
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    time_s: float = 0.0             # fwd_s + bwd_s (train) or fwd_s (inference)
    send_bytes: int = 0             # activation bytes per micro-batch to the next stage
    send_s: float = 0.0             # link time for them
    allreduce_s: float = 0.0        # gradient all-reduce among replicas, per iteration
    memory_bytes: int = 0           # peak per board: weights + optimizer + stashes + buffers
    weight_bytes: int = 0
    stash_bytes: int = 0
    stashes: int = 0
    resources: dict[str, int] = field(default_factory=dict)   # dsp, bram36, uram, lut per board
    cycles: dict[str, int] = field(default_factory=dict)      # fwd / bwd cycles per micro-batch


@dataclass
class Plan:
    """A complete pipeline plan for one model on one cluster."""

    model: str
    model_fingerprint: str
    cluster: str
    cluster_fingerprint: str
    mode: str = "train"
    schedule: str = "1f1b"
    chunks: int = 1                 # v for the interleaved schedule
    microbatches: int = 1
    microbatch_size: int = 1
    global_batch: int = 1
    number_format: str = "fixed16"
    optimizer: str = "sgd"
    utilisation_cap: float = 0.8
    stages: list[Stage] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)   # iteration_time_s, throughput_samples_per_s, ...
    baselines: dict[str, Any] = field(default_factory=dict)
    lower_bound_s: float = 0.0
    opaque: dict[str, list[float]] = field(default_factory=dict)  # ONNX op -> [fwd_s, bwd_s] given at plan time
    version: int = PLAN_VERSION

    @property
    def devices(self) -> int:
        """Pipeline depth p (distinct pipeline positions)."""
        return len({s.device for s in self.stages})

    def to_dict(self) -> dict:
        """Plain dict (the YAML form)."""
        d = asdict(self)
        for st, s in zip(d["stages"], self.stages):
            st["folding"] = {k: f.to_yaml() for k, f in s.folding.items()}
        return d

    def dumps(self) -> str:
        """Deterministic YAML text."""
        return yaml.safe_dump(_clean(self.to_dict()), sort_keys=False, default_flow_style=None, width=100)

    def save(self, path: str | Path) -> None:
        """Write plan.yaml."""
        Path(path).write_text(self.dumps(), encoding="utf-8")

    def fingerprint(self) -> str:
        """sha256 of the plan's canonical JSON (goes into generated file headers)."""
        return hashlib.sha256(json.dumps(_clean(self.to_dict()), sort_keys=True).encode()).hexdigest()


def _clean(obj: Any) -> Any:
    """Tuples to lists, floats rounded to 12 significant digits so files are stable."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.12g}")
    return obj


def _stage(node: Any, file: str, i: int, line: int | None) -> Stage:
    if not isinstance(node, Node):
        raise SpecError(file, line, f"stages[{i}]", "expected a mapping")
    f = Fields(node, "stage")
    fold_node = f.mapping("folding", Node())
    folding = {}
    for lname, fv in fold_node.items():
        if not isinstance(fv, Node):
            raise fold_node.error(lname, "expected {pe, simd}")
        ff = Fields(fv)
        if "lanes" in fv:
            folding[lname] = Folding(lanes=ff.int("lanes", min=1))
        else:
            folding[lname] = Folding(ff.int("pe", 1), ff.int("simd", 1))
        ff.done()
    st = Stage(
        index=f.int("index", min=0), layers=list(_strs(f, "layers")), first=f.int("first", min=0),
        last=f.int("last", min=0), boards=list(_strs(f, "boards")), board_type=f.str("board_type"),
        replicas=f.int("replicas", 1), mesh=list(f.ints("mesh", (1,))),
        layout=f.str("layout", None) if node.get("layout") is not None else f.raw("layout", None),
        chunk=f.int("chunk", 0, min=0), device=f.int("device", 0, min=0),
        style=f.str("style", "dataflow", choices=STYLES), folding=folding,
        fwd_s=f.num("fwd_s", 0.0, positive=False, min=0), bwd_s=f.num("bwd_s", 0.0, positive=False, min=0),
        time_s=f.num("time_s", 0.0, positive=False, min=0), send_bytes=f.int("send_bytes", 0, min=0),
        send_s=f.num("send_s", 0.0, positive=False, min=0), allreduce_s=f.num("allreduce_s", 0.0, positive=False, min=0),
        memory_bytes=f.int("memory_bytes", 0, min=0), weight_bytes=f.int("weight_bytes", 0, min=0),
        stash_bytes=f.int("stash_bytes", 0, min=0), stashes=f.int("stashes", 0, min=0),
        resources=dict(f.mapping("resources", Node())), cycles=dict(f.mapping("cycles", Node())),
    )
    f.done()
    if st.last < st.first or len(st.layers) != st.last - st.first + 1:
        raise f.err("layers", f"expected {st.last - st.first + 1} layer names for positions {st.first}..{st.last}")
    return st


def _whole_stage(node: Any, file: str, i: int) -> Any:
    """Every stage field must be present: `bapipe plan` (and Plan.save) always write them all,
    so a missing one means a truncated or hand-cut file, whose defaults (zero times, no
    cycles) would otherwise be simulated as if they were the plan's."""
    if isinstance(node, Node):
        missing = [f.name for f in fields(Stage) if f.name not in node]
        if missing:
            raise node.error(None, f"missing field '{missing[0]}' of stage {i} (a plan written by "
                                   "`bapipe plan` has every field; is the file truncated?)")
    return node


def _strs(f: Fields, key: str) -> list[str]:
    v = f.list(key)
    if not all(isinstance(x, str) for x in v):
        raise f.err(key, "expected a list of names")
    return v


def _opaque(node: Node) -> dict[str, list[float]]:
    out = {}
    for k, v in node.items():
        ok = isinstance(v, list) and len(v) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in v)
        if not ok:
            raise node.error(k, "expected [fwd_s, bwd_s], two non-negative numbers")
        out[str(k)] = [float(x) for x in v]
    return out


def parse_plan(node: Any, file: str) -> Plan:
    """Validate a plan document."""
    if not isinstance(node, Node):
        raise SpecError(file, None, None, "expected a plan mapping (written by `bapipe plan`)")
    f = Fields(node, "plan")
    version = f.int("version", PLAN_VERSION)
    if version != PLAN_VERSION:
        raise f.err("version", f"expected plan version {PLAN_VERSION}, got {version}")
    stages_node = f.list("stages")
    plan = Plan(
        model=f.str("model"), model_fingerprint=f.str("model_fingerprint"), cluster=f.str("cluster"),
        cluster_fingerprint=f.str("cluster_fingerprint"), mode=f.str("mode", "train", choices=MODES),
        schedule=f.str("schedule", "1f1b", choices=SCHEDULES), chunks=f.int("chunks", 1),
        microbatches=f.int("microbatches", 1), microbatch_size=f.int("microbatch_size", 1),
        global_batch=f.int("global_batch", 1), number_format=f.str("number_format", "fixed16", choices=FORMATS),
        optimizer=f.str("optimizer", "sgd", choices=("sgd", "adam")),
        utilisation_cap=f.num("utilisation_cap", 0.8),
        stages=[_stage(_whole_stage(s, file, i), file, i, stages_node.lines[i] if i < len(stages_node.lines) else None)
                for i, s in enumerate(stages_node)],
        predicted=dict(f.mapping("predicted", Node())), baselines=dict(f.mapping("baselines", Node())),
        lower_bound_s=f.num("lower_bound_s", 0.0, positive=False, min=0), version=version,
        opaque=_opaque(f.mapping("opaque", Node())),
    )
    f.done()
    prev_last = -1
    for i, s in enumerate(plan.stages):
        if s.index != i:
            raise SpecError(file, stages_node.lines[i] if i < len(stages_node.lines) else None,
                            f"stages[{i}].index", f"expected {i}")
        if s.first != prev_last + 1:
            raise SpecError(file, stages_node.lines[i] if i < len(stages_node.lines) else None,
                            f"stages[{i}].first", f"expected {prev_last + 1} (stages must cover the layers in order)")
        prev_last = s.last
    return plan


def load_plan(path: str | Path) -> Plan:
    """Read and validate plan.yaml."""
    return parse_plan(load_file(path), str(path))


def resolve(plan: Plan, plan_file: str | None = None):
    """Load the plan's model and cluster and check they are the ones it was made for.

    Returns (model, cluster). A plan for another cluster or a changed model is refused.
    With ``plan_file`` (every command passes the file it loaded) the plan is then checked
    in full by :func:`validate`; a Plan built in memory (tests, hand-made pipelines) gets
    the structural checks only: its stages cover the model and name real boards.
    """
    strict = plan_file is not None
    plan_file = plan_file or "<plan>"
    from .spec import load_model
    from fpga_models.cluster import load_cluster  # lazy: the spine does not import below at load time

    model = load_model(plan.model, opaque={k: tuple(v) for k, v in plan.opaque.items()} or None)
    if model.fingerprint() != plan.model_fingerprint:
        raise SpecError(plan_file, None, "model_fingerprint",
                        f"expected the fingerprint of model '{plan.model}': this plan was made for another "
                        "model or an earlier version of it; re-run `bapipe plan`")
    cluster = load_cluster(plan.cluster)
    if cluster.fingerprint() != plan.cluster_fingerprint:
        raise SpecError(plan_file, None, "cluster_fingerprint",
                        f"expected the fingerprint of cluster '{plan.cluster}': this plan was made for another "
                        "cluster or an earlier version of it; re-run `bapipe plan`")
    validate(plan, model, cluster, plan_file, strict=strict)
    return model, cluster


#: no stage time or iteration time above this (s): larger values are corrupt files, and the
#: simulator's arithmetic on them would overflow (fwd_s 1e300) or run for ever
MAX_SECONDS = 1e9
#: relative tolerance of derived fields (time_s = fwd_s + bwd_s) after the 12-digit rounding
_REL_TOL = 1e-6
#: predicted.* fields that downstream commands read as numbers
_PREDICTED_NUMBERS = ("iteration_time_s", "throughput_samples_per_s", "bubble_fraction", "objective_s",
                      "latency_s", "peak_memory_bytes")
#: plan resources key -> the board's usable amount (the planner never budgets beyond it)
_RESOURCE_LIMITS = {"dsp": "usable_dsp", "lut": "usable_lut", "bram36": "usable_bram36", "uram": "usable_uram",
                    "offchip_bytes": "offchip_bytes"}


def validate(plan: Plan, model, cluster, plan_file: str = "plan.yaml", strict: bool = True) -> None:
    """Check a parsed plan against its model and cluster; SpecError names the first wrong field.

    A plan is trusted downstream (the simulator replays its times, codegen builds its
    foldings, the host runs its batch fields), so a hand edit, a truncation or a copy onto
    another cluster must be refused here rather than produce a confident wrong answer:
    stages cover exactly the model's layers by name; boards exist, have the stage's type and
    count (replicas x mesh) and belong to one pipeline position; every layer of an FPGA stage
    has a legal folding; times are finite, bounded and consistent; resources and memory fit
    the board; and the batch fields agree.

    ``strict=False`` (a Plan built in memory by a test or a hand-made pipeline, which may
    use RTL-only shapes such as several stages taking turns on one board) checks only the
    layer coverage, the boards and their types.
    """
    def err(field: str, expected: str) -> SpecError:
        return SpecError(plan_file, None, field, expected)

    if not plan.stages:
        raise err("stages", "expected at least one stage")
    if strict:
        _check_batch(plan, err)
        _check_layout(plan, err)
    n = len(model.layers)
    last = plan.stages[-1].last
    if last != n - 1:
        raise err(f"stages[{len(plan.stages) - 1}].last",
                  f"expected {n - 1}: the stages must cover all {n} layers of model '{plan.model}' "
                  f"(they end at layer {last}; is the file truncated?)")
    boards = {b.name: b.board for b in cluster.boards}
    owner: dict[str, int] = {}
    for s in plan.stages:
        _check_stage(plan, s, model, boards, owner, err, strict)


def _check_batch(plan: Plan, err) -> None:
    """Batch fields: global_batch = microbatches x microbatch_size, chunks only when interleaved."""
    if plan.global_batch != plan.microbatches * plan.microbatch_size:
        raise err("global_batch", f"expected microbatches x microbatch_size = {plan.microbatches} x "
                                  f"{plan.microbatch_size} = {plan.microbatches * plan.microbatch_size}, "
                                  f"got {plan.global_batch}")
    if plan.schedule != "interleaved" and plan.chunks != 1:
        raise err("chunks", f"expected 1 (chunks apply to the interleaved schedule only), got {plan.chunks}")
    if not 0 < plan.utilisation_cap <= 1:
        raise err("utilisation_cap", f"expected a fraction in (0, 1], got {plan.utilisation_cap}")
    if not 0 <= plan.lower_bound_s <= MAX_SECONDS:
        raise err("lower_bound_s", f"expected 0..{MAX_SECONDS:g} s, got {plan.lower_bound_s}")
    for k in _PREDICTED_NUMBERS:
        v = plan.predicted.get(k)
        if k in plan.predicted and not _finite_number(v, MAX_SECONDS if k.endswith("_s") else None):
            raise err(f"predicted.{k}", f"expected a finite number >= 0, got {v!r}")
    for name, b in plan.baselines.items():
        if isinstance(b, dict) and "infeasible" in b:
            continue  # the planner records why a baseline has no time
        v = b.get("iteration_time_s") if isinstance(b, dict) else None
        if not _finite_number(v, MAX_SECONDS):
            raise err(f"baselines.{name}.iteration_time_s", f"expected a finite number >= 0, got {v!r}")


def _finite_number(v: Any, top: float | None = None) -> bool:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return ok and (top is None or v <= top)


def _check_layout(plan: Plan, err) -> None:
    """Pipeline positions 0..p-1; stage i at device i (or chunk i//p, device i%p when interleaved)."""
    p = plan.devices
    devs = sorted({s.device for s in plan.stages})
    if devs != list(range(p)):
        raise err("stages.device", f"expected pipeline positions 0..{p - 1}, got {devs}")
    v = plan.chunks if plan.schedule == "interleaved" else 1
    if len(plan.stages) != p * v:
        raise err("chunks", f"expected {p * v} stages for {p} pipeline positions x {v} chunks, got {len(plan.stages)}")
    for i, s in enumerate(plan.stages):
        want = (i // p, i % p) if v > 1 else (0, i)
        if (s.chunk, s.device) != want:
            raise err(f"stages[{i}].device", f"expected chunk {want[0]}, device {want[1]}; "
                                             f"got chunk {s.chunk}, device {s.device}")


def _check_stage(plan: Plan, s: Stage, model, boards: dict, owner: dict, err, strict: bool = True) -> None:
    """One stage against the model (layer names, foldings) and the cluster (boards, resources)."""
    from fpga_models.boards import on_chip_bytes

    at = f"stages[{s.index}]"
    want = [l.name for l in model.layers[s.first:s.last + 1]]
    if s.last >= len(model.layers) or s.layers != want:
        bad = next((i for i, (a, b) in enumerate(zip(s.layers, want)) if a != b), min(len(s.layers), len(want)))
        got = s.layers[bad] if bad < len(s.layers) else "nothing"
        exp = want[bad] if bad < len(want) else "no layer"
        raise err(f"{at}.layers[{bad}]", f"expected '{exp}' (layer {s.first + bad} of model '{plan.model}'), "
                                         f"got '{got}'")
    size = s.replicas * math.prod(s.mesh)
    if not s.boards or (strict and (len(s.boards) != size or len(set(s.boards)) != len(s.boards))):
        raise err(f"{at}.boards", f"expected {size} distinct boards (replicas {s.replicas} x mesh "
                                  f"{'x'.join(map(str, s.mesh))}), got {len(s.boards)}")
    for b in s.boards:
        if b not in boards:
            raise err(f"{at}.boards", f"board '{b}' is not in cluster '{plan.cluster}'")
        if boards[b].name != s.board_type:
            raise err(f"{at}.board_type", f"expected '{boards[b].name}' (the type of {b} in cluster "
                                          f"'{plan.cluster}'), got '{s.board_type}'")
        if strict and owner.setdefault(b, s.device) != s.device:
            raise err(f"{at}.boards", f"board '{b}' already runs pipeline position {owner[b]}")
    if not strict:
        return
    board = boards[s.boards[0]]
    gpu = board.kind == "gpu"
    if gpu != (s.style == "gpu"):
        raise err(f"{at}.style", f"expected {'gpu' if gpu else 'dataflow or time-multiplexed'} on a "
                                 f"{board.name} ({board.kind}), got '{s.style}'")
    extra = sorted(set(s.folding) - set(s.layers))
    if extra:
        raise err(f"{at}.folding.{extra[0]}", f"expected foldings of the stage's layers only")
    if not gpu:
        for l in model.layers[s.first:s.last + 1]:
            f = s.folding.get(l.name)
            if f is None and not s.cycles:
                continue  # a hand-made stage without cycles: codegen's documented 1x1 default
            if f is None:  # the plan's cycles were computed for a folding it no longer states
                raise err(f"{at}.folding", f"missing folding of layer '{l.name}' (expected {{pe, simd}})")
            if not _legal_folding(l, f):
                raise err(f"{at}.folding.{l.name}", f"expected a legal folding of {l.type} layer '{l.name}' "
                                                    f"({_folding_rule(l)}), got {f.to_yaml()}")
    train = plan.mode == "train"
    for k in ("fwd_s", "bwd_s", "time_s", "send_s", "allreduce_s"):
        if getattr(s, k) > MAX_SECONDS:
            raise err(f"{at}.{k}", f"expected at most {MAX_SECONDS:g} s, got {getattr(s, k):g}")
    expect = s.fwd_s + s.bwd_s if train else s.fwd_s
    if s.time_s and not math.isclose(s.time_s, expect, rel_tol=_REL_TOL, abs_tol=1e-15):
        raise err(f"{at}.time_s", f"expected {'fwd_s + bwd_s' if train else 'fwd_s'} = {expect:.6g} s, "
                                  f"got {s.time_s:.6g}")
    if not gpu:  # an FPGA stage's times are its cycles at the board clock: an edit of one is caught
        for k, t in (("fwd", s.fwd_s), ("bwd", s.bwd_s)):
            c = s.cycles.get(k)
            if _finite_number(c) and abs(t * board.clock_hz - c) > 1 + 1e-6 * c:
                raise err(f"{at}.{k}_s", f"expected cycles.{k} / clock = {c} / {board.clock_hz:g} Hz = "
                                         f"{c / board.clock_hz:.6g} s, got {t:.6g}")
    for name, table in (("resources", s.resources), ("cycles", s.cycles)):
        for k, v in table.items():
            if not _finite_number(v):
                raise err(f"{at}.{name}.{k}", f"expected a finite number >= 0, got {v!r}")
    for k, attr in _RESOURCE_LIMITS.items():
        usable = getattr(board, attr)
        # on-chip resources are budgeted under the plan's utilisation cap (rounded up to whole
        # blocks); off-chip memory is not capped
        cap = usable if k == "offchip_bytes" else math.ceil(usable * plan.utilisation_cap - 1e-9)
        if s.resources.get(k, 0) > cap:
            why = f"{usable} usable" if k == "offchip_bytes" else \
                f"utilisation_cap {plan.utilisation_cap:g} of {usable} usable"
            raise err(f"{at}.resources.{k}", f"expected at most {cap} ({why} on a {board.name}), "
                                             f"got {s.resources[k]}")
    # parts of the peak cannot exceed it (a hand-made plan leaving memory_bytes 0 states none)
    if s.memory_bytes and s.weight_bytes + s.stash_bytes > s.memory_bytes:
        raise err(f"{at}.memory_bytes", f"expected at least weight_bytes + stash_bytes = "
                                        f"{s.weight_bytes + s.stash_bytes}, got {s.memory_bytes}")
    if s.stashes > plan.microbatches * max(1, plan.chunks):  # a stage holds at most every micro-batch
        raise err(f"{at}.stashes", f"expected at most {plan.microbatches * max(1, plan.chunks)} "
                                   f"(micro-batches x chunks), got {s.stashes}")
    mem_cap = on_chip_bytes(board) + board.offchip_bytes
    if s.memory_bytes > mem_cap:
        raise err(f"{at}.memory_bytes", f"expected at most {mem_cap} bytes (on-chip + off-chip of a "
                                        f"{board.name}), got {s.memory_bytes}")


def _legal_folding(layer, f: Folding) -> bool:
    """The engine's rule: an MVU needs PE | MH and SIMD | MW (fpga_models.cost.matrix_shape);
    a streaming layer's PE and SIMD each divide its lane dimension (channels or features),
    the shapes both the cost model and the generators build."""
    from fpga_models.cost import lane_dim, matrix_shape

    ms = matrix_shape(layer)
    if ms is not None:
        return f.lanes is None and ms[0] % f.pe == 0 and ms[1] % f.simd == 0
    d = lane_dim(layer)
    if f.lanes is not None:
        return d % f.lanes == 0
    return d % f.pe == 0 and d % f.simd == 0 and d % f.ew_lanes == 0


def _folding_rule(layer) -> str:
    from fpga_models.cost import lane_dim, matrix_shape

    ms = matrix_shape(layer)
    if ms is not None:
        return f"PE divides MH={ms[0]}, SIMD divides MW={ms[1]}"
    return f"lanes divide its {lane_dim(layer)} channels or features"
