"""A plan checked against the model and cluster it names, before any command uses it.

``resolve`` loads the plan's model and cluster and refuses a plan made for others (by
fingerprint); ``validate`` checks every field against them: stages cover exactly the model's
layers, board types and counts match the cluster, foldings are legal for their engines,
times and resources are finite, in range and within the board, batch fields agree. Every
command (sim, gen, csim, rtlsim, synth, run) calls ``resolve`` on the file it loaded; the
errors name the file and field.

It lives here, not beside the plan's dataclasses in ``bapipe.plan``, because it needs the
board catalog and the engines' folding rules: the spine does not import the hardware models.
"""
from __future__ import annotations

import math
from typing import Any

from bapipe.errors import SpecError
from bapipe.plan import Folding, Plan, Stage
from bapipe.schedules import ASYNC, MAX_MICROBATCHES

def resolve(plan: Plan, plan_file: str | None = None):
    """Load the plan's model and cluster and check they are the ones it was made for.

    Returns (model, cluster). A plan for another cluster or a changed model is refused.
    With ``plan_file`` (every command passes the file it loaded) the plan is then checked
    in full by :func:`validate`; a Plan built in memory (tests, hand-made pipelines) gets
    the structural checks only: its stages cover the model and name real boards.
    """
    strict = plan_file is not None
    plan_file = plan_file or "<plan>"
    from bapipe.models import load_model

    from .cluster import load_cluster

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
    if not 1 <= plan.microbatches <= MAX_MICROBATCHES:   # gen's accumulators, sim's op count, run's replays
        raise err("microbatches", f"expected 1..{MAX_MICROBATCHES} micro-batches (the bound `bapipe plan` "
                                  f"keeps), got {plan.microbatches}")
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
    from .boards import on_chip_bytes

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
    most = plan.microbatches * max(1, plan.chunks)   # a stage holds at most every micro-batch
    if plan.schedule in ASYNC:   # no flush: the next iterations' micro-batches are in flight too
        most = max(most, plan.devices - s.device)
    if s.stashes > most:
        raise err(f"{at}.stashes", f"expected at most {most} (micro-batches x chunks"
                                   f"{', or the stages from this one on' if plan.schedule in ASYNC else ''}), "
                                   f"got {s.stashes}")
    mem_cap = on_chip_bytes(board) + board.offchip_bytes
    if s.memory_bytes > mem_cap:
        raise err(f"{at}.memory_bytes", f"expected at most {mem_cap} bytes (on-chip + off-chip of a "
                                        f"{board.name}), got {s.memory_bytes}")


def _legal_folding(layer, f: Folding) -> bool:
    """The engine's rule: an MVU needs PE | MH and SIMD | MW (fpga_models.cost.matrix_shape);
    a streaming layer's PE and SIMD each divide its lane dimension (channels or features),
    the shapes both the cost model and the generators build."""
    from .cost import lane_dim, matrix_shape

    ms = matrix_shape(layer)
    if ms is not None:
        return f.lanes is None and ms[0] % f.pe == 0 and ms[1] % f.simd == 0
    d = lane_dim(layer)
    if f.lanes is not None:
        return d % f.lanes == 0
    return d % f.pe == 0 and d % f.simd == 0 and d % f.ew_lanes == 0


def _folding_rule(layer) -> str:
    from .cost import lane_dim, matrix_shape

    ms = matrix_shape(layer)
    if ms is not None:
        return f"PE divides MH={ms[0]}, SIMD divides MW={ms[1]}"
    return f"lanes divide its {lane_dim(layer)} channels or features"
