"""Cluster specs: built-ins, routing, YAML round trip, validation errors, fuzzing."""
import copy
import itertools
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from bapipe.errors import SpecError
from bapipe.yamlio import loads
from bapipe.fpga_models.boards import BOARDS
from bapipe.fpga_models.cluster import (Cluster, builtin_clusters, dump_cluster_yaml, load_cluster, parse_cluster,
                                 torus_position)
from docpaths import doc_paths
from tolerances import f64_sum

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "clusters"
BUILTINS = builtin_clusters()
BOARD_NAMES = [cb.name for cb in BUILTINS["4xU250-ring"].boards]


def test_builtin_names_and_order():
    assert list(BUILTINS) == ["4xU250-ring", "8xU280-ring", "16xVCU118-torus", "hetero-mix", "64xU55C", "16xV100"]
    assert list(builtin_clusters()) == list(BUILTINS)  # fixed order
    for name, c in BUILTINS.items():
        assert c.name == name and c.source == "builtin"
        assert load_cluster(name) == c


@pytest.mark.parametrize("name,types,n,host_sizes,topology", [
    ("4xU250-ring", ["U250"], 4, [4], "ring"),
    ("8xU280-ring", ["U280"], 8, [4, 4], "ring"),
    ("16xVCU118-torus", ["VCU118"], 16, [4] * 4, "torus2d"),
    ("hetero-mix", ["U250", "U280", "VCU118"], 6, [2, 2, 2], "ring"),
    ("64xU55C", ["U55C"], 64, [4] * 16, "ring"),
    ("16xV100", ["V100"], 16, [4] * 4, "switch"),
])
def test_builtin_shapes(name, types, n, host_sizes, topology):
    c = BUILTINS[name]
    assert len(c.boards) == n and c.board_types() == types and c.topology == topology
    assert [len(h.boards) for h in c.hosts] == host_sizes
    # every board in exactly one host, host of each board consistent
    assert sorted(b for h in c.hosts for b in h.boards) == sorted(cb.name for cb in c.boards)
    for h in c.hosts:
        assert all(c.board(b).host == h.name for b in h.boards)
        assert h.pcie_bw_Bps > 0 and h.pcie_latency_s > 0
    # every board reachable from every other
    first = c.boards[0].name
    for cb in c.boards[1:]:
        r = c.route(first, cb.name)
        assert r and c.path_bandwidth(first, cb.name) > 0 and c.path_latency(first, cb.name) > 0


def test_hetero_mix_order():
    c = BUILTINS["hetero-mix"]
    assert [cb.board.name for cb in c.boards] == ["U250", "U250", "U280", "U280", "VCU118", "VCU118"]


@pytest.mark.parametrize("name", ["4xU250-ring", "8xU280-ring", "hetero-mix", "64xU55C"])
def test_ring_neighbours_one_hop(name):
    c = BUILTINS[name]
    names = [cb.name for cb in c.boards]
    n = len(names)
    assert len(c.links) == n
    for i in range(n):
        a, b = names[i], names[(i + 1) % n]
        r = c.route(a, b)
        assert len(r) == 1 and {r[0].a, r[0].b} == {a, b}
        # one link: its latency, no arithmetic
        assert c.path_bandwidth(a, b) == 11.9e9 and c.path_latency(a, b) == 0.5e-6
    # ring distance for all pairs
    for i, j in itertools.combinations(range(n), 2):
        assert len(c.route(names[i], names[j])) == min(j - i, n - (j - i))


def test_64_board_ring_far_pair():
    c = BUILTINS["64xU55C"]
    assert len(c.route("fpga0", "fpga32")) == 32
    # a float64 sum of 32 link latencies against one product
    assert c.path_latency("fpga0", "fpga32") == pytest.approx(32 * 0.5e-6, rel=f64_sum(32))


