"""One of each (issue #15 item 3): one weight generator, one number-format table, one route
function, one ring all-reduce formula, one event loop under the planner's replays.

Two kinds of check: the consumers give exactly what the one home gives (the hardware's
weights are the quantized draws the host starts from; every format table is the
bapipe.numformats one; a route's bandwidth and latency are Cluster.path's), and a grep of
the product code for a second copy of each formula (docs/architecture.md, "One home per
quantity", lists the homes and their readers).
"""
from __future__ import annotations

import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from bapipe.models import load_model
from tests.handplan import hand_plan

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ["bapipe", "fpga_models", "planner", "codegen", "host"]


@lru_cache(maxsize=None)
def _code(path: Path, strings: bool = False) -> list[tuple[int, str]]:
    """(line number, code) of a Python file with comments and (unless ``strings``) string
    literals blanked out, so a formula quoted in a docstring is not a copy."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    out = [list(line) for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and not strings):
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                row = out[r - 1]
                a = c0 if r == r0 else 0
                b = c1 if r == r1 else len(row)
                row[a:b] = " " * (b - a)
    return [(i + 1, "".join(row)) for i, row in enumerate(out)]


def _hits(pattern: str) -> set[str]:
    """Product files whose code (not comments; not strings unless the pattern starts with
    STR, for tables keyed by name) matches ``pattern``."""
    strings = pattern.startswith(STR)
    rx = re.compile(pattern[len(STR):] if strings else pattern)
    found = set()
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if any(rx.search(code) for _, code in _code(path, strings)):
                found.add(path.relative_to(ROOT).as_posix())
    return found


# --- the grep: a second copy of a formula fails here, naming the file -------------------

#: a pattern with this prefix is matched with string literals kept (format names)
STR = "(strings)"

#: pattern -> the files allowed to hold it (the home, and readers that need it for
#: something that is not the quantity, each with the reason)
ONE_HOME = {
    # ring all-reduce: 2 (r - 1) steps / seconds
    r"2\s*\*\s*\(\s*\w+\s*-\s*1\s*\)": {"fpga_models/collective.py"},
    # initial weight draws (uniform / normal arrays): the generator; the others draw stimulus
    # inputs (csim / rtlsim / agreement inputs) or ONNX export placeholders, not weights
    r"\.(uniform|standard_normal|normal)\(": {
        "fpga_models/weights.py",
        "bapipe/onnx_export.py",       # placeholder initializers of exported ONNX files (every op's layout)
        "codegen/check/agreement.py",        # input samples of the stage benches
        "codegen/cli_rtlsim.py",       # input samples of `bapipe rtlsim`
        "codegen/check/rtlsim_train.py",     # input samples of the training RTL run
    },
    # a route's bandwidth (slowest link) and latency (sum of links)
    r"min\([^)]*bandwidth_Bps\s+for": {"fpga_models/cluster.py"},
    r"sum\([^)]*latency_s\s+for": {"fpga_models/cluster.py"},
    # number-format tables: names, bytes, fixed-point bits
    # (a name mapped to a whole number: bytes or bits; the boards' per-format DSP costs are floats)
    STR + r"\"(fixed16|int8|fp16|bf16|fp32)\"\s*:\s*\d+\s*[,}]|\(\s*\"fixed16\"\s*,\s*\"int8\"": set(),
    STR + r"Fmt\(\s*\"(fixed16|int8)\"": set(),
    # the event loop of the planner's replays (the simulator has its own: credits, transmit
    # slots, host PCIe and memory that the planner's replay leaves out; Dijkstra in cluster)
    r"heapq\.heappop\(|\bpop\(heap\)": {
        "planner/pipeline.py", "fpga_models/sim.py",
        "fpga_models/cluster.py",          # Dijkstra (routes), not a replay
        "bapipe/onnx_import.py",           # topological order of ONNX nodes
        "planner/reshard/strategies.py",   # list scheduling of resharding pieces (its own model)
    },
    # stash counts (closed forms and the op-order walk) and the warm-ups they rest on
    r"def\s+stash_count\b": {"bapipe/schedules.py"},
    r"2\s*\*\s*\(\s*p\s*-\s*d|\(\s*p\s*-\s*d\s*-\s*1\s*\)\s*\*\s*2|\bp\s*-\s*d\b": {"bapipe/schedules.py"},
}


@pytest.mark.parametrize("pattern", sorted(ONE_HOME))
def test_no_second_copy(pattern):
    extra = _hits(pattern) - ONE_HOME[pattern]
    assert not extra, f"{pattern!r} is computed outside its home {sorted(ONE_HOME[pattern])}: {sorted(extra)}"


def test_the_grep_finds_a_copy(tmp_path):
    """The grep is not blind: a formula in code is found, the same formula in a docstring or
    a comment is not."""
    f = tmp_path / "x.py"
    f.write_text('"""2 * (r - 1) steps"""\n# 2 * (r - 1)\nsteps = 2 * (r - 1)\nB = {"bf16": 2, "fp32": 4}\n')
    rx = re.compile(r"2\s*\*\s*\(\s*\w+\s*-\s*1\s*\)")
    assert [n for n, code in _code(f) if rx.search(code)] == [3]
    fmt = re.compile(next(p for p in ONE_HOME if p.startswith(STR) and "bf16" in p)[len(STR):])
    assert [n for n, code in _code(f, True) if fmt.search(code)] == [4]


def test_one_event_loop_in_the_planner():
    """The 1F1B/GPipe/interleaved, 2BW and PipeDream replays all run on run_events: one
    loop over the heap in planner/pipeline.py."""
    loops = [n for n, code in _code(ROOT / "planner/pipeline.py") if re.search(r"\bwhile\s+heap\b", code)]
    assert len(loops) == 1, loops


# --- the consumers read the one home ----------------------------------------------------

def test_hardware_weights_are_the_quantized_host_draws():
    """codegen's fixed-point weights = quantize(the draws the host's float start holds), per
    layer, batch norm folded from the same gamma/beta/mean/var the host's running statistics
    start at; the fixed-point training masters are the same draws rounded."""
    from bapipe.codegen.design.context import make_weights, weight_seed
    from bapipe.fpga_models import fixedpoint as fx
    from bapipe.fpga_models import train_fixed as T
    from bapipe.fpga_models.weights import layer_draws
    from bapipe.host.program import fixed_master_params, init_stage_params

    model = load_model(str(ROOT / "examples/models/small-resnet.yaml"))
    plan = hand_plan(str(ROOT / "examples/models/small-resnet.yaml"), cuts=(3,))
    hw = make_weights(plan, model)
    seed = weight_seed(plan)
    params, state = init_stage_params(model, 0, len(model.layers) - 1, seed)
    kinds = set()
    for pos, layer in enumerate(model.layers):
        d = layer_draws(layer, seed, pos)
        if layer.type in ("dense", "conv2d"):
            kinds.add(layer.type)
            w_host = params[layer.name]["W"]
            w_host = w_host.T if layer.type == "dense" else w_host
            assert np.array_equal(w_host, d["w"].astype(np.float32))
            assert np.array_equal(hw[layer.name]["w"], fx.quantize(d["w"], plan.number_format))
            if "b" in d:
                assert np.array_equal(params[layer.name]["b"], d["b"].astype(np.float32))
                assert np.array_equal(hw[layer.name]["b"], fx.quantize(d["b"], plan.number_format))
                assert np.any(hw[layer.name]["b"] != 0)   # a dropped bias add would show
        elif layer.type == "batchnorm":
            kinds.add("batchnorm")
            assert np.array_equal(params[layer.name]["gamma"], d["gamma"].astype(np.float32))
            assert np.array_equal(state[layer.name]["running_var"], d["var"].astype(np.float32))
            scale, shift = fx.fold_batchnorm(d["gamma"], d["beta"], d["mean"], d["var"], plan.number_format)
            assert np.array_equal(hw[layer.name]["scale"], scale) and np.array_equal(hw[layer.name]["shift"], shift)
        else:
            assert d == {} and not hw.get(layer.name)
    assert kinds == {"conv2d", "dense", "batchnorm"}
    tf = T.get_formats(plan.number_format)
    master = fixed_master_params(model, 0, len(model.layers) - 1, seed, tf)
    conv = next(l for l in model.layers if l.type == "conv2d")
    assert np.array_equal(T.forward_weights({conv.name: master[conv.name]}, tf)[conv.name]["w"], hw[conv.name]["w"])


def test_draws_do_not_depend_on_the_partition(monkeypatch):
    """A layer's draws come from (seed, position): under one seed, the same weights however
    the plan cuts the model (plans seed by their fingerprint, so the seed is pinned here)."""
    import bapipe.codegen.design.context as C

    path = str(ROOT / "examples/models/small-resnet.yaml")
    model = load_model(path)
    monkeypatch.setattr(C, "weight_seed", lambda plan: 12345)
    wa, wb = C.make_weights(hand_plan(path, cuts=(3,)), model), C.make_weights(hand_plan(path, cuts=(1, 5)), model)
    assert set(wa) == set(wb) and len(wa) >= 3
    for name in wa:
        assert wa[name].keys() == wb[name].keys()
        assert all(np.array_equal(wa[name][k], wb[name][k]) for k in wa[name])


def test_number_format_tables_are_the_one_table():
    from bapipe import numformats as N
    from bapipe.plan import FORMATS as PLAN_FORMATS
    from bapipe.fpga_models import boards, fixedpoint as fx

    assert PLAN_FORMATS == boards.FORMATS == N.FORMATS == ("fixed16", "int8", "fp16", "bf16", "fp32")
    assert {n: boards.bytes_per_element(n) for n in N.FORMATS} == {"fixed16": 2, "int8": 1, "fp16": 2, "bf16": 2,
                                                                   "fp32": 4}
    # fixed16 = ap_fixed<16,6> (hls4ml's default), int8 = ap_fixed<8,4>
    assert {n: (f.width, f.frac, f.int_bits) for n, f in fx.FORMATS.items()} == {"fixed16": (16, 10, 6),
                                                                               "int8": (8, 4, 4)}


def test_route_readers_agree_with_cluster_path():
    """The simulator's and the planner's route figures are Cluster.path's (16xV100: routes
    through the switch and the hosts' PCIe)."""
    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.fpga_models.sim import _Net

    cl = load_cluster("16xV100")
    names = [b.name for b in cl.boards]
    net = _Net(cl)
    for a, b in ((names[0], names[1]), (names[0], names[9]), (names[3], names[15]), (names[2], names[2])):
        hops, bw, lat = cl.path(a, b)
        ids, bw2, lat2 = net.path(a, b)
        assert (bw2, lat2) == (bw, lat) == (cl.path_bandwidth(a, b), cl.path_latency(a, b))
        assert [net.names[i] for i in ids] == [f"{u}->{v}" for u, v, _ in hops]
        if a != b:
            assert bw == min(ln.bandwidth_Bps for ln in cl.route(a, b)) and len(hops) == len(cl.route(a, b))
