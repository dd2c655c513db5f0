"""Model YAML validation: every bad document gives one SpecError line naming file:line: field."""
import copy
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from bapipe import zoo
from bapipe.errors import SpecError
from bapipe.spec import model_from_text
from docpaths import doc_paths
import cli_fork

GOOD = textwrap.dedent("""\
    name: small
    input: [3, 16, 16]
    layers:
      - {name: c1, type: conv2d, out_channels: 8, kernel: 3, padding: 1}
      - {name: r1, type: relu}
      - {name: c2, type: conv2d, out_channels: 8, kernel: 3, padding: 1}
      - {name: add, type: add, inputs: [c2, r1]}
      - {name: p, type: maxpool, kernel: 2}
      - {name: f, type: flatten}
      - {name: fc, type: dense, units: 10}
    """)


def test_good_model_counts():
    m = model_from_text(GOOD, "m.yaml")
    assert [l.out_shape for l in m.layers][:2] == [(8, 16, 16), (8, 16, 16)]
    assert m.layers[0].params == 8 * 3 * 9 + 8
    assert m.layers[-1].params == 8 * 8 * 8 * 10 + 10
    assert [t.producer for t in m.cut_tensors(2)] == ["r1", "c2"]  # skip stays open across the cut


BAD = [
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: conv9d}\n", "m.yaml:4: layers[0].type: unknown layer type 'conv9d'"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: conv2d, kernel: 3}\n", "m.yaml:4: layers[0]: missing field 'out_channels'"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: conv2d, out_channels: -4, kernel: 3}\n", "m.yaml:4: layers[0].out_channels: expected an integer >= 1"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - name: a\n    type: dense\n    units: ten\n", "m.yaml:6: layers[0].units: expected an integer"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: relu, colour: red}\n", "m.yaml:4: layers[0].colour: unknown field 'colour'"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: relu}\n  - {name: b, type: add, inputs: [a, zz]}\n", "m.yaml:5: layers[1].inputs: 'zz' is not an earlier layer"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: conv2d, out_channels: 4, kernel: 3}\n  - {name: b, type: add, inputs: [a, input]}\n", "m.yaml:5: layers[1].inputs: add inputs must have equal shapes"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: conv2d, out_channels: 4, kernel: 11}\n", "m.yaml:4: layers[0].kernel: kernel 11x11 does not fit"),
    ("name: x\ninput: [0, 8, 8]\nlayers: []\n", "m.yaml:2: input: expected integers >= 1"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: relu}\n  - {name: a, type: relu}\n", "m.yaml:5: layers[1].name: duplicate name 'a'"),
    ("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: relu}\n  - {name: b, type: relu, inputs: [input]}\n", "m.yaml:4: layers[0].name: the output of layer 'a' is never used"),
    ("name: x\ninput: [3, 8, 8]\nlayers: {a: 1}\n", "m.yaml:3: layers: expected a list"),
    ("name: [x\n", "m.yaml:2: (document): malformed YAML"),
    ("- 1\n- 2\n", "m.yaml: (document): expected a mapping"),
]


@pytest.mark.parametrize("text,expect", BAD)
def test_bad_documents_name_file_line_field(text, expect):
    with pytest.raises(SpecError) as e:
        model_from_text(text, "m.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(expect), msg


# --- fuzzing: mutate valid documents into bad ones; nothing but SpecError may escape ---------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.floats(allow_nan=True),
                     st.text(max_size=6), st.sampled_from(["conv2d", "dense", "relu", "add", "input", "c1"]))
_VALUES = st.recursive(_SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                       max_leaves=6)
_BASES = [yaml.safe_load(GOOD)] + [zoo.ZOO[n]() for n in ("tiny-mlp", "tiny-cnn", "gnmt8")]




@st.composite
def mutated_docs(draw):
    doc = copy.deepcopy(draw(st.sampled_from(_BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in doc_paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(_VALUES)
        else:
            parent[path[-1]] = draw(_VALUES)
    text = yaml.safe_dump(doc, sort_keys=False)
    if draw(st.booleans()):  # also break the syntax sometimes
        i = draw(st.integers(0, max(0, len(text) - 1)))
        text = text[:i] + draw(st.sampled_from(["{", "]", ":", "\t", "- ", "&a", "*b", "!!python/object:x"])) + text[i:]
    return text


@pytest.mark.slow  # 1200 examples, 13-14 s: `make test` runs it, `make test-fast` does not
@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_docs())
def test_fuzzed_documents_never_traceback(text):
    try:
        m = model_from_text(text, "fuzz.yaml")
    except SpecError as e:
        msg = str(e)
        assert msg.startswith("fuzz.yaml") and "\n" not in msg
    else:
        assert m.layers  # a mutation may leave a valid model; then it must be a real one


def test_cli_bad_yaml_exit_2_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ninput: [3, 8, 8]\nlayers:\n  - {name: a, type: conv9d}\n")
    r = cli_fork.bapipe("profile", p, "4xU250-ring")   # the console script, forked (tests/cli_fork.py)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{p}:4: layers[0].type: unknown layer type 'conv9d'")
