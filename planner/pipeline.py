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

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache, partial

from bapipe.schedules import device_ops
from bapipe.fpga_models.collective import ring_allreduce_s  # noqa: F401  (planner.search imports it from here)
from bapipe.fpga_models.transfer import hold


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


def run_events(p: int, ops: list, fwd: list[float], bwd: list[float], routes: list, rings: list | None,
               n_stages: int, n_mb: int, deadlock: str, link_free: dict, gate=None, after_op=None,
               after_ring=None, probe=None) -> tuple[list[float], list[float]]:
    """The one event loop under every replay here; returns (per device: when its last op
    ended, its busy seconds).

    Device d runs ``ops[d]`` ((is_forward, micro-batch, stage) triples; stage s lives on
    device s % p) in order: an op starts when the device is free and its input has arrived
    (F(s, k): the activations of F(s-1, k); B(s, k): the gradient of B(s+1, k)), at the
    later of the two, or at what ``gate(d, i, is_f, mb, s, ready)`` returns (None: not
    yet). A finished op sends its activations (gradient) to the next (previous) stage over
    ``routes[s]`` (forward pieces, backward pieces) with :func:`reserve` on ``link_free``,
    then ``after_op(d, is_f, mb, s, end, start_ring)`` runs, then the receiving device and
    this one try their next op; ops left over at the end raise ``RuntimeError(deadlock)``.
    ``start_ring(s, tag, now)`` runs stage s's ring all-reduce (``rings[s]`` = (hops,
    steps)): replica y sends over hop y, forwards each step as soon as the previous one
    arrives, and after ``steps`` steps ``after_ring(s, tag, end, try_start)`` runs once per
    replica. Events at equal times run
    in the order they were made (a sequence number), so the sums are the same floats
    whichever replay drives the loop.

    ``probe`` (optional, planner.breakdown): called as each op starts with ``(d, is_f, mb, s,
    free, sent, arrived, start, dur)``: when the device became free, when the op's input left
    its producer (0.0 for none), when it arrived, and when the op starts (later than both when
    a gate held it). It observes only; the replay's times are the same with or without it.
    """
    last = n_stages - 1
    f_arr = [[None] * n_mb for _ in range(n_stages)]   # [stage][mb]: activations arrived
    b_arr = [[None] * n_mb for _ in range(n_stages)]   # [stage][mb]: gradient arrived
    free = [0.0] * p
    busy = [0.0] * p
    ptr = [0] * p
    idle = [True] * p
    heap: list = []
    seq = 0
    push, pop = heapq.heappush, heapq.heappop
    send = partial(reserve, link_free)
    # probe only: when each input left its producer, [stage][mb] (forward, backward)
    sent_f = [[0.0] * n_mb for _ in range(n_stages)] if probe is not None else None
    sent_b = [[0.0] * n_mb for _ in range(n_stages)] if probe is not None else None

    def try_start(d: int) -> None:
        nonlocal seq
        if not idle[d] or ptr[d] >= len(ops[d]):
            return
        i = ptr[d]
        is_f, mb, s = ops[d][i]
        if is_f:
            ready = 0.0 if s == 0 else f_arr[s][mb]
        else:
            ready = 0.0 if s == last else b_arr[s][mb]
        if ready is None:
            return
        arrived = ready
        if gate is not None:
            ready = gate(d, i, is_f, mb, s, ready)
            if ready is None:
                return
        dur = fwd[s] if is_f else bwd[s]
        idle[d] = False
        busy[d] += dur
        seq += 1
        start = free[d] if free[d] > ready else ready
        if probe is not None:
            probe(d, is_f, mb, s, free[d], (sent_f if is_f else sent_b)[s][mb], arrived, start, dur)
        push(heap, (start + dur, seq, 0, d))

    def ring_step(s: int, tag, step: int, y: int, now: float) -> None:
        nonlocal seq
        seq += 1
        hops = rings[s][0]
        push(heap, (send((hops[y],), now), seq, 1, (s, tag, step, (y + 1) % len(hops))))

    def start_ring(s: int, tag, now: float) -> None:
        for y in range(len(rings[s][0])):
            ring_step(s, tag, 0, y, now)

    for d in range(p):
        try_start(d)
    while heap:
        end, _, kind, d = pop(heap)
        if kind == 1:   # a ring step arrived at replica y
            s, tag, step, y = d
            if step + 1 < rings[s][1]:
                ring_step(s, tag, step + 1, y, end)
            else:
                after_ring(s, tag, end, try_start)
            continue
        is_f, mb, s = ops[d][ptr[d]]
        ptr[d] += 1
        free[d] = end
        idle[d] = True
        wake = -1
        if is_f and s < last:
            f_arr[s + 1][mb] = send(routes[s][0], end)
            wake = (s + 1) % p
            if sent_f is not None:
                sent_f[s + 1][mb] = end
        elif not is_f and s > 0:
            b_arr[s - 1][mb] = send(routes[s - 1][1], end)
            wake = (s - 1) % p
            if sent_b is not None:
                sent_b[s - 1][mb] = end
        if after_op is not None:
            after_op(d, is_f, mb, s, end, start_ring)
        if wake >= 0 and wake != d:
            try_start(wake)
        try_start(d)
    if any(ptr[d] < len(ops[d]) for d in range(p)):
        raise RuntimeError(deadlock)
    return free, busy


