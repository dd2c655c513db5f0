"""Cluster specs: boards, hosts and the links between them; YAML loading, built-ins, routing.

The YAML form (see docs/boards.md for the full reference)::

    name: 4xU250-ring
    topology: ring                 # chain | ring | torus2d | switch | explicit
    boards:                        # in pipeline order
      - {type: U250, count: 4}     # generated names fpga0.. (gpu0.. for GPUs): prefix + position
      - {name: big, type: U280, host: host1, overrides: {clock_hz: 2.5e+8}}
    hosts:                         # optional; default one host per 4 boards (host0, host1, ...)
      - {name: host0, boards: [fpga0, fpga1], pcie_bw: 1.2e+10, pcie_latency: 1.0e-6}
    link: {bandwidth: 1.19e+10, latency: 5.0e-7, kind: network}   # generated-link defaults
    torus: {rows: 4, cols: 4}      # torus2d only: boards are laid out in snake order
    switch: {name: switch0, attach: boards}   # switch only; attach: boards | hosts
    host_link: {bandwidth: 5.0e+10, latency: 1.0e-6, kind: nvlink}  # full mesh inside each host
    switches: [sw0]                # extra non-board nodes for explicit links
    links: [{a: fpga0, b: fpga1, bandwidth: 1.19e+10, latency: 5.0e-7, kind: network}]

Links are full duplex: ``bandwidth_Bps`` in each direction. ``Cluster.links`` holds the
generated links first (topology, then host_link), then the ``links`` entries.
Host PCIe links are part of the routing graph only with ``switch: {attach: hosts}``;
otherwise ``Host.pcie_bw_Bps`` describes host<->board I/O only.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from bapipe.errors import SpecError
from bapipe.names import MAX_IDENT, is_board_name, shown
from bapipe.yamlio import Fields, Node, NodeList, _kind, load_file, loads

from .boards import BOARDS, Board, FrozenMap, board_overrides, read_int, read_number, with_overrides

TOPOLOGIES = ("chain", "ring", "torus2d", "switch", "explicit")
MAX_BOARDS = 4096
BOARDS_PER_HOST = 4  # default host grouping
DEFAULT_LINK_LATENCY_S = 0.5e-6  # ~0.5 us per QSFP28 Aurora hop end to end (AMD PG074, REFERENCES)
DEFAULT_PCIE_LATENCY_S = 1.0e-6  # [verify] one PCIe DMA hop host<->board
DEFAULT_HOST_LINK_LATENCY_S = 1.0e-6  # [verify] GPU peer-to-peer (NVLink) transfer start-up
DEFAULT_SWITCH_NAME = "switch0"


@dataclass(frozen=True)
class Link:
    """A full-duplex link: ``bandwidth_Bps`` in each direction."""

    a: str
    b: str
    bandwidth_Bps: float
    latency_s: float
    kind: str = "network"  # "network" | "nvlink" | "pcie" | ...


@dataclass(frozen=True)
class Host:
    name: str
    boards: tuple[str, ...]
    pcie_bw_Bps: float
    pcie_latency_s: float


@dataclass(frozen=True)
class ClusterBoard:
    name: str
    board: Board
    host: str


@dataclass(frozen=True)
class Cluster:
    """A cluster: boards in pipeline order, hosts, links; routes are shortest paths."""

    name: str
    topology: str
    boards: tuple[ClusterBoard, ...]
    links: tuple[Link, ...]
    hosts: tuple[Host, ...]
    source: str = field(default="builtin", compare=False)
    # Normalized generator parameters (link defaults, torus shape, switch, host_link):
    # what to_dict needs to write the compact YAML form back.
    params: FrozenMap = field(default_factory=FrozenMap)

    # --- lookups -----------------------------------------------------------------------
    def board(self, name: str) -> ClusterBoard:
        for cb in self.boards:
            if cb.name == name:
                return cb
        raise SpecError(None, None, "board", f"unknown board {_show(name)} in cluster '{self.name}'; "
                                             f"expected one of {_names(b.name for b in self.boards)}")

    def board_types(self) -> list[str]:
        return sorted({cb.board.name for cb in self.boards})

    def host_of(self, board_name: str) -> Host:
        h = self.board(board_name).host
        return next(x for x in self.hosts if x.name == h)

    def nodes(self) -> list[str]:
        """Every routing node: boards, then any host or switch a link touches."""
        seen = {cb.name: None for cb in self.boards}
        for ln in self.links:
            seen.setdefault(ln.a, None)
            seen.setdefault(ln.b, None)
        return list(seen)

    # --- routing -----------------------------------------------------------------------
    def _adjacency(self) -> dict[str, dict[str, Link]]:
        adj = self.__dict__.get("_adj")
        if adj is None:
            adj = {n: {} for n in self.nodes()}
            for ln in self.links:  # parallel links: lowest latency, then highest bandwidth, then first
                for u, v in ((ln.a, ln.b), (ln.b, ln.a)):
                    cur = adj[u].get(v)
                    if cur is None or (ln.latency_s, -ln.bandwidth_Bps) < (cur.latency_s, -cur.bandwidth_Bps):
                        adj[u][v] = ln
            object.__setattr__(self, "_adj", adj)
            object.__setattr__(self, "_routes", {})
        return adj

    def route(self, a: str, b: str) -> list[Link]:
        """Shortest path: fewest hops, then lowest latency, then node names; [] if a == b."""
        adj = self._adjacency()
        for x in (a, b):
            if not isinstance(x, str) or x not in adj:
                raise SpecError(None, None, "board", f"unknown node {_show(x)} in cluster '{self.name}'; "
                                                     f"expected one of {_names(adj)}")
        if a == b:
            return []
        routes = self.__dict__["_routes"]
        key = (a, b)
        if key not in routes:
            routes[key] = self._dijkstra(adj, a, b)
        path = routes[key]
        if path is None:
            raise SpecError(None, None, "route", f"no route from '{a}' to '{b}' in cluster '{self.name}'")
        return list(path)

    @staticmethod
    def _dijkstra(adj, a: str, b: str):
        # Labels (hops, latency in ps, node names) are compared lexicographically; this
        # order is preserved by extending two equal-length paths with the same link.
        best: dict[str, tuple] = {a: (0, 0, (a,))}
        heap = [(0, 0, (a,), ())]
        while heap:
            hops, lat, names, links = heapq.heappop(heap)
            u = names[-1]
            if best.get(u, None) != (hops, lat, names):
                continue
            if u == b:
                return tuple(links)
            for v, ln in adj[u].items():
                if v in names:
                    continue
                label = (hops + 1, lat + round(ln.latency_s * 1e12), names + (v,))
                if v not in best or label < best[v]:
                    best[v] = label
                    heapq.heappush(heap, (*label, links + (ln,)))
        return None

    def path(self, a: str, b: str) -> tuple[tuple[tuple[str, str, Link], ...], float, float]:
        """The one route function: (the route's hops from a to b as (from node, to node, link),
        its bandwidth (the slowest link's), its latency (the links' sum)); ((), inf, 0.0) if
        a == b. The planner, the simulator, resharding and lowering all read routes here."""
        hops, node = [], a
        for ln in self.route(a, b):
            nxt = ln.b if ln.a == node else ln.a
            hops.append((node, nxt, ln))
            node = nxt
        return (tuple(hops), min((h[2].bandwidth_Bps for h in hops), default=math.inf),
                float(sum(h[2].latency_s for h in hops)))

    def path_bandwidth(self, a: str, b: str) -> float:
        return self.path(a, b)[1]

    def path_latency(self, a: str, b: str) -> float:
        return self.path(a, b)[2]

    # --- serialization -----------------------------------------------------------------
    def to_dict(self) -> dict:
        """The YAML form as plain values; ``parse_cluster`` of it gives an equal Cluster."""
        p = self.params
        out: dict[str, Any] = {"name": self.name, "topology": self.topology, "boards": _board_entries(self.boards)}
        out["hosts"] = [{"name": h.name, "boards": list(h.boards), "pcie_bw": h.pcie_bw_Bps,
                         "pcie_latency": h.pcie_latency_s} for h in self.hosts]
        link = dict(p.get("link") or {"latency": DEFAULT_LINK_LATENCY_S, "kind": "network"})
        out["link"] = {k: link[k] for k in ("bandwidth", "latency", "kind") if k in link}
        for sect in ("torus", "switch", "host_link"):
            if p.get(sect):
                out[sect] = dict(p[sect])
        if p.get("switches"):
            out["switches"] = list(p["switches"])
        gen = _generate_links(self.topology, self.boards, self.hosts, p)
        if tuple(self.links[: len(gen)]) != tuple(gen):
            raise ValueError(f"cluster '{self.name}': links do not start with the {self.topology} topology's "
                             "generated links; build it with topology 'explicit'")
        extra = self.links[len(gen):]
        if extra:
            out["links"] = [{"a": ln.a, "b": ln.b, "bandwidth": ln.bandwidth_Bps, "latency": ln.latency_s,
                             "kind": ln.kind} for ln in extra]
        return out

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of ``to_dict()`` (which never contains ``source``)."""
        d = self.to_dict()
        d.pop("source", None)
        text = json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()


