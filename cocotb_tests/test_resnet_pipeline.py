"""small-resnet (batchnorm, identity and projection skips, global average pool) through
`bapipe rtlsim`: bit-exact against fpga_models.fixedpoint.model_fwd, cycles per sample
within 2% of the cycle model (measured: equal), dataflow and time-multiplexed."""
from __future__ import annotations

import pytest

from cocotb_tests.common import needs_verilator, xdist_group
from cocotb_tests.test_pipeline import _gen, _rtlsim

pytestmark = [*needs_verilator, xdist_group("resnet_pipeline")]


def _run(style: str, boards: int, samples: int) -> dict:
    from tests.handplan import small_resnet_plan
    r = _rtlsim(_gen(small_resnet_plan(style, boards=boards), f"small-resnet-{style}-{boards}"), samples=samples)
    assert r["outputs_match"] and r["max_abs_err_lsb"] == 0 and len(r["boards"]) == boards
    assert abs(r["error"]) <= 0.02, r   # docs/rtl.md's throughput criterion (2%), not a rounding bound
    return r


@pytest.mark.soak  # 83 s in make test at c64382f (over its 10-minute budget); make test-all runs it
def test_small_resnet_dataflow_2_boards():
    """Identity skip inside fpga0's stage, projection skip forking at fpga1's input; every
    3x3 conv is folded to 3072 cycles per sample, which is then the interval."""
    r = _run("dataflow", 2, 8)
    assert r["predicted_cycles_per_sample"] == 3072


@pytest.mark.soak  # residual units in turns, three boards (~90 s): make test-all; test_tm and test_agreement cover turns
def test_small_resnet_time_multiplexed_3_boards():
    """Units (batchnorm, add and global average pool among them) in turns; block 1's identity
    skip forks at fpga1's input and waits in a frame buffer while the main path runs."""
    r = _run("time-multiplexed", 3, 5)
    assert r["bottleneck"] == "fpga2/jobs"


@pytest.mark.slow
@pytest.mark.soak  # two more cuts of the pipelines above: make test-all
@pytest.mark.parametrize("style,boards", [("dataflow", 3), ("time-multiplexed", 2)])
def test_small_resnet_other_cuts(style, boards):
    _run(style, boards, 5)


def test_small_resnet_lint_clean():
    """`verilator --lint-only -Wall` on the residual board tops (forks, adds, named wires) and
    the batchnorm instances with their baked parameters, dataflow and time-multiplexed."""
    import os
    import subprocess

    from bapipe.toolchain import verilator_bin, wire_verilator
    env = wire_verilator(dict(os.environ))
    exe = str(verilator_bin() / "verilator")
    from tests.handplan import small_resnet_plan
    failures = []
    for style, boards in (("dataflow", 2), ("time-multiplexed", 3)):
        rtl = _gen(small_resnet_plan(style, boards=boards), f"small-resnet-{style}-{boards}") / "rtl"
        r = subprocess.run([exe, "--lint-only", "-Wall", f"-I{rtl}", "--top-module", "cluster_top",
                            str(rtl / "cluster_top.v")], capture_output=True, text=True, env=env)
        if r.returncode or r.stderr.strip():
            failures.append(f"{rtl}: {r.stderr[:1500]}")
    assert not failures, "\n".join(failures)
