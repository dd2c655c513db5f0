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


#: The cases of Alpa's own cross-mesh resharding test (alpa-projects/alpa,
#: tests/pipeline_parallel/test_cross_mesh_resharding.py at 25a066e: test_4gpu_send_recv,
#: test_4gpu_allgather, test_8gpu_2_dim_allgather, test_4gpu_broadcast, test_8gpu_broadcast),
#: in our notation: a (1, n) Alpa mesh is `1xn`; Chunked([2]) over ShardedAxis(0) on a
#: (1, 2) mesh is S1 (split over the two devices); Replicated is R; the 8-GPU tests' 2 x 2
#: sharding of a (1, 4) mesh is written on a `1x2x2` mesh (axes 1 and 2 split two dims).
#: Alpa's tensors are int32 and tiny (its tests check correctness, not speed).
ALPA_CASES: tuple[Case, ...] = (
    Case("alpa-4gpu-repl-to-s0", (4, 8, 16), "int32", "1x2", "RRR", "1x2", "S1RR", note="send_recv, replicated src"),
    Case("alpa-4gpu-s0-to-s0", (4, 8, 16), "int32", "1x2", "S1RR", "1x2", "S1RR", note="send_recv, same split"),
    Case("alpa-4gpu-s1-to-s0", (4, 8, 16), "int32", "1x2", "RS1R", "1x2", "S1RR", note="send_recv, split moves"),
    Case("alpa-4gpu-allgather-repl", (4, 8, 16), "int32", "1x2", "RRR", "1x2", "RRR", note="allgather"),
    Case("alpa-4gpu-allgather-s0", (4, 8, 16), "int32", "1x2", "S1RR", "1x2", "RRR", note="allgather dim 0"),
    Case("alpa-4gpu-allgather-s1", (4, 8, 16), "int32", "1x2", "RS1R", "1x2", "RRR", note="allgather dim 1"),
    Case("alpa-4gpu-allgather-s1-odd", (3, 8, 2), "int32", "1x2", "RS1R", "1x2", "RRR",
         note="allgather at the second dim, (3, 8, 2)"),
    Case("alpa-8gpu-allgather-4", (6, 8, 16), "int32", "1x4", "RRR", "1x4", "RRR", note="2-dim allgather, 4 devices"),
    Case("alpa-8gpu-bcast-2d-to-repl", (2, 64, 64), "int32", "1x2x2", "S1S2R", "1x2x2", "RRR",
         note="broadcast: 2x2 sharded to replicated"),
    Case("alpa-8gpu-bcast-2d-move", (64, 64, 64), "int32", "1x2x2", "S1S2R", "1x2x2", "S1RS2",
         note="broadcast: second split moves to dim 2"),
)


def get_case(name: str) -> Case:
    """A suite case (or an Alpa case) by name."""
    for c in SUITE + ALPA_CASES:
        if c.name == name:
            return c
    raise KeyError(name)


def case_network(case: Case):
    """The network a case is planned on: its cluster's boards (source mesh first), else the default."""
    from math import prod

    from .cost import default_network, network_from_cluster
    from .layout import parse_mesh

    sm, dm = parse_mesh(case.src_mesh), parse_mesh(case.dst_mesh)
    if not case.cluster:
        return default_network(sm, dm)
    from bapipe.fpga_models.cluster import load_cluster

    cl = load_cluster(case.cluster)
    names = [cb.name for cb in cl.boards]
    return network_from_cluster(cl, names[: prod(sm)], names[prod(sm): prod(sm) + prod(dm)])


def run_case(case: Case, seed: int = 0, shape: tuple[int, ...] | None = None):
    """Plan one suite case (optionally at another tensor shape of the same rank); the api Result."""
    from .api import best_transfer
    from .layout import dtype_bytes, parse_mesh

    sm, dm = parse_mesh(case.src_mesh), parse_mesh(case.dst_mesh)
    return best_transfer(shape or case.shape, dtype_bytes(case.dtype), sm, case.src, dm, case.dst,
                         case_network(case), seed)
