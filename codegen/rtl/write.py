"""Write ``build/rtl/`` and build/design.json from the Design: the pipeline's modules, board and
cluster tops, the manifest (with where each MVU memory and each layer's parameters lie in the
stages' weight images, codegen.rtl.mem_images), single-stage benches and, for a training
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
from bapipe.codegen.design.weight_image import image_path, pipeline_slots, raw_dtype, write_image
from bapipe.codegen.rtl.mem_images import memory_table
from bapipe.codegen.rtl.pipeline import PARAM_KEYS, manifest, render_pipeline
from bapipe.codegen.rtl.train import write_train_files


def render_rtl(plan, model, cluster, out_dir: Path, params=None) -> list[Path]:
    """Lower ``plan`` (the RTL's passes; ``params``: weights to build with, default the plan's)
    and write ``out_dir/rtl/``: every module, board tops, cluster top and manifest.json, and
    the stages' weight images ``out_dir/stage<i>/weights.bin`` (codegen.design.weight_image) the
    MVU memories and the reference read (codegen.rtl.mem_images, codegen.rtl.pipeline.read_params).

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


def _weight_images(d: Design, root: Path) -> tuple[dict[tuple[str, str], dict], list[Path]]:
    """(layer, key) -> the described array of a stage image (codegen.design.weight_image), and
    the images written here: none when the Design has HLS stages (gen writes their images),
    else the pipeline's own (render_rtl)."""
    width = d.pipeline.elem_w
    dt = raw_dtype(width)
    if d.contexts:
        slots = {sc.name: sc.image for sc in d.contexts.values()}
        written = []
    else:
        slots = {f"stage{i}": v for i, v in pipeline_slots(d.pipeline).items()}
        written = [write_image(root / image_path(name), v, width) for name, v in slots.items()]
    entries = {(s.layer, s.key): s.describe(image_path(name), dt) for name, v in slots.items() for s in v}
    return entries, written


def _write_pipeline(d: Design, rtl: Path, placement: dict | None) -> tuple[dict[str, str], list[Path], dict]:
    plan, pipe = d.plan, d.pipeline
    plan_hash = plan.fingerprint()[:16]
    paths = []
    written = render_pipeline(pipe, plan.cluster, plan_hash)
    # Order matters to some tools: leaves first, tops last.
    order = sorted(written, key=lambda n: (n == "cluster_top.v", n.endswith("_top.v"), n))
    # the weights: the stages' images (gen's HLS stages wrote them; an RTL-only lowering writes
    # its own), which the MVU memories' $readmemh text is written from when a tool reads it
    entries, images = _weight_images(d, rtl.parent)
    paths += images
    table = memory_table(pipe, entries)
    for name in table:   # text or bytes of an earlier render are stale once the image is rewritten
        (rtl / name).unlink(missing_ok=True)
        (rtl / (name[:-len(".hex")] + ".bin")).unlink(missing_ok=True)
    man = manifest(pipe, plan, order, sorted(table))
    man["memories"] = table
    man["params"] = {op["layer"]: {k: entries[(op["layer"], k)] for k in PARAM_KEYS if k in op}
                     for op in pipe.ops if any(k in op for k in PARAM_KEYS)}
    written["manifest.json"] = json.dumps(man, indent=1, sort_keys=True) + "\n"
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
