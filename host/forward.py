"""Forward passes on generated hardware (verilator, xrt backends), checked against numpy.

The generated stage kernels compute the forward pass in the plan's fixed-point format with
weights baked in at generation time. This runs the test digits through them and compares
every output with ``fpga_models.fixedpoint`` (the bit-exact numpy reference of the same
kernels). Weights: the ones the kernels bake in (``codegen.design.dataflow.plan_weights``) or, with
``--resume ckpt.npz``, weights trained on the numpy backend, rounded to the format.
"""
from __future__ import annotations

import time

import numpy as np

from bapipe.errors import SpecError

from .backends import get_backend
from .data import load_digits


def trained_params(checkpoint: str, plan, model) -> dict[str, dict[str, np.ndarray]]:
    """Raw fixed-point weights in the generator's layout from a numpy-backend checkpoint.

    Dense weights are stored (in, units) by the host and (units, in) = (MH, MW) by the
    generator; conv weights are (O, C, kh, kw) in both.
    """
    from bapipe.fpga_models import fixedpoint as fx

    from .checkpoint import load

    _, _, state = load(checkpoint, plan, model)
    out = {}
    for st in state.values():
        for lname, p in st["params"].items():
            layer = model.layers[model.index[lname]]
            if layer.type not in ("dense", "conv2d"):
                continue
            if "w" in p:  # raw master weights of fixed-point training (fpga_models.train_fixed)
                from bapipe.fpga_models import train_fixed as T

                fw = T.forward_weights({lname: p}, T.get_formats(plan.number_format))[lname]
                out[lname] = {"w": fw["w"], "b": fw.get("b")}
                continue
            w = p["W"].T if layer.type == "dense" else p["W"]
            out[lname] = {"w": fx.quantize(w, plan.number_format),
                          "b": fx.quantize(p["b"], plan.number_format) if "b" in p else None}
    return out


def reference_logits(model, params: dict, x_q: np.ndarray, fmt: str) -> np.ndarray:
    """Raw fixed-point logits of the whole model from fpga_models.fixedpoint (numpy)."""
    from bapipe.fpga_models import fixedpoint as fx

    out = fx.model_fwd(model.layers, {model.inputs[0].name: x_q}, params, fmt)
    return np.asarray(out[model.layers[-1].name]).reshape(len(x_q), -1)


def run_forward(plan, model, backend: str, build: str | None = None, seed: int = 0, plan_file: str = "plan.yaml",
                checkpoint: str | None = None, timeout: float = 60.0, limit: int | None = None) -> dict:
    """Run the test set through ``backend`` and compare with the numpy fixed-point reference."""
    from bapipe.fpga_models import fixedpoint as fx
    from bapipe.fpga_models.cluster import load_cluster

    be = get_backend(backend)
    be.check({"build": build, "plan": plan})
    try:
        fmt = fx.get_fmt(plan.number_format)
    except ValueError as e:
        raise SpecError(plan_file, None, "number_format", str(e)) from None
    if checkpoint:
        params = trained_params(checkpoint, plan, model)
    else:
        from bapipe.codegen.design.dataflow import plan_weights

        params = plan_weights(plan, model)   # what `bapipe gen` bakes into the kernels
    data = load_digits(model.inputs[0].shape, seed)
    x, y = data.x_test, data.y_test
    if limit is not None:
        x, y = x[:limit], y[:limit]
    x_q = fx.quantize(x, fmt)
    ref = reference_logits(model, params, x_q, fmt)
    t0 = time.perf_counter()
    opts = {"build": build, "timeout": timeout, "plan_file": plan_file}
    got = np.asarray(be.forward(plan, model, load_cluster(plan.cluster), params, x_q, opts)).reshape(ref.shape)
    wall = opts.get("sim_s", time.perf_counter() - t0)  # a backend may exclude its one-off build
    logits = fx.dequantize(got, fmt)
    from .layers_np import softmax_cross_entropy

    loss, _ = softmax_cross_entropy(logits.astype(np.float32), y, 1.0 / len(y))
    diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
    return {
        "backend": backend, "epochs": 0, "final_loss": loss,
        "test_accuracy": float(np.mean(np.argmax(logits, axis=1) == y)),
        "samples_per_s": len(y) / wall if wall else 0.0, "grad_max_rel_err_vs_single_device": None,
        "samples": int(len(y)), "mismatches_vs_numpy": int(np.count_nonzero(diff.max(axis=1))),
        "max_abs_err_vs_numpy": float(diff.max() / (1 << fmt.frac)) if diff.size else 0.0,
        "numpy_test_accuracy": float(np.mean(np.argmax(ref, axis=1) == y)),
        "weights": "checkpoint" if checkpoint else "generated", "number_format": plan.number_format,
        "schedule": plan.schedule, "stages": len(plan.stages),
    }


__all__ = ["run_forward", "trained_params", "reference_logits"]