def _show(x: Any) -> str:
    return repr(x) if isinstance(x, str) else _kind(x)


def _names(names, limit: int = 12) -> str:
    names = list(names)
    s = ", ".join(names[:limit])
    return s + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _prefix(board: Board) -> str:
    return "gpu" if board.kind == "gpu" else "fpga"


def _board_entries(boards: tuple[ClusterBoard, ...]) -> list[dict]:
    """Compact board entries: runs of generated names with equal type/overrides -> count."""
    out: list[dict] = []
    run_key = None
    for i, cb in enumerate(boards):
        ov = board_overrides(cb.board)
        generated = cb.name == f"{_prefix(cb.board)}{i}"
        key = (cb.board.name, json.dumps(ov, sort_keys=True)) if generated else None
        if key is not None and key == run_key:
            out[-1]["count"] = out[-1].get("count", 1) + 1
            continue
        entry: dict[str, Any] = {} if generated else {"name": cb.name}
        entry["type"] = cb.board.name
        if generated:
            entry["count"] = 1
        if ov:
            entry["overrides"] = ov
        out.append(entry)
        run_key = key
    return out


# --- link generation ---------------------------------------------------------------------

def torus_position(k: int, cols: int) -> tuple[int, int]:
    """Grid (row, col) of the k-th board in snake (boustrophedon) order."""
    r, c = divmod(k, cols)
    return (r, c) if r % 2 == 0 else (r, cols - 1 - c)


