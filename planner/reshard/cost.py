"""The network a resharding runs on: devices in groups, ports and links, latency.

Model (what the strategies are timed against):

* every device has one *inter-group* egress port and one ingress port (``egress_Bps``,
  ``ingress_Bps``); a hop between groups holds the sender's egress and the receiver's
  ingress port for the whole transfer;
* inside a group devices are joined by a full mesh of directed *intra-group* links
  (``intra_Bps`` each way per pair, e.g. host links or direct cables); a hop inside a group
  holds only its own directed link, so a device can feed all its group peers at once;
* optionally a group has one shared uplink (a host NIC behind a switch): every hop into
  or out of the group also holds it;
* a transfer is a tree rooted at a holder with cut-through relay: every port and link of
  the tree streams for ``bytes / (slowest hop bandwidth)`` and the data is complete at the
  leaves ``(deepest path latency)`` later; a port or link streams one transfer at a time,
  but back-to-back transfers overlap their latencies (the wire is pipelined).

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
    """Devices of one resharding (source mesh then destination mesh, row-major) and their links."""

    src_devices: tuple[str, ...]
    dst_devices: tuple[str, ...]
    group: Mapping[str, str]  # device -> group (host) name
    egress_Bps: Mapping[str, float]  # inter-group port, per device
    ingress_Bps: Mapping[str, float]
    intra_Bps: Mapping[str, float]  # per group: each directed intra-group link
    inter_latency_s: float = DEFAULT_INTER_LATENCY_S
    intra_latency_s: float = DEFAULT_INTRA_LATENCY_S
    pair_latency_s: Mapping[tuple[str, str], float] = field(default_factory=dict)  # overrides per hop
    name: str = "default"
    # per group: one shared uplink (e.g. a host NIC) every inter-group hop in or out of the
    # group also holds; groups not listed have none (each device's port is its own).
    uplink_Bps: Mapping[str, float] = field(default_factory=dict)

    def hop_bandwidth(self, a: str, b: str) -> float:
        """Bandwidth of one hop a -> b."""
        ga, gb = self.group[a], self.group[b]
        if ga == gb:
            return self.intra_Bps[ga]
        return min(self.egress_Bps[a], self.ingress_Bps[b], self.uplink_Bps.get(ga, float("inf")),
                   self.uplink_Bps.get(gb, float("inf")))

    def hop_latency(self, a: str, b: str) -> float:
        """Latency of one hop a -> b."""
        lat = self.pair_latency_s.get((a, b))
        if lat is not None:
            return lat
        return self.intra_latency_s if self.group[a] == self.group[b] else self.inter_latency_s

    def hop_resources(self, a: str, b: str) -> tuple[tuple, ...]:
        """What a hop holds while it runs: the directed link inside a group, else two ports."""
        ga, gb = self.group[a], self.group[b]
        if ga == gb:
            return (("link", a, b),)
        res = [("tx", a), ("rx", b)]
        if ga in self.uplink_Bps:
            res.append(("up", ga))
        if gb in self.uplink_Bps:
            res.append(("down", gb))
        return tuple(res)

    def min_latency(self) -> float:
        """The smallest hop latency anywhere (a term of the lower bound)."""
        vals = [self.inter_latency_s, self.intra_latency_s, *self.pair_latency_s.values()]
        return min(vals)


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
    """A Network from a bapipe Cluster and the board names of the two meshes (row-major).

    Groups are the cluster's hosts. A board's inter-group port bandwidth is its board
    type's ``port_bw_Bps``, capped by the first link of its route to a board of another
    group (e.g. PCIe to the host); a host that is itself a routing node (a switch attached to
    hosts) gets a shared uplink of its links to the outside. The intra-group link bandwidth of a host is the fastest link
    the cluster has between two boards of that host (e.g. NVLink), else the slowest port
    of its boards. Hop latencies are the cluster's routed path latencies. Boards may be
    in both meshes (a resharding in place); a receiver that already holds a box copies it
    locally.
    """
    src_boards, dst_boards = tuple(src_boards), tuple(dst_boards)
    for what, names in (("src_boards", src_boards), ("dst_boards", dst_boards)):
        if not names:
            raise SpecError(None, None, what, "expected at least one board")
        if len(set(names)) != len(names):
            raise SpecError(None, None, what, f"expected distinct board names, got {list(names)}")
    devs = tuple(dict.fromkeys(src_boards + dst_boards))
    group, eg, ing = {}, {}, {}
    for d in devs:
        cb = cluster.board(d)  # SpecError for an unknown board
        group[d] = cb.host
        eg[d] = ing[d] = float(cb.board.port_bw_Bps)
    for d in devs:  # cap a port by the first hop out of its group (PCIe to a host NIC, say)
        outside = [x for x in devs if group[x] != group[d]]
        if outside:
            try:
                first = cluster.route(d, outside[0])[0]
                eg[d] = ing[d] = min(eg[d], float(first.bandwidth_Bps))
            except (SpecError, IndexError):
                pass
    nodes = set(cluster.nodes())
    uplink: dict[str, float] = {}
    for h in cluster.hosts:
        if h.name in nodes and h.name in set(group.values()):
            mine = set(h.boards) | {h.name}
            up = [ln.bandwidth_Bps for ln in cluster.links if (ln.a == h.name) != (ln.b == h.name)
                  and not ({ln.a, ln.b} <= mine)]
            if up:
                uplink[h.name] = float(sum(up))
    intra: dict[str, float] = {}
    for h in set(group.values()):
        members = {cb.name for cb in cluster.boards if cb.host == h}
        fast = [ln.bandwidth_Bps for ln in cluster.links if ln.a in members and ln.b in members]
        ports = [eg[d] for d in devs if group[d] == h]
        intra[h] = float(max(fast)) if fast else float(min(ports))
    lat: dict[tuple[str, str], float] = {}
    for a in devs:
        for b in devs:
            if a != b:
                try:
                    lat[(a, b)] = float(cluster.path_latency(a, b))
                except SpecError:
                    lat[(a, b)] = DEFAULT_INTER_LATENCY_S  # unrouted pair: fall back to the default
    inter = [v for (a, b), v in lat.items() if group[a] != group[b]] or [DEFAULT_INTER_LATENCY_S]
    intra_l = [v for (a, b), v in lat.items() if group[a] == group[b]] or [DEFAULT_INTRA_LATENCY_S]
    return Network(src_boards, dst_boards, group, eg, ing, intra, min(inter), min(intra_l), lat,
                   name=getattr(cluster, "name", "cluster"), uplink_Bps=uplink)
