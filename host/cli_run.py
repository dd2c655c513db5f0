"""`bapipe run plan.yaml --backend numpy|verilator|xrt`: train the plan's model on a backend."""
from __future__ import annotations

import sys

from bapipe.units import count

from .backends import BackendUnavailable
from .driver import train
from .pipeline import PipelineFailure, TrainingDiverged


def run_result(args) -> dict:
    """Run the plan's schedule (``args``: the `run` command's options; ``args.plan`` a plan file
    or a bapipe.plan.Plan); the --json object has backend, engine, epochs, final_loss,
    test_accuracy, samples_per_s and grad_max_rel_err_vs_single_device. bapipe.api.run and
    `bapipe run` both come here.

    A missing tool or board raises BackendUnavailable (exit 2), a failed worker PipelineFailure
    naming the stage and micro-batch and a NaN loss TrainingDiverged (exit 1): one line each.
    """
    import logging

    if getattr(args, "verbose", False):   # host.ray_mode shows Ray's warnings only then
        logging.getLogger("bapipe").setLevel(logging.INFO)
    if args.backend == "verilator":
        _check_rtl_folder(args.plan, args.build)
    r = train(args.plan, backend=args.backend, epochs=args.epochs, lr=args.lr, seed=args.seed,
                 precision=args.precision, log=args.log, checkpoint=args.checkpoint, resume=args.resume,
                 ray=args.ray, timeout=args.timeout, build=args.build,
                 global_batch=getattr(args, "global_batch", None), retries=_retries(args),
                 lr_schedule=getattr(args, "lr_schedule", "linear"),
                 progress=sys.stderr.isatty())  # bars only on a terminal; logs stay clean
    r["engine"] = engine_of(args.backend, r)
    return r


def engine_of(backend: str, r: dict) -> str:
    """What ran the run: ``ray`` (board workers as Ray actors), ``processes`` (local worker
    processes), or the hardware backend's own (``verilator``: the C++ Verilator harness of the
    generated RTL; ``xrt``: the boards through XRT)."""
    if backend != "numpy":
        return backend
    return "ray" if r.get("ray") else "processes"


def cmd_run(args) -> dict | tuple[dict, int]:
    """`bapipe run --backend torch` (the CLI calls it directly: its result is the torch run's,
    not a RunResult)."""
    return _run_torch(args)


def _run_torch(args) -> dict | tuple[dict, int]:
    """--backend torch: host/torch_train.py (one line, exit 2 without torch; exit 1 when a rank fails or
    the training diverged)."""
    from .torch_train import train_torch

    try:
        return train_torch(args.plan, epochs=args.epochs, lr=args.lr, seed=args.seed,
                           global_batch=getattr(args, "global_batch", None), timeout=args.timeout,
                           lr_schedule=getattr(args, "lr_schedule", "linear"),
                           max_iterations=getattr(args, "iterations", None))
    except BackendUnavailable as e:
        sys.stderr.write(f"bapipe run: {e}\n")
        return {"backend": "torch", "error": str(e)}, 2
    except (PipelineFailure, TrainingDiverged) as e:
        sys.stderr.write(f"bapipe run: {e}\n")
        return {"backend": "torch", "error": str(e)}, 1


def _show_torch(r: dict) -> str:
    """Human summary of a --backend torch run."""
    pred = r["predicted_iteration_s"]
    lines = [f"torch backend, {r['schedule']} schedule (torch.distributed.pipelining over {r['transport']}): "
             f"{r['processes']} processes = {r['devices']} positions x {r['replicas']} replicas, {r['stages']} stages, "
             f"{count(r['microbatches'], 'micro-batch')} of {r['microbatch_size']}",
             f"iterations        {r['iterations']}, final loss {r['final_loss']:.4f}, test accuracy "
             f"{r['test_accuracy']:.4f}",
             f"iteration time    {r['measured_iteration_s'] * 1e3:.2f} ms measured (median), "
             + (f"{pred * 1e3:.2f} ms predicted by the plan" if pred else "no prediction in the plan")]
    if "loss_max_rel_err" in r:
        lines.append(f"single process    losses within {r['loss_max_rel_err']:.1e}, weights within "
                     f"{r['weight_max_rel_err']:.1e} (tolerance {r['tolerance']:.0e}): "
                     f"{'match' if r['matches_single_process'] else 'DIFFER'}")
    return "\n".join(lines)


def _retries(args) -> int:
    """--retries: a non-negative integer."""
    from bapipe.errors import SpecError

    n = getattr(args, "retries", 0) or 0
    if n < 0:
        raise SpecError(None, None, "--retries", f"expected an integer >= 0, got {n}")
    return n