def test_torus_routes_are_manhattan_with_wraparound():
    c = BUILTINS["16xVCU118-torus"]
    rows = cols = 4
    names = [cb.name for cb in c.boards]
    pos = {nm: torus_position(k, cols) for k, nm in enumerate(names)}
    assert len(c.links) == 2 * rows * cols
    for a, b in itertools.product(names, names):
        (ra, ca), (rb, cb_) = pos[a], pos[b]
        dr, dc = abs(ra - rb), abs(ca - cb_)
        expect = min(dr, rows - dr) + min(dc, cols - dc)
        r = c.route(a, b)
        assert len(r) == expect, (a, b)
        # the path is connected from a to b
        cur = a
        for ln in r:
            assert cur in (ln.a, ln.b)
            cur = ln.b if cur == ln.a else ln.a
        assert cur == b
    # snake order: consecutive boards are neighbours
    for x, y in zip(names, names[1:]):
        assert len(c.route(x, y)) == 1


def test_route_is_deterministic_and_cached():
    c = BUILTINS["16xVCU118-torus"]
    r1 = c.route("fpga0", "fpga10")
    c2 = load_cluster(str(EXAMPLES / "16xVCU118-torus.yaml"))
    assert c2.route("fpga0", "fpga10") == r1 == c.route("fpga0", "fpga10")
    assert c.route("fpga3", "fpga3") == [] and c.path_bandwidth("fpga3", "fpga3") == math.inf
    assert c.path_latency("fpga3", "fpga3") == 0


def test_v100_nvlink_inside_host_network_between():
    c = BUILTINS["16xV100"]
    assert c.board_types() == ["V100"] and c.boards[0].board.kind == "gpu"
    assert [cb.name for cb in c.boards][:2] == ["gpu0", "gpu1"]
    intra = c.route("gpu0", "gpu3")
    assert len(intra) == 1 and intra[0].kind == "nvlink"
    assert c.path_bandwidth("gpu0", "gpu3") == 50e9
    inter = c.route("gpu0", "gpu4")
    assert [ln.kind for ln in inter] == ["pcie", "network", "network", "pcie"]
    assert any("switch0" in (ln.a, ln.b) for ln in inter)
    assert c.path_bandwidth("gpu0", "gpu4") == 12e9
    assert c.path_bandwidth("gpu0", "gpu1") > 4 * c.path_bandwidth("gpu0", "gpu15")
    assert c.path_latency("gpu0", "gpu4") == pytest.approx(4e-6, rel=f64_sum(4))   # a sum of 4 hops


def test_lookups_are_spec_errors():
    c = BUILTINS["4xU250-ring"]
    assert c.board("fpga2").board is BOARDS["U250"]
    with pytest.raises(SpecError, match="unknown board 'nope'"):
        c.board("nope")
    with pytest.raises(SpecError, match="unknown node 'nope'"):
        c.route("fpga0", "nope")
    with pytest.raises(SpecError, match="unknown cluster 'nope'; expected a built-in name"):
        load_cluster("nope")
    with pytest.raises(SpecError, match="missing.yaml: .*file not found"):
        load_cluster("missing.yaml")


@pytest.mark.parametrize("name", list(BUILTINS))
def test_round_trip(name):
    c = BUILTINS[name]
    text = dump_cluster_yaml(c)
    assert "&" not in text and "*" not in text  # no aliases
    c2 = parse_cluster(loads(text, "rt.yaml"))
    assert c2 == c and c2.source == "rt.yaml"
    assert c2.fingerprint() == c.fingerprint() and len(c.fingerprint()) == 64
    assert dump_cluster_yaml(c2) == text
    assert parse_cluster(loads(yaml.safe_dump(c.to_dict()))) == c


@pytest.mark.parametrize("name", list(BUILTINS))
def test_examples_match_dumps(name):
    path = EXAMPLES / f"{name}.yaml"
    assert path.read_text(encoding="utf-8") == dump_cluster_yaml(BUILTINS[name]), \
        f"{path} drifted: regenerate with `python -m fpga_models.cluster`"
    assert load_cluster(str(path)) == BUILTINS[name]