def replay(schedule: str, p: int, m: int, fwd: list[float], bwd: list[float], send_occ: list[float],
           send_lat: list[float], v: int = 1, allreduce: list[float] | None = None,
           forward_only: bool = False, routes: list | None = None, rings: list | None = None,
           probe=None, tails: list | None = None) -> Replay:
    """Replay one iteration. ``fwd``/``bwd`` per virtual stage s (device s % p, chunk s // p);
    ``send_occ``/``send_lat`` per virtual link s -> s+1 (len p*v - 1), same both directions;
    ``allreduce`` per virtual stage: seconds of its gradient ring, which starts after that
    stage's last backward; a device runs its stages' rings one after another.

    ``routes`` (optional, per virtual link): (forward pieces, backward pieces), a piece being
    (directed link ids, busy seconds, latency); a transfer reserves every link of every piece
    first come first served at the time its op ends (cut-through), so transfers of different
    cuts sharing a physical link queue behind each other. Without routes each device has one
    private link per direction with ``send_occ``/``send_lat``.

    ``rings`` (optional, per virtual stage): (hops, steps) simulates the all-reduce on the
    links instead of charging ``allreduce``: after the stage's last backward, replica i sends
    a 1/r share to replica i+1 over hop i, and each replica forwards the next step as soon as
    the previous one arrives, for 2(r-1) steps (the ring reserves links like any transfer).
    Runs on :func:`run_events` without a gate (``probe``: passed to it).

    ``tails`` (optional, per virtual stage): (seconds before its ring, seconds after it): the
    backward kernel's flush of the gradient sums and the update kernel
    (fpga_models.update.stage_tail); a stage without a ring runs them back to back after its
    last backward. The iteration ends when every stage's tail has.
    """
    V = p * v
    pre = [t[0] for t in tails] if tails else [0.0] * V
    post = [t[1] for t in tails] if tails else [0.0] * V
    if routes is None:
        routes = []
        for s in range(V - 1):
            up = (((s % p, 1),), send_occ[s], send_lat[s])
            down = ((((s + 1) % p, -1),), send_occ[s], send_lat[s])
            routes.append(((up,), (down,)))
    ops = [_ops(schedule, p, d, m, v, forward_only) for d in range(p)]
    link_free: dict = defaultdict(float)
    last_b = [0.0] * V          # end of each stage's last backward
    b_left = [m] * V            # backwards still to run per stage
    ar_left = [0] * V           # replicas whose ring has not finished
    ar_end = [0.0] * V

    def after_op(d, is_f, mb, s, end, start_ring) -> None:
        if is_f:
            return
        last_b[s] = end
        b_left[s] -= 1
        # the gradient for the previous stage leaves first, then the flush, then the ring starts
        if b_left[s] == 0 and rings is not None and rings[s] is not None and not forward_only:
            hops = rings[s][0]
            t0 = end + pre[s] if pre[s] else end
            if V == 1 and _disjoint(hops):   # nothing else moves: the ring alone (same sums)
                ar_end[s] = _lone_ring(hops, rings[s][1], t0, link_free)
            else:
                ar_left[s] = len(hops)
                start_ring(s, None, t0)

    def after_ring(s, _tag, end, _try_start) -> None:
        ar_left[s] -= 1
        if ar_left[s] == 0:
            ar_end[s] = end

    free, busy = run_events(p, ops, fwd, bwd, routes, rings, V, m,
                            f"schedule {schedule} deadlocked in replay (p={p}, m={m}, v={v})", link_free,
                            after_op=after_op, after_ring=after_ring, probe=probe)
    finish = list(free)
    if forward_only:
        return Replay(max(finish), busy, finish)
    if rings is not None:
        for s in range(V):
            if rings[s] is not None:
                end = ar_end[s] + post[s] if post[s] else ar_end[s]
            else:
                end = last_b[s] + pre[s] + post[s] if tails else 0.0
            finish[s % p] = max(finish[s % p], end)
    elif allreduce or tails:
        ar = allreduce or [0.0] * V
        for d in range(p):
            t = 0.0
            for s in sorted(range(d, V, p), key=lambda x: (last_b[x], x)):
                if ar[s] > 0 or pre[s] > 0 or post[s] > 0:
                    t = max(t, last_b[s]) + pre[s] + ar[s] + post[s]
            finish[d] = max(free[d], t)
    return Replay(max(finish), busy, finish)


