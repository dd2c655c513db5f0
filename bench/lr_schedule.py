"""Test accuracy of the fixed16 training reference under each learning-rate schedule, over seeds.

The numbers behind host.optim's default schedule (docs/training.md "Learning-rate schedule"):
the planner's tiny-mlp plan on 4xU250-ring (batch 32, lr by host.optim.default_lr), trained
``--epochs`` epochs with fpga_models.train_fixed.train_step (the arithmetic the hardware runs
and `bapipe run --backend verilator` checks bit for bit), in the driver's epoch order, then
the test accuracy of the last weights; per schedule and rate the min, mean and each seed.
Usage: python bench/lr_schedule.py [--seeds 8] [--epochs 5] [--rates 0.025,0.05] [-o bench/results/lr_schedule.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bapipe.plan import load_plan  # noqa: E402
from bapipe.fpga_models import train_fixed as T  # noqa: E402
from bapipe.fpga_models.plancheck import resolve  # noqa: E402
from bapipe.host.data import epoch_order, load_digits  # noqa: E402
from bapipe.host.optim import LR_SCHEDULES, default_lr, lr_factor  # noqa: E402
from bapipe.host.program import fixed_master_params  # noqa: E402


def final_accuracy(plan, model, lr: float, schedule: str, seed: int, epochs: int) -> float:
    """Test accuracy after ``epochs`` epochs of fixed16 SGD (momentum 0.9) at ``lr`` under ``schedule``."""
    tf = T.get_formats(plan.number_format)
    data = load_digits(model.inputs[0].shape, seed)
    b = plan.global_batch
    per = data.n_train // b
    sched = T.sgd_schedule(lr, 0.9, b, tf, [lr_factor(schedule, e, epochs) for e in range(epochs)], per)
    x_q = T.quantize(data.x_train, tf.act)
    m, v = fixed_master_params(model, 0, len(model.layers) - 1, seed, tf), {}
    it = 0
    for e in range(epochs):
        order = epoch_order(data.n_train, seed, e)
        for k in range(per):
            i = order[k * b:(k + 1) * b]
            m, v, _ = T.train_step(model, m, v, x_q[i], data.y_train[i], sched.at(it), tf, max(1, plan.microbatches))
            it += 1
    z = T.layers_fwd(model.layers, {model.inputs[0].name: T.quantize(data.x_test, tf.act)}, T.forward_weights(m, tf), tf)
    return float(np.mean(np.argmax(z[model.layers[-1].name].reshape(len(data.y_test), -1), 1) == data.y_test))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rates", default="", help="extra rates beside the default rule's (comma separated)")
    ap.add_argument("-o", default=str(ROOT / "bench" / "results" / "lr_schedule.json"))
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "plan.yaml"
        subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", "tiny-mlp", "4xU250-ring", "-o", str(p)],
                       check=True, capture_output=True)
        plan = load_plan(p)
    model, _ = resolve(plan)
    lr0 = default_lr(plan.optimizer, plan.global_batch, plan.schedule)
    rates = [lr0] + [float(r) for r in a.rates.split(",") if r]
    rows, t0 = [], time.process_time()
    print(f"tiny-mlp 4xU250-ring default plan: batch {plan.global_batch}, {a.epochs} epochs, seeds 0..{a.seeds - 1}")
    print(f"{'schedule':10s} {'lr':>8s} {'min':>6s} {'mean':>6s}  per seed")
    for sched in LR_SCHEDULES:
        for lr in rates:
            acc = [final_accuracy(plan, model, lr, sched, s, a.epochs) for s in range(a.seeds)]
            rows.append({"schedule": sched, "lr": lr, "min": min(acc), "mean": float(np.mean(acc)), "accuracy": acc})
            print(f"{sched:10s} {lr:8.4f} {min(acc):6.3f} {np.mean(acc):6.3f}  {' '.join(f'{x:.3f}' for x in acc)}")
    out = Path(a.o)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"plan": {"model": "tiny-mlp", "cluster": "4xU250-ring", "global_batch": plan.global_batch},
                               "epochs": a.epochs, "seeds": a.seeds, "rows": rows,
                               "cpu_s": time.process_time() - t0}, indent=1))
    print(f"wrote {out} ({time.process_time() - t0:.1f} s CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
