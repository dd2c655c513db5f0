"""The m_axi bundles of an engine (forward) kernel: as few AXI masters as its concurrency allows.

Every m_axi bundle is one AXI4 master of the kernel, and v++ maps a bundle, not an argument,
to a memory bank; a bank takes at most 15 kernel interfaces (UG1393 / UG1700, "Mapping Kernel
Ports to Memory"; codegen.check.physical_rules' ``masters`` rule). One bundle per argument
(Vitis's habit when each port names its own) puts 14-40 masters of one kernel on a board's
four DDR banks. A master's read and write channels are independent (AXI4: AR/R and AW/W/B), so
two arguments may share one when they are never read, nor written, at the same time:

- the weight loads (codegen.design.weight_memory: the once-a-call load process, the fill turn)
  run their calls one after another; a sequential unit constrains nothing;
- every other turn of a time-multiplexed kernel is a DATAFLOW region: the ports its processes
  read at once must be on different bundles, and the ports they write at once too (a frame
  read and a frame written in one turn may share one);
- the feed runs beside every turn; a dataflow kernel's engines all run at once.

``assign_bundles`` colours the ports greedily in argument order (the first bundle no conflicting
port holds, in each direction it is used): ``gmem0``, ``gmem1``, ... Which port is read or
written follows from the engine call that names it (``frame_write`` and ``stash_write``
write; ``frame_read``, the weight fetches and streams and ``bias_copy`` read).

A training stage's backward and update kernels reach buffers the forward kernel also holds (its
stashes, its banked weight arrays): ``mirror_bundles`` gives their ports the forward's grouping,
one bundle of theirs per forward bundle (``st_gmem0``, ``rom_gmem0``, ...), so each shares its
bank with the forward's (codegen.design.placement.shared_buffers) and brings one master, not
one a port. The backward reads a stash per turn one turn after another (time-multiplexed) or
all at once as the forward wrote them (dataflow: the forward gave those different bundles);
the update rewrites its arrays one after another. A time-multiplexed backward's stashes the
forward kernel does not write (a stage that is not one engine kernel) are coloured by its
turns: ``gmem_st0``, ``gmem_st1``, ... (two read in one turn apart).
"""
from __future__ import annotations

import re

#: engine calls that write the m_axi array they name; every other call naming one reads it
_WRITERS = ("bapipe::frame_write", "bapipe::stash_write")


def _named(call: str, name: str) -> bool:
    return re.search(rf"[(,]\s*{re.escape(name)}\s*[,)]", call) is not None


def _uses(calls: list[str], ports: list[str]) -> dict[str, set[str]]:
    """Port -> the directions ('r', 'w') in which ``calls`` (run at once) use it."""
    out: dict[str, set[str]] = {}
    for c in calls:
        d = "w" if c.strip().startswith(_WRITERS) else "r"
        for p in ports:
            if _named(c, p):
                out.setdefault(p, set()).add(d)
    return out


def concurrency(es, ports: list[str]) -> list[dict[str, set[str]]]:
    """The groups of port uses that happen at once in EngineStage ``es``: per DATAFLOW region (a
    turn, the feed beside each turn, a dataflow kernel's engines) its ports and directions;
    sequential units (the weight loads) and the dataflow kernel's load process add none."""
    if not es.units:
        return [_uses(es.calls, ports)]
    feed = _uses(es.feed.calls, ports) if es.feed is not None else {}
    groups = []
    for u in es.units:
        if u.sequential:
            continue
        g = _uses(u.calls, ports)
        for p, ds in feed.items():
            g.setdefault(p, set()).update(ds)
        groups.append(g)
    return groups or [feed]


def colour(ports: list[str], groups: list[dict[str, set[str]]]) -> dict[str, int]:
    """Port -> bundle index: the smallest no port it is used with at once (same direction, same
    group) holds; ports in argument order."""
    out: dict[str, int] = {}
    for p in ports:
        taken = {out[q] for g in groups if p in g for q, ds in g.items()
                 if q in out and q != p and ds & g[p]}
        k = 0
        while k in taken:
            k += 1
        out[p] = k
    return out


def assign_bundles(es) -> dict[str, str]:
    """Set the bundle of every m_axi argument of engine kernel ``es`` (its external weight
    arrays, off-chip frames and stashes); returns argument -> bundle."""
    objs = [r for r in es.roms if r.external] + list(es.frames) + list(es.stashes)
    ports = [o.name for o in objs]
    k = colour(ports, concurrency(es, ports))
    for o in objs:
        o.bundle = f"gmem{k[o.name]}"
    return {o.name: o.bundle for o in objs}


def mirror_bundles(sc) -> None:
    """The bundles of stage context ``sc``'s backward stash ports and update kernel's forward
    arrays, after :func:`assign_bundles` of its forward kernel (see the module docstring)."""
    es = sc.engine
    if es is None:
        return
    bwd = getattr(sc, "bwd", None)
    if bwd is not None:
        bwd.stash_bundles = {x: f"st_{b.bundle}" for b in es.stashes if b.bundle for x in b.ports}
        rest = [p.name for p in bwd.stashes if p.name not in bwd.stash_bundles]
        if rest and bwd.turns:   # no forward bundle to mirror: one turn after another, read at once within one
            groups = [{p: {"r"} for p in rest if p in t.args} for t in bwd.turns]
            k = colour(rest, groups)
            bwd.stash_bundles.update({p: f"gmem_st{k[p]}" for p in rest})
    upd = getattr(sc, "update", None)
    if upd is not None:
        by = {r.name: r.bundle for r in es.external if r.bundle}
        upd.rom_bundles = {r: f"rom_{by[r]}" for r, _n in upd.roms if r in by}
