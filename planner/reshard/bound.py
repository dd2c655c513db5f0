"""A lower bound on the time of any resharding plan on a ``cost.Network``.

Three bandwidth terms, each a valid bound on its own once the latency of the last hop
through its bottleneck is added (inter-group latency where that hop must cross groups,
else the smallest hop latency); the bound is the largest:

* **group ingress**: the bytes a receiving group needs and no device of the group holds
  must enter through the group's inter-group ingress ports;
* **holder egress**: every box some receiver lacks leaves at least one of its holders at
  least once; the best fractional split of those bytes over the holders, each limited by
  its egress (inter-group port plus its intra-group links when it shares a group with a
  receiver), is found exactly as the least T for which a flow network
  (source -> holder set -> holder -> sink, holder capacity T x egress) carries every byte:
  a binary search on T over a max-flow we compute ourselves (Dinic);
* **device ingress**: each receiver must take in every byte it lacks through its
  inter-group port and its intra-group links.

On a routed cluster network (route mode) the two ingress terms use the max flow (min cut)
of the links that routes between the devices use, from the bytes' holders into the group
or the device, instead of summed ports.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .cost import Network
from .tasks import UnitTask


@dataclass(frozen=True)
class Bound:
    """The lower bound and its terms (seconds)."""

    time_s: float
    group_ingress_s: float
    holder_egress_s: float
    device_ingress_s: float
    latency_s: float  # what the latency adds to the largest bandwidth term


class _MaxFlow:
    """Dinic's max-flow on float capacities (small graphs)."""

    def __init__(self, n: int):
        self.n = n
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[float] = []

    def add(self, u: int, v: int, c: float) -> None:
        """An edge u -> v of capacity c (and its residual twin)."""
        self.adj[u].append(len(self.to)); self.to.append(v); self.cap.append(c)
        self.adj[v].append(len(self.to)); self.to.append(u); self.cap.append(0.0)

    def run(self, s: int, t: int, eps: float) -> float:
        """The maximum flow from s to t (augmenting paths narrower than eps are ignored)."""
        flow = 0.0
        while True:
            level = [-1] * self.n
            level[s] = 0
            q = deque([s])
            while q:
                u = q.popleft()
                for e in self.adj[u]:
                    if self.cap[e] > eps and level[self.to[e]] < 0:
                        level[self.to[e]] = level[u] + 1
                        q.append(self.to[e])
            if level[t] < 0:
                return flow
            it = [0] * self.n

            def dfs(u: int, f: float) -> float:
                if u == t:
                    return f
                while it[u] < len(self.adj[u]):
                    e = self.adj[u][it[u]]
                    v = self.to[e]
                    if self.cap[e] > eps and level[v] == level[u] + 1:
                        got = dfs(v, min(f, self.cap[e]))
                        if got > 0:
                            self.cap[e] -= got
                            self.cap[e ^ 1] += got
                            return got
                    it[u] += 1
                return 0.0

            while True:
                f = dfs(s, float("inf"))
                if f <= 0:
                    break
                flow += f


def fractional_makespan(demands: dict[tuple[str, ...], float], rate: dict[str, float],
                        pool: dict[str, str] | None = None, pool_rate: dict[str, float] | None = None,
                        rel_tol: float = 1e-10) -> float:
    """min T such that each demand (bytes over a set of senders) splits over its senders with
    every sender h carrying at most T * rate[h] (and the senders of a pool together at most
    T * pool_rate[pool]); returns a value within rel_tol below the optimum."""
    pool, pool_rate = pool or {}, pool_rate or {}
    demands = {k: v for k, v in demands.items() if v > 0}
    if not demands:
        return 0.0
    total = sum(demands.values())
    senders = sorted({h for k in demands for h in k})
    lo = max(v / sum(rate[h] for h in k) for k, v in demands.items())  # each set alone
    lo = max(lo, total / sum(rate[h] for h in senders))

    def eff(h: str) -> float:
        return min(rate[h], pool_rate.get(pool.get(h), float("inf")))

    hi = max(v / max(eff(h) for h in k) for k, v in demands.items()) * len(demands)  # all from the best sender
    hi = max(hi, lo)
    sets = list(demands)
    pools = sorted(set(pool[h] for h in senders if h in pool))
    hid = {h: 1 + len(sets) + i for i, h in enumerate(senders)}
    pid = {p: 1 + len(sets) + len(senders) + i for i, p in enumerate(pools)}
    sink = 1 + len(sets) + len(senders) + len(pools)

    def feasible(T: float) -> bool:
        g = _MaxFlow(sink + 1)
        for i, k in enumerate(sets):
            g.add(0, 1 + i, demands[k])
            for h in k:
                g.add(1 + i, hid[h], float("inf"))
        for h in senders:
            g.add(hid[h], pid[pool[h]] if h in pool else sink, T * rate[h])
        for p in pools:
            g.add(pid[p], sink, T * pool_rate[p])
        return g.run(0, sink, total * 1e-15) >= total * (1 - 1e-12)

    if feasible(lo):
        return lo
    for _ in range(200):  # lo infeasible, hi feasible
        if hi - lo <= rel_tol * hi:
            break
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo


