"""Resharding between OS processes over torch.distributed gloo (planner/reshard/dist.py).

Every layout pair of the resharding suite (at a smaller, unevenly split shape) and every
case of Alpa's own cross-mesh resharding test runs its best plan between one process per
device; each destination tile must equal, bit for bit, the slice of the global tensor cut
here with numpy.array_split (not with the planner's tile code), and the bytes each rank
passed to isend/irecv must equal the plan's per device and per link. Needs torch (the
[torch] extra); the CLI without torch is checked too.
"""
import itertools
import json
import subprocess
import sys
from math import prod

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="resharding between processes needs the [torch] extra")

#: every test starts torch.distributed process groups (forked ranks, gloo): 1-17 s each: make test, not make test-fast
pytestmark = pytest.mark.slow

from bapipe.planner.reshard import parse_layout  # noqa: E402
from bapipe.planner.reshard.dist import TransferFailure, execute_distributed  # noqa: E402
from bapipe.planner.reshard.dist_rank import pattern  # noqa: E402
from bapipe.planner.reshard.layout import parse_mesh  # noqa: E402
from bapipe.planner.reshard.suite import ALPA_CASES, SUITE, case_network, run_case  # noqa: E402
from bapipe.planner.reshard.transport import Transport, retime, transport_network  # noqa: E402
import cli_fork  # noqa: E402

# 4-8 s each on the shared 2-core machine (32 processes connecting a full gloo mesh, or slow
# planning): `make test` runs them, `make test-fast` does not
_SLOW = {"all-to-all-4x4", "v100-issue-3d", "issue-3d", "repl-to-shard"}


def small(shape):
    """A suite shape cut 64-fold, plus 3 so that splits are uneven (4096 -> 67, 3000 -> 49)."""
    return tuple(d // 64 + 3 for d in shape)


def expected_tile(shape, mesh, layout, dev_index, nbytes):
    """The tile of device ``dev_index`` (row-major on ``mesh``), cut from the global bits with
    numpy.array_split: first listed mesh axis most significant, mesh axes no dimension uses replicate."""
    full = pattern(tuple((0, n) for n in shape), shape, nbytes)
    coord = list(itertools.product(*(range(m) for m in mesh)))[dev_index]
    index = []
    for d, axes in enumerate(layout.dims):
        k, parts = 0, 1
        for a in axes:
            k, parts = k * mesh[a] + coord[a], parts * mesh[a]
        index.append(np.array_split(np.arange(shape[d]), parts)[k])
    return full[np.ix_(*index)]


def run(case, shape, plan=None, **kw):
    res = run_case(case, shape=shape)
    net = case_network(case)
    sm, dm = parse_mesh(case.src_mesh), parse_mesh(case.dst_mesh)
    src, dst = parse_layout(case.src), parse_layout(case.dst)
    out = execute_distributed(plan or res.best, shape, case.dtype, sm, src, dm, dst, net.src_devices,
                              net.dst_devices, return_tiles=True, **kw)
    return res, net, out


def check(case, shape, plan=None):
    res, net, out = run(case, shape, plan)
    dm, dst = parse_mesh(case.dst_mesh), parse_layout(case.dst)
    nbytes = 4
    assert out.bit_exact and out.wrong_elements == 0 and out.missing_elements == 0
    for i, dev in enumerate(net.dst_devices):
        want = expected_tile(shape, dm, dst, i, nbytes)
        assert out.tiles[dev].shape == want.shape and np.array_equal(out.tiles[dev], want), dev
    assert out.bytes_match_plan, (out.sent_bytes, out.plan_sent_bytes)
    # every byte a receiver lacks arrives at least once
    moved = sum(t.nbytes * len(t.receivers) for t in res.tasks)
    assert sum(out.received_bytes.values()) >= moved
    assert out.ranks == len(set(net.src_devices) | set(net.dst_devices))
    return res, out


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c.name in _SLOW else c
                                  for c in SUITE], ids=lambda c: c.name)
