"""The README tour's plan (`bapipe plan tiny-cnn 4xU250-ring --no-replication`) through every
backend `bapipe run` offers, for a short run each (issue 38).

`run --backend verilator --epochs 1` on it trained for minutes and then ended in an
IndexError: the training RTL's conv weights came back as the engine's (O, kh*kw*C) matrix,
and the test accuracy computed from them looked for (O, C, kh, kw). The backends now return
the host layout (host/backends/verilator_backend.host_layout); each run here must end with
its accuracy and its summary. The runs are limited to a few iterations (``max_iterations``:
the CLI trains whole epochs, 44 iterations of 32 digits here).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bapipe.cli import main

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tour(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tour")
    assert main(["plan", "tiny-cnn", "4xU250-ring", "--no-replication", "-o", str(d / "plan.yaml")]) == 0
    return d


def _summary_ok(r: dict) -> None:
    from bapipe.host.cli_run import show_run

    assert 0.0 <= r["test_accuracy"] <= 1.0 and r["iterations"] >= 1
    assert "test accuracy" in show_run(r)


def test_host_layout_turns_engine_matrices_back_into_conv_weights():
    """The conv weights the training RTL holds (tile order of the (O, kh*kw*C) matrix) come
    back as (O, C, kh, kw), equal to what was loaded; batchnorm as scale/shift; no bias for
    a layer without one."""
    from bapipe.codegen.rtl.train import tile_order
    from bapipe.fpga_models.fixedpoint import conv_weight_matrix
    from bapipe.host.backends.verilator_backend import host_layout

    rng = np.random.default_rng(0)
    w = rng.integers(-500, 500, size=(16, 8, 3, 3))
    b = rng.integers(-50, 50, size=16)
    entry = {"mh": 16, "mw": 72, "pe": 4, "simd": 8, "conv": [16, 8, 3, 3]}
    got = host_layout(entry, {"w": tile_order(conv_weight_matrix(w), 4, 8), "b": b})
    assert got["w"].shape == (16, 8, 3, 3) and np.array_equal(got["w"], w) and np.array_equal(got["b"], b)
    dense = rng.integers(-9, 9, size=(10, 64))
    got = host_layout({"mh": 10, "mw": 64, "pe": 10, "simd": 8, "bias": False},
                      {"w": tile_order(dense, 10, 8), "b": np.zeros(10)})
    assert set(got) == {"w"} and np.array_equal(got["w"], dense)
    got = host_layout({"mh": 4, "mw": 1, "pe": 4, "simd": 1, "bn": True}, {"w": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    assert list(got["scale"]) == [1, 2, 3, 4] and list(got["shift"]) == [5, 6, 7, 8]


@pytest.mark.slow   # the numpy backend's board workers start (~3 s)
def test_tour_plan_on_numpy(tour):
    from bapipe.host.driver import train

    r = train(tour / "plan.yaml", backend="numpy", epochs=1, max_iterations=3)
    _summary_ok(r)


@pytest.mark.slow   # gen of the tour plan and the fixed-point reference run of 2 iterations (~8 s)
def test_tour_plan_on_xrt_against_the_fake(tour, monkeypatch):
    """The xrt backend drives the recording fake of pyxrt (it computes nothing, so the
    weights do not match numpy's); the run still ends with its accuracy."""
    sys.path.insert(0, str(HERE))
    import fake_pyxrt
    from bapipe.host.driver import train

    build = tour / "xbuild"
    assert main(["gen", str(tour / "plan.yaml"), "-o", str(build)]) == 0
    stamp = json.loads((build / "bapipe-build.json").read_text())
    for b in stamp["xrt"]["boards"]:
        (build / b["xclbin"]).write_bytes(b"stand-in for v++ output")
    monkeypatch.setitem(sys.modules, "pyxrt", fake_pyxrt.make(len(stamp["xrt"]["boards"])))
    r = train(tour / "plan.yaml", backend="xrt", epochs=1, max_iterations=2, build=str(build))
    _summary_ok(r)
    assert r["iterations"] == 2


@pytest.mark.slow
@pytest.mark.verilator   # Verilator builds the tour's training RTL (~60 s on 2 shared cores)
def test_tour_plan_on_verilator(tour):
    """The path the README suggests: the hardware's weights equal numpy's fixed-point run
    after every iteration, and the test accuracy is computed from them."""
    from bapipe.host.driver import train

    r = train(tour / "plan.yaml", backend="verilator", epochs=1, max_iterations=2, build=str(tour / "vbuild"))
    _summary_ok(r)
    assert r["weights_match"] and r["outputs_match"]
    assert r["test_accuracy"] == r["numpy_test_accuracy"]
