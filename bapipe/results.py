"""What the Python API (bapipe.api) returns: one dataclass per command, whose fields are the
keys of that command's ``--json`` object.

``Result.to_json()`` gives back exactly the dict the command prints with ``--json`` (same
keys, same order, same values), so a notebook and a script read the same names. Nested
values (stages, boards, links) stay plain dicts and lists, as in the JSON. A key a command
adds that its class does not declare yet is kept in ``extra`` (and in ``to_json()``), never
dropped; tests/test_api.py checks that the commands' keys are all declared.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Result:
    """Base of the result classes: ``from_json`` / ``to_json`` and dict-style reading."""

    #: keys of the --json object this class does not declare (none, for the commands' own keys)
    extra: dict = field(default_factory=dict, repr=False)
    #: the --json object's keys in order (which declared fields the command set)
    keys: tuple = field(default=(), repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: dict):
        """The result of a command's --json object ``obj``."""
        names = {f.name for f in fields(cls)} - {"extra", "keys"}
        return cls(**{k: v for k, v in obj.items() if k in names},
                   extra={k: v for k, v in obj.items() if k not in names}, keys=tuple(obj))

    def to_json(self) -> dict:
        """The command's --json object (the keys it set, in its order)."""
        return {k: self.extra[k] if k in self.extra else getattr(self, k) for k in self.keys}

    def set(self, key: str, value: Any) -> None:
        """Set a key (a declared field or an extra one), keeping --json's key order."""
        if key in {f.name for f in fields(self)} - {"extra", "keys"}:
            setattr(self, key, value)
        else:
            self.extra[key] = value
        if key not in self.keys:
            self.keys = (*self.keys, key)

    def __getitem__(self, key: str):
        """``r["iteration_time_s"]``: the --json value by key, as a script reading the JSON would."""
        return self.to_json()[key]


@dataclass
class PlanResult(Result):
    """`bapipe plan --json`: the chosen plan and its prediction (times in seconds)."""

    model: str = None
    cluster: str = None
    mode: str = None
    iteration_time_s: float = None
    throughput_samples_per_s: float = None
    schedule: str = None
    first_iteration_time_s: float = None
    chunks: int = None
    microbatches: int = None
    microbatch_size: int = None
    global_batch: int = None
    replicas: Any = None
    boards_used: int = None
    boards_total: int = None
    placement_exact: bool = None
    recompute: bool = None
    bubble_fraction: float = None
    latency_s: float = None
    stages: list = None
    baselines: dict = None
    lower_bound_s: float = None
    speedup_vs_data_parallel: float = None
    pareto: list = None
    cost_model: str = None
    pipedream_cost: dict = None
    breakdown: list = None       # per pipeline position: compute/fills/offchip/link/allreduce/update/bubble seconds
    unpriced: list = None        # parts of the breakdown the planner does not price yet (reported as 0)
    roofline: dict = None        # DSP and off-chip rooflines and the fraction reached
    limit: dict = None           # the one resource that limits the plan
    output: str = None


@dataclass
class SimResult(Result):
    """`bapipe sim --json`: the event replay of a plan (times in seconds)."""

    model: str = None
    cluster: str = None
    schedule: str = None
    mode: str = None
    devices: int = None
    chunks: int = None
    microbatches: int = None
    iterations: int = None
    iteration_time_s: float = None
    iteration_cycles: int = None
    steady_iteration_s: float = None
    makespan_s: float = None
    throughput_samples_per_s: float = None
    bubble_fraction: float = None
    bubble_ratio: float = None
    boards: list = None
    links: list = None
    events: int = None
    wall_s: float = None
    events_per_s: float = None
    bubble_mean_over_boards: float = None
    bubble_busiest: float = None
    planner_iteration_time_s: float = None
    sim_vs_planner: float = None
    gantt: str = None
    trace: str = None


@dataclass
class ProfileResult(Result):
    """`bapipe profile --json`: per-layer counts and cost per board type."""

    model: str = None
    cluster: str = None
    format: str = None
    batch: int = None
    params: int = None
    fwd_macs: int = None
    layers: list = None
    totals: dict = None


