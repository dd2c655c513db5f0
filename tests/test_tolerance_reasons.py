"""Every float tolerance in the tests says why it is that size (docs/testing.md, tolerance policy).

A line that compares floats with a tolerance (pytest.approx, allclose, isclose, rtol=/atol=,
abs(a - b) <, < 1e-k) passes when
  - it carries a comment, or a comment line sits above it in the same paragraph (no blank
    line, def, class or decorator between them: a comment can cover a few asserts and the
    continuation lines of one call), or
  - its bound is a documented name: one imported from tests/tolerances.py (each defined with
    its derivation) or an UPPER_CASE constant of the same file defined under or beside a comment.
A grep, not a proof: it finds the bound nobody explained, not a wrong explanation.
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("tests/*.py"), *ROOT.glob("cocotb_tests/*.py")])
SKIP = {"tolerances.py", Path(__file__).name}

COMPARISON = re.compile(r"approx\(|allclose\(|isclose\(|\brtol=|\batol=|almost_equal|"
                        r"abs\(.*-.*\)\s*<|[<>]=?\s*\d[\d.]*e-\d")
STOP = ("def ", "async def ", "class ", "@")


def _comment_lines(lines: list[str]) -> set[int]:
    """0-based numbers of the lines holding a comment (tokenize: a '#' in a string is none)."""
    toks = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
    try:
        return {t.start[0] - 1 for t in toks if t.type == tokenize.COMMENT}
    except (tokenize.TokenError, IndentationError, SyntaxError):   # not Python: any '#' counts
        return {i for i, line in enumerate(lines) if "#" in line}


def _commented_above(lines: list[str], comments: set[int], i: int) -> bool:
    """A comment on line i or on a line above it in the same paragraph."""
    for j in range(i, -1, -1):
        if j in comments:
            return True
        s = lines[j].strip()
        if j < i and (not s or s.startswith(STOP)):
            return False
    return False


def _documented_names(lines: list[str], comments: set[int]) -> set[str]:
    """Names imported from tests/tolerances.py and UPPER_CASE constants defined with a comment."""
    names: set[str] = set()
    for i, line in enumerate(lines):
        m = re.match(r"from tolerances import ([^#]+)", line)
        if m:
            names |= {n.strip() for n in m.group(1).strip("() ").split(",") if n.strip()}
        m = re.match(r"([A-Z][A-Z0-9_]*)\s*(:[^=]+)?=", line)
        if m and _commented_above(lines, comments, i):
            names.add(m.group(1))
    return names


def unexplained(lines: list[str]) -> list[int]:
    """0-based numbers of the lines that compare floats with a tolerance and give no reason."""
    comments = _comment_lines(lines)
    names = _documented_names(lines, comments)
    return [i for i, line in enumerate(lines)
            if COMPARISON.search(line) and not line.lstrip().startswith(("#", "from ", "import "))
            and not _commented_above(lines, comments, i)
            and not any(re.search(rf"\b{re.escape(n)}\b", line) for n in names)]


def test_every_float_tolerance_states_its_reason():
    missing = []
    for f in FILES:
        if f.name in SKIP:
            continue
        lines = f.read_text().splitlines()
        missing += [f"{f.relative_to(ROOT)}:{i + 1}: {lines[i].strip()}" for i in unexplained(lines)]
    assert not missing, "tolerances without a reason comment:\n" + "\n".join(missing)


def test_the_lint_finds_an_unexplained_tolerance():
    src = ["from tolerances import U64", "BOUND = 1e-3", "", "", "def test_a():", "    x = 1.0",
           "    assert x == pytest.approx(1.0, rel=1e-9)",          # bare literal: flagged
           "    assert x == pytest.approx(1.0, rel=4 * U64)",       # documented name
           "    assert abs(x - 1) < BOUND",                         # constant without a comment: flagged
           "    # one rounding",
           "    assert np.allclose(x, 1.0, rtol=U64 * 2, atol=0)",  # under a comment
           "    assert math.isclose(x, 1.0, rel_tol=3e-16)",
           "", "    assert x < 1e-3, '# not a comment'"]           # new paragraph, '#' in a string: flagged
    assert unexplained(src) == [6, 8, 13]