def test_examples_folder_has_only_builtins():
    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == sorted(BUILTINS)


def test_fingerprints_differ():
    assert len({c.fingerprint() for c in BUILTINS.values()}) == len(BUILTINS)


def test_overrides_explicit_names_and_extra_links():
    text = """\
name: custom
topology: chain
boards:
  - {type: U250, count: 2}
  - {name: big, type: U280, host: h1, overrides: {clock_hz: 2.5e+8, usable_dsp: 8000}}
  - {name: small, type: ZCU102, host: h1}
hosts:
  - {name: h0, boards: [fpga0, fpga1], pcie_bw: 8.0e+9}
  - {name: h1}
link: {latency: 1.0e-6}
links:
  - {a: fpga0, b: small, bandwidth: 1.0e+9}
"""
    c = parse_cluster(loads(text, "custom.yaml"))
    assert [cb.name for cb in c.boards] == ["fpga0", "fpga1", "big", "small"]
    assert c.board("big").board.clock_hz == 250e6 and c.board("big").board.usable_dsp == 8000
    assert c.board("big").board.peak_flops["fixed16"] == 2 * 8000 * 250e6   # integers below 2**53: exact
    assert [(h.name, h.boards, h.pcie_bw_Bps) for h in c.hosts] == \
        [("h0", ("fpga0", "fpga1"), 8e9), ("h1", ("big", "small"), 2e9)]
    # chain link fpga1-big: both QSFP28; big-small: min with the ZCU102's SFP+
    assert c.path_bandwidth("fpga1", "big") == 11.9e9
    assert c.path_bandwidth("big", "small") == BOARDS["ZCU102"].port_bw_Bps
    assert c.route("fpga0", "small") == [c.links[-1]] and c.path_latency("fpga0", "small") == 1e-6
    c2 = parse_cluster(loads(dump_cluster_yaml(c)))
    assert c2 == c


def test_explicit_topology_and_switches():
    text = """\
name: star
topology: explicit
boards: [{type: U55C, count: 3}]
switches: [sw]
links:
  - {a: fpga0, b: sw}
  - {a: fpga1, b: sw}
  - {a: fpga2, b: sw, bandwidth: 5.0e+9}
"""
    c = parse_cluster(loads(text))
    assert len(c.route("fpga0", "fpga2")) == 2 and c.path_bandwidth("fpga0", "fpga2") == 5e9
    assert parse_cluster(loads(dump_cluster_yaml(c))) == c


def test_switch_attach_boards():
    c = parse_cluster(loads("name: s\ntopology: switch\nboards: [{type: U280, count: 5}]\n"))
    assert len(c.links) == 5 and all("switch0" in (ln.a, ln.b) for ln in c.links)
    assert len(c.route("fpga0", "fpga4")) == 2
    assert [len(h.boards) for h in c.hosts] == [4, 1]


def test_torus_small_shapes_and_degenerate():
    for rows, cols, nlinks in ((2, 2, 4), (1, 4, 4), (2, 3, 9), (3, 3, 18)):
        n = rows * cols
        c = parse_cluster(loads(f"name: t\ntopology: torus2d\nboards: [{{type: U250, count: {n}}}]\n"
                                f"torus: {{rows: {rows}, cols: {cols}}}\n"))
        assert len(c.links) == nlinks
        names = [cb.name for cb in c.boards]
        for a, b in itertools.combinations(names, 2):
            (ra, ca), (rb, cb_) = torus_position(names.index(a), cols), torus_position(names.index(b), cols)
            dr, dc = abs(ra - rb), abs(ca - cb_)
            assert len(c.route(a, b)) == min(dr, rows - dr) + min(dc, cols - dc)
        assert parse_cluster(loads(dump_cluster_yaml(c))) == c


# --- validation errors -------------------------------------------------------------------