def _disjoint(hops) -> bool:
    """True when no two hops of a ring reserve the same directed link."""
    ids = [i for h in hops for i in h[0]]
    return len(ids) == len(set(ids))


def _lone_ring(hops, steps: int, start: float, link_free: dict) -> float:
    """When the last step of a ring ends, for a ring nothing else shares links with (one
    stage, every hop on links of its own): replica y's step k leaves when step k-1 has
    arrived from replica y-1 and hop y is free, holds hop y for its ``occ`` and arrives
    ``lat`` later. The same additions as :func:`replay`'s event loop in the same order (so
    the same floats), without an event per step: 2(r-1) x r events for 64 replicas was most
    of a data-parallel plan's replay."""
    r = len(hops)
    ready = [start] * r                     # when replica y holds the data of its next step
    free = [max([link_free.get(i, 0.0) for i in ids], default=0.0) for ids, _o, _l in hops]
    arrive = [0.0] * r
    for _ in range(steps):
        for y, (ids, occ, lat) in enumerate(hops):
            t0 = ready[y] if ready[y] > free[y] else free[y]
            free[y] = t0 + occ
            a = t0 + occ + lat
            arrive[y] = a if a > ready[y] else ready[y]
        ready = [arrive[y - 1] for y in range(r)]   # replica y+1 receives what y sent
    for (ids, _o, _l), f in zip(hops, free):
        for i in ids:
            link_free[i] = f
    return max(ready)


def flowshop_time(stage_times: list[float], m: int) -> float:
    """sum t + (m-1) max t: m identical jobs through stages in series (Alpa eq. 2)."""
    return sum(stage_times) + (m - 1) * max(stage_times)



def reserve(link_free: dict, pieces, now: float) -> float:
    """Send over ``pieces`` (link ids, occupancy, latency) from ``now``: each piece waits until
    all its links are free, holds them for its occupancy and arrives after its latency
    (``fpga_models.transfer.hold``, the simulator's link model too); ``link_free`` (link id
    -> free from, a defaultdict(float)) is updated. Returns the last arrival. The link model
    of every replay here (transfers and ring steps alike)."""
    arrive = now
    for ids, occ, lat in pieces:
        t = hold(link_free, ids, now, occ) + occ + lat
        if t > arrive:
            arrive = t
    return arrive


def replay_2bw(p: int, m: int, fwd: list[float], bwd: list[float], routes: list, rings: list | None,
               iterations: int = 4, probe=None) -> tuple[float, float]:
    """PipeDream-2BW without a flush: (steady seconds per iteration, first iteration's end).

    ``iterations`` x m micro-batches run as one 1F1B stream per device (v = 1). A stage's
    ring all-reduce of iteration j starts after its last backward of iteration j; the
    device's first op of iteration j + 2 waits until every ring of its stages for
    iteration j has ended (the second weight version covers iteration j + 1) - the
    simulator's gating. Transfers and rings reserve links as in :func:`replay`. The steady
    figure is the mean gap between successive iteration ends, the last one left out (an
    iteration ends when every device has run its ops of it and its rings have ended).
    Runs on :func:`run_events`, the gate holding an iteration's first op.
    """
    K = iterations
    M = m * K
    ops = [_ops("2bw", p, d, M, 1, False) for d in range(p)]
    first_of = [{} for _ in range(p)]           # device -> {op index: iteration it opens}
    for d in range(p):
        seen = set()
        for i, (_f, mb, _s) in enumerate(ops[d]):
            j = mb // m
            if j not in seen:
                seen.add(j)
                first_of[d][i] = j
    b_left = {(s, j): m for s in range(p) for j in range(K)}
    ar_left: dict = {}
    done_at: dict = {}                          # (device, iteration) -> its rings' (or backwards') end
    ops_end = [[0.0] * K for _ in range(p)]

    def gate(d, i, is_f, mb, s, ready):
        j = first_of[d].get(i)
        if j is not None and j >= 2:
            g = done_at.get((d, j - 2))
            if g is None:
                return None
            ready = max(ready, g)
        return ready

    def after_op(d, is_f, mb, s, end, start_ring) -> None:
        j = mb // m
        ops_end[d][j] = max(ops_end[d][j], end)
        if not is_f:
            b_left[(s, j)] -= 1
            if b_left[(s, j)] == 0:
                if rings is not None and rings[s] is not None:
                    ar_left[(s, j)] = len(rings[s][0])
                    start_ring(s, j, end)
                else:
                    done_at[(s, j)] = end

    def after_ring(s, j, end, try_start) -> None:
        ar_left[(s, j)] -= 1
        if ar_left[(s, j)] == 0:
            done_at[(s, j)] = end
            try_start(s)

    run_events(p, ops, fwd, bwd, routes, rings, p, M, f"2bw deadlocked in replay (p={p}, m={m})", defaultdict(float),
               gate=gate, after_op=after_op, after_ring=after_ring, probe=probe)
    ends = [max(max(ops_end[d][j], done_at.get((d, j), 0.0)) for d in range(p)) for j in range(K)]
    # the last iteration ends early (nothing after it waits on its rings): mean gap between
    # the ends of the first K - 1 iterations
    return (ends[-2] - ends[0]) / (K - 2), ends[0]


