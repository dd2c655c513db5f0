"""`bapipe sim plan.yaml [--iterations N] [--gantt g.png] [--trace t.json] [--json]`."""
from __future__ import annotations

import sys

from bapipe.errors import SpecError

#: most compute ops one `bapipe sim` replays (~400k events/s: about half a minute); a plan
#: with 10**9 micro-batches would otherwise run for days before printing anything
MAX_SIM_OPS = 10_000_000
#: above this many ops (a quarter of a second or more), sim says on a terminal how long it will take
PROGRESS_OPS = 100_000


def sim_result(plan, model, cluster, plan_file: str, iterations: int = 1, gantt: str | None = None,
               trace: str | None = None) -> dict:
    """Simulate ``plan`` (with its loaded model and cluster; ``plan_file`` names it in errors);
    write the Gantt chart / trace if asked; return the --json object (bapipe.api's
    Plan.simulate and `bapipe sim` both come here)."""
    from .sim import simulate
    from .trace import gantt_format, write_gantt, write_trace

    if iterations is None or isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise SpecError(None, None, "--iterations", f"expected a positive integer, got {iterations}")
    if gantt:
        gantt_format(gantt)  # a wrong suffix is refused before the simulation, not after
        from bapipe.extras import require
        require("plot", "a Gantt chart (--gantt)")
    ops = iterations * plan.microbatches * len(plan.stages) * (2 if plan.mode == "train" else 1)
    if ops > MAX_SIM_OPS:
        raise SpecError(plan_file, None, "microbatches" if iterations == 1 else "--iterations",
                        f"expected at most {MAX_SIM_OPS:,} simulated ops (iterations {iterations} x "
                        f"micro-batches {plan.microbatches} x stages {len(plan.stages)} x passes), got {ops:,}; "
                        "simulate fewer --iterations or plan fewer micro-batches")
    if sys.stderr.isatty() and ops > PROGRESS_OPS:  # ~400k events/s: say how long before it starts
        sys.stderr.write(f"bapipe sim: replaying {ops:,} ops (~{max(1, round(ops / 400_000))} s)\n")
    result = simulate(plan, model, cluster, iterations=iterations)
    out = result.to_json()
    # one definition of bubble across commands (docs/simulator.md): `bubble_fraction` is the
    # idle share of the busiest board's time, as `bapipe plan` predicts it; the mean over
    # boards (the simulator's own bubble_fraction) stays alongside under its own name
    out["bubble_mean_over_boards"] = out["bubble_fraction"]
    out["bubble_fraction"] = out["bubble_busiest"] = result.bubble_busiest
    predicted = (plan.predicted or {}).get("iteration_time_s")
    if predicted:
        out["planner_iteration_time_s"] = float(predicted)
        out["sim_vs_planner"] = result.iteration_time_s / float(predicted) - 1.0
    for opt, write, path in (("gantt", write_gantt, gantt), ("trace", write_trace, trace)):
        if path:
            try:
                out[opt] = str(write(result, path))
            except OSError as e:  # unwritable path or a directory: bad input, not a bug
                raise SpecError(str(path), None, f"--{opt}", f"cannot write the file: {e.strerror or e}") from None
    return out


def show_sim(r: dict) -> str:
    """Human table of a simulation."""
    from bapipe.units import seconds, si

    lines = [f"{r['model']} on {r['cluster']}: {r['schedule']} ({r['mode']}), {r['devices']} pipeline positions"
             + (f" x {r['chunks']} chunks" if r["chunks"] > 1 else "")
             + f", {r['microbatches']} micro-batches, {r['iterations']} iteration(s)",
             "simulated (event replay of the plan's stage times and links):",
             f"iteration time  {seconds(r['iteration_time_s'], 4)} ({r['iteration_cycles']:,} cycles of the first board)",
             f"throughput      {si(r['throughput_samples_per_s'], 'samples/s', 4)}",
             f"bubble          {r['bubble_fraction']:.2%} of the busiest board's time idle "
             f"(as `bapipe plan` predicts it); {r['bubble_mean_over_boards']:.2%} averaged over boards"]
    if "planner_iteration_time_s" in r:
        lines.append(f"planner         {seconds(r['planner_iteration_time_s'], 4)} predicted (simulated {r['sim_vs_planner']:+.2%}"
                     "; both use the plan's stage times, so this checks the schedule and links, not the cycle model)")
    lines.append("")
    lines.append(f"{'board':<12}{'pos':>4}{'busy':>8}{'bubble':>8}{'stall':>8}{'peak memory':>16}{'off-chip':>14}")
    for b in r["boards"]:
        lines.append(f"{b['name']:<12}{b['device']:>4}{b['busy']:>8.1%}{b['bubble']:>8.1%}{b['stall']:>8.1%}"
                     f"{_bytes(b['peak_memory_bytes']):>16}{_bytes(b['peak_offchip_bytes']):>14}")
    used = [ln for ln in r["links"] if ln["transfers"]]
    if used:
        lines.append("")
        lines.append(f"{'link':<24}{'kind':>9}{'utilisation':>13}{'bytes':>14}")
        for ln in sorted(used, key=lambda x: -x["utilisation"])[:16]:
            lines.append(f"{ln['name']:<24}{ln['kind']:>9}{ln['utilisation']:>13.2%}{_bytes(ln['bytes']):>14}")
        if len(used) > 16:
            lines.append(f"... {len(used) - 16} more links (see --json)")
    lines.append("")
    lines.append(f"{r['events']:,} events in {seconds(r['wall_s'])}")
    for k in ("gantt", "trace"):
        if k in r:
            lines.append(f"wrote {r[k]}")
    return "\n".join(lines)


def _bytes(n: float) -> str:
    from bapipe.units import nbytes

    return nbytes(n, 4)