BASE = "name: c\ntopology: ring\nboards:\n"
BAD = [
    # (document, expected message start)
    (BASE + "  - {type: U250, count: 2}\n  - {type: U999}\n",
     "bad.yaml:5: boards[1].type: unknown board type 'U999'; expected one of U250, U280, U55C, VCU118, ZCU102, "
     "S10MX, V100, A100"),
    ("name: c\ntopology: ring\nboards:\n  - type: U250\n    count: 0\n",
     "bad.yaml:5: boards[0].count: expected an integer >= 1, got 0"),
    (BASE + "  - {type: U250, count: -3}\n", "bad.yaml:4: boards[0].count: expected an integer >= 1"),
    (BASE + "  - {type: U250, count: four}\n", "bad.yaml:4: boards[0].count: expected an integer, got the string"),
    (BASE + "  - {type: U250, count: 100000}\n", "bad.yaml:4: boards[0].count: expected an integer <= 4096"),
    (BASE + "  - {count: 2}\n", "bad.yaml:4: boards[0]: missing field 'type'"),
    (BASE + "  - {type: U250, colour: red}\n", "bad.yaml:4: boards[0].colour: unknown field 'colour'"),
    (BASE + "  - U250\n", "bad.yaml:4: boards[0]: expected a mapping"),
    (BASE + "  - {name: a, type: U250}\n  - {name: a, type: U280}\n",
     "bad.yaml:5: boards[1].name: duplicate board name 'a'"),
    (BASE + "  - {name: fpga1, type: U250}\n  - {type: U250}\n",
     "bad.yaml:5: boards[1]: duplicate board name 'fpga1'"),
    (BASE + "  - {name: a, type: U250, count: 2}\n", "bad.yaml:4: boards[0].count: a board with a name"),
    (BASE + "  - {type: U250, overrides: {dsp: x}}\n", "bad.yaml:4: boards[0].overrides.dsp: expected an integer"),
    (BASE + "  - {type: U250, overrides: [1]}\n", "bad.yaml:4: boards[0].overrides: expected a mapping"),
    ("name: c\ntopology: ring\nboards: {type: U250}\n", "bad.yaml:3: boards: expected a list, got a mapping"),
    ("name: c\ntopology: ring\nboards: []\n", "bad.yaml:3: boards: expected a non-empty list"),
    ("name: c\ntopology: ring\n", "bad.yaml:1: (document): missing field 'boards'"),
    ("topology: ring\nboards: [{type: U250}]\n", "bad.yaml:1: (document): missing field 'name'"),
    ("name: c\ntopology: mesh\nboards: [{type: U250}]\n",
     "bad.yaml:2: topology: expected one of chain, ring, torus2d, switch, explicit; got 'mesh'"),
    ("name: c\ntopology: ring\nboards: [{type: U250}]\nextra: 1\n", "bad.yaml:4: extra: unknown field 'extra'"),
    ("name: [1]\ntopology: ring\nboards: [{type: U250}]\n", "bad.yaml:1: name: expected a non-empty string"),
    ("- a\n- b\n", "bad.yaml:1: (document): expected a cluster mapping, got a list"),
    ("", "bad.yaml: (document): expected a cluster mapping, got nothing"),
    ("name: c\ntopology: ring\nboards: [{type: U250}]\nlink: {bandwidth: 0}\n",
     "bad.yaml:4: link.bandwidth: expected a number > 0, got 0"),
    ("name: c\ntopology: ring\nboards: [{type: U250}]\nlink: {latency: -1.0e-6}\n",
     "bad.yaml:4: link.latency: expected a number > 0"),
    ("name: c\ntopology: ring\nboards: [{type: U250}]\nlink: {bandwidth: fast}\n",
     "bad.yaml:4: link.bandwidth: expected a finite number, got the string 'fast'"),
    ("name: c\ntopology: ring\nboards: [{type: U250}]\nlink: 5\n", "bad.yaml:4: link: expected a mapping"),
    ("name: c\ntopology: ring\nboards: [{type: U250, count: 2}]\nhosts:\n  - {name: h, boards: [fpga0, fpga7]}\n",
     "bad.yaml:5: hosts[0].boards[1]: unknown board 'fpga7'"),
    ("name: c\ntopology: ring\nboards: [{type: U250, count: 2}]\nhosts:\n  - {name: h, boards: [fpga0, fpga1]}\n"
     "  - {name: g, boards: [fpga1]}\n", "bad.yaml:6: hosts[1].boards[0]: board 'fpga1' is already in host 'h'"),
    ("name: c\ntopology: ring\nboards: [{type: U250, count: 2}]\nhosts:\n  - {name: h, boards: [fpga0]}\n",
     "bad.yaml:3: boards[0]: board 'fpga1' belongs to no host"),
    ("name: c\ntopology: ring\nboards: [{type: U250, count: 2}]\nhosts:\n  - {name: h, boards: [fpga0, fpga1]}\n"
     "  - {name: h, boards: []}\n", "bad.yaml:6: hosts[1].name: duplicate host name 'h'"),
    ("name: c\ntopology: ring\nboards: [{type: U250, count: 2}]\nhosts:\n"
     "  - {name: h, boards: [fpga0, fpga1], pcie_bw: -5}\n", "bad.yaml:5: hosts[0].pcie_bw: expected a number > 0"),
    ("name: c\ntopology: ring\nboards: [{type: U250, host: hx}]\nhosts: [{name: h}]\n",
     "bad.yaml:3: boards[0].host: unknown host 'hx'"),
    ("name: c\ntopology: torus2d\nboards: [{type: U250, count: 6}]\ntorus: {rows: 2, cols: 2}\n",
     "bad.yaml:4: torus: rows x cols = 2 x 2 = 4 must equal the board count 6"),
    ("name: c\ntopology: torus2d\nboards: [{type: U250, count: 4}]\n",
     "bad.yaml:2: topology: missing field 'torus'"),
    ("name: c\ntopology: torus2d\nboards: [{type: U250, count: 4}]\ntorus: {rows: 2}\n",
     "bad.yaml:4: torus: missing field 'cols'"),
    ("name: c\ntopology: ring\nboards: [{type: U250, count: 4}]\ntorus: {rows: 2, cols: 2}\n",
     "bad.yaml:4: torus: 'torus' is only valid with topology torus2d"),
    ("name: c\ntopology: switch\nboards: [{type: U250}]\nswitch: {attach: racks}\n",
     "bad.yaml:4: switch.attach: expected one of boards, hosts; got 'racks'"),
    ("name: c\ntopology: switch\nboards: [{type: U250}]\nswitch: {attach: hosts}\n",
     "bad.yaml:2: topology: missing field 'link'"),
    ("name: c\ntopology: switch\nboards: [{name: switch0, type: U250}]\n",
     "bad.yaml:2: topology: switch name 'switch0' is already a board name"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 3}]\nlinks:\n  - {a: fpga0, b: fpga1}\n",
     "bad.yaml:4: links: board 'fpga2' is unreachable from 'fpga0'"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 2}]\nlinks:\n  - {a: fpga0, b: fpga9}\n",
     "bad.yaml:5: links[0].b: unknown board 'fpga9'"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 2}]\nlinks:\n  - {a: fpga0, b: fpga0}\n",
     "bad.yaml:5: links[0].b: a link needs two different ends"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 2}]\nlinks:\n"
     "  - {a: fpga0, b: fpga1, latency: 0}\n", "bad.yaml:5: links[0].latency: expected a number > 0"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 2}]\n",
     "bad.yaml:2: topology: missing field 'links'"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 2}]\nlinks: []\n",
     "bad.yaml:4: links: expected a non-empty list"),
    ("name: c\ntopology: explicit\nboards: [{type: U250, count: 2}]\nlinks: [fpga0]\n",
     "bad.yaml:4: links[0]: expected a mapping"),
    ("name: c\ntopology: ring\nboards: [{type: V100, count: 2}]\nhost_link: {latency: 1.0e-6}\n",
     "bad.yaml:4: host_link: missing field 'bandwidth'"),
    ("name: c\ntopology: ring\nboards: [{type: U250}]\nswitches: [fpga0]\n",
     "bad.yaml:4: switches[0]: switch name 'fpga0' is already a board name"),
    ("name: c\ntopology: ring\nboards:\n  - {type: U250\n", "bad.yaml:5: (document): malformed YAML"),
    ("name: c\ntopology: ring\nname: d\nboards: [{type: U250}]\n", "bad.yaml:3: name: duplicate key"),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_documents(text, expected):
    with pytest.raises(SpecError) as e:
        parse_cluster(loads(text, "bad.yaml"), "bad.yaml")
    msg = str(e.value)
    assert msg.startswith(expected), msg
    assert "\n" not in msg


