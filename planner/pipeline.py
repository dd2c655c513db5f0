"""Iteration time of a pipeline: closed forms and an exact replay of the schedule's op order.

The replay is the planner's predicted iteration time (what ``bapipe sim`` is checked
against). It executes, per device, the op order of ``bapipe.schedules.device_ops`` with:

- F of virtual stage s on micro-batch k starts when the device is free and the activations
  of F(s-1, k) have arrived; B(s, k) when the gradient of B(s+1, k) has arrived (and, by the
  op order, after F(s, k));
- a transfer on a link direction starts when the data is ready and the link is free, holds
  the link for ``bytes / bandwidth`` (``occ``) and arrives ``latency`` later (``lat``);
  links are FIFO in the sender's op order, no credit stalls (infinite receive FIFOs);
- a replicated stage's gradient all-reduce starts after the device's last backward and the
  iteration ends when every device has finished its all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from bapipe.schedules import device_ops


@dataclass
class Replay:
    """Result of a replay: iteration time, per-device busy time and finish times."""

    iteration_s: float
    busy_s: list[float]
    finish_s: list[float]

    @property
    def bubble_fraction(self) -> float:
        """1 - (busiest device's work) / iteration time."""
        return 1.0 - max(self.busy_s) / self.iteration_s if self.iteration_s > 0 else 0.0


@lru_cache(maxsize=4096)
def _ops(schedule: str, p: int, d: int, m: int, v: int, forward_only: bool) -> tuple:
    """Device d's op order as (is_forward, micro-batch, virtual stage) triples."""
    return tuple((op.kind == "F", op.mb, op.chunk * p + d)
                 for op in device_ops(schedule, p, d, m, v, forward_only=forward_only))


def closed_form_bubble(p: int, m: int, v: int = 1) -> float:
    """Bubble fraction of balanced stages: (p-1)/(m+p-1) (GPipe/1F1B); interleaved (p-1)/(v m + p - 1).

    The interleaved bubble-to-ideal ratio is (p-1)/(v m) (Narayanan et al. SC'21); as a
    fraction of the iteration that is (p-1)/(v m + p - 1).
    """
    return (p - 1) / (v * m + p - 1)


def replay(schedule: str, p: int, m: int, fwd: list[float], bwd: list[float], send_occ: list[float],
           send_lat: list[float], v: int = 1, allreduce: list[float] | None = None,
           forward_only: bool = False) -> Replay:
    """Replay one iteration. ``fwd``/``bwd`` per virtual stage s (device s % p, chunk s // p);
    ``send_occ``/``send_lat`` per virtual link s -> s+1 (len p*v - 1), same both directions;
    ``allreduce`` per device (seconds, after its last backward).
    """
    V = p * v
    ops = [_ops(schedule, p, d, m, v, forward_only) for d in range(p)]
    f_arr = [[None] * m for _ in range(V)]   # [stage][mb]: activations arrived at that stage
    b_arr = [[None] * m for _ in range(V)]   # [stage][mb]: gradient arrived at that stage
    up_free = [0.0] * p                      # link direction d -> d+1 free at
    down_free = [0.0] * p                    # link direction d -> d-1 free at
    free = [0.0] * p
    busy = [0.0] * p
    ptr = [0] * p
    remaining = sum(len(o) for o in ops)
    todo = list(range(p - 1, -1, -1))   # devices that may be able to run their next op
    queued = [True] * p
    last = V - 1
    while todo:
        d = todo.pop()
        queued[d] = False
        od = ops[d]
        k = ptr[d]
        t = free[d]
        while k < len(od):
            is_f, mb, s = od[k]
            if is_f:
                ready = 0.0 if s == 0 else f_arr[s][mb]
            else:
                ready = 0.0 if s == last else b_arr[s][mb]
            if ready is None:
                break
            dur = fwd[s] if is_f else bwd[s]
            end = (t if t > ready else ready) + dur
            busy[d] += dur
            t = end
            wake = -1
            if is_f:
                if s < last:
                    t0 = end if end > up_free[d] else up_free[d]
                    up_free[d] = t0 + send_occ[s]
                    f_arr[s + 1][mb] = t0 + send_occ[s] + send_lat[s]
                    wake = (s + 1) % p
            elif s > 0:
                t0 = end if end > down_free[d] else down_free[d]
                down_free[d] = t0 + send_occ[s - 1]
                b_arr[s - 1][mb] = t0 + send_occ[s - 1] + send_lat[s - 1]
                wake = (s - 1) % p
            k += 1
            remaining -= 1
            if wake >= 0 and wake != d and not queued[wake]:
                queued[wake] = True
                todo.append(wake)
        ptr[d] = k
        free[d] = t
    if remaining:
        raise RuntimeError(f"schedule {schedule} deadlocked in replay (p={p}, m={m}, v={v})")
    ar = allreduce or [0.0] * p
    finish = [free[d] + (0.0 if forward_only else ar[d]) for d in range(p)]
    return Replay(max(finish), busy, finish)


def flowshop_time(stage_times: list[float], m: int) -> float:
    """sum t + (m-1) max t: m identical jobs through stages in series (Alpa eq. 2)."""
    return sum(stage_times) + (m - 1) * max(stage_times)


def ring_allreduce_s(nbytes: float, r: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over r replicas: 2(r-1)/r * W / BW + 2(r-1) latency (Patarasuk & Yuan)."""
    if r <= 1:
        return 0.0
    return 2 * (r - 1) / r * nbytes / bandwidth + 2 * (r - 1) * latency
