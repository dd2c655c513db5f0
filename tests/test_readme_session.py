"""The README's notebook session (issue #36: README figures true): its plan, breakdown,
simulation and error lines are run as a doctest against the code, so a planner change that
moves the figures fails here instead of leaving the README stale (it had drifted from
"2 stages, 775 ms" to the planner's 4 stages, 1.06 s). The lines that build, C-simulate or
train (seconds to minutes each) are the commands' own tests' business and are skipped."""
from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: examples the doctest leaves out: they need a build or a training run (tests/test_api.py runs them)
HEAVY = ("gantt(", "generate(", "csim(", "bapipe.run(")


def _session() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Python API.*?```python\n(.*?)```", text, re.S)
    assert block, "README.md: no ```python block under '## Python API'"
    return block.group(1)


@pytest.mark.slow   # plans and simulates vgg16 on 4xU250-ring (~3 s CPU)
def test_readme_python_session_is_true(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # p.save("vgg16.yaml") writes here
    test = doctest.DocTestParser().get_doctest(_session(), {}, "README.md", "README.md", 0)
    kept = [e for e in test.examples if not any(h in e.source for h in HEAVY)]
    assert len(kept) >= 6 and len(test.examples) - len(kept) == 4
    test.examples = kept
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out: list[str] = []
    runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)