def _check_rtl_folder(plan_file, build: str | None) -> None:
    """The verilator backend simulates the `bapipe gen` build in BUILD (host/backends/rtl_build.py),
    generating it there first when BUILD is new, empty or holds only the host's ``host_rtl``
    folder; a build of another plan, or any other folder, is refused rather than written into."""
    from pathlib import Path

    from bapipe.errors import SpecError
    from bapipe.plan import Plan, load_plan
    from bapipe.codegen.cli_gen import STAMP, check_build

    folder = Path(build or "build")
    if not folder.is_dir():
        if folder.exists():
            raise SpecError(str(folder), None, "--build", "expected a folder (a `bapipe gen` build of the plan)")
        return
    names = {p.name for p in folder.iterdir()}
    if names <= {"host_rtl"}:
        return
    if STAMP not in names:
        raise SpecError(str(folder), None, "--build", "expected a new or empty folder, or a `bapipe gen` build "
                                                      "of this plan (the build would be written into it)")
    plan = plan_file if isinstance(plan_file, Plan) else load_plan(plan_file)
    check_build(folder, plan.fingerprint(), "--build")


#: run --json ``engine`` -> how the summary names it
_ENGINES = {"ray": "Ray actors", "processes": "local processes"}


def show_run(r: dict) -> str:
    """Human summary of a run."""
    from bapipe.units import si

    if "error" in r:
        return ""
    if "mismatches_vs_numpy" in r:  # a forward pass on generated hardware
        return "\n".join([
            f"{r['backend']} backend: {r['samples']} test digits through {r['stages']} stages "
            f"({r['number_format']}, {r['weights']} weights)",
            f"outputs differing from numpy fixed point: {r['mismatches_vs_numpy']} "
            f"(max abs error {r['max_abs_err_vs_numpy']:g})",
            f"test accuracy     {r['test_accuracy']:.4f} (numpy reference {r['numpy_test_accuracy']:.4f})",
            f"throughput        {si(r['samples_per_s'], 'samples/s')}",
        ])
    if r.get("backend") == "torch":
        return _show_torch(r)
    if "weights_match" in r:  # training on generated hardware (host/train_hw.py)
        cyc, plan_c = r["iteration_cycles"], r["plan_iteration_cycles"]
        return "\n".join([
            f"{r['backend']} backend trained {r['iterations']} iterations ({r['epochs']} epochs requested), "
            f"{count(r['stages'], 'stage')}, {count(r['microbatches'], 'micro-batch')} of {r['microbatch_size']}, "
            f"{r['optimizer']} lr {r['lr']:g} ({r.get('lr_schedule', 'constant')}), {r['number_format']}",
            f"weights equal to numpy fixed point after every iteration: {r['weights_match']} "
            f"(per epoch {r['weights_match_per_epoch']}; first mismatch {r['first_mismatch']})",
            f"logits equal to numpy fixed point: {r['outputs_match']}",
            f"test accuracy     {r['test_accuracy']:.4f} (numpy run {r['numpy_test_accuracy']:.4f}, "
            f"{r['test_samples']} digits)",
            f"cycles/iteration  {sum(cyc) / len(cyc):.0f} measured" + (f", {plan_c:.0f} planned" if plan_c else "")
            if cyc else "cycles/iteration  (not reported)",
        ])
    util = " ".join(f"{u:.0%}" for u in r["stage_utilisation"])
    err = r["grad_max_rel_err_vs_single_device"]
    lines = [
        f"{r['backend']} backend, {r['schedule']} schedule: {r['stages']} stages, {r['devices']} pipeline positions, "
        f"{r['workers']} board workers ({_ENGINES.get(r.get('engine'), r.get('engine'))}), "
        f"{count(r['microbatches'], 'micro-batch')} of {r['microbatch_size']} (global batch {r['global_batch']}), "
        f"{r['optimizer']} lr {r['lr']:g} ({r.get('lr_schedule', 'constant')}), {r['precision']}",
        *(f"  epoch {h['epoch'] + 1}: mean loss {h['mean_loss']:.4f}" for h in r["history"] if h["mean_loss"] is not None),
        f"final loss        {r['final_loss']:.4f}" if r["final_loss"] is not None else "final loss        (no training)",
        f"test accuracy     {r['test_accuracy']:.4f} ({r['test_samples']} digits)",
        f"throughput        {si(r['samples_per_s'], 'samples/s')} (measured on this host's {r['backend']} workers)",
        f"stage utilisation {util}",
        f"grad rel. error   {err:.2e} vs single device (measured on the first iteration)" if err is not None
        else "grad rel. error   (not checked)",
    ]
    if r.get("ray"):
        hosts = sorted({p["host"] for p in r.get("ray_placement", []) if p["host"]})
        lines.append(f"ray               ran on Ray: {r.get('ray_nodes', '?')} of {r.get('ray_cluster_nodes', '?')} "
                     f"node(s), workers " + ("placed by host (" + ", ".join(hosts) + ")" if r.get("ray_placed")
                                             else "not placed (the Ray cluster offers no board resources)"))
    return "\n".join(lines)
