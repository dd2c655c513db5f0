"""Resharding strategies: how each unit task travels, who sends it, in which order.

Patterns (how a task reaches its receivers):

* ``p2p``    - one copy from a holder to every receiver;
* ``gather`` - per receiving group, the task is cut into chunks; each chunk crosses once
  into the group, then the receivers all-gather the chunks over the group's links (store
  and forward: the gather waits for its chunk);
* ``chain``  - the task is cut into chunks; each chunk is a cut-through broadcast that
  enters every receiving group once, fans out on the group's links and relays on to the
  next group; chunk i enters each group at that group's (i mod size)-th receiver so the
  chunks use different ports.

* ``relay``  - like ``chain``, but a chunk may enter a group by any destination device of
  it (a receiver or not), which then fans it out; the chooser picks the entry with the
  sender, so on a routed cluster the chunks spread over the links between groups.

Chunks: one per receiver of the (largest) group, refined to a common multiple of the
holder count and up to 4x finer while the plan stays small (``_chunks``).

Sender choice (``chooser``): ``first`` holder in task order; ``greedy`` least-loaded
sending port, largest pieces first; ``ordered``: ordering-aware - repeatedly place the
piece that can start earliest at the holder that starts (then finishes) it earliest,
with ties broken by several ranks and seeded random restarts within a deterministic
work budget; ``exact``: every holder assignment when there are few (in the ``ordered``
order).

Timing is list scheduling on the ports and links of ``cost.Network``.
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass

from .cost import Network
from .layout import Box, box_size
from .tasks import UnitTask

PATTERNS = ("p2p", "gather", "chain", "relay")
CHOOSERS = ("first", "greedy", "ordered", "exact")
# relay only pays where routes are uneven: it is tried with the better choosers only
PLAN_SET = tuple((p, CHOOSERS) for p in PATTERNS[:3]) + (("relay", ("greedy", "ordered")),)
EXACT_MAX_ASSIGNMENTS = 1024
EXACT_MAX_WORK = 16_384  # assignments x pieces
ORDERED_WORK_BUDGET = 300_000  # hops placed (holder x piece x hops) across the restarts
ORDERED_MAX_RESTARTS = 24
MAX_CHOICES = 1536  # finer chunking stops at this many (piece, holder) pairs
MAX_CHUNKS = 24


@dataclass(frozen=True)
class Transfer:
    """One cut-through transfer: a box sent along a tree of hops (parents before children)."""

    task: int
    box: Box
    nbytes: int
    edges: tuple[tuple[str, str], ...]
    after: tuple[int, ...] = ()  # transfers (indices in the plan) that must finish first


@dataclass(frozen=True)
class Plan:
    """A timed strategy: transfers in issue order with their start and finish times."""

    name: str
    transfers: tuple[Transfer, ...]
    start_s: tuple[float, ...]
    finish_s: tuple[float, ...]

    @property
    def time_s(self) -> float:
        """Makespan: when the last transfer finishes (0 when nothing moves)."""
        return max(self.finish_s, default=0.0)


@dataclass(frozen=True)
class _Piece:
    """A unit of sender choice: a box for some receivers, expanded once a holder is known."""

    task: int
    box: Box
    nbytes: int
    holders: tuple  # the sender options: holder names (relay: (holder, entry index) pairs)
    pattern: str
    targets: tuple[tuple[str, ...], ...]  # p2p: ((r,),); gather: (group receivers,); chain, relay: groups
    chunk: int = 0
    relays: tuple[tuple[str, ...], ...] = ()  # relay: per group, the devices a chunk may enter by


def split_box(box: Box, k: int) -> list[Box]:
    """Cut a box into at most k near-equal non-empty boxes along its longest dimension."""
    if k <= 1:
        return [box]
    d = max(range(len(box)), key=lambda i: (box[i][1] - box[i][0], -i))
    lo, hi = box[d]
    n = min(k, hi - lo)
    q, r = divmod(hi - lo, n)
    out, s = [], lo
    for i in range(n):
        e = s + q + (1 if i < r else 0)
        out.append(box[:d] + ((s, e),) + box[d + 1:])
        s = e
    return out


def _groups(net: Network, devices) -> list[tuple[str, ...]]:
    """Devices grouped by network group, groups in first-appearance order."""
    out: dict[str, list[str]] = {}
    for d in devices:
        out.setdefault(net.group[d], []).append(d)
    return [tuple(v) for v in out.values()]


def _chunks(receivers: int, holders: int, budget: int) -> int:
    """Chunks per task and group: one per receiver (each enters through its own port),
    refined to a common multiple of the holder count, and up to 4x finer, when affordable
    (so holders can send equal shares and interleave)."""
    room = max(receivers, min(MAX_CHUNKS, budget))
    k = receivers * holders // math.gcd(receivers, holders)
    if k > room:
        return receivers
    # With a choice of senders, finer chunks let them share a receiver's load evenly
    # (senders outnumbering receivers would otherwise wait on each other).
    for m in (4, 2):
        if holders > 1 and k * m <= room:
            return k * m
    return k


def make_pieces(net: Network, tasks: list[UnitTask], pattern: str, dtype_bytes: int) -> list[_Piece]:
    """The pieces of a pattern: the units whose sender the chooser picks."""
    pieces: list[_Piece] = []
    # room for finer chunks (a multiple of the holder count) while the plan stays small
    budget = MAX_CHOICES // max(1, sum(len(t.receivers) * len(t.holders) for t in tasks))
    dst_by_group: dict[str, list[str]] = {}
    for d in net.dst_devices:
        dst_by_group.setdefault(net.group[d], []).append(d)
    for t in tasks:
        if not t.receivers:
            continue
        if pattern == "p2p":
            for r in t.receivers:
                pieces.append(_Piece(t.index, t.box, t.nbytes, t.holders, "p2p", ((r,),)))
        elif pattern == "gather":
            for grp in _groups(net, t.receivers):
                chunks = split_box(t.box, _chunks(len(grp), len(t.holders), budget))
                for i, cb in enumerate(chunks):
                    pieces.append(_Piece(t.index, cb, box_size(cb) * dtype_bytes, t.holders, "gather", (grp,), i))
        elif pattern == "chain":
            groups = _groups(net, t.receivers)
            chunks = split_box(t.box, _chunks(max(len(g) for g in groups), len(t.holders), budget))
            for i, cb in enumerate(chunks):
                pieces.append(_Piece(t.index, cb, box_size(cb) * dtype_bytes, t.holders, "chain",
                                     tuple(groups), i))
        elif pattern == "relay":
            groups = _groups(net, t.receivers)
            hs = set(t.holders)
            relays = tuple(tuple(d for d in dst_by_group[net.group[g[0]]] if d not in hs) or g for g in groups)
            chunks = split_box(t.box, _chunks(max(len(r) for r in relays), len(t.holders), budget))
            # the chooser picks (holder, entry) together: entry k enters group g by relays[g][k % size]
            ways = max(len(r) for r in relays)
            options = tuple((h, k) for h in t.holders for k in range(ways))
            for i, cb in enumerate(chunks):
                pieces.append(_Piece(t.index, cb, box_size(cb) * dtype_bytes, options, "relay",
                                     tuple(groups), i, relays))
        else:
            raise ValueError(f"unknown pattern {pattern!r}")
    return pieces


def expand(piece: _Piece, holder: str) -> list[tuple[tuple[tuple[str, str], ...], tuple[int, ...]]]:
    """The transfers of a piece sent by ``holder``: (edges, local indices it waits for)."""
    if piece.pattern == "p2p":
        return [(((holder, piece.targets[0][0]),), ())]
    if piece.pattern == "gather":
        grp = piece.targets[0]
        entry = grp[piece.chunk % len(grp)]
        out = [(((holder, entry),), ())]
        rest = tuple((entry, r) for r in grp if r != entry)
        if rest:
            out.append((rest, (0,)))
        return out
    # chain: enter each group at its (chunk)-th receiver, fan out, relay to the next group;
    # relay: the same, entering by any destination device of the group (receiver or not)
    edges: list[tuple[str, str]] = []
    k = piece.chunk
    if piece.pattern == "relay":
        holder, k = holder  # an option: (holder, entry index)
    prev = holder
    for gi, grp in enumerate(piece.targets):
        ways = piece.relays[gi] if piece.relays else grp
        entry = ways[k % len(ways)]
        edges.append((prev, entry))
        edges += [(entry, r) for r in grp if r != entry]
        prev = entry
    return [(tuple(edges), ())]


class _Timer:
    """Cached duration and resources of a tree of hops on a network."""

    def __init__(self, net: Network):
        self.net = net
        self.cache: dict = {}

    def shape(self, edges) -> tuple[float, float, tuple]:
        """(bandwidth, deepest latency, resources) of a tree."""
        got = self.cache.get(edges)
        if got is None:
            net = self.net
            bw = min(net.hop_bandwidth(a, b) for a, b in edges)
            depth = {edges[0][0]: 0.0}
            res: list = []
            for a, b in edges:
                depth[b] = depth.get(a, 0.0) + net.hop_latency(a, b)
                res += net.hop_resources(a, b)
            got = (bw, max(depth.values()), tuple(dict.fromkeys(res)))
            self.cache[edges] = got
        return got


def _place(timer: _Timer, free: dict, finish: list, items, nbytes: int, commit: bool):
    """Schedule a piece's transfers after everything placed so far; returns (last finish, times)."""
    times: list[tuple[float, float]] = []
    touched: dict = {}
    for edges, after in items:
        _, _, res = timer.shape(edges)
        t0 = max((touched.get(r, free.get(r, 0.0)) for r in res), default=0.0)
        for a in after:  # local indices: always an earlier transfer of this piece
            t0 = max(t0, times[a][1])
        bw, lat, _ = timer.shape(edges)
        busy = t0 + nbytes / bw
        for r in res:  # ports stream back to back: the next message need not wait out the latency
            touched[r] = busy
        times.append((t0, busy + lat))
    if commit:
        free.update(touched)
    return max(t for _, t in times), times


