"""Measure a model's per-layer cost in PyTorch on this machine, and describe its CPU processes.

``measure_layers`` times every layer alone, the way PipeDream's profiler records a layer:
its forward on a batch of its real inputs (from one forward pass of the whole model on
digits-shaped random data) and its backward (input and weight gradients for a random
output gradient), each the median of ``reps`` runs after warm-up, one torch thread (a
process of ``bapipe run --backend torch`` uses one). The result is a profile in the YAML
form `bapipe plan --profile` reads (docs/profiles.md).

``cpu_cluster`` describes N such processes on this machine as a cluster YAML: one host, a
switch every process reaches by one link at the gloo point-to-point bandwidth and latency
measured here (``planner.reshard.transport``), per process a 1/N share of the memory, and
its fp32 peak set to the dense (matmul) rate measured here on one thread. The catalog has
no CPU type, so the entry overrides the figures of a GPU type (kind ``gpu``: the planner
prices it with the measured profile) and says so in its description.
"""
from __future__ import annotations

import os
import statistics
import time

WARMUP = 3


def _time(fn, reps: int) -> float:
    for _ in range(WARMUP):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _layer_inputs(torch, model, mod, batch: int, seed: int) -> dict[str, object]:
    """Every tensor of one forward pass of the whole model on random inputs (name -> tensor)."""
    g = torch.Generator().manual_seed(seed)
    env = {i.name: torch.rand((batch,) + tuple(i.shape), generator=g) for i in model.inputs}
    with torch.no_grad():
        for layer, lm in zip(mod.order, mod.mods):
            env[layer.name] = lm(*[env[i] for i in layer.inputs])
    return env


def measure_layers(model, batch: int, reps: int = 20, seed: int = 0) -> list[dict]:
    """[{name, fwd_s, bwd_s, activation_bytes, param_bytes}] for every layer, in model order."""
    import torch

    from .torch_model import whole_model

    torch.set_num_threads(1)
    mod = whole_model(model, seed)
    mod.train()
    env = _layer_inputs(torch, model, mod, batch, seed)
    rows = []
    for layer, lm in zip(mod.order, mod.mods):
        xs = [env[i].detach().clone().requires_grad_(env[i].is_floating_point()) for i in layer.inputs]
        params = list(lm.parameters())
        fwd = _time(lambda: lm(*xs), reps)
        grad = torch.randn_like(env[layer.name])
        wrt = [x for x in xs if x.requires_grad] + params

        def backward():
            y = lm(*xs)
            torch.autograd.grad(y, wrt, grad, allow_unused=True)

        # the backward alone: (forward + backward) minus the forward just measured
        bwd = max(0.0, _time(backward, reps) - fwd)
        rows.append({"name": layer.name, "fwd_s": float(fwd), "bwd_s": float(bwd),
                     "activation_bytes": int(layer.out_elems * batch * 4),
                     "param_bytes": int(sum(p.numel() for p in params) * 4)})
    return rows


def profile_doc(model, batch: int, reps: int = 20, seed: int = 0) -> dict:
    """The profile YAML document (docs/profiles.md) of ``measure_layers``."""
    import torch

    return {"model": model.name,
            "source": f"bapipe profile --measure torch: PyTorch {torch.__version__}, CPU, 1 thread, "
                      f"median of {reps} runs per layer on {os.cpu_count()} cores",
            "batch": int(batch), "layers": measure_layers(model, batch, reps, seed)}


def matmul_flops(n: int = 256, reps: int = 10) -> float:
    """fp32 FLOP/s of an n x n matmul on one torch thread (the process's dense peak)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.rand(n, n), torch.rand(n, n)
    return 2 * n ** 3 / _time(lambda: a @ b, reps)


def cpu_cluster(processes: int, name: str, transport, flops: float, memory_bytes: int) -> dict:
    """A cluster YAML document: ``processes`` CPU processes of one host behind a loopback 'switch'."""
    bw, lat = float(transport.pair_Bps), float(max(transport.latency_s, 1e-9))
    desc = (f"one CPU process of bapipe run --backend torch (PyTorch, 1 thread, gloo over loopback) on a "
            f"{os.cpu_count()}-core machine; figures measured here (fp32 matmul peak, gloo bandwidth and "
            "latency); a GPU-kind entry only because the catalog has no CPU type")
    board = {"type": "V100", "count": int(processes),
             "overrides": {"description": desc, "peak_flops": {"fp32": float(flops), "fp16": float(flops)},
                           "offchip_bytes": int(memory_bytes // processes), "offchip_bw_Bps": 1e10,
                           "network_ports": 1, "port_bw_Bps": bw, "pcie_bw_Bps": bw}}
    names = [f"gpu{i}" for i in range(processes)]
    return {"name": name, "topology": "switch", "boards": [board],
            "hosts": [{"name": "host0", "boards": names, "pcie_bw": bw, "pcie_latency": lat}],
            "link": {"bandwidth": bw, "latency": lat, "kind": "network"},
            "switch": {"name": "loopback", "attach": "boards"}}


def memory_bytes() -> int:
    """Physical memory of this machine (bytes)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

