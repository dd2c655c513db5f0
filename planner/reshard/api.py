"""The one entry point other modules call: the best plan for one resharding."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from bapipe.errors import SpecError

from .bound import Bound, lower_bound
from .cost import Network, default_network, network_from_cluster
from .layout import Layout, parse_layout, parse_mesh, parse_shape
from .strategies import Plan, Transfer, run_strategies
from .tasks import UnitTask, make_tasks


@dataclass(frozen=True)
class Result:
    """The outcome of planning one resharding."""

    time_s: float  # predicted time of the best strategy
    strategy: str  # its name, e.g. "chain/ordered"
    lower_bound_s: float
    bound: Bound
    plans: tuple[Plan, ...]  # every strategy tried, in a fixed order
    tasks: tuple[UnitTask, ...]
    nbytes: int  # bytes of the whole tensor
    moved_bytes: int  # bytes of the boxes some receiver lacks (each box once)

    @property
    def best(self) -> Plan:
        """The plan of the best strategy (its transfers carry start and finish times)."""
        return next(p for p in self.plans if p.name == self.strategy)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """The best plan's transfers (what a simulator replays)."""
        return self.best.transfers

    def hop_records(self, plan: Plan | None = None) -> list[dict]:
        """Every hop of a plan (default: the best) for a simulator to replay: src, dst, bytes,
        start_s, finish_s (data complete at the leaves), transfer index, waits_for (indices)."""
        plan = plan or self.best
        out = []
        for i, tr in enumerate(plan.transfers):
            for a, b in tr.edges:
                out.append({"transfer": i, "src": a, "dst": b, "bytes": tr.nbytes, "start_s": plan.start_s[i],
                            "finish_s": plan.finish_s[i], "waits_for": list(tr.after)})
        return out

    def ratio_to_bound(self, plan: Plan | None = None) -> float:
        """time / lower bound (1.0 when nothing moves)."""
        t = (plan or self.best).time_s
        return t / self.lower_bound_s if self.lower_bound_s > 0 else 1.0


def best_transfer(shape, dtype_bytes: int, src_mesh, src_layout, dst_mesh, dst_layout,
                  network: Network | None = None, seed: int = 0, fast: bool = False) -> Result:
    """Plan a resharding with every strategy; the fastest one, the bound and all plans.

    ``shape``: tensor shape (tuple or "a,b,c"); meshes: tuple or "2x4"; layouts: Layout,
    string ("S0R") or YAML list; ``network``: from ``default_network`` (used when None) or
    ``network_from_cluster``. ``fast``: skip exact search and random restarts (for a
    planner's inner loop). Deterministic for a given seed. Bad input -> SpecError.
    """
    shape = parse_shape(shape)
    src_mesh = parse_mesh(src_mesh, "src_mesh")
    dst_mesh = parse_mesh(dst_mesh, "dst_mesh")
    src = src_layout if isinstance(src_layout, Layout) else parse_layout(src_layout, len(shape), src_mesh, "src")
    dst = dst_layout if isinstance(dst_layout, Layout) else parse_layout(dst_layout, len(shape), dst_mesh, "dst")
    if not isinstance(dtype_bytes, int) or dtype_bytes <= 0:
        raise SpecError(None, None, "dtype_bytes", f"expected a positive integer, got {dtype_bytes!r}")
    net = network or default_network(src_mesh, dst_mesh)
    for what, mesh, devs in (("src_mesh", src_mesh, net.src_devices), ("dst_mesh", dst_mesh, net.dst_devices)):
        if prod(mesh) != len(devs):
            raise SpecError(None, None, what, f"mesh has {prod(mesh)} devices but the network lists {len(devs)}")
    tasks = make_tasks(shape, dtype_bytes, src_mesh, src, dst_mesh, dst, net.src_devices, net.dst_devices)
    if fast:
        plans = run_strategies(net, tasks, dtype_bytes, seed, only=("first", "greedy", "ordered"), max_restarts=0)
    else:
        plans = run_strategies(net, tasks, dtype_bytes, seed)
    bound = lower_bound(net, tasks)
    best = min(plans, key=lambda p: p.time_s)  # first of equals: plans come in a fixed order
    return Result(best.time_s, best.name, bound.time_s, bound, tuple(plans), tuple(tasks),
                  prod(shape) * dtype_bytes, sum(t.nbytes for t in tasks if t.receivers))


def cluster_network(cluster: Any, src_boards, dst_boards) -> Network:
    """Alias of ``network_from_cluster`` (a Cluster plus the two meshes' board names, row-major)."""
    return network_from_cluster(cluster, src_boards, dst_boards)
