"""Every library layer in g++ C-simulation against the numpy fixed-point reference, bit-exact."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from bapipe import toolchain

from csim_cases import all_cases

pytestmark = [pytest.mark.csim,
              pytest.mark.skipif(toolchain.gxx() is None or toolchain.ap_types_dir() is None,
                                 reason="needs g++ and the hls4ml ap_types headers")]

CACHE = Path(os.environ.get("BAPIPE_TEST_CSIM_CACHE", Path(tempfile.gettempdir()) / "bapipe-csim-cache"))


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory):
    from bapipe.codegen.check.csim import run_harness

    cases = all_cases()
    outs, comp, run_s = run_harness([c for c, _ in cases], "fixed16", tmp_path_factory.mktemp("harness"),
                                    cache=CACHE, name="layers")
    return cases, outs


def test_every_case_bit_exact(harness_run):
    cases, outs = harness_run
    bad = []
    for (case, expected), got in zip(cases, outs):
        for e, g in zip(expected, got):
            if e.shape != g.shape or not np.array_equal(e, g):
                err = int(np.max(np.abs(e - g))) if e.shape == g.shape else -1
                bad.append(f"{case.name}: max err {err} LSB")
    assert not bad, bad


def test_cases_cover_types_and_foldings(harness_run):
    cases, _ = harness_run
    names = [c.name for c, _ in cases]
    for kind in ("dense ", "conv2d ", "relu",
                 "maxpool", "avgpool", "globalavgpool", "batchnorm", "add", "flatten"):
        foldings = {n.split(" pe=")[-1] for n in names if n.startswith(kind)}
        assert len(foldings) >= (3 if kind != "flatten" else 1), (kind, foldings)


def test_outputs_are_not_trivial(harness_run):
    """The cases exercise rounding and saturation, not just zeros."""
    cases, outs = harness_run
    flat = np.concatenate([g for o in outs for g in o])
    assert np.count_nonzero(flat) > 0.5 * flat.size   # integer counts: a non-triviality threshold
    assert (flat == 32767).any() and (flat == -32768).any()   # saturation cases hit both rails


def test_int64_mac_path_equals_numpy(tmp_path):
    """The 64-bit integer MAC path (big stages in csim) is bit-exact too, on every MAC layer."""
    from bapipe.codegen.check.csim import run_harness

    cases = [(c, e) for c, e in all_cases() if c.name.startswith(("dense", "conv2d"))]
    outs, _, _ = run_harness([c for c, _ in cases], "fixed16", tmp_path, cache=CACHE, name="layers_int64",
                             ap_mac=False)
    for (case, expected), got in zip(cases, outs):
        for e, g in zip(expected, got):
            assert np.array_equal(e, g), case.name