def _generate_links(topology: str, boards, hosts, params) -> list[Link]:
    names = [cb.name for cb in boards]
    ports = {cb.name: cb.board.port_bw_Bps for cb in boards}
    lk = params.get("link") or {}
    lat = lk.get("latency", DEFAULT_LINK_LATENCY_S)
    kind = lk.get("kind", "network")

    def net(a: str, b: str) -> Link:
        bw = lk.get("bandwidth")
        if bw is None:
            bw = min(ports[x] for x in (a, b) if x in ports)
        return Link(a, b, bw, lat, kind)

    out: list[Link] = []
    n = len(names)
    if topology in ("chain", "ring"):
        out += [net(names[i], names[i + 1]) for i in range(n - 1)]
        if topology == "ring" and n >= 3:
            out.append(net(names[-1], names[0]))
    elif topology == "torus2d":
        rows, cols = params["torus"]["rows"], params["torus"]["cols"]
        at = {torus_position(k, cols): names[k] for k in range(n)}
        seen = set()
        for r in range(rows):
            for c in range(cols):
                for rr, cc in ((r, (c + 1) % cols), ((r + 1) % rows, c)):
                    pair = frozenset((at[r, c], at[rr, cc]))
                    if len(pair) == 2 and pair not in seen:
                        seen.add(pair)
                        out.append(net(at[r, c], at[rr, cc]))
    elif topology == "switch":
        sw = params["switch"]
        if sw["attach"] == "hosts":
            out += [net(h.name, sw["name"]) for h in hosts]
            for h in hosts:
                out += [Link(b, h.name, h.pcie_bw_Bps, h.pcie_latency_s, "pcie") for b in h.boards]
        else:
            out += [net(b, sw["name"]) for b in names]
    hl = params.get("host_link")
    if hl:
        for h in hosts:
            for i, a in enumerate(h.boards):
                for b in h.boards[i + 1:]:
                    out.append(Link(a, b, hl["bandwidth"], hl["latency"], hl["kind"]))
    return out


