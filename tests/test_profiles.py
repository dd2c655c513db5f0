"""Measured per-layer profiles: YAML/CSV formats, per-board files, validation with file:line:field."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapipe import zoo
from bapipe.errors import SpecError
from bapipe.profiles import load_profile, load_profiles
from tolerances import f64_sum

MLP = zoo.get("tiny-mlp")   # fc1 relu1 fc2 relu2 fc3 relu3 fc4
NAMES = [l.name for l in MLP.layers]
# a time read as value x unit (1e-3, 1e-6: themselves rounded) x batch ratio, against a literal:
# at most 3 float64 roundings plus the literal's one
UNIT = f64_sum(4)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def yaml_rows(skip=(), extra="", fmt="{{name: {n}, fwd_ms: {i}.5, bwd_ms: {i}, activation_bytes: {a}, param_bytes: {p}}}"):
    rows = [("  - " + fmt.format(n=l.name, i=i, a=l.out_elems * 4, p=l.params * 4))
            for i, l in enumerate(MLP.layers) if l.name not in skip]
    return "model: tiny-mlp\nlayers:\n" + "\n".join(rows) + "\n" + extra


def test_example_profile_loads_for_vgg16():
    m = zoo.get("vgg16")
    p = load_profile("examples/profiles/vgg16-v100.yaml", m)
    assert list(p) == [l.name for l in m.layers]
    assert p["conv2"]["param_bytes"] == 4 * m.layers[m.index["conv2"]].params
    assert p["conv2"]["activation_bytes"] == 4 * 64 * 64 * 224 * 224     # batch 64, fp32
    assert all(e["bwd_s"] >= e["fwd_s"] >= 0 for e in p.values())


def test_yaml_units_in_seconds_and_model_order(tmp_path):
    p = load_profile(write(tmp_path, "p.yaml", yaml_rows()), MLP)
    assert list(p) == NAMES
    assert p["fc1"] == {"fwd_s": 0.5e-3, "bwd_s": 0.0, "activation_bytes": 64 * 4, "param_bytes": (64 * 64 + 64) * 4}
    assert p["relu1"]["fwd_s"] == pytest.approx(1.5e-3, rel=UNIT)


def test_csv_with_pipedream_column_names_and_us(tmp_path):
    rows = "\n".join(f"{n},{i + 1},{2 * (i + 1)},{100 * i},{8 * i}" for i, n in enumerate(NAMES))
    path = write(tmp_path, "p.csv", "# PipeDream export\nlayer,forward_compute_time,backward_compute_time,"
                                    f"activation_size,parameter_size\n{rows}\n")
    p = load_profile(path, MLP)
    assert p["relu1"] == {"fwd_s": pytest.approx(2e-3, rel=UNIT), "bwd_s": pytest.approx(4e-3, rel=UNIT), "activation_bytes": 100,
                          "param_bytes": 8}
    rows = "\n".join(f"{n},{i},{i},0,0" for i, n in enumerate(NAMES))
    p = load_profile(write(tmp_path, "q.csv", f"name,fwd_us,bwd_s,activation_bytes,param_bytes\n{rows}\n"), MLP)
    assert p["fc2"]["fwd_s"] == pytest.approx(2e-6, rel=UNIT) and p["fc2"]["bwd_s"] == 2.0


def test_per_board_yaml_and_csv(tmp_path):
    body = yaml_rows().split("layers:\n")[1]
    ind = "\n".join("      " + r.strip() if r.strip().startswith("-") else r for r in body.splitlines())
    path = write(tmp_path, "b.yaml", f"boards:\n  V100:\n    layers:\n{ind}\n  U250:\n    layers:\n{ind}\n")
    assert set(load_profiles(path, MLP)) == {"V100", "U250"}
    assert load_profile(path, MLP, board="U250")["fc1"]["fwd_s"] == 0.5e-3
    with pytest.raises(SpecError, match="say which one"):
        load_profile(path, MLP)
    with pytest.raises(SpecError, match="no profile for board type 'VCU118'; it has V100, U250"):
        load_profile(path, MLP, board="VCU118")
    rows = "\n".join(f"{b},{n},1,2,3,4" for b in ("A", "B") for n in NAMES)
    csvp = write(tmp_path, "b.csv", f"board,layer,fwd_s,bwd_s,activation_bytes,param_bytes\n{rows}\n")
    assert load_profile(csvp, MLP, board="B")["fc4"] == {"fwd_s": 1.0, "bwd_s": 2.0, "activation_bytes": 3,
                                                         "param_bytes": 4}
    # a file without boards serves any board type
    assert load_profile(write(tmp_path, "p.yaml", yaml_rows()), MLP, board="V100")["fc1"]["fwd_s"] == 0.5e-3


def test_batch_scaling(tmp_path):
    path = write(tmp_path, "p.yaml", yaml_rows().replace("model: tiny-mlp", "model: tiny-mlp\nbatch: 4"))
    p = load_profile(path, MLP, batch=8)
    assert p["fc1"]["fwd_s"] == pytest.approx(1e-3, rel=UNIT) and p["fc1"]["activation_bytes"] == 2 * 256
    assert p["fc1"]["param_bytes"] == (64 * 64 + 64) * 4


@pytest.mark.parametrize("mutate,where,msg", [
    (lambda t: t.replace("name: relu2", "name: relu9"), ":6: layers[3].name", "'relu9' is not a layer of model 'tiny-mlp'; did you mean 'relu"),
    (lambda t: t.replace("fwd_ms: 2.5", "fwd_ms: -2.5"), ":5: layers[2].fwd_ms", "expected a number >= 0, got -2.5"),
    (lambda t: t.replace("activation_bytes: 256, param_bytes: 16640", "activation_bytes: -1, param_bytes: 16640"),
     ":3: layers[0].activation_bytes", ">= 0"),
    (lambda t: t.replace("fwd_ms: 0.5", "fwd_ms: fast"), ":3: layers[0].fwd_ms", "expected a number, got 'fast'"),
    (lambda t: t.replace("fwd_ms: 0.5", "fwd_s: 1, fwd_ms: 0.5"), ":3: layers[0].fwd_s", "exactly one of"),
    (lambda t: t.replace("name: fc2", "name: fc1"), ":5: layers[2].name", "'fc1' is profiled twice"),
    (lambda t: t.replace(", param_bytes: 16640", ""), ":3: layers[0].param_bytes", "missing field 'param_bytes'"),
    (lambda t: t.replace("param_bytes: 16640", "param_bytes: 16640, flops: 3"), ":3: layers[0].flops", "unknown field"),
    (lambda t: t.replace("model: tiny-mlp", "modle: tiny-mlp"), ":1: modle", "unknown field 'modle'"),
])
def test_yaml_errors_name_file_line_field(tmp_path, mutate, where, msg):
    path = write(tmp_path, "p.yaml", mutate(yaml_rows()))
    with pytest.raises(SpecError) as e:
        load_profile(path, MLP)
    s = str(e.value)
    assert s.startswith(path + where) and msg in s and "\n" not in s


def test_missing_layers_listed(tmp_path):
    path = write(tmp_path, "p.yaml", yaml_rows(skip=("relu1", "fc4")))
    with pytest.raises(SpecError) as e:
        load_profile(path, MLP)
    assert str(e.value) == f"{path}:2: layers: no measurement for layer(s) relu1, fc4 of model 'tiny-mlp' (7 layers)"


@pytest.mark.parametrize("text,where,msg", [
    ("layer,fwd_s,bwd_s,activation_bytes,param_bytes\nfc1,1,2,3\n", ":2: row", "expected 5 values"),
    ("layer,fwd_s,bwd_s,activation_bytes,param_bytes\n# c\nfc1,1,-2,3,4\n", ":3: bwd_s", ">= 0, got -2.0"),
    ("layer,fwd_s,bwd_s,activation_bytes,param_bytes\nfc1,1,2,3.5,4\n", ":2: activation_bytes", "whole number"),
    ("layer,fwd_s,bwd_s,activation_bytes,param_bytes\nconv1,1,2,3,4\n", ":2: name", "not a layer"),
    ("layer,fwd_s,bwd_s,activation_bytes,param_bytes\nfc1,1,2,3,4\n", ":1", "no measurement for layer(s) relu1"),
    ("# only a comment\n", "", "expected a header row"),
])
def test_csv_errors(tmp_path, text, where, msg):
    path = write(tmp_path, "p.csv", text)
    with pytest.raises(SpecError) as e:
        load_profile(path, MLP)
    assert str(e.value).startswith(path + where) and msg in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_profile(str(tmp_path / "none.csv"), MLP)
    with pytest.raises(SpecError, match="expected a .yaml, .yml or .csv"):
        load_profile(str(tmp_path / "p.json"), MLP)
    with pytest.raises(SpecError, match="either 'layers'"):
        load_profile(write(tmp_path, "p.yaml", "model: x\n"), MLP)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 10, allow_nan=False),
                          st.integers(0, 2**40), st.integers(0, 2**40)), min_size=7, max_size=7))
def test_csv_round_trip_property(tmp_path_factory, vals):
    """Whatever numbers a profiler writes (repr of floats), loading returns them exactly, in seconds."""
    d = tmp_path_factory.mktemp("p")
    rows = "\n".join(f"{n},{f!r},{b!r},{a},{p}" for n, (f, b, a, p) in zip(NAMES, vals))
    got = load_profile(write(d, "p.csv", f"layer,fwd_s,bwd_s,activation_bytes,param_bytes\n{rows}\n"), MLP)
    assert [(e["fwd_s"], e["bwd_s"], e["activation_bytes"], e["param_bytes"]) for e in got.values()] == \
        [(float(f), float(b), a, p) for f, b, a, p in vals]


# --- PyTorch profiler per-module table (tests/fixtures/profiles, made by tests/make_torch_profile.py) ---
TORCH_TABLE = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "profiles" / "tiny_mlp_torch.csv"


def test_torch_table_imports_per_call_times_and_model_bytes(tmp_path):
    """torch.profiler's totals / calls per label, bytes from the model's shapes x 4 x batch."""
    import csv

    from bapipe.profiles import import_torch_table
    from bapipe.models import load_model

    model = load_model("tiny-mlp")
    prof = tmp_path / "p.yaml"
    prof.write_text(import_torch_table(str(TORCH_TABLE), model, 32, clock="cpu"))
    p = load_profiles(str(prof), model, require_batch=True)[None]
    rows = {r["name"]: r for r in csv.DictReader(TORCH_TABLE.open())}
    for l in model.layers:
        for kind in ("fwd", "bwd"):
            r = rows[f"bapipe.{kind}.{l.name}"]
            want = float(r["cpu_time_total_us"]) / int(r["calls"]) * 1e-6
            # one division, one product, then 9 significant digits in the YAML (5e-10 relative)
            assert p[l.name][f"{kind}_s"] == pytest.approx(want, rel=1e-9, abs=0)
        assert p[l.name]["activation_bytes"] == l.out_elems * 32 * 4
        assert p[l.name]["param_bytes"] == l.params * 4
    assert p["fc1"]["param_bytes"] == 4160 * 4 and p["fc4"]["activation_bytes"] == 10 * 32 * 4


def test_torch_table_plans(tmp_path):
    from bapipe.cli import main

    prof = tmp_path / "p.yaml"
    from bapipe.profiles import main as prof_main
    assert prof_main(["torch-table", str(TORCH_TABLE), "--model", "tiny-mlp", "--batch", "32", "--clock", "cpu",
                      "-o", str(prof)]) == 0
    assert main(["plan", "tiny-mlp", "4xU250-ring", "--profile", str(prof), "-o", str(tmp_path / "plan.yaml")]) == 0


@pytest.mark.parametrize("edit, args, msg", [
    (None, [], "device_time_total_us: is 0"),                          # a CPU run read as device time
    (lambda t: t.replace("bapipe.bwd.relu2", "bapipe.bwd.relu22"), ["--clock", "cpu"], "did you mean 'relu2'"),
    (lambda t: "\n".join(l for l in t.splitlines() if "fwd.fc3" not in l), ["--clock", "cpu"],
     "no forward row 'bapipe.fwd.fc3'"),
    (lambda t: t.replace("calls", "count", 1), ["--clock", "cpu"], "missing column 'calls'"),
    (lambda t: t.replace("bapipe.fwd.fc1,10", "bapipe.fwd.fc1,0"), ["--clock", "cpu"], "calls: expected at least 1"),
    (lambda t: t + "\nbapipe.fwd.fc1,10,1.0,0.0\n", ["--clock", "cpu"], "appears twice"),
])
def test_torch_table_errors_are_one_line(tmp_path, capsys, edit, args, msg):
    from bapipe.profiles import main as prof_main

    table = tmp_path / "t.csv"
    text = TORCH_TABLE.read_text()
    table.write_text(edit(text) if edit else text)
    rc = prof_main(["torch-table", str(table), "--model", "tiny-mlp", "--batch", "32", *args,
                    "-o", str(tmp_path / "p.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and msg in err and "t.csv" in err, err
    assert not (tmp_path / "p.yaml").exists()


def test_torch_table_needs_batch(tmp_path):
    from bapipe.profiles import main as prof_main

    with pytest.raises(SystemExit) as e:   # argparse: --batch is required
        prof_main(["torch-table", str(TORCH_TABLE), "--model", "tiny-mlp", "-o", str(tmp_path / "p.yaml")])
    assert e.value.code == 2
