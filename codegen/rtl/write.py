"""Write ``build/rtl/`` and build/design.json from the Design: the pipeline's modules, board and
cluster tops, the MVUs' weight images, raw parameters, single-stage benches and, for a training
plan, the training RTL. Nothing here lowers: every structure is the Design's
(codegen.design.lower)."""
from __future__ import annotations

import json
from pathlib import Path

from bapipe.errors import SpecError
from bapipe.codegen.design.lower import RTL_PASSES, Design, lower
from bapipe.codegen.design.record import design_json, tail_record
from bapipe.codegen.rtl.benches import stage_bench_files
from bapipe.codegen.rtl.env import GENERATOR_VERSION, GENERIC, render_template
from bapipe.codegen.rtl.mem_words import mvu_word_files
from bapipe.codegen.rtl.pipeline import manifest, mvu_specs, render_pipeline, write_params
from bapipe.codegen.rtl.train import write_train_files


def render_rtl(plan, model, cluster, out_dir: Path, params=None) -> list[Path]:
    """Lower ``plan`` (the RTL's passes; ``params``: weights to build with, default the plan's)
    and write ``out_dir/rtl/``: every module, board tops, cluster top, the MVUs' weight memory
    images (.hex), manifest.json and params/ (raw weights for the reference).

    When the plan needs what the RTL cannot build yet, only the generic glue is written with
    ``manifest.json`` saying ``supported: false`` and why (`bapipe rtlsim` reports it).
    Returns the paths written, sorted. (An ``out_dir`` already named ``rtl`` is used as is,
    so callers passing ``build/rtl`` get the same tree.)
    """
    return write_rtl(lower(plan, model, cluster, passes=RTL_PASSES, weights=params), out_dir)[0]


def _unsupported(d: Design, why: str) -> dict[str, str]:
    plan_hash = d.plan.fingerprint()[:16]
    written = {f"{name}.v": render_template(name, plan_hash) for name in GENERIC}
    written["manifest.json"] = json.dumps({"generator": f"bapipe {GENERATOR_VERSION}", "plan": d.plan.fingerprint(),
                                           "supported": False, "reason": why,
                                           "files": sorted(written)}, indent=1, sort_keys=True) + "\n"
    return written


def write_rtl(d: Design, out_dir: Path, placement: dict | None = None) -> tuple[list[Path], dict | None]:
    """Write the Design's RTL under ``out_dir/rtl`` and build/design.json (with ``placement``,
    the placement pass's section, when given); returns the paths and the design.json record
    (None when the lowering does not build the plan)."""
    if isinstance(d.pipeline_error, SpecError):
        raise d.pipeline_error
    out_dir = Path(out_dir)
    rtl = out_dir if out_dir.name == "rtl" else out_dir / "rtl"
    rtl.mkdir(parents=True, exist_ok=True)
    if d.pipeline is None:
        written, paths, ddict = _unsupported(d, str(d.pipeline_error)), [], None
    else:
        written, paths, ddict = _write_pipeline(d, rtl, placement)
    for name in sorted(written):
        p = rtl / name
        p.write_text(written[name], encoding="utf-8")
        paths.append(p)
    return sorted(paths), ddict


def _write_pipeline(d: Design, rtl: Path, placement: dict | None) -> tuple[dict[str, str], list[Path], dict]:
    plan, pipe = d.plan, d.pipeline
    plan_hash = plan.fingerprint()[:16]
    paths = []
    written = render_pipeline(pipe, plan.cluster, plan_hash)
    # Order matters to some tools: leaves first, tops last.
    order = sorted(written, key=lambda n: (n == "cluster_top.v", n.endswith("_top.v"), n))
    mem_names = []
    for spec in mvu_specs(pipe):
        # Written one MVU at a time: VGG-16's images total ~0.7 GB.
        for name, data in mvu_word_files(spec).items():
            (rtl / name).write_bytes(data)
            paths.append(rtl / name)
            mem_names.append(name)
    written["manifest.json"] = json.dumps(manifest(pipe, plan, order, sorted(mem_names)), indent=1,
                                          sort_keys=True) + "\n"
    paths += write_params(rtl, pipe)
    benches, alone = stage_bench_files(d, plan_hash, dict(written))
    written.update(benches)
    (rtl / "stages").mkdir(exist_ok=True)
    for i in range(len(pipe.stages)):
        (rtl / "stages" / f"s{i}").mkdir(exist_ok=True)
    train_record = None
    if d.train is not None:   # training engines, sequencers and stashes: rtl/train/ (codegen/rtl/train.py)
        train_paths, train_record = write_train_files(d.train, plan, rtl)
        paths += train_paths
    tails = [tail_record(getattr(d.contexts.get(i), "update", None), plan.stages[i]) if d.contexts else None
             for i in range(len(plan.stages))]
    ddict = design_json(pipe, plan, alone, d.backward_memory, train_record, d.train_error, placement, tails)
    design = rtl.parent / "design.json"
    design.write_text(json.dumps(ddict, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    paths.append(design)
    return written, paths, ddict
