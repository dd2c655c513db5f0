"""The project's own resharding suite: named cases the bench and the tests run.

Tensors are large enough (tens of MB) that bandwidth, not hop latency, decides.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One resharding: tensor, two meshes and layouts, optionally a built-in cluster."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    src_mesh: str
    src: str
    dst_mesh: str
    dst: str
    cluster: str | None = None
    note: str = ""


SUITE: tuple[Case, ...] = (
    Case("repl-to-shard", (4096, 4096), "fp32", "2x4", "RR", "2x4", "S01R", note="replicated to sharded"),
    Case("shard-to-repl", (4096, 4096), "fp32", "2x4", "S01R", "2x4", "RR", note="sharded to replicated"),
    Case("transpose-split", (4096, 4096), "fp32", "2x4", "S01R", "2x4", "RS01", note="split moves to the other dim"),
    Case("swap-axes", (4096, 4096), "fp32", "2x4", "S0S1", "2x4", "S1S0", note="transposed mesh axes"),
    Case("bcast-1to8", (4096, 4096), "fp32", "1", "RR", "2x4", "RR", note="1-to-8 broadcast"),
    Case("misaligned-2to3", (3000, 4096), "fp32", "1x2", "S1R", "1x3", "S1R", note="2-way to 3-way, one group each"),
    Case("misaligned-2to3-hosts", (3000, 4096), "fp32", "2x1", "S0R", "3x1", "S0R",
         note="2-way to 3-way, one board per group"),
    Case("all-to-all-4x4", (4096, 4096), "fp32", "4x4", "S01R", "4x4", "RS01", note="all-to-all style, 16 boards"),
    Case("issue-3d", (1024, 1024, 512), "int32", "2x4", "S0RR", "2x4", "RS0R", note="the issue's CLI example"),
    Case("shrink-8to4", (4096, 4096), "fp32", "2x4", "S01R", "1x4", "S1R", note="8 boards to 4"),
    Case("grow-4to8", (4096, 4096), "fp32", "1x4", "S1R", "2x4", "S01R", note="4 boards to 8"),
    Case("partial-repl", (4096, 4096), "fp32", "2x4", "S0R", "2x4", "S1R", note="split over groups to over boards"),
    Case("misaligned-6to4", (3000, 3000), "fp32", "3x2", "S01R", "2x2", "S01R", note="6-way to 4-way"),
    Case("v100-issue-3d", (1024, 1024, 512), "int32", "2x4", "S0RR", "2x4", "RS0R", "16xV100",
         note="hosts behind one NIC each"),
    Case("u280-ring-transpose", (4096, 4096), "fp32", "1x4", "S1R", "1x4", "RS1", "8xU280-ring",
         note="FPGA ring: two hosts joined by two links"),
)


def get_case(name: str) -> Case:
    """A suite case by name."""
    for c in SUITE:
        if c.name == name:
            return c
    raise KeyError(name)


def run_case(case: Case, seed: int = 0):
    """Plan one suite case; the api Result."""
    from math import prod

    from .api import best_transfer
    from .cost import default_network, network_from_cluster
    from .layout import dtype_bytes, parse_mesh

    sm, dm = parse_mesh(case.src_mesh), parse_mesh(case.dst_mesh)
    if case.cluster:
        from bapipe.fpga_models.cluster import load_cluster

        cl = load_cluster(case.cluster)
        names = [cb.name for cb in cl.boards]
        net = network_from_cluster(cl, names[: prod(sm)], names[prod(sm): prod(sm) + prod(dm)])
    else:
        net = default_network(sm, dm)
    return best_transfer(case.shape, dtype_bytes(case.dtype), sm, case.src, dm, case.dst, net, seed)
