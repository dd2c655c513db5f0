"""A demanding user's sweep of the `bapipe` CLI: bad input gives one line naming the file
and field, exit code 2, never a traceback; --json prints exactly one JSON object.

One plan and one generated build (tiny-mlp on 4xU250-ring) are made once per module and
shared; each bad-input case is one process running the console script's entry point, forked
from a process that has imported the CLI (tests/cli_fork.py); each --json case is one
subprocess call of the installed console script.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapipe.errors import SpecError
from bapipe.plan import load_plan
from bapipe.fpga_models.plancheck import resolve
from cli_fork import ForkServer
from docpaths import doc_paths

BAPIPE = str(Path(sys.executable).with_name("bapipe"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BAPIPE_DEBUG"}
    # the compiled-kernel cache the csim tests share: tiny-mlp's stages compile once per machine
    env.setdefault("BAPIPE_CSIM_CACHE", os.environ.get("BAPIPE_TEST_CSIM_CACHE",
                                                       str(Path(tempfile.gettempdir()) / "bapipe-csim-cache")))
    return env


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([BAPIPE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env())


#: one worker runs the module, so the workspace (plans and a build) is made once, not once per worker
pytestmark = pytest.mark.xdist_group("cli_robustness")


@pytest.fixture(scope="module")
def fork():
    """The workspace's and the bad-input sweep's ~90 calls fork from one process that has imported
    the CLI (tests/cli_fork.py): a few ms each instead of ~0.5 s of CPU for starting Python and
    importing numpy and the toolkit. The --json cases below run the installed script itself."""
    server = ForkServer(_env())
    yield server
    server.close()


@pytest.fixture(scope="module")
def ws(tmp_path_factory, fork) -> Path:
    """Workspace: a good plan, a good build, and the broken files the sweep feeds in."""
    d = tmp_path_factory.mktemp("robust")
    # --placements 0 (the boards in cluster order): a planner-made plan in 0.3 s of CPU instead of
    # 4.5 s for searching every placement; the sweep needs a good plan, not the best one (the
    # placement search's CLI: test_planner_placement)
    r = fork.run(["plan", "tiny-mlp", "4xU250-ring", "-o", "p.yaml", "--placements", "0"], d)
    assert r.returncode == 0, r.stderr
    r = fork.run(["plan", "tiny-cnn", "4xU250-ring", "-o", "pc.yaml"], d)
    assert r.returncode == 0, r.stderr
    r = fork.run(["gen", "p.yaml", "-o", "build", "--allow-rule-violations"], d)
    assert r.returncode == 0, r.stderr
    text = (d / "p.yaml").read_text()
    (d / "bad.yaml").write_text("a: [1,\n")
    (d / "empty.yaml").write_text("")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "unk.yaml").write_text("name: m\ninputs: [{name: x, shape: [4]}]\nlayers:\n  - {name: a, type: foo, inputs: [x]}\n")
    (d / "dir.yaml").mkdir()
    (d / "afile").write_text("x")
    (d / "emptyb").mkdir()
    # the planner's choice of m and schedule may change: edit whatever the plan says
    (d / "p_str.yaml").write_text(re.sub(r"(?m)^microbatches: \d+$", 'microbatches: "x"', text, count=1))
    (d / "p_zero.yaml").write_text(re.sub(r"(?m)^microbatches: \d+$", "microbatches: 0", text, count=1))
    (d / "p_other.yaml").write_text(text.replace("cluster: 4xU250-ring", "cluster: 8xU280-ring", 1))
    (d / "p_sched.yaml").write_text(re.sub(r"(?m)^schedule: \S+$", "schedule: zigzag", text, count=1))
    # a valid cluster file; the plan made on it is then loaded against an edited copy
    from bapipe.fpga_models.cluster import load_cluster  # noqa: F401  (the builtin must exist)
    (d / "cl.yaml").write_text(_cluster_yaml(1.0e10))
    r = fork.run(["plan", "tiny-mlp", "cl.yaml", "-o", "pcl.yaml", "--placements", "0"], d)
    assert r.returncode == 0, r.stderr
    (d / "cl.yaml").write_text(_cluster_yaml(2.0e10))     # same name, other links: the plan is stale
    for name, edit in (("bmix", "plan"), ("btrunc", "weights"), ("bjson", "config")):
        shutil.copytree(d / "build", d / name)
        if edit == "plan":
            shutil.copy(d / "pc.yaml", d / name / "plan.yaml")
        elif edit == "weights":
            wb = d / name / "stage0" / "weights.bin"
            wb.write_bytes(wb.read_bytes()[:100])
        else:
            (d / name / "host_config.json").write_text("{")
    return d


def _cluster_yaml(bw: float) -> str:
    return ("name: mine\ntopology: ring\nboards:\n- {type: U250, count: 4}\nhosts:\n- name: host0\n"
            "  boards: [fpga0, fpga1, fpga2, fpga3]\n  pcie_bw: 1.2e+10\n  pcie_latency: 1.0e-6\n"
            f"link: {{bandwidth: {bw}, latency: 5.0e-7, kind: network}}\n")


# (args, substrings the single stderr line must contain: the file and/or the field)
BAD = [
    (["plan", "bad.yaml", "4xU250-ring", "-o", "x.yaml"], ["bad.yaml", "YAML"]),
    (["plan", "empty.yaml", "4xU250-ring", "-o", "x.yaml"], ["empty.yaml"]),
    (["plan", "list.yaml", "4xU250-ring", "-o", "x.yaml"], ["list.yaml"]),
    (["plan", "unk.yaml", "4xU250-ring", "-o", "x.yaml"], ["unk.yaml", "type", "foo"]),
    (["plan", "nosuch.yaml", "4xU250-ring", "-o", "x.yaml"], ["nosuch.yaml", "not found"]),
    (["plan", "dir.yaml", "4xU250-ring", "-o", "x.yaml"], ["dir.yaml"]),
    (["plan", "tiny-mlp", "nosuch", "-o", "x.yaml"], ["cluster", "nosuch"]),
    (["plan", "tiny-mlp", "bad.yaml", "-o", "x.yaml"], ["bad.yaml"]),
    (["plan", "tiny-mlp", "dir.yaml", "-o", "x.yaml"], ["dir.yaml"]),
    (["plan", "gpt3-175b", "4xU250-ring", "-o", "x.yaml"], ["gpt3-175b", "memory"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "emptyb"], ["emptyb", "-o"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "nodir/x.yaml"], ["nodir/x.yaml", "-o"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--microbatches", "0"], ["--microbatches"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--microbatches", "abc"], ["--microbatches"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--global-batch", "0"], ["--global-batch"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--cap", "nan"], ["--cap"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--boards", "0"], ["--boards"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--schedule", "foo"], ["--schedule"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--partition", "0-99"], ["--partition"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--mesh", "0"], ["--mesh"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--profile", "emptyb"], ["emptyb", "--profile"]),
    (["plan", "tiny-mlp", "4xU250-ring", "-o", "x.yaml", "--microbatches", "x", "--json"], ["--microbatches"]),
    (["profile", "tiny-mlp", "4xU250-ring", "--batch", "0"], ["--batch"]),
    (["profile", "tiny-mlp", "4xU250-ring", "--batch", "10" * 11], ["--batch", "1048576"]),   # was accepted
    # empty --microbatches/--partition and --cap 1e-9: tests/test_planner_cli.py (in-process, faster)
    (["profile", "tiny-mlp", "4xU250-ring", "--format", "zz"], ["--format"]),
    (["profile", "nosuch", "4xU250-ring"], ["nosuch"]),
    (["sim", "nosuch.yaml"], ["nosuch.yaml"]),
    (["sim", "emptyb"], ["emptyb"]),
    (["sim", "bad.yaml"], ["bad.yaml"]),
    (["sim", "empty.yaml"], ["empty.yaml"]),
    (["sim", "p_str.yaml"], ["p_str.yaml", "microbatches"]),
    (["sim", "p_zero.yaml"], ["p_zero.yaml", "microbatches"]),
    (["sim", "p_sched.yaml"], ["p_sched.yaml", "schedule"]),
    (["sim", "p_other.yaml"], ["p_other.yaml", "cluster"]),
    (["sim", "pcl.yaml"], ["pcl.yaml", "cluster_fingerprint"]),
    (["sim", "unk.yaml"], ["unk.yaml", "stages"]),
    (["sim", "p.yaml", "--iterations", "0"], ["--iterations"]),
    (["sim", "p.yaml", "--iterations", "-1"], ["--iterations"]),
    (["sim", "p.yaml", "--trace", "emptyb"], ["emptyb", "--trace"]),
    (["sim", "p.yaml", "--gantt", "emptyb"], ["emptyb", "--gantt"]),
    (["sim", "p.yaml", "--trace", "afile/t.json"], ["afile/t.json", "--trace"]),
    (["reshard", "--shape", "0,4", "--src-mesh", "2x2", "--src", "S0R", "--dst-mesh", "2x2", "--dst", "RS0"],
     ["--shape"]),
    (["reshard", "--shape", "4,4", "--src-mesh", "0x2", "--src", "S0R", "--dst-mesh", "2x2", "--dst", "RS0"],
     ["--src-mesh"]),
    (["reshard", "--shape", "4,4", "--src-mesh", "2x2", "--src", "ZZ", "--dst-mesh", "2x2", "--dst", "RS0"],
     ["--src"]),
    (["reshard", "--shape", "4,4", "--src-mesh", "2x2", "--src", "S0R", "--dst-mesh", "2x2", "--dst", "RS0",
      "--cluster", "bad.yaml"], ["bad.yaml"]),
    (["gen", "nosuch.yaml", "-o", "x", "--allow-rule-violations"], ["nosuch.yaml"]),
    (["gen", "p_other.yaml", "-o", "x", "--allow-rule-violations"], ["p_other.yaml", "cluster"]),
    (["gen", "p.yaml", "-o", "afile", "--allow-rule-violations"], ["afile", "-o"]),
    (["gen", "p.yaml", "-o", "afile/sub", "--allow-rule-violations"], ["afile/sub", "-o"]),
    (["csim", "nosuch"], ["nosuch"]),
    (["csim", "afile"], ["afile"]),
    (["csim", "emptyb"], ["emptyb", "host_config.json"]),
    (["csim", "build", "--samples", "0"], ["--samples"]),
    (["csim", "build", "--samples", "-1"], ["--samples"]),
    (["csim", "bmix"], ["bmix/plan.yaml", "plan_fingerprint"]),
    (["csim", "btrunc"], ["btrunc/stage0/weights.bin", "weights"]),
    (["csim", "bjson"], ["bjson/host_config.json"]),
    (["csim", "build", "--seed", "-1"], ["--seed"]),
    (["rtlsim", "build", "--samples", "0"], ["--samples"]),
    (["rtlsim", "emptyb"], ["emptyb", "manifest.json"]),
    (["synth", "afile"], ["afile", "manifest.json"]),
    (["run", "p.yaml", "--epochs", "-1"], ["--epochs"]),
    (["run", "p.yaml", "--lr", "-1"], ["--lr"]),
    (["run", "p.yaml", "--lr", "nan"], ["--lr"]),
    (["run", "p.yaml", "--timeout", "0"], ["--timeout"]),
    (["run", "p.yaml", "--log", "emptyb"], ["emptyb", "--log"]),
    (["run", "p.yaml", "--log", "nodir/l.json"], ["nodir/l.json", "--log"]),
    (["run", "p.yaml", "--log", "l.txt"], ["l.txt", "--log"]),
    (["run", "p.yaml", "--checkpoint", "emptyb"], ["emptyb", "--checkpoint"]),
    (["run", "p.yaml", "--resume", "nosuch.npz"], ["nosuch.npz", "--resume"]),
    (["run", "p.yaml", "--resume", "bad.yaml"], ["bad.yaml", "--resume"]),
    (["run", "p.yaml", "--seed", "-1"], ["--seed"]),
    (["run", "p.yaml", "--backend", "verilator", "--build", "afile"], ["afile", "--build"]),
    (["run", "empty.yaml"], ["empty.yaml"]),
    (["run", "p_other.yaml"], ["p_other.yaml", "cluster"]),
    (["export", "nosuch", "-o", "x.onnx"], ["nosuch"]),
    (["export", "tiny-mlp", "-o", "emptyb"], ["emptyb"]),
    (["export", "tiny-mlp", "-o", "nodir/x.onnx"], ["nodir/x.onnx"]),
    (["export", "tiny-mlp", "-o", "x.onnx", "--seed", "-1"], ["--seed"]),
]


def _slow_runs(cases, args_of):
    """`bapipe run` cases start worker processes (~3 s each): they run in `make test`, not test-fast."""
    return [pytest.param(*c if isinstance(c, tuple) else (c,), marks=pytest.mark.slow)
            if args_of(c)[0] == "run" and any(a in ("--resume", "--epochs") for a in args_of(c)) else c
            for c in cases]


@pytest.mark.parametrize("args,names", _slow_runs(BAD, lambda c: c[0]), ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(ws, fork, args, names):
    r = fork.run(args, ws)
    lines = r.stderr.splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    for n in names:
        assert n in lines[0], (n, lines[0])
    if "--json" not in args:
        assert r.stdout == ""


GOOD = [
    ["models"], ["boards"], ["clusters"], ["profile", "tiny-mlp", "4xU250-ring"],
    ["plan", "tiny-cnn", "4xU250-ring", "-o", "j.yaml"], ["sim", "p.yaml", "--trace", "t.json"],
    ["reshard", "--shape", "8,8", "--src-mesh", "2x2", "--src", "S0R", "--dst-mesh", "2x2", "--dst", "RS0"],
    ["gen", "p.yaml", "-o", "jbuild", "--allow-rule-violations"], ["csim", "build"], ["run", "p.yaml", "--epochs", "1"],
    ["run", "p.yaml", "--epochs", "0"], ["export", "tiny-mlp", "-o", "m.onnx"],
]


@pytest.mark.parametrize("args", _slow_runs(GOOD, lambda c: c), ids=[" ".join(a) for a in GOOD])
def test_json_is_one_object(ws, args):
    # csim compiles every stage with g++ on first use: minutes on a loaded 2-core machine
    r = _run([*args, "--json"], ws, timeout=600)
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)  # the whole stdout is one document
    assert isinstance(obj, dict) and obj
    assert r.stdout.count("\n") == 1


@pytest.mark.slow  # a bapipe run subprocess: ~3 s
def test_human_output_of_zero_epochs(ws):
    r = _run(["run", "p.yaml", "--epochs", "0"], ws)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "final loss" in r.stdout


# --- plan.yaml mutations: only SpecError may escape load_plan + resolve ---------------------

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=6), st.lists(st.integers(-2, 5), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.fixture(scope="module")
def plan_doc(ws):
    return yaml.safe_load((ws / "p.yaml").read_text())


@pytest.mark.slow  # 300 cases of ~50 ms; tests/test_validation_fuzz.py has the fast run
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_plan_only_spec_error(plan_doc, tmp_path_factory, data):
    doc = copy.deepcopy(plan_doc)
    paths = list(doc_paths(doc))[1:]   # every node but the root
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            action = data.draw(st.sampled_from(("set", "delete")))
            if action == "delete":
                del parent[path[-1]]
            else:
                parent[path[-1]] = data.draw(_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this path
    f = tmp_path_factory.getbasetemp() / "mutated_plan.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        plan = load_plan(f)
        resolve(plan, str(f))
    except SpecError as e:
        assert "\n" not in str(e)