def test_bad_file_through_load_cluster(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(BASE + "  - {type: U250, count: 2}\n  - {type: U999}\n")
    with pytest.raises(SpecError) as e:
        load_cluster(str(p))
    assert str(e.value).startswith(f"{p}:5: boards[1].type: unknown board type 'U999'; expected one of U250")


# --- fuzzing: nothing but Cluster or SpecError escapes ----------------------------------

_SEEDS = [BUILTINS[n].to_dict() for n in ("4xU250-ring", "16xVCU118-torus", "hetero-mix", "16xV100")] + [
    {"name": "x", "topology": "explicit", "boards": [{"type": "U55C", "count": 3},
                                                     {"name": "b", "type": "U250", "host": "h9",
                                                      "overrides": {"dsp_per_mac": {"int8": 0.25}, "dsp": 20000}}],
     "switches": ["sw"], "links": [{"a": "fpga0", "b": "sw"}, {"a": "fpga1", "b": "sw"}, {"a": "fpga2", "b": "b"},
                                   {"a": "b", "b": "sw", "bandwidth": 1.0e9, "latency": 1.0e-6}]},
]

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10, max_value=10), st.integers(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["U250", "V100", "fpga0", "fpga1", "host0", "switch0", "ring", "torus2d", "switch",
                     "explicit", "hosts", "boards", "12e9", "nvlink", "", "  "]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["type", "count", "name", "a", "b", "rows", "cols",
                                                             "bandwidth", "latency", "boards", "host", "x"]) |
                                            st.text(max_size=5), inner, max_size=4)),
    max_leaves=10,
)