# --- parsing -----------------------------------------------------------------------------

def _at(lst: list, i: int) -> tuple:
    """(file, line, field path) of item ``i`` of a loaded list."""
    lines = getattr(lst, "lines", [])
    return (getattr(lst, "file", None), lines[i] if i < len(lines) else getattr(lst, "line", None),
            f"{getattr(lst, 'path', '')}[{i}]")


def _item(lst: NodeList, i: int, what: str) -> Node:
    v = lst[i]
    if not isinstance(v, Node):
        raise SpecError(*_at(lst, i),
                        f"expected a mapping ({what}), got {_kind(v)}")
    return v


def _name_at(lst: NodeList, i: int, what: str) -> str:
    v = lst[i]
    if not isinstance(v, str) or not v.strip():
        raise SpecError(*_at(lst, i),
                        f"expected a {what} name, got {_kind(v)}")
    return v


def _opt_number(f: Fields, key: str, default: Any = None, **kw) -> Any:
    if not f.has(key):
        return default
    return read_number(f.node, key, **kw)


def _link_params(node: Node | None, need_bandwidth: bool = False, kind: str = "network",
                 latency: float = DEFAULT_LINK_LATENCY_S) -> FrozenMap:
    if node is None:
        return FrozenMap({"latency": latency, "kind": kind})
    f = Fields(node, "link")
    out: dict[str, Any] = {}
    if f.has("bandwidth") or need_bandwidth:
        f.raw("bandwidth")  # missing and needed: an error
        out["bandwidth"] = read_number(node, "bandwidth")
    out["latency"] = _opt_number(f, "latency", latency)
    out["kind"] = f.str("kind", kind)
    f.done()
    return FrozenMap(out)


@dataclass
class _Entry:
    """One board as the YAML lists it: its name, spec, the host it names (or None), its
    entry and the entry's field that gave the name (None: a generated name)."""

    name: str
    board: Board
    host: str | None
    item: Node
    key: str | None


def _board_item(item: Node) -> tuple[Board, str | None, int, str | None]:
    """One ``boards`` entry: (board with its overrides, name or None, count, host or None)."""
    bf = Fields(item, "board")
    btype = bf.str("type")
    if btype not in BOARDS:
        raise item.error("type", f"unknown board type {btype!r}; expected one of {', '.join(BOARDS)}")
    board = BOARDS[btype]
    bname = bf.str("name", None)
    if bname is not None and not is_board_name(bname):   # it names files, modules and kernels
        raise item.error("name", f"expected a board name of letters, digits and '_' not starting with a digit "
                                 f"(at most {MAX_IDENT} characters), got {shown(bname)!r}")
    count = read_int(item, "count", minimum=1, maximum=MAX_BOARDS) if bf.has("count") else 1
    if bname is not None and count != 1:
        raise item.error("count", "a board with a name stands for one board; drop the name to generate "
                                  f"{count} names, or list each board")
    host = bf.str("host", None)
    ov = bf.mapping("overrides", None)
    bf.done()
    if ov is not None:
        board = with_overrides(board, ov)
    return board, bname, count, host


def _parse_boards(f: Fields) -> tuple[list[_Entry], dict[str, int]]:
    """The ``boards`` list, counts expanded (generated names: prefix + position), and each
    board name's position; a duplicate name is an error."""
    blist = f.list("boards")
    entries: list[_Entry] = []
    for i in range(len(blist)):
        item = _item(blist, i, "{type, count} or {name, type}")
        board, bname, count, host = _board_item(item)
        if len(entries) + count > MAX_BOARDS:
            raise item.error("count", f"expected at most {MAX_BOARDS} boards in a cluster")
        for _ in range(count):
            pos = len(entries)
            nm = bname if bname is not None else f"{_prefix(board)}{pos}"
            entries.append(_Entry(nm, board, host, item, "name" if bname is not None else None))
    board_names: dict[str, int] = {}
    for pos, e in enumerate(entries):
        if e.name in board_names:
            raise e.item.error(e.key, f"duplicate board name '{e.name}' (board {board_names[e.name]} has it too)")
        board_names[e.name] = pos
    return entries, board_names