def test_suite_best_plan_bit_exact_between_processes(case):
    check(case, small(case.shape))


@pytest.mark.parametrize("case", ALPA_CASES, ids=lambda c: c.name)
def test_alpa_cases_bit_exact_between_processes(case):
    check(case, case.shape)


# bcast-1to8 (~10 s) covers every pattern of the default network; the other two are slow
# (~8 s; ~50 s for the ring's 14 plans, relay included)
@pytest.mark.parametrize("name", ["bcast-1to8", pytest.param("misaligned-2to3", marks=pytest.mark.slow),
                                  pytest.param("u280-ring-transpose", marks=pytest.mark.slow)])
def test_every_strategy_runs_bit_exact(name):
    # every pattern's trees (p2p, gather's entry and fan-out, chain's relays, relay's entries) on real ranks
    case = next(c for c in SUITE if c.name == name)
    shape = small(case.shape)
    res = run_case(case, shape=shape)
    for plan in res.plans:
        check(case, shape, plan)


def test_dead_rank_is_named_and_nothing_kept():
    case = next(c for c in SUITE if c.name == "bcast-1to8")
    shape = small(case.shape)
    res = run_case(case, shape=shape)
    chain = next(p for p in res.plans if p.name == "chain/first")
    relay = chain.transfers[0].edges[1][0]   # the first group's entry device forwards to its peers
    with pytest.raises(TransferFailure) as e:
        run(case, shape, chain, fault=(relay, 1))
    msg = str(e.value)
    assert f"device {relay} (destination" in msg and "died mid-transfer" in msg and "signal 9" in msg
    assert "\n" not in msg and "no destination tile was kept" in msg


def test_retime_on_measured_transport_by_hand():
    # 1 -> 2 broadcast as p2p: two sends from one port back to back, then the latency
    case = next(c for c in ALPA_CASES if c.name == "alpa-4gpu-allgather-repl")
    res = run_case(case)
    tr = Transport("gloo", 1e-4, 1e9, 1.5e9, 2)
    net = transport_network(("s0", "s1"), ("d0", "d1"), tr)
    p2p = next(p for p in res.plans if p.name == "p2p/first")
    t = retime(p2p, net)
    per = 4 * 8 * 16 * 4 / 1e9   # one whole (4, 8, 16) int32 tensor at 1 GB/s
    # both receivers are fed from s0 (first holder): 2 sends through one port, one latency;
    # a float64 sum of 3 terms: 1e-12 relative is far above its rounding
    assert t.time_s == pytest.approx(2 * per + 1e-4, rel=1e-12)


def test_cli_execute_json():
    r = cli_fork.bapipe("reshard", "--shape", "37,29", "--dtype", "int32", "--src-mesh", "2x2", "--src", "S0R",
                        "--dst-mesh", "1x3", "--dst", "RS1", "--execute", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bit_exact"] is True and out["bytes_match_plan"] is True and out["naive_bit_exact"] is True
    assert out["measured_s"] > 0 and out["model_s"] > 0 and out["naive_measured_s"] > 0
    assert out["ranks"] == 7 and out["executed"] == out["best"]
    assert sum(out["sent_bytes"].values()) == sum(x["bytes"] for x in out["link_bytes"])


def test_cli_option_without_execute_is_refused():
    r = cli_fork.bapipe("reshard", "--shape", "8,8", "--src-mesh", "2", "--src", "S0R", "--dst-mesh", "2",
                        "--dst", "RS0", "--repeat", "3")
    assert r.returncode == 2 and "--repeat" in r.stderr and r.stderr.count("\n") == 1


def test_cli_without_torch_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None; from bapipe.cli import main; "
            "sys.exit(main(['reshard', '--shape', '8,8', '--src-mesh', '2', '--src', 'S0R', '--dst-mesh', '2', "
            "'--dst', 'RS0', '--execute']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "[torch]" in r.stderr, r.stderr
    assert r.stdout == ""
