"""`bapipe csim build/ [--json]`: g++ C-simulation of every generated stage against numpy."""
from __future__ import annotations

import math
import sys

from bapipe.errors import SpecError

from bapipe.codegen.check.csim import csim_project

#: most random inputs per stage `csim` runs
MAX_SAMPLES = 4096
#: most training iterations `csim --iterations` runs (each compiles nothing new: ~1 s of csim)
MAX_ITERATIONS = 1000


def cmd_csim(args) -> tuple[dict, int]:
    """CLI handler: the --json object, exit 1 when a stage does not match numpy.

    The folder must be exactly what `bapipe gen` wrote (see cli_gen.check_build).
    """
    from bapipe.codegen.cli_gen import check_build

    iterations = getattr(args, "iterations", None)
    if iterations is not None:
        return _cmd_train(args, iterations)
    samples = getattr(args, "samples", 4)
    if isinstance(samples, int) and samples > MAX_SAMPLES:  # each runs through every compiled stage
        raise SpecError(None, None, "--samples", f"expected at most {MAX_SAMPLES} samples, got {samples}")
    check_build(args.build)
    if sys.stderr.isatty():  # g++ takes seconds to a minute per stage the first time
        sys.stderr.write(f"bapipe csim: compiling and running each stage of {args.build} "
                         "(first run ~1 min for small plans; compiled stages are cached)\n")
    r = csim_project(args.build, samples=getattr(args, "samples", 4), seed=getattr(args, "seed", 0))
    for d in r.get("deadlocks", []):   # one line each: kernel, process, stream, occupancy/depth
        sys.stderr.write(f"bapipe csim: deadlock: {d}\n")
    return r, 0 if r["passed"] else 1


def _cmd_train(args, iterations: int) -> tuple[dict, int]:
    """`--iterations K` on a training build: codegen.check.csim_train; exit 1 when a weight differs."""
    from bapipe.codegen.cli_gen import check_build
    from bapipe.codegen.check.csim_train import csim_train

    if not 1 <= iterations <= MAX_ITERATIONS:
        raise SpecError(None, None, "--iterations", f"expected 1 to {MAX_ITERATIONS} iterations, got {iterations}")
    lr, mu = getattr(args, "lr", None), getattr(args, "momentum", 0.9)
    if lr is None:   # the rate `bapipe run` trains this plan with (bapipe.training.default_lr)
        lr = _plan_lr(args.build)
    if not (math.isfinite(lr) and lr > 0):
        raise SpecError(None, None, "--lr", f"expected a learning rate > 0, got {lr}")
    if not 0 <= mu < 1:
        raise SpecError(None, None, "--momentum", f"expected a momentum in [0, 1), got {mu}")
    check_build(args.build)
    if sys.stderr.isatty():
        sys.stderr.write(f"bapipe csim: compiling the forward, backward and update kernels of {args.build} "
                         f"and running {iterations} training iteration(s)\n")
    r = csim_train(args.build, iterations, seed=getattr(args, "seed", 0), lr=lr, momentum=mu)
    return r, 0 if r["passed"] else 1


def _plan_lr(build) -> float:
    """bapipe.training.default_lr for the build's plan (sgd: csim trains sgd with momentum)."""
    from pathlib import Path

    from bapipe.plan import load_plan
    from bapipe.training import default_lr

    plan = load_plan(Path(build) / "plan.yaml")
    return default_lr("sgd", plan.global_batch, plan.schedule)


def show_train(r: dict) -> str:
    """Human table of a training run."""
    lines = [f"{'iteration':<11}{'loss':>12}{'master err':>12}{'velocity err':>14}{'grad err':>10}{'fwd err':>9}"
             f"{'dz err':>8}  weights"]
    for it in r["per_iteration"]:
        dz = it.get("loss_grad_max_abs_err_lsb", "-")
        lines.append(f"{it['iteration']:<11}{it['loss']:>12.4f}{it['master_max_abs_err_lsb']:>12}"
                     f"{it['velocity_max_abs_err_lsb']:>14}{it['grad_sums_max_abs_err']:>10}"
                     f"{it['forward_max_abs_err_lsb']:>9}{dz:>8}  {'match' if it['weights_match'] else 'DIFFER'}")
    lines.append(f"{r['iterations']} iteration(s) of {r['per_iteration'][0]['samples'] if r['per_iteration'] else 0} "
                 f"samples vs fpga_models.train_fixed.train_step (lr {r['lr']}, momentum {r['momentum']}); "
                 f"host-side: {'; '.join(r['not_in_hls'])}")
    lines.append("PASSED" if r["passed"] else "FAILED")
    return "\n".join(lines)


def show_csim(r: dict) -> str:
    """Human table."""
    if r.get("mode") == "train":
        return show_train(r)
    lines = [f"{'stage':<10}{'result':>8}{'max err (LSB)':>15}{'compile s':>11}{'run s':>8}"]
    for s in r["stages"]:
        err = "-" if s["max_abs_err_lsb"] is None else str(s["max_abs_err_lsb"])
        comp = "cached" if s.get("cached") else f"{s['compile_s']:.1f}"
        res = "SKIP" if s.get("skipped") else ("PASS" if s["passed"] else "FAIL")
        extra = s.get("error") or s.get("skipped") or s.get("note") or ""
        if s.get("cycles_per_sample") is not None:
            extra = (f"cycles/sample {s['cycles_per_sample']:g} counted vs {s['plan_cycles_per_sample']:g} plan  "
                     + extra).rstrip()
        lines.append(f"{s['name']:<10}{res:>8}{err:>15}{comp:>11}{s['run_s']:>8.2f}"
                     + (f"  samples={s['samples']}" if "samples" in s else "") + (f"  {extra}" if extra else ""))
    if r.get("model_max_abs_err_lsb") is not None:
        lines.append(f"whole pipeline vs numpy over {r['samples']} samples: max error "
                     f"{r['model_max_abs_err_lsb']} LSB ({r['format']})")
    if r.get("skipped"):
        lines.append(f"not simulated (over the csim budget): {', '.join(r['skipped'])}")
    lines.append("PASSED" if r["passed"] else "FAILED")
    return "\n".join(lines)