@dataclass
class GenResult(Result):
    """`bapipe gen --json`: what was generated where."""

    output: str = None
    fingerprint: str = None
    files: int = None
    rtl_files: int = None
    format: str = None
    stages: list = None
    boards: list = None
    skipped: list = None
    engines: str = None
    rtl_kernels: list = None
    check: dict = None           # `bapipe check` on the new build: ok, failed_rules, boards (board: rules broken)


@dataclass
class CsimResult(Result):
    """`bapipe csim --json`: the C-simulation of every stage against numpy (forward), or of
    training iterations against fpga_models.train_fixed (``mode: train``)."""

    passed: bool = None
    format: str = None
    stages: list = None
    samples: int = None
    model_max_abs_err_lsb: int = None
    cache: str = None
    skipped: list = None
    deadlocks: list = None
    mode: str = None
    iterations: int = None
    weights_match: bool = None
    per_iteration: list = None
    lr: float = None
    momentum: float = None
    sgd_constants: dict = None
    compile_s: float = None
    cached: bool = None
    run_s: float = None
    not_in_hls: list = None
    schedule: str = None


@dataclass
class RtlsimResult(Result):
    """`bapipe rtlsim --json`: the Verilator run of the generated pipeline."""

    outputs_match: bool = None
    samples: int = None
    cycles_per_sample: float = None
    predicted_cycles_per_sample: float = None
    error: float = None
    sim_cycles_per_s: float = None
    boards: list = None
    max_abs_err_lsb: int = None
    latency_cycles: int = None
    sim_cycles: int = None
    compile_s: float = None
    overflow: bool = None
    bottleneck: str = None
    steady_state_cycles_per_sample: float = None
    engine: str = None
    stage_boards: list = None
    stages: list = None
    plan_error: float = None
    training_unsupported: str = None
    training_skipped: str = None
    training: bool = None
    weights_match: bool = None
    weights_match_per_iteration: list = None
    completed: int = None
    iterations: int = None
    microbatches: int = None
    microbatch_size: int = None
    replicas: Any = None
    schedule: str = None
    iteration_cycles: list = None
    iteration_error: list = None
    max_iteration_error: float = None
    plan_iteration_cycles: float = None
    update_cycles: Any = None
    wall_s: float = None


@dataclass
class SynthResult(Result):
    """`bapipe synth --json`: yosys resource counts per board against the plan's."""

    tool: str = None
    timeout_s: float = None
    boards: list = None
    total_wall_s: float = None
    logs: str = None


@dataclass
class RunResult(Result):
    """`bapipe run --json`: a training run (numpy, or on the generated training RTL) or a
    forward pass on generated hardware; ``engine`` says what ran it."""

    backend: str = None
    engine: str = None
    epochs: int = None
    final_loss: float = None
    test_accuracy: float = None
    samples_per_s: float = None
    grad_max_rel_err_vs_single_device: float = None
    schedule: str = None
    stages: int = None
    devices: int = None
    workers: int = None
    microbatches: int = None
    microbatch_size: int = None
    global_batch: int = None
    plan_global_batch: int = None
    optimizer: str = None
    lr: float = None
    lr_schedule: str = None
    precision: str = None
    number_format: str = None
    iterations: int = None
    stage_utilisation: list = None
    history: list = None
    test_samples: int = None
    ray: bool = None
    # a forward pass on generated hardware (host/forward.py)
    samples: int = None
    mismatches_vs_numpy: int = None
    max_abs_err_vs_numpy: float = None
    numpy_test_accuracy: float = None
    weights: int = None
    # training on the generated RTL (host/train_hw.py)
    weights_match: bool = None
    weights_match_per_epoch: list = None
    first_mismatch: Any = None
    outputs_match: bool = None
    numpy_s: float = None
    hardware_s: float = None
    iteration_cycles: list = None
    plan_iteration_cycles: float = None
    sgd_constants: dict = None
    error: str = None


#: command -> its result class
RESULTS = {"plan": PlanResult, "sim": SimResult, "profile": ProfileResult, "gen": GenResult, "csim": CsimResult,
           "rtlsim": RtlsimResult, "synth": SynthResult, "run": RunResult}
