"""`make demo`: where pipelining wins, predicted and measured, then the hardware flow on the
planner's own choice; written with the Python API (bapipe.api), as a user would.

1. Where pipelining wins (predicted by the planner, replayed by the simulator): VGG-16 and
   tiny-mlp, each training on 4 U250s, against data parallelism (every board a replica,
   gradients all-reduced) and against the best plan on one board.
2. Measured: tiny-mlp's chosen plan and its one-board plan are generated and run in Verilator;
   their forward cycles per sample give the measured pipeline-vs-one-board factor next to the
   predicted one. (The win over data parallelism is the all-reduce the pipeline avoids; the
   forward RTL does not run one, so that factor is predicted only, and said so.)
3. The hardware flow on the planner's own choice: gen, csim (bit-exact vs numpy), rtlsim
   (each stage's cycles vs the plan), and training on the host in the plan's fixed16 arithmetic.
4. A correctness exercise, labelled so: a forced 4-stage split of tiny-mlp trains a few
   iterations on the generated training RTL, weights checked against numpy fixed16.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .toolchain import wire_verilator
from .units import seconds, si

CLUSTER = os.environ.get("BAPIPE_DEMO_CLUSTER", "4xU250-ring")
OUT = Path(os.environ.get("BAPIPE_DEMO_OUT", "build/demo"))
#: the model whose plans are generated and measured: small enough for Verilator in minutes
MODEL = "tiny-mlp"
#: its plans' resource cap: at a 2% share of each U250 a pipeline of 3 stages (one replicated)
#: beats both data parallelism (3.2x) and one board (1.2x) in the planner's model
CAP = 0.02
#: every stage's measured cycles per sample within this of the plan's (the product's promise)
PLAN_TOLERANCE = 0.02

#: the correctness exercise: a forced split, 4 boards, 4 micro-batches of 2 samples
TRAIN_ITERATIONS = int(os.environ.get("BAPIPE_DEMO_TRAIN_ITERATIONS", "4"))
FORCED = dict(no_replication=True, schedule="1f1b", microbatches=4, global_batch=8, partition="0-1,2-3,4-5,6",
              cap=0.005)


def _step(name: str, ok: bool, text: str, t0: float) -> int:
    print(f"[{'ok  ' if ok else 'FAIL'}] {name:<9} {text}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0 if ok else 1


def _factor(a: float, b: float) -> str:
    """How many times faster time ``a`` is than ``b``, as a factor read the right way round."""
    return f"{b / a:.2f}x faster" if b >= a else f"{a / b:.2f}x SLOWER"


def wins(model: str, **options) -> tuple[int, object]:
    """Part 1 for one model: the planner's plan against data parallel and one board, predicted
    and simulated. Returns (failures, the plan)."""
    import bapipe

    t0 = time.perf_counter()
    try:
        p = bapipe.plan(model, CLUSTER, **options)
        # the same samples per iteration on one board (its default would be 8 per board)
        one = bapipe.plan(model, CLUSTER, boards=1, global_batch=p.result.global_batch, **options)
    except bapipe.BapipeError as e:
        return _step("plan", False, f"{model}: {e}", t0), None
    r, dp = p.result, p.result.baselines.get("data_parallel", {})
    s = p.simulate()
    p.save(OUT / f"{model}.plan.yaml", force=True)
    shape = " + ".join(f"{len(st.boards)}x[{st.first}-{st.last}]" for st in p.spec.stages)
    print(f"\n{model} training on {CLUSTER}: the planner's plan is {len(p.spec.stages)} stages ({shape} boards x "
          f"[layers]), {r.schedule}, {r.microbatches} micro-batches of {r.microbatch_size}")
    print(f"  {'':<26}{'iteration':>12}{'samples/s':>14}   plan vs it")
    rows = [("pipeline (planner)", r.iteration_time_s, None), ("  same, simulated", s.iteration_time_s, None)]
    if "iteration_time_s" in dp:
        rows.append(("data parallel (4 x 1)", dp["iteration_time_s"], "predicted"))
    rows.append(("one board (--boards 1)", one.result.iteration_time_s, "predicted"))
    for name, t, _ in rows:
        cmp = "" if name.startswith(("pipeline", "  same")) else _factor(r.iteration_time_s, t)
        print(f"  {name:<26}{seconds(t):>12}{si(r.global_batch / t):>14}   {cmp}")
    ok = "iteration_time_s" in dp and r.iteration_time_s < dp["iteration_time_s"] \
        and r.iteration_time_s <= one.result.iteration_time_s
    return _step("plan+sim", ok, f"{model}: predicted by the planner and replayed by `sim` "
                 f"({100 * (s.iteration_time_s / r.iteration_time_s - 1):+.2f}%)", t0), (p, one)


def measured(p, one) -> int:
    """Part 2: forward cycles per sample of the chosen plan and the one-board plan in Verilator."""
    import bapipe

    t0 = time.perf_counter()
    figs = {}
    for name, plan in (("pipeline", p), ("one board", one)):
        try:
            b = plan.generate(OUT / f"{MODEL}.{name.replace(' ', '_')}", force=True)
            v = b.rtlsim(stages=False)
        except bapipe.BapipeError as e:
            return _step("measure", False, f"{name}: {e}", t0)
        figs[name] = (v.cycles_per_sample, v.predicted_cycles_per_sample, v.outputs_match)
    (pm, pp, pok), (om, op, ook) = figs["pipeline"], figs["one board"]
    print(f"\n{MODEL} forward pass in Verilator (cycles per sample in steady state, the generated RTL):")
    print(f"  pipeline {pm:.1f} measured ({pp:.1f} predicted); one board {om:.1f} measured ({op:.1f} predicted)")
    print(f"  pipeline vs one board: {_factor(pm, om)} measured, {_factor(pp, op)} predicted "
          f"(outputs bit-exact vs numpy: {pok and ook})")
    return _step("measure", pok and ook and pm < om, "forward pass of both plans in Verilator", t0)


def flow(p) -> int:
    """Part 3: gen, csim, rtlsim per stage and host training on the planner's own plan."""
    import bapipe

    failed = 0
    t0 = time.perf_counter()
    build = OUT / f"{MODEL}.build"
    try:
        b = p.generate(build, force=True)
    except bapipe.BapipeError as e:
        return _step("gen", False, str(e), t0)
    failed += _step("gen", True, f"{build}/: {b.result.files} files + {b.result.rtl_files} RTL files", t0)
    t0 = time.perf_counter()
    try:
        c = b.csim()
        st = c.stages
        failed += _step("csim", c.passed, f"{sum(s['passed'] for s in st)}/{len(st)} stages match numpy, max error "
                        f"{max((s['max_abs_err_lsb'] or 0) for s in st)} LSB", t0)
    except bapipe.BapipeError as e:
        failed += _step("csim", False, str(e), t0)
    t0 = time.perf_counter()
    try:
        v = b.rtlsim()
        per = "; ".join(f"stage {s['index']} {s['measured_cycles_per_sample']:.1f} vs {s['plan_cycles_per_sample']:.1f}"
                        for s in v.stages or [])
        ok = bool(v.outputs_match) and v.plan_error is not None and v.plan_error <= PLAN_TOLERANCE
        failed += _step("rtlsim", ok, f"outputs bit-exact: {v.outputs_match}; forward cycles/sample, Verilator vs "
                        f"the plan: {per} (worst {100 * (v.plan_error or 0):.2f}%)", t0)
    except bapipe.BapipeError as e:
        failed += _step("rtlsim", False, str(e), t0)
    t0 = time.perf_counter()
    try:
        t = bapipe.run(p, epochs=5)
        failed += _step("run", True, f"trained {t.epochs} epochs on digits ({t.precision} {t.number_format}, "
                        f"{t.workers} {t.engine}): loss {t.final_loss:.4f}, test accuracy {100 * t.test_accuracy:.1f}%",
                        t0)
    except bapipe.BapipeError as e:
        failed += _step("run", False, str(e), t0)
    return failed


