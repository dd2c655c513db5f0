"""Regenerate tests/fixtures/profiles/tiny_mlp_torch.csv (needs torch; the suite does not).

The docs/profiles.md snippet (label_modules, write_table), run on a torch copy of the zoo's
tiny-mlp whose module names are the layer names, batch 32, 10 profiled steps on the CPU.
Usage: python tests/make_torch_profile.py   (from the repository root, with torch installed)
"""
import csv
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function


def label_modules(model, names=None):
    """Wrap every leaf module's forward and backward in record_function labels
    'bapipe.fwd.<layer>' / 'bapipe.bwd.<layer>' (names: module name -> layer name)."""
    names = names or {}
    for mod_name, mod in model.named_modules():
        if not mod_name or list(mod.children()):
            continue
        layer = names.get(mod_name, mod_name)
        mod.register_forward_pre_hook(lambda m, a, l=layer: setattr(m, "_bp_f", record_function(f"bapipe.fwd.{l}").__enter__()))
        mod.register_forward_hook(lambda m, a, o: m._bp_f.__exit__(None, None, None))
        mod.register_full_backward_pre_hook(lambda m, g, l=layer: setattr(m, "_bp_b", record_function(f"bapipe.bwd.{l}").__enter__()))
        mod.register_full_backward_hook(lambda m, gi, go: m._bp_b.__exit__(None, None, None))


def write_table(prof, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "calls", "cpu_time_total_us", "device_time_total_us"])
        for e in prof.key_averages():
            if e.key.startswith("bapipe."):
                w.writerow([e.key, e.count, f"{e.cpu_time_total:.3f}", f"{getattr(e, 'device_time_total', 0.0):.3f}"])


torch.manual_seed(0)
torch.set_num_threads(1)   # a shared 2-core machine: one thread measures the layer, not the contention
model = nn.Sequential()
for name, mod in [("fc1", nn.Linear(64, 64)), ("relu1", nn.ReLU()), ("fc2", nn.Linear(64, 64)), ("relu2", nn.ReLU()),
                  ("fc3", nn.Linear(64, 32)), ("relu3", nn.ReLU()), ("fc4", nn.Linear(32, 10))]:
    model.add_module(name, mod)
label_modules(model)
x = torch.randn(32, 64, requires_grad=True)   # batch 32
for _ in range(3):                               # warm-up
    model(x).sum().backward()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(10):
        model(x).sum().backward()
write_table(prof, Path(__file__).resolve().parent / "fixtures" / "profiles" / "tiny_mlp_torch.csv")