def _listed_hosts(hlist: NodeList | None, board_names: dict[str, int]) -> tuple[dict[str, dict], dict[str, str]]:
    """The ``hosts`` list: per host its PCIe bandwidth and latency (None: the default) and its
    entry; the host of each board a host lists."""
    host_specs: dict[str, dict] = {}
    member: dict[str, str] = {}
    for i in range(len(hlist) if hlist is not None else 0):
        item = _item(hlist, i, "{name, boards, pcie_bw, pcie_latency}")
        hf = Fields(item, "host")
        hname = hf.str("name")
        if hname in host_specs:
            raise item.error("name", f"duplicate host name '{hname}'")
        if hname in board_names:
            raise item.error("name", f"host name '{hname}' is already a board name")
        spec = {"bw": _opt_number(hf, "pcie_bw"), "lat": _opt_number(hf, "pcie_latency"), "node": item}
        hb = hf.list("boards", None)
        hf.done()
        for j in range(len(hb) if hb is not None else 0):
            b = _name_at(hb, j, "board")
            where = _at(hb, j)
            if b not in board_names:
                raise SpecError(*where, f"unknown board '{b}'; expected one of {_names(board_names)}")
            if b in member:
                raise SpecError(*where, f"board '{b}' is already in host '{member[b]}'")
            member[b] = hname
        host_specs[hname] = spec
    return host_specs, member


def _join_hosts(node: Node, entries: list[_Entry], listed: bool, host_specs: dict[str, dict],
                member: dict[str, str], board_names: dict[str, int]) -> None:
    """Boards that name their host (``host:``) join it (without a ``hosts`` list, naming a host
    creates it); with no host anywhere, BOARDS_PER_HOST boards a host (host0, host1, ...).
    Every board must end in one host."""
    for e in entries:
        if e.host is None:
            continue
        if e.host not in host_specs:
            if listed:
                raise e.item.error("host", f"unknown host '{e.host}'; expected one of {_names(host_specs)}")
            if e.host in board_names:
                raise e.item.error("host", f"host name '{e.host}' is already a board name")
            host_specs[e.host] = {"bw": None, "lat": None, "node": e.item}
        if member.get(e.name, e.host) != e.host:
            raise e.item.error("host", f"board '{e.name}' is already in host '{member[e.name]}'")
        member[e.name] = e.host
    if not host_specs:  # default grouping: BOARDS_PER_HOST boards per host
        for pos, e in enumerate(entries):
            h = f"host{pos // BOARDS_PER_HOST}"
            if h in board_names:
                raise node.error("hosts", f"default host name '{h}' is already a board name; list hosts")
            host_specs.setdefault(h, {"bw": None, "lat": None, "node": node})
            member[e.name] = h
    for e in entries:
        if e.name not in member:
            raise e.item.error(e.key, f"board '{e.name}' belongs to no host; list it under a host's boards or "
                                      "give it host:")


def _parse_hosts(f: Fields, node: Node, entries: list[_Entry],
                 board_names: dict[str, int]) -> tuple[list[Host], dict[str, str]]:
    """The hosts (listed, named by boards, or the default grouping) and each board's host; a
    host's PCIe bandwidth defaults to its slowest board's, its latency to DEFAULT_PCIE_LATENCY_S."""
    hlist = f.list("hosts", None)
    host_specs, member = _listed_hosts(hlist, board_names)
    _join_hosts(node, entries, hlist is not None, host_specs, member, board_names)
    hosts: list[Host] = []
    for hname, spec in host_specs.items():
        hb = tuple(e.name for e in entries if member[e.name] == hname)
        if not hb:
            raise spec["node"].error("name", f"host '{hname}' has no boards")
        bw = spec["bw"] if spec["bw"] is not None else min(entries[board_names[b]].board.pcie_bw_Bps for b in hb)
        lat = spec["lat"] if spec["lat"] is not None else DEFAULT_PCIE_LATENCY_S
        hosts.append(Host(hname, hb, bw, lat))
    return hosts, member


