"""Issue 31, one Design lowered once: the verilator backend simulates a `bapipe gen` build
and never lowers again. Counted here: every call of codegen.design.lower.lower (wherever it
was imported) across a gen and the runs on its build."""
from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

from handplan import tiny_mlp_plan


@pytest.fixture
def lowerings(monkeypatch) -> list:
    """The plan fingerprint of every lowering from now on (each module's ``lower`` replaced)."""
    import bapipe.codegen.gen_folder  # noqa: F401  (modules holding `lower` are loaded before patching)
    import bapipe.codegen.rtl.write  # noqa: F401
    from bapipe.codegen.design import lower as low

    real, calls = low.lower, []

    def counting(plan, *a, **k):
        calls.append(plan.fingerprint())
        return real(plan, *a, **k)

    for mod in list(sys.modules.values()):
        if getattr(mod, "lower", None) is real:
            monkeypatch.setattr(mod, "lower", counting)
    return calls


def _gen(plan, folder):
    from bapipe.codegen.gen_folder import generate_folder
    from bapipe.fpga_models.plancheck import resolve

    model, cluster = resolve(plan, "plan.yaml")
    return generate_folder(plan, model, cluster, folder, plan.dumps(), "plan.yaml")


def _train_plan():
    """tiny-mlp on 4 boards (GPipe, 4 micro-batches of 2) with the RTL tests' small folding."""
    return dataclasses.replace(tiny_mlp_plan(4), mode="train", microbatches=4, microbatch_size=2, global_batch=8)


def test_host_images_hold_the_host_weights_where_the_manifest_says(tmp_path):
    """The host's weights written into copies of the stage images read back (weight_image.read_model,
    what the MVU memories' text is written from) equal to what was written, for every array; the
    generated weights give byte-identical images; the build's own images are not touched."""
    from bapipe.codegen.gen_folder import check_build
    from bapipe.codegen.design.weight_image import read_model
    from bapipe.codegen.rtl.pipeline import read_params
    from bapipe.host.backends.rtl_build import write_host_images

    plan = tiny_mlp_plan(4)
    _gen(plan, tmp_path / "b")
    b = tmp_path / "b"
    man = json.loads((b / "rtl" / "manifest.json").read_text())
    gen = read_params(b / "rtl", list(man["params"]))
    rng = np.random.default_rng(1)
    new = {l: {k: rng.integers(-3000, 3000, v.shape) for k, v in d.items()} for l, d in gen.items()}
    mem = write_host_images(b, new)
    assert sorted(json.loads((mem / "manifest.json").read_text())["memories"]) == sorted(man["memories"])
    n = 0
    for l, d in man["params"].items():
        for k, e in d.items():
            assert np.array_equal(read_model(b / "host_rtl", e), new[l][k])
            assert np.array_equal(read_model(b, e), gen[l][k])     # the build keeps the generated ones
            n += 1
    assert n == 8     # w and b of fc1..fc4
    write_host_images(b, gen)
    files = {e["file"] for d in man["params"].values() for e in d.values()}
    assert len(files) == 4 and all((b / f).read_bytes() == (b / "host_rtl" / f).read_bytes() for f in files)
    check_build(b, plan.fingerprint())   # every generated file as gen wrote it


