"""Whole generated pipelines (>= 3 boards, link emulators between) through `bapipe rtlsim`.

Outputs bit-exact against fpga_models.fixedpoint.model_fwd; measured cycles per sample
within 2% of the cycle model (here they agree exactly).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cocotb_tests.common import needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import CACHE

pytestmark = [*needs_verilator, xdist_group("pipeline")]


def _gen(plan, name: str) -> Path:
    from bapipe.fpga_models.plancheck import resolve
    from bapipe.codegen.rtl.write import render_rtl
    out = CACHE / f"pipeline-{name}"
    model, cluster = resolve(plan)
    render_rtl(plan, model, cluster, out)
    return out


def _rtlsim(build: Path, samples: int) -> dict:
    from bapipe.codegen.cli_rtlsim import cmd_rtlsim
    result, rc = cmd_rtlsim(argparse.Namespace(build=str(build), samples=samples, json=True))
    assert rc == 0
    json.dumps(result)  # the --json object must serialise
    return result


@pytest.mark.slow
@pytest.mark.soak  # ~35 s: make test-all; tests/test_rtlsim_cpp.py runs the same 3-board build against numpy in make test, test_agreement the cycles vs plan
def test_tiny_mlp_3_boards():
    from tests.handplan import tiny_mlp_plan
    r = _rtlsim(_gen(tiny_mlp_plan(3), "tiny-mlp-3"), samples=12)
    assert r["outputs_match"] and len(r["boards"]) == 3
    # error = measured / predicted cycles per sample - 1: a model-accuracy criterion (docs/rtl.md:
    # throughput within 2%), not a rounding bound; the cycle counts themselves are exact integers
    assert abs(r["error"]) <= 0.02, r
    assert set(r) >= {"outputs_match", "samples", "cycles_per_sample", "predicted_cycles_per_sample", "error",
                      "sim_cycles_per_s"}


@pytest.mark.slow
@pytest.mark.soak   # ~35 s; its conv/pool/dense chain is covered by test_tiny_cnn_3_boards (make test-all keeps it)
def test_conv_mini_3_boards():
    from tests.handplan import conv_mini_plan
    r = _rtlsim(_gen(conv_mini_plan(), "conv-mini"), samples=4)
    assert r["outputs_match"]
    assert abs(r["error"]) <= 0.02, r


@pytest.mark.slow
@pytest.mark.soak   # 67 s cold (session 10: make test 11:38 cold): make test-all; make test keeps a multi-board conv
# pipeline bit-exact with cycles vs plan (tests/test_agreement.py::test_demo_plan_every_stage_meets_the_plan, 4 boards)
def test_tiny_cnn_3_boards():
    from tests.handplan import tiny_cnn_plan
    r = _rtlsim(_gen(tiny_cnn_plan(), "tiny-cnn"), samples=4)
    assert r["outputs_match"]
    assert abs(r["error"]) <= 0.02, r


@pytest.mark.soak   # 83 s cold: make test-all; make test keeps time-multiplexed turns against the plan
# (tests/test_agreement.py::test_time_multiplexed_stage_meets_the_plan) and the interleaved chunk order (test_rtl_train)
def test_tiny_cnn_interleaved_time_multiplexed():
    """Two boards taking turns between two stages each, layers in turns inside a stage: bit-exact,
    and the measured cycles per sample within 1% of the turn-taking replay."""
    from tests.handplan import tiny_cnn_interleaved_plan
    r = _rtlsim(_gen(tiny_cnn_interleaved_plan(), "tiny-cnn-tm"), samples=6)
    assert r["outputs_match"] and r["boards"] == ["fpga0", "fpga1"]
    assert abs(r["error"]) <= 0.01, r
    # the steady state is the busier board's jobs: fpga1 runs conv2, relu2, pool1 | pool2, fc:
    # MVU NF*SF*pixels + fill; relu2 paced by its 8->4 converter; pools replay + 1 + converter
    assert r["steady_state_cycles_per_sample"] == (1152 + 4) + 128 + (128 + 2) + (32 + 2) + (20 + 4) + 2
