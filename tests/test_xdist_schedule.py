"""tests/xdist_schedule.py: the workers' xdist groups reach the scheduler (pytest 9.2 drops the
`@group` suffix xdist 3.8 puts on the node id), and the long units are handed out first; and
the test suite's C++ level for verilated models (bapipe.toolchain.verilator_cxx_opt)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import xdist_schedule as xs


class _Item:
    def __init__(self, nodeid: str, groups: list[str]):
        self.nodeid = nodeid
        self._marks = [SimpleNamespace(args=(g,), kwargs={}) for g in groups]

    def iter_markers(self, name: str):
        return iter(self._marks if name == "xdist_group" else [])


class _Node:
    """A stand-in for xdist's WorkerController: records the test indexes it is sent."""

    def __init__(self, uid: str, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.workerinput = {"testrunuid": uid}
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True


def test_groups_from_the_workers_file_and_the_long_units_first(tmp_path, monkeypatch):
    monkeypatch.setattr(xs.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(xs, "LONG", {"g": 5.0, "m.py::long": 9.0})
    items = [_Item("m.py::a", []), _Item("m.py::b", ["g"]), _Item("m.py::c", []), _Item("m.py::d", ["g"]),
             _Item("m.py::long", [])]
    xs.write_groups(items, "run1")
    assert xs.groups_file("run1").exists()
    # xdist's default --loadscope-reorder puts units with more tests first (g): the LONG order wins
    config = SimpleNamespace(getvalue=lambda name: ["popen", "popen"] if name == "tx" else None,
                             option=SimpleNamespace(loadscopereorder=True))
    sched = xs.GroupScheduling(config)
    nodes = [_Node("run1", "gw0"), _Node("run1", "gw1")]
    for n in nodes:
        sched.add_node(n)
    for n in nodes:
        sched.add_node_collection(n, [i.nodeid for i in items])
    sched.schedule()
    # the 9 s test to the first worker, the 5 s group (b and d together) to the second, then the
    # rest in collection order: a, then c
    assert nodes[0].sent == [[4], [0]]
    assert nodes[1].sent == [[1, 3], [2]]
    assert not xs.groups_file("run1").exists()   # read once, then removed


def test_verilator_cxx_opt_from_the_environment(monkeypatch):
    from bapipe.errors import SpecError
    from bapipe.toolchain import verilator_cxx_opt

    monkeypatch.delenv("BAPIPE_VERILATOR_CXX_OPT", raising=False)
    assert verilator_cxx_opt("-O2") == "-O2" and verilator_cxx_opt(None) is None
    monkeypatch.setenv("BAPIPE_VERILATOR_CXX_OPT", "-O1")
    assert verilator_cxx_opt("-O2") == "-O1"
    monkeypatch.setenv("BAPIPE_VERILATOR_CXX_OPT", "-O9 -march=native")
    with pytest.raises(SpecError) as e:
        verilator_cxx_opt("-O2")
    assert "BAPIPE_VERILATOR_CXX_OPT" in str(e.value) and "\n" not in str(e.value)