def exercise() -> int:
    """Part 4, a correctness exercise: a forced 4-stage split trains on the generated training
    RTL in Verilator; weights against numpy fixed16 after every iteration."""
    import bapipe
    from host.driver import train

    t0 = time.perf_counter()
    print(f"\ncorrectness exercise (a forced split, not the planner's choice): {MODEL} over 4 boards, one stage "
          "each, trained on the generated training RTL")
    try:
        p = bapipe.plan(MODEL, CLUSTER, **FORCED)
        path = p.save(OUT / f"{MODEL}.forced.plan.yaml", force=True)
        t = train(str(path), backend="verilator", epochs=1, max_iterations=TRAIN_ITERATIONS,
                  build=str(OUT / "train_build"))
    except bapipe.BapipeError as e:
        return _step("train", False, str(e), t0)
    cyc, plan_c = t.get("iteration_cycles") or [], t.get("plan_iteration_cycles")
    vs = (f"{sum(cyc) / len(cyc):.0f} cycles/iteration in Verilator vs {plan_c:.0f} planned "
          f"({(sum(cyc) / len(cyc) / plan_c - 1) * 100:+.1f}%)" if cyc and plan_c else "no cycle figures")
    ok = bool(t["weights_match"] and t["outputs_match"])
    return _step("train", ok, f"{t['iterations']} iterations: weights equal numpy fixed16 after every iteration: "
                 f"{t['weights_match']}, logits: {t['outputs_match']}; {vs}", t0)


def main() -> int:
    """Run the demo; exit 1 if a step fails."""
    wire_verilator(os.environ)
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"BaPipe demo on {CLUSTER} (outputs in {OUT}/)")
    failed, big = wins("vgg16")
    f, small = wins(MODEL, cap=CAP)
    failed += f
    if small is None:
        return 1
    failed += measured(*small)
    print(f"\nthe hardware flow on the planner's own {MODEL} plan:")
    failed += flow(small[0])
    failed += exercise()
    print(f"\n{'all steps passed' if not failed else f'{failed} step(s) failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