def _torus_params(node: Node, t: Node | None, n: int) -> FrozenMap:
    """``torus: {rows, cols}`` of a torus2d topology; rows x cols must be the board count."""
    if t is None:
        raise node.error("topology", "missing field 'torus' ({rows, cols}) for topology torus2d")
    tf = Fields(t, "torus")
    tf.raw("rows"), tf.raw("cols")
    rows = read_int(t, "rows", minimum=1, maximum=MAX_BOARDS)
    cols = read_int(t, "cols", minimum=1, maximum=MAX_BOARDS)
    tf.done()
    if rows * cols != n:
        raise node.error("torus", f"rows x cols = {rows} x {cols} = {rows * cols} must equal the board count {n}")
    return FrozenMap({"rows": rows, "cols": cols})


def _switch_params(node: Node, s: Node | None, nodes: dict[str, str]) -> FrozenMap:
    """``switch: {name, attach}`` of a switch topology; the switch joins ``nodes``."""
    sw = {"name": DEFAULT_SWITCH_NAME, "attach": "boards"}
    if s is not None:
        sf = Fields(s, "switch")
        sw["name"] = sf.str("name", DEFAULT_SWITCH_NAME)
        sw["attach"] = sf.str("attach", "boards", choices=("boards", "hosts"))
        sf.done()
    if sw["name"] in nodes:
        where = (s, "name") if s is not None and "name" in s else (node, "topology")
        raise where[0].error(where[1], f"switch name '{sw['name']}' is already a {nodes[sw['name']]} name")
    nodes[sw["name"]] = "switch"
    return FrozenMap(sw)


def _host_link_params(hl: Node) -> FrozenMap:
    """``host_link``: the full mesh inside each host (bandwidth required)."""
    hf = Fields(hl, "host_link")
    hf.raw("bandwidth")
    out = FrozenMap({"bandwidth": read_number(hl, "bandwidth"),
                     "latency": _opt_number(hf, "latency", DEFAULT_HOST_LINK_LATENCY_S),
                     "kind": hf.str("kind", "nvlink")})
    hf.done()
    return out


def _switch_names(slist: NodeList, nodes: dict[str, str]) -> tuple[str, ...]:
    """``switches``: extra non-board nodes for explicit links; each joins ``nodes``."""
    names = []
    for j in range(len(slist)):
        s_name = _name_at(slist, j, "switch")
        if s_name in nodes:
            raise SpecError(*_at(slist, j), f"switch name '{s_name}' is already a {nodes[s_name]} name")
        nodes[s_name] = "switch"
        names.append(s_name)
    return tuple(names)


def _topology_params(f: Fields, node: Node, topology: str, n: int, board_names: dict[str, int],
                     hosts: list[Host]) -> tuple[dict[str, Any], dict[str, str]]:
    """The generator parameters (link defaults, torus, switch, host_link, switches) and every
    routing node by kind (board, host, switch)."""
    params: dict[str, Any] = {}
    nodes: dict[str, str] = {nm: "board" for nm in board_names}
    for h in hosts:
        nodes[h.name] = "host"
    sect = {k: f.mapping(k, None) for k in ("link", "torus", "switch", "host_link")}
    for k, want in (("torus", "torus2d"), ("switch", "switch")):
        if sect[k] is not None and topology != want:
            raise node.error(k, f"'{k}' is only valid with topology {want}; the topology is {topology}")
    if topology == "torus2d":
        params["torus"] = _torus_params(node, sect["torus"], n)
    if topology == "switch":
        params["switch"] = _switch_params(node, sect["switch"], nodes)
    need_bw = topology == "switch" and params["switch"]["attach"] == "hosts"
    if need_bw and sect["link"] is None:
        raise node.error("topology", "missing field 'link' ({bandwidth, latency}): switch attach hosts needs "
                                     "the host network bandwidth")
    params["link"] = _link_params(sect["link"], need_bandwidth=need_bw)
    if sect["host_link"] is not None:
        params["host_link"] = _host_link_params(sect["host_link"])
    slist = f.list("switches", None)
    if slist is not None:
        params["switches"] = _switch_names(slist, nodes)
    return params, nodes