def _build(name: str, timer: _Timer, pieces, holders, order) -> Plan:
    """Lay the pieces out in ``order`` with the given holders; the timed plan."""
    free: dict = {}
    transfers: list[Transfer] = []
    start: list[float] = []
    finish: list[float] = []
    for i in order:
        p = pieces[i]
        items = expand(p, holders[i])
        base = len(transfers)
        _, times = _place(timer, free, finish, items, p.nbytes, True)
        for (edges, after), (t0, t1) in zip(items, times):
            transfers.append(Transfer(p.task, p.box, p.nbytes, edges, tuple(base + a for a in after)))
            start.append(t0)
            finish.append(t1)
    return Plan(name, tuple(transfers), tuple(start), tuple(finish))


def _egress_key(net: Network, piece: _Piece, h: str):
    """The resource a holder's first hop uses (what the least-loaded rule balances)."""
    first = expand(piece, h)[0][0][0]
    res = net.hop_resources(*first)
    return res[0], net.hop_bandwidth(*first)


def choose_first(net, timer, pieces) -> Plan:
    """Every piece from its first holder, in task order."""
    return _build("first", timer, pieces, [p.holders[0] for p in pieces], range(len(pieces)))


def _size_order(pieces) -> list[int]:
    return sorted(range(len(pieces)), key=lambda i: (-pieces[i].nbytes, i))


