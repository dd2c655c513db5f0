"""Non-dominated plans over (iteration time, peak memory per board, boards used) (TensorOpt-style)."""
from __future__ import annotations

from dataclasses import replace

from bapipe.errors import SpecError
from bapipe.spec import Model
from bapipe.fpga_models.cluster import Cluster

from .search import Explorer, Request


def non_dominated(points: list[dict], keys=("iteration_time_s", "peak_memory_bytes", "boards")) -> list[dict]:
    """Points no other point beats or equals on every key while beating on one (sorted by the keys)."""
    out = []
    for a in points:
        dominated = any(all(b[k] <= a[k] for k in keys) and any(b[k] < a[k] for k in keys) for b in points)
        if not dominated and not any(all(o[k] == a[k] for k in keys) for o in out):
            out.append(a)
    return sorted(out, key=lambda x: tuple(x[k] for k in keys))


def pareto_plans(model: Model, cluster: Cluster, req: Request) -> list[dict]:
    """Best replayed plan per (board count, schedule, replication), reduced to the Pareto set.

    Board counts are 1..N (up to 16 boards; beyond, divisors of N and powers of two), a
    prefix of the boards in topology order; every schedule is searched on its own so low-memory schedules are not pruned away
    by faster, hungrier ones.
    """
    N = len(cluster.boards) if req.max_boards is None else req.max_boards
    points = []
    # every board count up to 16; beyond, the divisors of N and the powers of two (a full
    # search per count)
    counts = [k for k in range(1, N + 1) if N <= 16 or N % k == 0 or k & (k - 1) == 0]
    for nb in counts:
        ex = Explorer(model, cluster, replace(req, max_boards=nb, partition=None))
        try:
            ex.mesh_sizes(), ex.mesh_vectors()
        except SpecError:   # the requested meshes do not fit this many boards: one board per stage
            ex = Explorer(model, cluster, replace(req, max_boards=nb, partition=None, meshes=(1,)))
        rc = (False, True) if ex.train else (False,)
        replicas = list(range(1, nb + 1)) if req.replication else [1]
        for sched in ex.schedules():
            for r in replicas:
                # exactly nb boards (fewer are the smaller counts' points)
                found = ex.search([c for c in ex.configs([sched], [r], rc) if ex.boards_used(c) == nb])
                if not found or found[0].iteration_s is None:
                    continue
                c = found[0]
                points.append({"iteration_time_s": c.iteration_s, "peak_memory_bytes": c.peak_memory,
                               "boards": c.boards_used, "schedule": c.config.schedule, "microbatches": c.config.m,
                               "replicas": c.config.r, "stages": c.config.p * c.config.v,
                               "recompute": c.config.recompute,
                               "mesh": list(c.config.kv) if c.config.kv else c.config.k})
    return non_dominated(points)