@st.composite
def _mutated(draw):
    doc = copy.deepcopy(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = list(doc_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "insert"]))
        if not path:
            if op == "replace":
                doc = draw(_values)
            continue
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        if op == "replace":
            parent[key] = draw(_values)
        elif op == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(_values)
        else:
            parent.insert(key, draw(_values))
    return doc


@pytest.mark.slow  # 1000 examples, about 14 s: `make test` runs it, `make test-fast` does not
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_mutated())
def test_fuzz_only_cluster_or_spec_error(doc):
    text = yaml.safe_dump(doc, sort_keys=False)
    try:
        c = parse_cluster(loads(text, "fuzz.yaml"), "fuzz.yaml")
    except SpecError as e:
        assert str(e).startswith("fuzz.yaml")
        return
    assert isinstance(c, Cluster)
    # a valid result routes and round-trips
    names = [cb.name for cb in c.boards]
    c.route(names[0], names[-1])
    assert parse_cluster(loads(dump_cluster_yaml(c))) == c


@pytest.mark.slow  # 300 examples, about 3-5 s
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_values)
def test_fuzz_random_documents(doc):
    try:
        c = parse_cluster(loads(yaml.safe_dump(doc), "fuzz.yaml"))
    except SpecError:
        return
    assert isinstance(c, Cluster)
