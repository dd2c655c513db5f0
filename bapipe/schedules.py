"""Pipeline schedules as per-device op orders.

Every consumer (planner stash counts, the cycle model, the host driver) reads the op order
from here, so a schedule means the same thing everywhere. Devices are pipeline positions
0..p-1; with interleaving a device holds ``v`` model chunks and virtual stage ``c*p + d``
lives on device ``d`` (Narayanan et al., SC'21).

Asynchronous schedules (``ASYNC``: PipeDream-2BW and PipeDream) never flush: iterations
follow each other in one op stream per device (``stream_ops``), so their stash counts come
from the stream, not from one iteration's order.

An op is (kind, microbatch, chunk): ``F`` forward, ``B`` backward (input and weight grad
together) or, with ``split_backward``, ``B`` input grad and ``W`` weight grad.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved", "eager-1f1b", "2bw", "pipedream")

#: schedules without a flush whose forwards read stale weights: they change what the user
#: trains, so the planner's auto never picks them
ASYNC = ("2bw", "pipedream")

#: most micro-batches per iteration a plan has (`bapipe plan --microbatches` and the planner's
#: own choice): the search and the replay are linear in it, 10**9 ran for hours, and no
#: pipeline needs more than a few thousand; bapipe sim's op bound holds for any plan within it
MAX_MICROBATCHES = 16384


@dataclass(frozen=True, order=True)
class Op:
    """One unit of work on a device."""

    kind: str  # "F" | "B" | "W"
    mb: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


def warmup_forwards(schedule: str, p: int, d: int, m: int) -> int:
    """Forwards device ``d`` runs before its first backward (non-interleaved schedules).

    GPipe runs all m; 1F1B, 2BW and PipeDream run p-d (Narayanan et al. SOSP'19: PipeDream's
    startup admits NOAM = p-d micro-batches on an unreplicated pipeline); eager-1F1B runs
    2(p-d)-1 so activation sends overlap compute (Zhuang et al., arXiv 2211.05322).
    """
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "2bw", "pipedream"):
        return min(p - d, m)
    if schedule == "eager-1f1b":
        return min(2 * (p - d) - 1, m)
    raise ValueError(f"no warm-up rule for {schedule}")


def interleaved_warmup(p: int, d: int, m: int, v: int) -> int:
    """Forwards device ``d`` runs before its first backward in Megatron-LM's interleaved
    1F1B (Narayanan et al. SC'21): 2(p-d-1) + (v-1)p + 1, at most all m v."""
    return min(m * v, (p - d - 1) * 2 + (v - 1) * p + 1)


def _one_f_one_b(nf: int, m: int, split: bool) -> list[Op]:
    ops: list[Op] = [Op("F", i) for i in range(nf)]
    f, b = nf, 0
    while b < m:
        ops.append(Op("B", b))
        if split:
            ops.append(Op("W", b))
        b += 1
        if f < m:
            ops.append(Op("F", f))
            f += 1
    return ops


def _interleaved(p: int, d: int, m: int, v: int, split: bool) -> list[Op]:
    """Megatron-LM's interleaved 1F1B order for device ``d``: groups of p micro-batches per chunk."""
    if m % p:
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) to be a multiple of stages ({p})")
    total = m * v

    def f_op(k: int) -> Op:  # k-th forward on this device
        group, r = divmod(k, p * v)
        return Op("F", group * p + r % p, r // p)

    def b_op(k: int) -> Op:  # k-th backward: chunks in reverse
        group, r = divmod(k, p * v)
        return Op("B", group * p + r % p, v - 1 - r // p)

    warm = interleaved_warmup(p, d, m, v)
    ops = [f_op(k) for k in range(warm)]
    f, b = warm, 0
    while b < total:
        bo = b_op(b)
        ops.append(bo)
        if split:
            ops.append(Op("W", bo.mb, bo.chunk))
        b += 1
        if f < total:
            ops.append(f_op(f))
            f += 1
    return ops


def device_ops(schedule: str, p: int, d: int, m: int, v: int = 1, split_backward: bool = False,
               forward_only: bool = False) -> list[Op]:
    """The op order of device ``d`` (0-based) of ``p`` for one iteration of ``m`` micro-batches."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if not (0 <= d < p) or m < 1 or v < 1:
        raise ValueError("need 0 <= d < p, m >= 1, v >= 1")
    if forward_only:
        return [Op("F", i, c) for i in range(m) for c in range(v)] if schedule != "interleaved" else \
            [op for op in _interleaved(p, d, m, v, False) if op.kind == "F"]
    if schedule == "interleaved":
        return _interleaved(p, d, m, v, split_backward)
    if v != 1:
        raise ValueError(f"{schedule} has one chunk per device (v=1)")
    if schedule == "gpipe":
        ops = [Op("F", i) for i in range(m)]
        for i in range(m):
            ops.append(Op("B", i))
            if split_backward:
                ops.append(Op("W", i))
        return ops
    return _one_f_one_b(warmup_forwards(schedule, p, d, m), m, split_backward)


def peak_stash(ops: list[Op]) -> int:
    """Most micro-batch activations held at once (a forward stashes, its last backward frees)."""
    live = peak = 0
    last_back = {}
    for i, op in enumerate(ops):
        if op.kind in ("B", "W"):
            last_back[(op.mb, op.chunk)] = i
    for i, op in enumerate(ops):
        if op.kind == "F":
            live += 1
            peak = max(peak, live)
        elif last_back.get((op.mb, op.chunk)) == i:
            live -= 1
    return peak


def stream_ops(schedule: str, p: int, d: int, m: int, iterations: int) -> list[tuple[Op, int]]:
    """Device ``d``'s ops over ``iterations`` iterations of ``m`` micro-batches, each with the
    iteration it belongs to (micro-batch ids run on across iterations). Asynchronous
    schedules run one op order over all ``iterations x m`` micro-batches (no flush); the
    others repeat one iteration's order."""
    if schedule in ASYNC:
        return [(o, o.mb // m) for o in device_ops(schedule, p, d, m * iterations)]
    base = device_ops(schedule, p, d, m)
    return [(Op(o.kind, o.mb + j * m, o.chunk), j) for j in range(iterations) for o in base]


def stash_count(schedule: str, p: int, d: int, m: int, v: int = 1) -> int:
    """Activation stashes device ``d`` holds at its peak (per chunk summed): the one
    stash-count function (the planner, the training RTL and the simulator read it).

    Closed forms where they exist (the op-order walk is O(m) per call): GPipe m; 1F1B
    min(p-d, m); eager-1F1B min(2(p-d)-1, m) (the warm-up forwards, :func:`warmup_forwards`);
    2BW and PipeDream p-d whatever m (no flush: the next iteration's micro-batches are in
    flight too); interleaved its warm-up, :func:`interleaved_warmup`. Else
    :func:`stash_walk`; tests/test_planner.py checks every closed form against the walk.
    """
    if v == 1 and schedule in ASYNC:
        return p - d
    if v == 1 and schedule in ("gpipe", "1f1b", "eager-1f1b"):
        return warmup_forwards(schedule, p, d, m)
    if schedule == "interleaved" and m % p == 0:
        return interleaved_warmup(p, d, m, v)
    return stash_walk(schedule, p, d, m, v)


def chunk_stash_count(schedule: str, p: int, d: int, m: int, v: int, chunk: int) -> int:
    """Activation stashes chunk ``chunk`` of device ``d`` holds at its peak: the size of that
    chunk's own stash memory (the training RTL builds one a chunk board; the planner charges each
    virtual stage this count). One chunk (v = 1): :func:`stash_count`. Chunks peak at different
    times, so the chunks' counts add up to at least the device's :func:`stash_count`."""
    if v == 1:
        return stash_count(schedule, p, d, m)
    return peak_stash(chunk_ops(schedule, p, d, m, v, chunk))


def chunk_ops(schedule: str, p: int, d: int, m: int, v: int, chunk: int) -> list[Op]:
    """Chunk ``chunk``'s ops in device ``d``'s order: what that chunk's stage runs (v = 1: all)."""
    return [o for o in device_ops(schedule, p, d, m, v) if o.chunk == chunk]


def stash_walk(schedule: str, p: int, d: int, m: int, v: int = 1) -> int:
    """:func:`stash_count` from the op order: the most forwards whose last backward has not
    run yet. Asynchronous schedules count the stream over enough iterations."""
    if schedule in ASYNC:
        return peak_stash([o for o, _j in stream_ops(schedule, p, d, m, -(-p // m) + 1)])
    return peak_stash(device_ops(schedule, p, d, m, v))


def weight_versions(schedule: str) -> int:
    """Weight copies a stage keeps besides the ones stashed per micro-batch: 2BW
    double-buffers weights (Narayanan et al. ICML'21); PipeDream keeps one version per
    in-flight micro-batch instead (:func:`stashes_weights`)."""
    return 2 if schedule == "2bw" else 1


def stashes_weights(schedule: str) -> bool:
    """PipeDream's weight stashing (Narayanan et al. SOSP'19, section 3.3): every in-flight
    micro-batch keeps the weight version its forward used, for its backward; the newest of
    them is the current weights. So a stage holding s stashes holds s - 1 older versions."""
    return schedule == "pipedream"


def gradient_buffers(schedule: str) -> int:
    """Weight-sized gradient buffers of a stage: PipeDream updates after every micro-batch
    and a replicated stage all-reduces micro-batch k's gradient while its next backward
    writes the other buffer (double-buffered, so the all-reduce overlaps compute); the
    flushed schedules and 2BW accumulate into one."""
    return 2 if schedule == "pipedream" else 1


def allreduce_gate(schedule: str) -> int:
    """PipeDream: a replicated stage's backward of micro-batch k waits until the all-reduce of
    micro-batch k - ``allreduce_gate`` has ended (that gradient buffer is free again). 0: no
    per-micro-batch all-reduce (the others reduce once per iteration)."""
    return gradient_buffers(schedule) if schedule == "pipedream" else 0