def replay_pipedream(p: int, m: int, fwd: list[float], bwd: list[float], routes: list, rings: list | None,
                     iterations: int = 1, probe=None) -> list[float]:
    """Asynchronous PipeDream (Narayanan et al. SOSP'19): the end of each of ``iterations``
    iterations of ``m`` micro-batches run as one 1F1B stream per device (v = 1, no flush).

    Every micro-batch is a weight update. A replicated stage all-reduces micro-batch k's
    gradient on its ring as soon as B(k) ends (after the gradient for the previous stage
    has left), overlapped with the device's next ops (the paper's stage time max(compute,
    all-reduce)); with two gradient buffers (bapipe.schedules.gradient_buffers) its B(k)
    waits until the all-reduce of micro-batch k - 2 has ended. Forwards never wait for an
    update (weight stashing: each uses the newest weights and keeps that version for its
    backward). Transfers and rings reserve links as in :func:`replay`. An iteration ends
    when every device has run its ops of that iteration's micro-batches and their rings
    have ended. ``bapipe sim`` applies the same gating. Runs on :func:`run_events`, the gate
    holding a backward until its gradient buffer is free.
    """
    from bapipe.schedules import allreduce_gate
    K = iterations
    M = m * K
    buffers = allreduce_gate("pipedream")
    ops = [_ops("pipedream", p, d, M, 1, False) for d in range(p)]
    ar_end = [[None] * M for _ in range(p)]     # [stage][mb]: its all-reduce ended (rings only)
    ar_left: dict = {}
    ends = [0.0] * K

    def gate(d, i, is_f, mb, s, ready):
        if not is_f and rings is not None and rings[s] is not None and mb >= buffers:
            g = ar_end[s][mb - buffers]
            if g is None:
                return None
            ready = max(ready, g)
        return ready

    def after_op(d, is_f, mb, s, end, start_ring) -> None:
        ends[mb // m] = max(ends[mb // m], end)
        if not is_f and rings is not None and rings[s] is not None:
            ar_left[(s, mb)] = len(rings[s][0])
            start_ring(s, mb, end)

    def after_ring(s, k, end, try_start) -> None:
        ar_left[(s, k)] -= 1
        if ar_left[(s, k)] == 0:
            ar_end[s][k] = end
            ends[k // m] = max(ends[k // m], end)
            try_start(s)

    run_events(p, ops, fwd, bwd, routes, rings, p, M, f"pipedream deadlocked in replay (p={p}, m={m})", defaultdict(float),
               gate=gate, after_op=after_op, after_ring=after_ring, probe=probe)
    return ends


def steady_pipedream(p: int, m: int, fwd: list[float], bwd: list[float], routes: list,
                     rings: list | None) -> float:
    """PipeDream's seconds per iteration once running: the mean of n gaps between the ends
    of iterations j0 .. j0 + n, j0 = ceil(p / m) (by then the pipeline holds p micro-batches),
    in a stream of 2 j0 + n + 1 iterations (the last j0 + 1 are shortened by the drain and
    left out: with m = 1 on 3 stages the second-to-last gap was 7% short).

    The steady state may repeat with a period of several micro-batches (a replicated stage
    whose ring is slower than its compute alternates long and short gaps: resnet50 on
    16xV100, one stage x 16, m = 1: 7.19 and 8.79 ms), so the n gaps span a multiple of 12
    micro-batches (periods 1, 2, 3, 4 and 6 average out exactly) when m <= 24; beyond, two
    gaps of m micro-batches each."""
    j0, n = pipedream_window(p, m)
    # the drain reaches back over the last ceil(p / m) iterations (their micro-batches were
    # still in flight when device 0 ran out of forwards): j0 + 1 more are left out after j0 + n
    ends = replay_pipedream(p, m, fwd, bwd, routes, rings, 2 * j0 + n + 1)
    return (ends[j0 + n] - ends[j0]) / n


def pipedream_window(p: int, m: int) -> tuple[int, int]:
    """(j0, n): :func:`steady_pipedream` measures iterations j0 .. j0 + n of a stream of
    2 j0 + n + 1 (planner.breakdown splits the same window)."""
    j0 = -(-p // m)
    return j0, (max(2, 12 // math.gcd(m, 12)) if m <= 24 else 2)