def choose_greedy(net, timer, pieces) -> Plan:
    """Largest pieces first, each from the holder whose sending port has the least load."""
    load: dict = {}
    holders: list[str] = [""] * len(pieces)
    order = _size_order(pieces)
    for i in order:
        p = pieces[i]
        best = None
        for h in p.holders:
            key, bw = _egress_key(net, p, h)
            cost = load.get(key, 0.0) + p.nbytes / bw
            if best is None or cost < best[0]:
                best = (cost, h, key)
        load[best[2]] = best[0]
        holders[i] = best[1]
    return _build("greedy", timer, pieces, holders, order)


def _ordered_pass(timer, pieces, order) -> tuple[float, list[str]]:
    """One ordering-aware pass: each piece at the holder that finishes it earliest."""
    free: dict = {}
    finish: list[float] = []
    holders: list[str] = [""] * len(pieces)
    makespan = 0.0
    for i in order:
        p = pieces[i]
        best = None
        for h in p.holders:
            end, _ = _place(timer, free, finish, expand(p, h), p.nbytes, False)
            if best is None or end < best[0] - 1e-15:
                best = (end, h)
        end, times = _place(timer, free, finish, expand(p, best[1]), p.nbytes, True)
        finish += [t1 for _, t1 in times]
        holders[i] = best[1]
        makespan = max(makespan, end)
    return makespan, holders