def _used_links(net: Network) -> dict[tuple[str, str], float]:
    """Route mode: the directed links some route between two devices uses (no other link
    can carry a byte of any plan, since every hop follows a route)."""
    used = {}
    for path in net.routes.values():
        for ln in path:
            used[ln] = net.link_Bps[ln]
    return used


def _cut_term(net: Network, moving: list[UnitTask], inside: set[str]) -> float:
    """Route mode: bytes the receivers in ``inside`` need and nobody inside holds, over the
    max flow of the used links from those bytes' holders into ``inside`` (a min cut every
    such byte crosses at least once)."""
    need = 0
    sources: set[str] = set()
    for t in moving:
        if any(r in inside for r in t.receivers) and not any(h in inside for h in t.holders):
            need += t.nbytes
            sources.update(t.holders)
    if need == 0:
        return 0.0
    links = _used_links(net)
    nodes = sorted({u for u, _ in links} | {v for _, v in links} | sources | inside)
    idx = {n: i + 2 for i, n in enumerate(nodes)}  # 0: super source, 1: super sink
    g = _MaxFlow(len(nodes) + 2)
    for (u, v), bw in links.items():
        g.add(idx[u], idx[v], bw)
    for s in sources:
        g.add(0, idx[s], float("inf"))
    for d in inside:
        g.add(idx[d], 1, float("inf"))
    cap = g.run(0, 1, 1e-9)
    return need / cap if cap > 0 else float("inf")


def lower_bound(net: Network, tasks: list[UnitTask]) -> Bound:
    """The lower bound of any plan moving ``tasks`` on ``net`` (see the module docstring)."""
    moving = [t for t in tasks if t.receivers]
    if not moving:
        return Bound(0.0, 0.0, 0.0, 0.0, 0.0)
    # group ingress
    need_g: dict[str, int] = {}
    for t in moving:
        hold_groups = {net.group[h] for h in t.holders}
        for g in {net.group[r] for r in t.receivers}:
            if g not in hold_groups:
                need_g[g] = need_g.get(g, 0) + t.nbytes
    if net.routes:  # route mode: the min cut of the routed links from the holders into the group
        group_s = max((_cut_term(net, moving, {d for d in net.dst_devices + net.src_devices if net.group[d] == g})
                       for g in need_g), default=0.0)
    else:
        group_s = max((b / net.group_in_cap(g) for g, b in need_g.items()), default=0.0)

    # device ingress
    need_d: dict[str, int] = {}
    for t in moving:
        for r in t.receivers:
            need_d[r] = need_d.get(r, 0) + t.nbytes
    if net.routes:
        device_s = max(_cut_term(net, moving, {d}) for d in need_d)
    else:
        device_s = max(b / net.device_in_cap(d) for d, b in need_d.items())

    # holder egress (fractional split)
    recv_groups = {net.group[r] for t in moving for r in t.receivers}
    rate = {}
    demands: dict[tuple[str, ...], float] = {}
    for t in moving:
        key = tuple(sorted(t.holders))
        demands[key] = demands.get(key, 0.0) + t.nbytes
        for h in key:
            rate[h] = net.device_out_cap(h, net.group[h] in recv_groups)
    # A holder group with no receiver inside must send through the group's way out.
    caps = {}
    for h in rate:
        g = net.group[h]
        if g not in recv_groups and g not in caps:
            cap = net.group_out_cap(g)
            if cap is not None:
                caps[g] = cap
    egress_s = fractional_makespan(demands, rate, {h: net.group[h] for h in rate if net.group[h] in caps}, caps)
    # Latency: the last byte through the bottleneck still has a hop to cross. Into a group
    # that holds none of it, that hop is an inter-group one.
    lat = net.min_latency()
    inter = net.inter_latency_s
    mixed = bool(recv_groups & {net.group[h] for t in moving for h in t.holders})
    time_s = max(group_s + inter if need_g else 0.0, egress_s + (lat if mixed else inter), device_s + lat)
    return Bound(time_s, group_s, egress_s, device_s, time_s - max(group_s, egress_s, device_s))