def _listed_link(item: Node, nodes: dict[str, str], ports: dict[str, float], lk: FrozenMap) -> Link:
    """One ``links`` entry; bandwidth, latency and kind default to ``link:``'s (bandwidth:
    else the slower board port of its ends)."""
    lf = Fields(item, "link")
    ends = []
    for key in ("a", "b"):
        e = lf.str(key)
        if e not in nodes:
            raise item.error(key, f"unknown board '{e}'; expected a board, host or switch name: {_names(nodes)}")
        ends.append(e)
    if ends[0] == ends[1]:
        raise item.error("b", f"a link needs two different ends, got '{ends[0]}' twice")
    if lf.has("bandwidth"):
        bw = read_number(item, "bandwidth")
    elif "bandwidth" in lk:
        bw = lk["bandwidth"]
    elif any(e in ports for e in ends):
        bw = min(ports[e] for e in ends if e in ports)
    else:
        raise item.error(None, "missing field 'bandwidth' (neither end is a board)")
    lat = _opt_number(lf, "latency", lk["latency"])
    kind = lf.str("kind", lk["kind"])
    lf.done()
    return Link(ends[0], ends[1], bw, lat, kind)


def _listed_links(f: Fields, node: Node, topology: str, nodes: dict[str, str], boards: tuple[ClusterBoard, ...],
                  lk: FrozenMap) -> list[Link]:
    """The ``links`` list (required, non-empty, for topology explicit; extra links otherwise)."""
    llist = f.list("links", None, nonempty=topology == "explicit")
    if topology == "explicit" and llist is None:
        raise node.error("topology", "missing field 'links' for topology explicit")
    ports = {cb.name: cb.board.port_bw_Bps for cb in boards}
    return [_listed_link(_item(llist, i, "{a, b, bandwidth, latency, kind}"), nodes, ports, lk)
            for i in range(len(llist or []))]


def _check_reachable(node: Node, boards: tuple[ClusterBoard, ...], links: list[Link], nodes: dict[str, str]) -> None:
    """Every board reachable from the first."""
    adj: dict[str, set[str]] = {x: set() for x in nodes}
    for ln in links:
        adj[ln.a].add(ln.b)
        adj[ln.b].add(ln.a)
    seen, todo = {boards[0].name}, [boards[0].name]
    while todo:
        for v in adj[todo.pop()]:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    for cb in boards:
        if cb.name not in seen:
            key = "links" if "links" in node else "topology"
            raise node.error(key, f"board '{cb.name}' is unreachable from '{boards[0].name}'; add a link to it")


def parse_cluster(node: Any, file: str | None = None) -> Cluster:
    """Validate a loaded YAML document into a Cluster; every problem is a SpecError."""
    file = file or getattr(node, "file", None) or "<input>"
    if not isinstance(node, Node):
        raise SpecError(file, getattr(node, "line", None), None, f"expected a cluster mapping, got {_kind(node)}")
    f = Fields(node, "cluster")
    name = f.str("name")
    topology = f.str("topology", choices=TOPOLOGIES)
    entries, board_names = _parse_boards(f)
    hosts, member = _parse_hosts(f, node, entries, board_names)
    boards = tuple(ClusterBoard(e.name, e.board, member[e.name]) for e in entries)
    params, nodes = _topology_params(f, node, topology, len(entries), board_names, hosts)
    params_f = FrozenMap(params)
    links = _generate_links(topology, boards, hosts, params_f)
    links += _listed_links(f, node, topology, nodes, boards, params["link"])
    f.done()
    _check_reachable(node, boards, links, nodes)
    return Cluster(name=name, topology=topology, boards=boards, links=tuple(links), hosts=tuple(hosts),
                   source=file, params=params_f)


# --- YAML output -------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    pass


def _float_text(v: float) -> str:
    """Shortest round-trip float text, in e-notation YAML 1.1 reads as a float."""
    if not math.isfinite(v) or v == 0 or 1e-3 <= abs(v) < 1e6:
        return repr(v) if math.isfinite(v) else (".nan" if v != v else ("-.inf" if v < 0 else ".inf"))
    sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()
    e = exp + len(digits) - 1
    rest = "".join(map(str, digits[1:])) or "0"
    s = f"{'-' if sign else ''}{digits[0]}.{rest}e{'+' if e >= 0 else '-'}{abs(e)}"
    return s if float(s) == v else repr(v)


