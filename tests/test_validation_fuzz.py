"""A hypothesis fuzzer over plan.yaml mutations: truncation at any line, type swaps and
extreme values. Each case must end, within a per-case time limit (hypothesis' deadline),
in either a SpecError of one line or a plan that really is whole and consistent with its
model and cluster: no other exception, no hang, no silently accepted damage.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapipe.errors import SpecError
from bapipe.plan import load_plan, parse_plan
from bapipe.fpga_models.plancheck import resolve
from bapipe.yamlio import loads
from docpaths import doc_paths

#: per-case wall-time limit: a load + validation takes milliseconds; a hang fails here
CASE_DEADLINE_MS = 2000

_EXTREMES = st.sampled_from([0, -1, 1, 2 ** 63, 10 ** 20, -(10 ** 20), 1e300, -1e300, 1e-300, float("nan"),
                             float("inf"), -float("inf"), 0.5, True, False, None, "", "fast", "1e9", [], {},
                             [1], {"pe": 1}, "fpga99", "U280", 10 ** 9])


@pytest.fixture(scope="module")
def plan_text(tmp_path_factory) -> str:
    """A real plan: tiny-cnn on 4xU250-ring (several stages, foldings for every layer)."""
    from bapipe.cli import main

    d = tmp_path_factory.mktemp("fuzz")
    assert main(["plan", "tiny-cnn", "4xU250-ring", "-o", str(d / "p.yaml"), "--schedule", "gpipe",
                 "--no-replication"]) == 0
    return (d / "p.yaml").read_text()


def _check_whole(plan, original) -> None:
    """An accepted plan is consistent: the damage was harmless or the value equivalent."""
    model, cluster = resolve(plan, "fuzz.yaml")
    assert [l for s in plan.stages for l in s.layers] == [l.name for l in model.layers]
    assert plan.global_batch == plan.microbatches * plan.microbatch_size
    names = {b.name: b.board.name for b in cluster.boards}
    for s in plan.stages:
        assert all(names[b] == s.board_type for b in s.boards)
        for v in (s.fwd_s, s.bwd_s, s.time_s, s.send_s, s.allreduce_s):
            assert math.isfinite(v) and 0 <= v <= 1e9
    assert [s.layers for s in plan.stages] == [s.layers for s in original.stages]


#: examples per run: the default run stays near 5 s (a case parses ~40 KB of YAML in pure
#: Python); the `slow` variants below run many more
FAST, MANY = 25, 400


def _truncated(plan_text, data):
    lines = plan_text.splitlines(keepends=True)
    cut = data.draw(st.integers(0, len(lines) - 1))
    text = "".join(lines[:cut])
    if data.draw(st.booleans()):  # also mid-line, as a copy interrupted anywhere leaves it
        text += lines[cut][:data.draw(st.integers(0, len(lines[cut])))]
    original = parse_plan(loads(plan_text, "p.yaml"), "p.yaml")
    try:
        plan = parse_plan(loads(text, "fuzz.yaml"), "fuzz.yaml")
        _check_whole(plan, original)
    except SpecError as e:
        assert "\n" not in str(e) and str(e).startswith("fuzz.yaml")


def _mutated(plan_text, tmp_path_factory, data):
    doc = yaml.safe_load(plan_text)
    original = parse_plan(loads(plan_text, "p.yaml"), "p.yaml")
    paths = list(doc_paths(doc))[1:]   # every node but the root
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            action = data.draw(st.sampled_from(("extreme", "delete", "swap")))
            if action == "delete":
                del parent[path[-1]]
            elif action == "swap":  # the value of another field of the document, of another type
                other = data.draw(st.sampled_from(paths))
                src = doc
                for k in other:
                    src = src[k]
                parent[path[-1]] = copy.deepcopy(src)
            else:
                parent[path[-1]] = data.draw(_EXTREMES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this path
    f = Path(tmp_path_factory.getbasetemp()) / "fuzz.yaml"
    try:
        f.write_text(yaml.safe_dump(doc, sort_keys=False))
    except (ValueError, OverflowError):
        return  # PyYAML cannot write this document; nothing to load
    try:
        plan = load_plan(f)
        _check_whole(plan, original)
    except SpecError as e:
        assert "\n" not in str(e)


_HC = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=FAST, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(data=st.data())
def test_truncated_plan_is_refused_or_whole(plan_text, data):
    _truncated(plan_text, data)


@pytest.mark.slow  # ~1 s of CPU: make test, not make test-fast (docs/testing.md)
@settings(max_examples=FAST, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(data=st.data())
def test_mutated_plan_is_refused_or_consistent(plan_text, tmp_path_factory, data):
    _mutated(plan_text, tmp_path_factory, data)


@pytest.mark.soak  # hundreds of mutated plans: make test-all
@pytest.mark.slow
@settings(max_examples=MANY, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(data=st.data())
def test_truncated_plan_is_refused_or_whole_many(plan_text, data):
    _truncated(plan_text, data)


@pytest.mark.soak  # hundreds of mutated plans: make test-all
@pytest.mark.slow
@settings(max_examples=MANY, deadline=CASE_DEADLINE_MS, suppress_health_check=_HC)
@given(data=st.data())
def test_mutated_plan_is_refused_or_consistent_many(plan_text, tmp_path_factory, data):
    _mutated(plan_text, tmp_path_factory, data)
