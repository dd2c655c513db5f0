"""The network a resharding runs on: devices in groups, ports and links, latency.

Model (what the strategies are timed against):

* every device has one *inter-group* egress port and one ingress port (``egress_Bps``,
  ``ingress_Bps``); a hop between groups holds the sender's egress and the receiver's
  ingress port for the whole transfer;
* inside a group devices are joined by a full mesh of directed *intra-group* links
  (``intra_Bps`` each way per pair, e.g. host links or direct cables); a hop inside a group
  holds only its own directed link, so a device can feed all its group peers at once;
* a transfer is a tree rooted at a holder with cut-through relay: every port and link of
  the tree streams for ``bytes / (slowest hop bandwidth)`` and the data is complete at the
  leaves ``(deepest path latency)`` later; a port or link streams one transfer at a time,
  but back-to-back transfers overlap their latencies (the wire is pipelined).

From a cluster (``network_from_cluster``) a hop instead holds every directed link of its
route (route mode), so shared host NICs, PCIe and a ring's few links between hosts are
contended as routed.

Default without a cluster (``default_network``): source and destination devices are
distinct boards; a mesh's axis 0 indexes groups (a 1-d mesh ``n`` is cut into groups of
4), source groups first. Every link is 100 Gb/s (12.5 GB/s) per direction; a hop between
groups costs 0.5 us latency, a hop inside a group 0.25 us.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any, Mapping

from bapipe.errors import SpecError

DEFAULT_LINK_BPS = 100e9 / 8  # 100 Gb/s per direction
DEFAULT_INTER_LATENCY_S = 0.5e-6
DEFAULT_INTRA_LATENCY_S = 0.25e-6
DEFAULT_GROUP_SIZE = 4


@dataclass(frozen=True)
class Network:
    """Devices of one resharding (source mesh then destination mesh, row-major) and their links.

    Two modes. *Port mode* (``routes`` empty; the default network): per-device inter-group
    ports and a full mesh of intra-group links. *Route mode* (built from a cluster): a hop
    a -> b holds every directed cluster link on its route, at the slowest link's bandwidth.
    """

    src_devices: tuple[str, ...]
    dst_devices: tuple[str, ...]
    group: Mapping[str, str]  # device -> group (host) name
    egress_Bps: Mapping[str, float]  # port mode: inter-group port, per device
    ingress_Bps: Mapping[str, float]
    intra_Bps: Mapping[str, float]  # port mode, per group: each directed intra-group link
    inter_latency_s: float = DEFAULT_INTER_LATENCY_S
    intra_latency_s: float = DEFAULT_INTRA_LATENCY_S
    pair_latency_s: Mapping[tuple[str, str], float] = field(default_factory=dict)  # overrides per hop
    name: str = "default"
    # route mode: (a, b) -> directed links (u, v) on the route; (u, v) -> bandwidth
    routes: Mapping[tuple[str, str], tuple[tuple[str, str], ...]] = field(default_factory=dict)
    link_Bps: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # route mode: group -> every routing node of the group (all its boards, its host node)
    group_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def hop_bandwidth(self, a: str, b: str) -> float:
        """Bandwidth of one hop a -> b."""
        if self.routes:
            return min(self.link_Bps[ln] for ln in self.routes[(a, b)])
        if self.group[a] == self.group[b]:
            return self.intra_Bps[self.group[a]]
        return min(self.egress_Bps[a], self.ingress_Bps[b])

    def hop_latency(self, a: str, b: str) -> float:
        """Latency of one hop a -> b."""
        lat = self.pair_latency_s.get((a, b))
        if lat is not None:
            return lat
        return self.intra_latency_s if self.group[a] == self.group[b] else self.inter_latency_s

    def hop_resources(self, a: str, b: str) -> tuple[tuple, ...]:
        """What a hop holds while it runs: its route's directed links (route mode); else the
        directed link inside a group, or the sender's egress and receiver's ingress port."""
        if self.routes:
            return tuple(("wire", u, v) for u, v in self.routes[(a, b)])
        if self.group[a] == self.group[b]:
            return (("link", a, b),)
        return (("tx", a), ("rx", b))

    def min_latency(self) -> float:
        """The smallest hop latency anywhere (a term of the lower bound)."""
        vals = [self.inter_latency_s, self.intra_latency_s, *self.pair_latency_s.values()]
        return min(vals)

    # --- capacities for the lower bound (valid whatever a plan does) -------------------
    def _members(self, g: str) -> list[str]:
        return [d for d in dict.fromkeys(self.src_devices + self.dst_devices) if self.group[d] == g]

    def _wires(self, into=None, out_of=None) -> float:
        return sum(bw for (u, v), bw in self.link_Bps.items()
                   if (into is None or (v in into and u not in into)) and
                   (out_of is None or (u in out_of and v not in out_of)))

    def device_in_cap(self, d: str) -> float:
        """Most bytes/s device d can take in (port plus group links, or its cluster links)."""
        if self.routes:
            return self._wires(into={d})
        return self.ingress_Bps[d] + self.intra_Bps[self.group[d]] * (len(self._members(self.group[d])) - 1)

    def device_out_cap(self, d: str, with_group: bool) -> float:
        """Most bytes/s device d can send (group links counted only when ``with_group``)."""
        if self.routes:
            return self._wires(out_of={d})
        extra = self.intra_Bps[self.group[d]] * (len(self._members(self.group[d])) - 1) if with_group else 0.0
        return self.egress_Bps[d] + extra

    def group_in_cap(self, g: str) -> float:
        """Most bytes/s that can enter group g from outside it."""
        if self.routes:
            return self._wires(into=set(self.group_nodes.get(g, ())) | set(self._members(g)))
        return sum(self.ingress_Bps[d] for d in self._members(g))

    def group_out_cap(self, g: str) -> float | None:
        """Most bytes/s that can leave group g (None: no cap beyond its devices' own)."""
        if self.routes:
            return self._wires(out_of=set(self.group_nodes.get(g, ())) | set(self._members(g)))
        return None


def _default_groups(mesh: tuple[int, ...], offset: int, prefix: str) -> list[str]:
    n = prod(mesh)
    per = prod(mesh[1:]) if len(mesh) > 1 else DEFAULT_GROUP_SIZE
    return [f"{prefix}g{offset + i // per}" for i in range(n)]


def default_network(src_mesh: tuple[int, ...], dst_mesh: tuple[int, ...],
                    link_Bps: float = DEFAULT_LINK_BPS) -> Network:
    """The documented default: groups of a mesh's axis 0 (or of 4), 100 Gb/s everywhere."""
    src = tuple(f"s{i}" for i in range(prod(src_mesh)))
    dst = tuple(f"d{i}" for i in range(prod(dst_mesh)))
    sg = _default_groups(src_mesh, 0, "s")
    dg = _default_groups(dst_mesh, 0, "d")
    group = dict(zip(src, sg)) | dict(zip(dst, dg))
    devs = src + dst
    return Network(src, dst, group, {d: link_Bps for d in devs}, {d: link_Bps for d in devs},
                   {g: link_Bps for g in set(group.values())}, name="default")


def network_from_cluster(cluster: Any, src_boards, dst_boards) -> Network:
    """A route-mode Network from a bapipe Cluster and the board names of the two meshes (row-major).

    Groups are the cluster's hosts. A hop a -> b holds every directed link of the
    cluster's route from a to b (so a ring's few links between hosts, a host's NIC behind
    a switch, or PCIe to the host are shared exactly as routed) and runs at the slowest
    link's bandwidth; its latency is the route's latency. Boards may be in both meshes
    (a resharding in place): a receiver that already holds a box copies it locally.
    """
    src_boards, dst_boards = tuple(src_boards), tuple(dst_boards)
    for what, names in (("src_boards", src_boards), ("dst_boards", dst_boards)):
        if not names:
            raise SpecError(None, None, what, "expected at least one board")
        if len(set(names)) != len(names):
            raise SpecError(None, None, what, f"expected distinct board names, got {list(names)}")
    devs = tuple(dict.fromkeys(src_boards + dst_boards))
    group, port = {}, {}
    for d in devs:
        cb = cluster.board(d)  # SpecError for an unknown board
        group[d] = cb.host
        port[d] = float(cb.board.port_bw_Bps)
    routes: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
    link_bw: dict[tuple[str, str], float] = {}
    lat: dict[tuple[str, str], float] = {}
    for ln in cluster.links:  # every directed link, for the bound's capacities
        for u, v in ((ln.a, ln.b), (ln.b, ln.a)):
            link_bw[(u, v)] = max(link_bw.get((u, v), 0.0), float(ln.bandwidth_Bps))
    for a in devs:
        for b in devs:
            if a == b:
                continue
            hops, _bw, lat[(a, b)] = cluster.path(a, b)  # SpecError when no route
            routes[(a, b)] = tuple((u, v) for u, v, _ln in hops)
    # a route's bandwidth is its slowest link's; parallel links: the one routing picked
    for (a, b), path in routes.items():
        for ln in cluster.route(a, b):
            for key in ((ln.a, ln.b), (ln.b, ln.a)):
                if key in path:
                    link_bw[key] = float(ln.bandwidth_Bps)
    nodes: dict[str, tuple[str, ...]] = {}
    known = set(cluster.nodes())
    for h in cluster.hosts:
        nodes[h.name] = tuple(h.boards) + ((h.name,) if h.name in known else ())
    intra: dict[str, float] = {}
    for g in set(group.values()):
        inside = [routes[(a, b)] for a in devs for b in devs if a != b and group[a] == group[b] == g]
        intra[g] = min((min(link_bw[ln] for ln in r) for r in inside), default=min(port[d] for d in devs
                                                                                   if group[d] == g))
    inter = [v for (a, b), v in lat.items() if group[a] != group[b]] or [DEFAULT_INTER_LATENCY_S]
    intra_l = [v for (a, b), v in lat.items() if group[a] == group[b]] or [DEFAULT_INTRA_LATENCY_S]
    return Network(src_boards, dst_boards, group, port, dict(port), intra, min(inter), min(intra_l), lat,
                   name=getattr(cluster, "name", "cluster"), routes=routes, link_Bps=link_bw, group_nodes=nodes)