_Dumper.add_representer(float, lambda d, v: d.represent_scalar("tag:yaml.org,2002:float", _float_text(v)))
_Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]


def dump_cluster_yaml(cluster: Cluster) -> str:
    """Deterministic YAML text of ``cluster.to_dict()`` (fixed key order, no aliases)."""
    body = yaml.dump(cluster.to_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                     width=100, allow_unicode=True)
    return f"# cluster {cluster.name}: written by fpga_models.cluster.dump_cluster_yaml\n{body}"


# --- built-ins ---------------------------------------------------------------------------

_BUILTIN_YAML = {
    "4xU250-ring": """
name: 4xU250-ring
topology: ring
boards: [{type: U250, count: 4}]
""",
    "8xU280-ring": """
name: 8xU280-ring
topology: ring
boards: [{type: U280, count: 8}]
""",
    "16xVCU118-torus": """
name: 16xVCU118-torus
topology: torus2d
boards: [{type: VCU118, count: 16}]
torus: {rows: 4, cols: 4}
""",
    "hetero-mix": """
name: hetero-mix
topology: ring
boards:
  - {type: U250, count: 2}
  - {type: U280, count: 2}
  - {type: VCU118, count: 2}
hosts:
  - {name: host0, boards: [fpga0, fpga1]}
  - {name: host1, boards: [fpga2, fpga3]}
  - {name: host2, boards: [fpga4, fpga5]}
""",
    "64xU55C": """
name: 64xU55C
topology: ring
boards: [{type: U55C, count: 64}]
""",
    # 4 hosts of 4 V100 SXM2: NVLink 2.0 full mesh inside a host, 2 links (2 x 25 GB/s per
    # direction) per GPU pair; hosts on a 100 Gb/s (EDR InfiniBand / 100GbE) switch,
    # ~12 GB/s payload [verify]; GPUs reach the NIC over PCIe Gen3 x16.
    "16xV100": """
name: 16xV100
topology: switch
boards: [{type: V100, count: 16}]
switch: {name: switch0, attach: hosts}
link: {bandwidth: 12.0e+9, latency: 1.0e-6, kind: network}
host_link: {bandwidth: 50.0e+9, latency: 1.0e-6, kind: nvlink}
""",
}


@lru_cache(maxsize=1)
def _builtins() -> tuple[tuple[str, Cluster], ...]:
    out = []
    for name, text in _BUILTIN_YAML.items():
        c = parse_cluster(loads(text, f"<builtin {name}>"))
        object.__setattr__(c, "source", "builtin")
        out.append((name, c))
    return tuple(out)


def builtin_clusters() -> dict[str, Cluster]:
    """The built-in clusters by name, in a fixed order."""
    return dict(_builtins())


def load_cluster(name_or_path: str) -> Cluster:
    """A built-in cluster by name, or a cluster YAML file (.yaml/.yml)."""
    builtins = builtin_clusters()
    if isinstance(name_or_path, str) and name_or_path in builtins:
        return builtins[name_or_path]
    if isinstance(name_or_path, (str, Path)) and str(name_or_path).strip():
        p = str(name_or_path)
        if p.endswith((".yaml", ".yml")) or Path(p).is_file():
            return parse_cluster(load_file(p), p)
    raise SpecError(None, None, "cluster", f"unknown cluster {_show(name_or_path)}; expected a built-in name "
                                           f"({', '.join(builtins)}) or a .yaml path")


def write_examples(folder: str | Path = "examples/clusters") -> list[Path]:
    """Write examples/clusters/<name>.yaml for every built-in (tests check they match)."""
    out = []
    for name, c in builtin_clusters().items():
        p = Path(folder) / f"{name}.yaml"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dump_cluster_yaml(c), encoding="utf-8")
        out.append(p)
    return out


if __name__ == "__main__":  # python -m fpga_models.cluster  -> regenerate examples/clusters
    for written in write_examples(Path(__file__).resolve().parent.parent / "examples" / "clusters"):
        print(written)