@pytest.mark.verilator
@pytest.mark.slow   # a Verilator build of tiny-mlp's 4-board RTL (~40 s on 2 shared cores)
def test_gen_then_verilator_run_lowers_once(tmp_path, lowerings, monkeypatch, capsys):
    """`bapipe gen` then `bapipe run --backend verilator` on its build, and a forward run with
    weights other than the generated ones: one lowering (the gen's), every output equal to the
    numpy fixed-point reference; a run on an empty folder generates the build there (one more
    lowering), once."""
    from bapipe.cli import main
    from bapipe.codegen.gen_folder import check_build
    from bapipe.codegen.design import dataflow
    from bapipe.host.forward import run_forward
    from bapipe.zoo import get

    plan, model = tiny_mlp_plan(4), get("tiny-mlp")
    (tmp_path / "plan.yaml").write_text(plan.dumps())
    assert main(["gen", str(tmp_path / "plan.yaml"), "-o", str(tmp_path / "b")]) == 0
    assert lowerings == [plan.fingerprint()]
    capsys.readouterr()
    assert main(["run", str(tmp_path / "plan.yaml"), "--backend", "verilator", "--build", str(tmp_path / "b"),
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["samples"] == 359 and r["mismatches_vs_numpy"] == 0 and r["weights"] == "generated"
    assert lowerings == [plan.fingerprint()]          # the run read the build: no lowering of its own
    rng = np.random.default_rng(7)
    generated = dataflow.plan_weights(plan, model)
    other = {l: {k: rng.integers(-300, 300, np.shape(v)) for k, v in d.items() if v is not None}
             for l, d in generated.items()}
    monkeypatch.setattr(dataflow, "plan_weights", lambda p, m: other)   # the weights the run streams with
    out = run_forward(plan, model, "verilator", build=str(tmp_path / "b"), limit=16)
    assert out["samples"] == 16 and out["mismatches_vs_numpy"] == 0 and out["max_abs_err_vs_numpy"] == 0
    from bapipe.fpga_models import fixedpoint as fx
    from bapipe.host.data import load_digits
    from bapipe.host.forward import reference_logits

    x = fx.quantize(load_digits(model.inputs[0].shape, 0).x_test[:16], fx.get_fmt(plan.number_format))
    ref_gen = reference_logits(model, generated, x, plan.number_format)
    ref_other = reference_logits(model, other, x, plan.number_format)
    assert np.count_nonzero(ref_gen != ref_other) > 100   # so the RTL computed with the host's weights
    assert lowerings == [plan.fingerprint()]
    check_build(tmp_path / "b", plan.fingerprint())   # the build is as gen wrote it
    out = run_forward(plan, model, "verilator", build=str(tmp_path / "e"), limit=4)
    assert out["mismatches_vs_numpy"] == 0 and lowerings == [plan.fingerprint()] * 2
    run_forward(plan, model, "verilator", build=str(tmp_path / "e"), limit=4)
    assert len(lowerings) == 2


def test_training_build_is_generated_once_for_the_runs_constants(tmp_path, lowerings):
    """The training RTL holds its SGD constants as parameters: a run on an empty folder generates
    its build once with the run's constants (one lowering), a second run with them reads it (none);
    a run with other constants on that gen build gets its own in host_rtl/gen (one lowering)
    and leaves the user's build as gen wrote it."""
    from bapipe.codegen.gen_folder import check_build
    from bapipe.fpga_models import train_fixed as T
    from bapipe.fpga_models.plancheck import resolve
    from bapipe.host.backends import verilator_backend as vb
    from bapipe.host.backends.rtl_build import sgd_matches

    plan = _train_plan()
    model, cluster = resolve(plan, "plan.yaml")
    tf = T.get_formats(plan.number_format)
    a = T.sgd_schedule(0.03, 0.9, 8, tf, [1.0, 0.5], 5)
    b = T.sgd_schedule(0.02, 0.9, 8, tf, [1.0], 5)
    build = tmp_path / "b"
    vb.check_training(plan, model, cluster, {"build": str(build), "sgd": a})
    assert lowerings == [plan.fingerprint()] and sgd_matches(build, a) and not sgd_matches(build, b)
    man = json.loads((build / "rtl" / "train" / "manifest.json").read_text())
    assert man["sgd"]["lr_steps"] == [c.lr for c in a.steps] and man["sgd"]["lr_period"] == 5
    assert vb.train_build(plan, model, cluster, {"build": str(build), "sgd": a}) == build
    assert len(lowerings) == 1
    got = vb.train_build(plan, model, cluster, {"build": str(build), "sgd": b})
    assert got == build / "host_rtl" / "gen" and sgd_matches(got, b) and len(lowerings) == 2
    assert vb.train_build(plan, model, cluster, {"build": str(build), "sgd": b}) == got and len(lowerings) == 2
    check_build(build, plan.fingerprint())


def test_initial_weights_go_into_the_training_images(tmp_path):
    """The host's initial master weights, written into copies of the training RTL's images, read
    back (tile order, as the testbench's $readmemh loads them) as the forward-format weights."""
    from bapipe.codegen.design.training import from_tile_order, read_hex
    from bapipe.fpga_models import train_fixed as T
    from bapipe.host.backends.rtl_build import write_train_images
    from bapipe.host.program import fixed_master_params
    from bapipe.zoo import get

    plan, model = _train_plan(), get("tiny-mlp")
    _gen(plan, tmp_path / "b")
    tdir = tmp_path / "b" / "rtl" / "train"
    man = json.loads((tdir / "manifest.json").read_text())
    tf = T.get_formats(plan.number_format)
    fw = T.forward_weights(fixed_master_params(model, 0, len(model.layers) - 1, 3, tf), tf)
    out = write_train_images(tdir, man, fw, tmp_path / "imgs")
    assert sorted(p.name for p in out.glob("*.hex")) == sorted(p.name for p in tdir.glob("*.hex"))
    for l in man["dense"]:
        w = from_tile_order(read_hex((out / f"{l['ident']}_w.hex").read_text(), 16), l["mh"], l["mw"], l["pe"], l["simd"])
        assert np.array_equal(w, fw[l["name"]]["w"])
        assert np.array_equal(read_hex((out / f"{l['ident']}_b.hex").read_text(), 16), fw[l["name"]]["b"])
        assert not np.array_equal(w, from_tile_order(read_hex((tdir / f"{l['ident']}_w.hex").read_text(), 16),
                                                     l["mh"], l["mw"], l["pe"], l["simd"]))
    assert len(man["dense"]) == 4
