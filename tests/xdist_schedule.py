"""How `pytest -n 2 --dist loadgroup` (make test, make test-fast) hands tests to its workers.

Two things xdist does not do for this suite by itself:

1. **Groups.** ``@pytest.mark.xdist_group(name)`` keeps tests that share a module fixture or a
   cached build on one worker. pytest-xdist 3.8 passes the group to the controller by appending
   ``@name`` to the item's ``_nodeid``; pytest 9.2 builds ``nodeid`` from a structured id and
   ignores that field, so every group was silently split across both workers (pytest-xdist issue
   #1386, fix pending in PR #1388). Here each worker writes the groups it collected, read from the
   marks, to a file of the run (``groups_file``), and :class:`GroupScheduling` (xdist's loadgroup
   scheduler) reads them from there. A nodeid that does carry ``@name`` (a fixed xdist) is split
   as xdist does.

2. **Order.** A work unit (a group, or one test) goes to whichever worker asks next, in
   collection order, so a long unit collected last (the cocotb groups, collected after tests/)
   runs alone at the end while the other worker idles. :class:`GroupScheduling` hands out the
   units of ``LONG`` first, longest first (the longest-processing-time rule), then the rest in
   collection order. ``LONG``'s figures are CPU seconds measured in a cold make test (docs/testing.md);
   only their order matters, and a unit missing from it is merely scheduled later.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from xdist.scheduler import LoadGroupScheduling

#: work unit (an xdist_group name, or a test's nodeid prefix) -> its CPU seconds in a cold make test
#: (2026-12-07, build/cocotb empty, the machine's csim cache warm, models at -O0, load 6-7): units
#: of 12 s and more; only the order is used
LONG: dict[str, float] = {
    "agreement": 127,
    "mvu": 118,
    "tests/test_rtl_train.py::test_tiny_mlp_trains_bit_exact[gpipe-2]": 89,
    "resnet_blocks": 81,
    "tests/test_signals.py::test_signal_during_rtlsim_stops_verilator[compiling-INT]": 42,
    "pipeline": 41,
    "cli_robustness": 38,
    "tests/test_allreduce.py::test_transposed_update_trains_bit_exact": 38,
    "tests/test_mesh.py::test_mesh_auto_and_errors": 36,
    "tests/test_tour_backends.py::test_tour_plan_on_verilator": 35,
    "tests/test_host_one_lowering.py::test_gen_then_verilator_run_lowers_once": 32,
    "tm": 27,
    "tests/test_names_injection.py::test_hostile_build_compiles_and_lints": 23,
    "tests/test_reshard_property.py::test_every_plan_delivers_and_bound_holds": 22,
    "transport": 18,
    "tests/test_planner_bruteforce.py::test_search_equals_every_placement_heavy[35]": 18,
    "tests/test_reshard_dist.py::test_every_strategy_runs_bit_exact[u280-ring-transpose]": 17,
    "axis_fifo": 16,
    "kernel_wrapper": 16,
    "axis_width_conv": 15,
    "train_bn_add": 15,
    "reshard_router": 14,
    "axis_relu": 14,
    "pool": 13,
    "swg": 13,
    "tests/test_planner_pipedream.py::test_a_steady_state_with_a_period_of_two_microbatches": 12,
}


def groups_file(testrunuid: str) -> Path:
    """The file of one run's groups (nodeid -> group name), written by every worker."""
    return Path(tempfile.gettempdir()) / f"bapipe-xdist-groups-{testrunuid}.json"


def write_groups(items, testrunuid: str) -> None:
    """On a worker: record each collected item's xdist_group (as xdist joins several: sorted,
    with "_"). Both workers collect the same items and write the same text; the replace is atomic."""
    groups = {}
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names:
            groups[item.nodeid] = "_".join(names)
    f = groups_file(testrunuid)
    tmp = f.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(groups, sort_keys=True))
    tmp.replace(f)


def weight(scope: str) -> float:
    """The unit's CPU seconds from ``LONG`` (0 when it is not there)."""
    return max((s for k, s in LONG.items() if scope == k or scope.startswith(k)), default=0.0)


class GroupScheduling(LoadGroupScheduling):
    """xdist's loadgroup scheduling with the groups read from the workers' file and the
    ``LONG`` units first (see the module's docstring)."""

    _groups: dict[str, str] | None = None
    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.rfind("@") > nodeid.rfind("]"):   # xdist's own suffix, once it works again
            return super()._split_scope(nodeid)
        if self._groups is None:
            uid = next(iter(self.nodes)).workerinput["testrunuid"]
            f = groups_file(uid)
            self._groups = json.loads(f.read_text()) if f.exists() else {}
            f.unlink(missing_ok=True)   # every worker wrote it before reporting its collection
        return self._groups.get(nodeid, nodeid)

    def _assign_work_unit(self, node) -> None:
        # The work queue is built in collection order before the first unit is handed out: put
        # the LONG units first, longest first (sorted is stable: the rest keep their order).
        if not self._ordered:
            units = sorted(self.workqueue.items(), key=lambda unit: -weight(unit[0]))
            self.workqueue.clear()
            self.workqueue.update(units)
            self._ordered = True
        super()._assign_work_unit(node)
