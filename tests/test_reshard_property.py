"""Property test: every strategy's plan, executed on numpy, delivers every destination tile
exactly, and the lower bound never exceeds any strategy's time."""
from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapipe.planner.reshard import Layout, Network, best_transfer, default_network, network_from_cluster
from bapipe.planner.reshard.execute import check_delivery
from tolerances import f64_sum


@st.composite
def meshes(draw):
    k = draw(st.integers(1, 3))
    shape = []
    for _ in range(k):
        shape.append(draw(st.integers(1, max(1, 8 // max(1, prod(shape))) if shape else 4)))
    return tuple(shape)


@st.composite
def layouts(draw, rank, mesh):
    dims: list[list[int]] = [[] for _ in range(rank)]
    axes = list(range(len(mesh)))
    axes = draw(st.permutations(axes))
    for a in axes:
        d = draw(st.integers(-1, rank - 1))  # -1: this mesh axis replicates
        if d >= 0:
            dims[d].append(a)
    return Layout(tuple(tuple(x) for x in dims))


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    sm, dm = draw(meshes()), draw(meshes())
    return shape, sm, draw(layouts(rank, sm)), dm, draw(layouts(rank, dm)), draw(st.integers(0, 3)), draw(
        st.integers(0, 3))


CLUSTERS = ("8xU280-ring", "16xV100", "16xVCU118-torus", "hetero-mix")


def _network(sm, dm, overlap: int, group: int) -> Network:
    """The default network; (overlap 1, 2) one whose meshes share boards, grouped in `group`s;
    (overlap 3) a built-in cluster in route mode, meshes on consecutive boards."""
    if overlap == 0:
        return default_network(sm, dm)
    if overlap == 3:
        from bapipe.fpga_models.cluster import load_cluster

        ns, nd = prod(sm), prod(dm)
        cl = load_cluster(CLUSTERS[group] if max(ns, nd) <= 6 else "16xV100")
        names = [cb.name for cb in cl.boards]
        dst = names[ns:ns + nd] if ns + nd <= len(names) else names[len(names) - nd:]
        return network_from_cluster(cl, names[:ns], dst)
    ns, nd = prod(sm), prod(dm)
    src = tuple(f"b{i}" for i in range(ns))
    start = max(0, ns - (ns if overlap == 2 else ns // 2))  # overlap 2: the same boards first
    dst = tuple(f"b{start + i}" for i in range(nd))
    devs = sorted(set(src + dst), key=lambda s: int(s[1:]))
    g = max(1, group)
    grp = {d: f"g{int(d[1:]) // g}" for d in devs}
    fast = 2.0e10 if group % 2 else 1.25e10
    return Network(src, dst, grp, {d: 1.25e10 for d in devs}, {d: 1.0e10 for d in devs},
                   {x: fast for x in set(grp.values())}, name="overlap")


@pytest.mark.slow  # ~5-20 s: 500 examples, every plan executed
@settings(max_examples=500, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(cases())
def test_every_plan_delivers_and_bound_holds(case):
    shape, sm, sl, dm, dl, overlap, group = case
    net = _network(sm, dm, overlap, group)
    res = best_transfer(shape, 4, sm, sl, dm, dl, net, seed=1)
    array = np.arange(prod(shape), dtype=np.int64).reshape(shape) * 7 + 3
    for plan in res.plans:
        check_delivery(plan, array, sm, sl, dm, dl, net.src_devices, net.dst_devices)
        # a plan may meet the bound: each is a float64 sum over at most one term per transfer and
        # task, 2 roundings each
        rel = f64_sum(2 * (len(plan.transfers) + len(res.tasks)))
        assert res.lower_bound_s <= plan.time_s * (1 + rel), (plan.name, plan.time_s, res.bound)
    assert res.time_s == min(p.time_s for p in res.plans)
    # the unit tasks partition every destination tile
    need = sum(t.nbytes * (len(t.receivers) + len(t.local)) for t in res.tasks)
    from bapipe.planner.reshard.layout import box_size, device_tiles
    assert need == 4 * sum(box_size(b) for b in device_tiles(shape, dm, dl))
