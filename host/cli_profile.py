"""`bapipe profile MODEL CLUSTER.yaml --measure torch -o PROFILE.yaml`: measure, don't model.

Writes two files: the per-layer profile of MODEL measured in PyTorch on this machine
(host/torch_profile.py; `bapipe plan --profile` reads it) and, at CLUSTER.yaml, the cluster
of ``--processes`` CPU processes of this machine (the gloo transport measured here), so that
`bapipe plan MODEL CLUSTER.yaml --profile PROFILE.yaml --format fp32` plans for the processes
`bapipe run --backend torch` will start. Both files are written only when both are complete.
"""
from __future__ import annotations

import os
from pathlib import Path

from bapipe.errors import SpecError
from bapipe.models import load_model


def _target(path: str, force: bool, field: str) -> Path:
    p = Path(path)
    if not p.suffix.lower() in (".yaml", ".yml"):
        raise SpecError(None, None, field, f"expected a .yaml path to write, got {path!r}")
    if p.exists() and not force:
        raise SpecError(None, None, field, f"{path} exists; pass --force to overwrite it")
    if not p.parent.exists():
        raise SpecError(None, None, field, f"folder {p.parent} does not exist")
    return p


def cmd_profile(args) -> dict:
    """Measure the model's layers and the transport; write the profile and the cluster YAML."""
    from .torch_run import require_torch

    if not args.output:
        raise SpecError(None, None, "-o", "--measure torch writes a profile: give -o PROFILE.yaml")
    prof_path = _target(args.output, args.force, "-o")
    cl_path = _target(args.cluster, args.force, "CLUSTER")
    if not 1 <= args.processes <= 64:
        raise SpecError(None, None, "--processes", f"expected 1..64 processes, got {args.processes}")
    if not 1 <= args.reps <= 1000:
        raise SpecError(None, None, "--reps", f"expected 1..1000 runs per layer, got {args.reps}")
    if args.batch < 1:
        raise SpecError(None, None, "--batch", f"expected a positive integer, got {args.batch}")
    model = load_model(args.model)
    require_torch()
    import yaml

    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.planner.reshard.transport import measure_transport

    from .torch_profile import cpu_cluster, matmul_flops, memory_bytes, profile_doc

    doc = profile_doc(model, args.batch, args.reps)
    tr = measure_transport("gloo", reps=10, pairs=1)
    cl = cpu_cluster(args.processes, cl_path.stem, tr, matmul_flops(), memory_bytes())
    tmp_p, tmp_c = prof_path.with_suffix(".tmp"), cl_path.with_suffix(".tmp")
    try:
        tmp_p.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        tmp_c.write_text(yaml.safe_dump(cl, sort_keys=False), encoding="utf-8")
        load_cluster(str(tmp_c))  # the cluster parses before either file is in place
        os.replace(tmp_p, prof_path)
        os.replace(tmp_c, cl_path)
    finally:
        for t in (tmp_p, tmp_c):
            t.unlink(missing_ok=True)
    return {"model": model.name, "profile": str(prof_path), "cluster": str(cl_path), "batch": args.batch,
            "processes": args.processes, "layers": doc["layers"], "transport": tr.to_dict(),
            "fp32_flops_per_process": cl["boards"][0]["overrides"]["peak_flops"]["fp32"]}


def show_profile(r: dict) -> str:
    """Human table of the measured layers."""
    lines = [f"{r['model']}: measured in PyTorch on this machine, batch {r['batch']} -> {r['profile']}",
             f"cluster of {r['processes']} CPU processes -> {r['cluster']} (gloo {r['transport']['pair_Bps'] / 1e9:.2f} "
             f"GB/s, {r['transport']['latency_s'] * 1e6:.0f} us)", "",
             f"  {'layer':<16} {'fwd us':>10} {'bwd us':>10}"]
    for row in r["layers"]:
        lines.append(f"  {row['name']:<16} {row['fwd_s'] * 1e6:>10.1f} {row['bwd_s'] * 1e6:>10.1f}")
    return "\n".join(lines)
