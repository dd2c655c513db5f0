"""Every placement of pipeline stages onto boards, up to interchangeable boards (issue 19).

A placement gives each pipeline position a non-empty group of boards (its data-parallel
replicas), boards left idle allowed; a group's replicas run in topology (index) order, the
order its ring all-reduce visits them and its transfers pair them (``Explorer.pieces``).

Two boards are *interchangeable* when they have the same board type, sit in the same host,
and swapping them maps every board-to-board route of the cluster onto the route between the
swapped ends, link for link with the same bandwidth, latency and kind
(:func:`route_equivariant`). Everything the planner prices a placement with is a function of
the boards' types and of those routes (stage tables per board type; transfers, link loads,
framing and rings per route and link), so a swap of interchangeable boards leaves J and the
replay unchanged, bit for bit, and so does any composition of swaps. Boards are grouped
into *classes*: runs of consecutive boards, each pair interchangeable. Because a class is a
run of indices, a group sorted by index lists its classes in a fixed order, so two
placements that take the same number of boards of every class for every position are
images of each other under a product of swaps inside classes (re-sorting a group only
permutes boards of one class among themselves): they have the same J. :func:`placements`
enumerates one placement per such pattern. Hosts with the same contents are not merged: a
host swap can reorder a group's replicas (a stage on boards of two hosts), which changes
which replicas exchange activations, so it is not a symmetry of this space.
"""
from __future__ import annotations

import itertools

#: every placement is searched (planner.search.Explorer.every_placement) when its patterns x the
#: (schedule, m) pairs each is tried with are at most this many, else the board orders
#: (Explorer.orders): every random instance of tests/test_planner_bruteforce.py (up to 25,180
#: patterns x 1 pair) is searched exactly, while hetero-mix under auto (2,859 patterns x 30
#: pairs) keeps the orders, for the sweep's time (docs/planner.md section 6). Here, not in
#: planner.search, so that the CLI's help reads it without importing the search.
PLACE_WORK = 30000
#: the most `bapipe plan --placements` accepts: every pattern and its configurations are held in
#: memory at once (Explorer.configs), so an unbounded count is an unbounded allocation
PLACE_WORK_MAX = 10 ** 6


def route_equivariant(cluster, names: list[str], swap: dict[str, str]) -> bool:
    """Whether the node map ``swap`` (a permutation of some node names, identity elsewhere)
    maps the route between every two boards of ``names`` onto the route between their
    images, link for link (same bandwidth, latency and kind)."""
    s = lambda x: swap.get(x, x)  # noqa: E731
    for a, b in itertools.permutations(names, 2):
        r1, r2 = cluster.route(a, b), cluster.route(s(a), s(b))
        if len(r1) != len(r2):
            return False
        for l1, l2 in zip(r1, r2):
            if {s(l1.a), s(l1.b)} != {l2.a, l2.b} or (l1.bandwidth_Bps, l1.latency_s, l1.kind) != \
                    (l2.bandwidth_Bps, l2.latency_s, l2.kind):
                return False
    return True


def board_classes(cluster, boards) -> list[int]:
    """Class id of every board of ``boards`` (ClusterBoards in index order): maximal runs of
    consecutive boards of one type and host in which every two boards are interchangeable
    (:func:`route_equivariant` of their swap)."""
    names = [cb.name for cb in boards]
    out, cls = [], -1
    start = 0
    for i, cb in enumerate(boards):
        same = i > 0 and (cb.board.name, cb.host) == (boards[i - 1].board.name, boards[i - 1].host)
        # interchangeable with every board of the current run (a swap with one member and
        # that member's swaps with the others generate the rest, but checking all is cheap)
        if same and all(route_equivariant(cluster, names, {names[j]: cb.name, cb.name: names[j]})
                        for j in range(start, i)):
            out.append(cls)
            continue
        cls += 1
        start = i
        out.append(cls)
    return out


def placements(types: list[str], classes: list[int], pmax: int, rmax: int,
               limit: int) -> list[tuple[tuple[int, ...], ...]] | None:
    """One placement (groups of board indices, each sorted) per pattern of boards taken from
    every class by every position: p = 1..pmax positions, each a non-empty group of one board
    type with at most ``rmax`` boards, boards left idle allowed. None when there are more than
    ``limit`` patterns (the caller falls back to fewer layouts)."""
    ncls = max(classes) + 1
    members = [[i for i, c in enumerate(classes) if c == k] for k in range(ncls)]
    ctype = [types[m[0]] for m in members]
    by_type: dict[str, list[int]] = {}
    for k in range(ncls):
        by_type.setdefault(ctype[k], []).append(k)
    out: list = []

    def groups(avail: tuple[int, ...]):
        """Every (count taken per class, new avail) of one non-empty single-type group."""
        for ks in by_type.values():
            for take in itertools.product(*(range(avail[k] + 1) for k in ks)):
                r = sum(take)
                if 1 <= r <= rmax:
                    nxt = list(avail)
                    for k, x in zip(ks, take):
                        nxt[k] -= x
                    yield tuple(zip(ks, take)), tuple(nxt)

    def rec(prefix: list, avail: tuple[int, ...]) -> bool:
        for g, nxt in groups(avail):
            pl = prefix + [g]
            out.append(pl)
            if len(out) > limit:
                return False
            if len(pl) < pmax and not rec(pl, nxt):
                return False
        return True

    if pmax < 1 or not rec([], tuple(len(m) for m in members)):
        return None if pmax >= 1 else []
    res = []
    for pl in out:
        used = [0] * ncls
        gs = []
        for g in pl:
            idx = []
            for k, x in g:
                idx += members[k][used[k]:used[k] + x]
                used[k] += x
            gs.append(tuple(sorted(idx)))
        res.append(tuple(gs))
    return res
