"""plan.yaml: the one artefact the simulator, codegen, RTL and host driver all read.

The planner writes it; nobody downstream re-derives a decision made here (folding,
partition, schedule, micro-batching, replication). ``load_plan`` validates a file and
names the field on any mistake.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .numformats import FORMATS  # the one number-format table
from .schedules import SCHEDULES
from .yamlio import Fields, Node, load_file

PLAN_VERSION = 1
MODES = ("train", "inference")
STYLES = ("dataflow", "time-multiplexed", "gpu")


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
    flush_s: float = 0.0            # the backward kernel's flush of the gradient sums, per iteration
    update_s: float = 0.0           # the weight-update kernel, per iteration (fpga_models.update)
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
        # libyaml's emitter when the wheel has it (same text, 3x faster: gpt3-175b's 78 kB plan)
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        return yaml.dump(_clean(self.to_dict()), Dumper=dumper, sort_keys=False, default_flow_style=None, width=100)

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
        flush_s=f.num("flush_s", 0.0, positive=False, min=0), update_s=f.num("update_s", 0.0, positive=False, min=0),
        memory_bytes=f.int("memory_bytes", 0, min=0), weight_bytes=f.int("weight_bytes", 0, min=0),
        stash_bytes=f.int("stash_bytes", 0, min=0), stashes=f.int("stashes", 0, min=0),
        resources=dict(f.mapping("resources", Node())), cycles=dict(f.mapping("cycles", Node())),
    )
    f.done()
    if st.last < st.first or len(st.layers) != st.last - st.first + 1:
        raise f.err("layers", f"expected {st.last - st.first + 1} layer names for positions {st.first}..{st.last}")
    return st


#: stage fields plans gained after version 1: a plan written before them did not price what they
#: hold (issue 32: the flush and update kernels), so 0 is what it said
LATER_STAGE_FIELDS = frozenset({"flush_s", "update_s"})


def _whole_stage(node: Any, file: str, i: int) -> Any:
    """Every stage field must be present: `bapipe plan` (and Plan.save) always write them all,
    so a missing one means a truncated or hand-cut file, whose defaults (zero times, no
    cycles) would otherwise be simulated as if they were the plan's."""
    if isinstance(node, Node):
        missing = [f.name for f in fields(Stage) if f.name not in node and f.name not in LATER_STAGE_FIELDS]
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