def _touches(p: _Piece) -> int:
    """Hops of a piece's transfers: the work unit of the ordering-aware budget."""
    return sum(len(edges) for edges, _ in expand(p, p.holders[0]))


def _dense_pass(timer, pieces, rank, counter=None, limit: float = math.inf) -> tuple[float, list[str], list[int]]:
    """One ordering-aware pass: repeatedly place the piece that can start earliest, at its best holder.

    Ports only ever get busier, so a piece's earliest start never decreases: a lazy heap
    (re-check the top, push it back if it got later) picks the true earliest each step.
    Ties of start time go to the lower ``rank`` (largest first, task order, smallest first,
    then seeded shuffles).
    """
    free: dict = {}
    finish: list[float] = []
    holders: list[str] = [""] * len(pieces)
    order: list[int] = []

    def best_of(i):
        p = pieces[i]
        best = None
        if counter is not None:
            counter[0] += len(p.holders) * cost[i]
        for h in p.holders:
            items = expand(p, h)
            end, times = _place(timer, free, finish, items, p.nbytes, False)
            # the option: earliest start, then the fewest ports and links held (leaves the
            # most room for the pieces still to come), then earliest finish
            nres = sum(len(timer.shape(edges)[2]) for edges, _ in items)
            key = (math.floor(times[0][0] / quantum), nres, end)
            if best is None or key < best[0]:
                best = (key, h, (times[0][0], end))
        return best[2], best[1]

    # Starts closer than a tenth of a typical piece count as equal, so near-equal pieces
    # (uneven array_split chunks) are ordered by rank, not by a sliver of time.
    durs = sorted(p.nbytes / timer.shape(expand(p, p.holders[0])[0][0])[0] for p in pieces)
    quantum = max(durs[len(durs) // 2] * 0.1, 1e-15) if durs else 1.0
    cost = [_touches(p) for p in pieces]
    heap = []
    for i in range(len(pieces)):
        key, h = best_of(i)
        heap.append((math.floor(key[0] / quantum), rank[i], i))
    heapq.heapify(heap)
    makespan = 0.0
    while heap:
        if counter is not None and counter[0] > limit:
            return math.inf, holders, order  # over budget: this pass is dropped
        s0, r, i = heapq.heappop(heap)
        (s1, e1), h = best_of(i)
        q = math.floor(s1 / quantum)
        if heap and (q, r) > heap[0][:2]:
            heapq.heappush(heap, (q, r, i))
            continue
        end, times = _place(timer, free, finish, expand(pieces[i], h), pieces[i].nbytes, True)
        finish += [t1 for _, t1 in times]
        holders[i] = h
        order.append(i)
        makespan = max(makespan, end)
    return makespan, holders, order


def choose_ordered(net, timer, pieces, seed: int = 0,
                   max_restarts: int = ORDERED_MAX_RESTARTS) -> tuple[Plan, list[int]]:
    """Ordering-aware greedy: one largest-first pass, then earliest-start passes whose ties
    go by size (largest, then smallest first), task order, then seeded random ranks
    (restarts) while the placement budget lasts; the best (plan, order) wins."""
    rng = random.Random(seed)
    size_rank = [0] * len(pieces)
    for k, i in enumerate(_size_order(pieces)):
        size_rank[i] = k
    span, holders = _ordered_pass(timer, pieces, _size_order(pieces))
    best = (span, holders, _size_order(pieces))
    ranks = [size_rank, list(range(len(pieces))), [len(pieces) - 1 - k for k in size_rank]]
    counter = [0]  # placements tried: a deterministic work budget (no wall clock)
    choices = sum(len(p.holders) * _touches(p) for p in pieces)
    if choices * 8 > ORDERED_WORK_BUDGET:  # too big for earliest-start passes: keep the static one
        ranks, max_restarts = [], 0
    for k in range(len(ranks) + max_restarts):
        if k >= len(ranks):
            r = list(range(len(pieces)))
            rng.shuffle(r)
            ranks.append(r)
        # the first pass may use several budgets' worth: a big case still gets one
        span, holders, order = _dense_pass(timer, pieces, ranks[k], counter,
                                           ORDERED_WORK_BUDGET * (4 if k == 0 else 1))
        if span < best[0] - 1e-15:
            best = (span, holders, order)
        if counter[0] >= ORDERED_WORK_BUDGET:
            break
    return _build("ordered", timer, pieces, best[1], best[2]), best[2]


def choose_exact(net, timer, pieces, order=None) -> Plan | None:
    """Every holder assignment (for at most EXACT_MAX_ASSIGNMENTS); None when too many."""
    choice = [i for i, p in enumerate(pieces) if len(p.holders) > 1]
    n = 1
    for i in choice:
        n *= len(pieces[i].holders)
        if n > EXACT_MAX_ASSIGNMENTS or n * len(pieces) > EXACT_MAX_WORK:
            return None
    order = list(order) if order is not None else _size_order(pieces)
    best = None
    base = [p.holders[0] for p in pieces]
    for combo in itertools.product(*(pieces[i].holders for i in choice)):
        holders = list(base)
        for i, h in zip(choice, combo):
            holders[i] = h
        plan = _build("exact", timer, pieces, holders, order)
        if best is None or plan.time_s < best.time_s - 1e-15:
            best = plan
    return best


def run_strategies(net: Network, tasks: list[UnitTask], dtype_bytes: int, seed: int = 0,
                   plan_set=PLAN_SET, only=None, max_restarts: int = ORDERED_MAX_RESTARTS) -> list[Plan]:
    """The (pattern, chooser) plans of ``plan_set``, named ``pattern/chooser`` (choosers
    limited to ``only`` when given); exact only where small enough."""
    timer = _Timer(net)
    out: list[Plan] = []
    for pat, choosers in plan_set:
        if pat == "relay" and not net.routes:
            continue  # with a port per device, entering by a non-receiver only adds a hop
        pieces = make_pieces(net, tasks, pat, dtype_bytes)
        ordered_order = None
        for ch in choosers:
            if only is not None and ch not in only:
                continue
            if ch == "first":
                plan = choose_first(net, timer, pieces)
            elif ch == "greedy":
                plan = choose_greedy(net, timer, pieces)
            elif ch == "ordered":
                plan, ordered_order = choose_ordered(net, timer, pieces, seed, max_restarts)
            elif ch == "exact":
                # keep the order the ordering-aware pass found (if it ran)
                plan = choose_exact(net, timer, pieces, ordered_order)
                if plan is None:
                    continue
            else:
                raise ValueError(f"unknown chooser {ch!r}")
            out.append(Plan(f"{pat}/{ch}", plan.transfers, plan.start_s, plan.finish_s))
    return out
