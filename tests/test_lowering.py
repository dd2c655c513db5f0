"""One Design, lowered once (issue 31 item 1): `bapipe gen` runs the lowering once, and no
renderer, check or host backend calls a lowering step itself.

Two checks: a static one (every call of a lowering step in the product code sits in
codegen/design/lower.py, the pass list) and a count of the calls in one real gen.
"""
from __future__ import annotations

import ast
from pathlib import Path

from handplan import make_plan

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ["bapipe", "fpga_models", "planner", "codegen", "host"]
#: the lowering's steps: each may be called only by a pass of codegen/design/lower.py
STEPS = {"build_pipeline", "train_design", "build_bwd", "engine_stage", "build_stage", "build_stashes",
         "stage_update", "build_loss", "design_backward_memory", "build_boards"}


def step_calls(root: Path = ROOT) -> list[str]:
    """'file:line: step' of every call of a lowering step outside the pass list."""
    out = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "codegen/design/lower.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                    if name in STEPS:
                        out.append(f"{rel}:{node.lineno}: {name}")
    return out


def test_lowering_steps_are_called_by_the_pass_list_only():
    assert step_calls() == []


def test_step_scan_finds_a_call(tmp_path):
    """The scan itself: a renderer calling build_pipeline (directly or through a module) is found."""
    for top in PRODUCT:
        (tmp_path / top).mkdir()
    (tmp_path / "codegen" / "r.py").write_text("def f(p):\n    return dataflow.build_pipeline(p)\n"
                                               "def g(p):\n    return train_design(p)\n")
    assert step_calls(tmp_path) == ["codegen/r.py:2: build_pipeline", "codegen/r.py:4: train_design"]


def test_gen_lowers_once(tmp_path, monkeypatch):
    """A training gen of a 3-stage tiny-cnn plan: lower() runs once, the dataflow lowering
    1 + S times inside it (the whole plan, then each stage alone for its bench), the training
    RTL's once, and every backward kernel once; design.json is written once."""
    import bapipe.codegen.gen_folder as cli_gen   # gen's library: its one lower() call
    import bapipe.codegen.design.lower as L

    counts = {"lower": 0, "build_pipeline": 0, "train_design": 0, "build_bwd": 0}

    def counted(name, fn):
        def wrapper(*a, **k):
            counts[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(cli_gen, "lower", counted("lower", L.lower))
    for name in ("build_pipeline", "train_design", "build_bwd"):
        monkeypatch.setattr(L, name, counted(name, getattr(L, name)))
    writes = []
    real_write = Path.write_text

    def write_text(self, *a, **k):
        if self.name == "design.json":
            writes.append(self)
        return real_write(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)
    plan, model, cluster = make_plan("tiny-cnn", cuts=(3, 6), mode="train")
    cli_gen.generate_plan(plan, model, cluster, tmp_path / "b")
    stages = len(plan.stages)
    assert counts == {"lower": 1, "build_pipeline": 1 + stages, "train_design": 1, "build_bwd": stages}
    assert len(writes) == 1
