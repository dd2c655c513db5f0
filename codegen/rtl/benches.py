"""Single-stage RTL benches: each stage of the Design alone (codegen.design.lower's
``stage_benches`` pass lowered them), written as ``rtl/stages/s<i>/``."""
from __future__ import annotations

import json
from dataclasses import replace

from bapipe.codegen.rtl.pipeline import manifest, render_pipeline


def stage_bench_files(d, plan_hash: str, main_files: dict[str, str] | None = None
                      ) -> tuple[dict[str, str], list[float]]:
    """Single-stage RTL builds, one per stage, as ``stages/s<i>/<file>`` -> text (manifest included).

    Each is the stage's engines exactly as the whole pipeline builds them (same blocks, names
    and weight images, read from the main rtl/ folder: ``mem_dir``), fed straight from the
    host at its first engine's width, with nothing after it: run alone, it shows the stage's
    own pace, which the whole pipeline (moving at its bottleneck's) cannot. Modules identical
    to the main build's (``main_files``: the generic glue, the MVUs) are named from there.
    Returns the files and each bench's predicted cycles per sample.
    """
    main_files = main_files or {}
    plan = d.plan
    out: dict[str, str] = {}
    alone: list[float] = []
    for i, (st, one) in enumerate(zip(d.pipeline.stages, d.benches)):
        sub = replace(plan, stages=[plan.stages[i]])
        files = render_pipeline(one, plan.cluster, plan_hash)
        own = {n: t for n, t in files.items() if main_files.get(n) != t}
        names = {n: (n if n in own else f"../../{n}") for n in files}
        order = sorted(files, key=lambda n: (n == "cluster_top.v", n.endswith("_top.v"), n))
        man = manifest(one, sub, [names[n] for n in order])
        man["mem_dir"] = "../.."      # the MVU images of the main build (rtl/)
        man["stage"] = st.index
        for name, text in own.items():
            out[f"stages/s{i}/{name}"] = text
        out[f"stages/s{i}/manifest.json"] = json.dumps(man, indent=1, sort_keys=True) + "\n"
        alone.append(float(one.interval))
    return out, alone
