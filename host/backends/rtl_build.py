"""The `bapipe gen` build the verilator backend simulates, and the host's weights in its images.

The backend never lowers or renders (issue 31: one Design, lowered once). It reads a build
`bapipe gen` wrote: ``rtl/`` (the pipeline and its manifest), ``rtl/train/`` (the training
RTL and its manifest) and the stages' weight images. When the ``--build`` folder holds no
build of the plan, :func:`gen_build` writes one with gen's own entry point
(codegen.gen_folder.generate_folder), which is then the run's one lowering.

The host's weights (trained on the numpy backend, or a training run's initial master
weights) go into copies of the images the RTL loads with ``$readmemh``, under
``BUILD/host_rtl``; the build itself is never written to:

- inference: the stages' weight images (``host_rtl/stage<i>/weights.bin``) with the host's
  arrays at the places ``rtl/manifest.json`` describes, and a copy of that manifest in
  ``host_rtl/mem``, the folder the simulation reads the MVUs' ``$readmemh`` text from
  (codegen.rtl.mem_images writes it from the copied images);
- training: ``host_rtl/train_mem``, the training RTL's ``<layer>_w.hex`` / ``_b.hex`` with
  the host's initial weights (tile order, as codegen.rtl.train writes them).

The training RTL's SGD constants are Verilog parameters of its update engines (sgd_update's
MU_Q, LR_TABLE, LR_SHIFT), fixed when the build is generated: a run whose rate schedule is not
the build's needs a build for its own constants, which :func:`gen_build` writes (once, with
gen's entry point) into ``BUILD/host_rtl/gen``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError

#: the host's folder inside the --build folder (copied images, the simulations' caches)
HOST = "host_rtl"


# ------------------------------------------------------------------ the build


@dataclass
class GenBuild:
    """A `bapipe gen` build of the run's plan: its folder, and when it was generated for this run,
    what gen wrote to stderr (its warnings), None otherwise."""
    folder: Path
    messages: str | None = None

    def report(self) -> None:
        """Pass gen's warnings on (a run that goes ahead on the build it generated)."""
        if self.messages:
            sys.stderr.write(self.messages)

    def discard(self) -> None:
        """Remove a build generated for this run (a run refused after gen leaves nothing behind)."""
        if self.messages is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def gen_build(plan, model, cluster, build: str | Path | None, plan_file: str = "plan.yaml", sgd=None) -> GenBuild:
    """A `bapipe gen` build of ``plan`` (whose training RTL, given ``sgd``, holds those SGD
    constants): ``build`` itself when it is one, else one generated now with gen's entry point,
    into ``build`` when that holds nothing but the host's folder, into ``build/host_rtl/gen``
    when ``build`` is a build of the plan for other SGD constants. A folder holding anything
    else is refused (one line naming --build), never written into."""
    from bapipe.codegen.gen_folder import STAMP, check_build

    folder = Path(build or "build")
    if folder.exists() and not folder.is_dir():
        raise SpecError(str(folder), None, "--build", "expected a folder (a `bapipe gen` build of the plan)")
    if (folder / STAMP).is_file():
        check_build(folder, plan.fingerprint(), "--build")
        if sgd is None or sgd_matches(folder, sgd):
            return GenBuild(folder)
        private = folder / HOST / "gen"   # this plan, the run's own rate schedule
        if (private / STAMP).is_file() and sgd_matches(private, sgd):
            check_build(private, plan.fingerprint(), "--build")
            return GenBuild(private)
        return _generate(plan, model, cluster, private, plan_file, sgd)
    if folder.is_dir() and {p.name for p in folder.iterdir()} - {HOST}:
        raise SpecError(str(folder), None, "--build", "expected a new or empty folder, or a `bapipe gen` build "
                                                      "of this plan (the build would be written into it)")
    return _generate(plan, model, cluster, folder, plan_file, sgd)


def _generate(plan, model, cluster, folder: Path, plan_file: str, sgd) -> GenBuild:
    """`bapipe gen` of ``plan`` into ``folder`` (replaced whole): the run's one lowering. Its
    warnings are held back (:meth:`GenBuild.report`): a run refused next says one line."""
    from bapipe.codegen.gen_folder import generate_folder

    folder.parent.mkdir(parents=True, exist_ok=True)   # BUILD/host_rtl for a private build
    held = io.StringIO()
    with contextlib.redirect_stderr(held):
        generate_folder(plan, model, cluster, folder, plan.dumps(), plan_file, force=True, sgd=sgd)
    return GenBuild(folder, held.getvalue())


def wanted_sgd(sgd) -> dict:
    """A rate schedule as the training manifest's ``sgd`` section states it (one step: no period,
    the update engines never step the rate)."""
    from bapipe.fpga_models import train_fixed as T

    sched = T.as_schedule(sgd)
    c0 = sched.steps[0]
    steps = [c.lr for c in sched.steps]
    return {"mu": c0.mu, "lr_scale": c0.lr_scale, "shift": c0.shift, "lr_steps": steps,
            "lr_period": sched.period if len(steps) > 1 else None}


def build_sgd(man: dict) -> dict:
    """The SGD constants a training manifest's RTL holds, in :func:`wanted_sgd`'s form."""
    c = man.get("sgd", {})
    steps = c.get("lr_steps", [c.get("lr")])
    return {"mu": c.get("mu"), "lr_scale": c.get("lr_scale"), "shift": c.get("shift"), "lr_steps": steps,
            "lr_period": c.get("lr_period", 1) if len(steps) > 1 else None}


def sgd_matches(folder: Path, sgd) -> bool:
    """Whether the training RTL of the build ``folder`` holds the constants of ``sgd`` (False
    when it has no training RTL)."""
    path = Path(folder) / "rtl" / "train" / "manifest.json"
    if not path.is_file():
        return False
    return build_sgd(json.loads(path.read_text(encoding="utf-8"))) == wanted_sgd(sgd)


def train_refusal(folder: Path) -> str | None:
    """Why the build ``folder`` has no training RTL (design.json ``train_unsupported``, or the
    pipeline's own refusal in rtl/manifest.json), None when it has one."""
    folder = Path(folder)
    if (folder / "rtl" / "train" / "manifest.json").is_file():
        return None
    for path, key in ((folder / "design.json", "train_unsupported"), (folder / "rtl" / "manifest.json", "reason")):
        if path.is_file():
            why = json.loads(path.read_text(encoding="utf-8")).get(key)
            if why:
                return str(why)
    return "the build has no training RTL (rtl/train/)"


# ------------------------------------------------------------------ inference images


def stored_elements(values, entry: dict) -> np.ndarray:
    """A model-layout array as a weight image stores it (``entry``: its description,
    codegen.design.weight_image.Slot.describe), flat int64: the inverse of weight_image.read_model."""
    from bapipe.codegen.design.weight_layout import Banked, MvuMatrix

    a = np.asarray(values, dtype=np.int64).reshape([int(x) for x in entry["shape"]])
    if entry["layout"] == "banked":
        hwc = tuple(entry["hwc"]) if entry.get("hwc") else None
        return np.asarray(Banked(MvuMatrix(a, hwc), int(entry["pe"]), int(entry["simd"]))).reshape(-1)
    if a.ndim >= 2:   # the kernel-layout matrix: dense as is, conv2d (O, kh*kw*C)
        return np.asarray(MvuMatrix(a)).reshape(-1)
    return a.reshape(-1)


def _put(image: bytearray, entry: dict, flat: np.ndarray) -> None:
    """Write ``flat`` over the array ``entry`` describes in the image bytes."""
    dt = np.dtype(entry["dtype"])
    info = np.iinfo(dt)
    if flat.size != int(entry["elements"]) or flat.min(initial=0) < info.min or flat.max(initial=0) > info.max:
        raise ValueError(f"{entry['name']}: {flat.size} values in [{flat.min(initial=0)}, {flat.max(initial=0)}], "
                         f"the image holds {entry['elements']} {dt.name} values")
    start = int(entry["offset"]) * dt.itemsize
    image[start:start + flat.size * dt.itemsize] = flat.astype(dt).tobytes()


def write_host_images(build: Path, params: dict) -> Path:
    """Copy the stage images ``build/rtl/manifest.json`` describes into ``build/host_rtl/``
    with ``params`` ({layer: {key: model-layout raw array}}) in place of the generated arrays,
    and that manifest into ``build/host_rtl/mem`` (emptied of earlier ``$readmemh`` text);
    returns that folder, the simulation's memory folder. An array the RTL holds as a Verilog
    parameter (batchnorm scale and shift) cannot take other values: ValueError naming it."""
    from bapipe.codegen.design.weight_image import read_model

    build = Path(build)
    man = json.loads((build / "rtl" / "manifest.json").read_text(encoding="utf-8"))
    table = man.get("params") or {}
    in_memory = {(s["array"]["layer"], s["array"]["key"]) for s in (man.get("memories") or {}).values()}
    host = build / HOST
    images = {}
    for layer, arrays in sorted(table.items()):
        for key, entry in sorted(arrays.items()):
            got = (params.get(layer) or {}).get(key)
            if got is None:
                continue
            if (layer, key) not in in_memory:
                if not np.array_equal(np.asarray(got, np.int64), read_model(build, entry)):
                    raise ValueError(f"{layer}.{key} is a Verilog parameter of the generated RTL, "
                                     "not a memory image: it keeps the generated values")
                continue
            if entry["file"] not in images:
                images[entry["file"]] = bytearray((build / entry["file"]).read_bytes())
            _put(images[entry["file"]], entry, stored_elements(got, entry))
    for spec in (man.get("memories") or {}).values():   # images the host changes nothing in: as generated
        f = spec["array"]["file"]
        if f not in images:
            images[f] = bytearray((build / f).read_bytes())
    for f, data in images.items():
        (host / f).parent.mkdir(parents=True, exist_ok=True)
        (host / f).write_bytes(bytes(data))
    mem = host / "mem"
    shutil.rmtree(mem, ignore_errors=True)   # text of the previous run's weights
    mem.mkdir(parents=True)
    (mem / "manifest.json").write_text(json.dumps(man, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return mem


def sim_manifest(build: Path, mem: Path) -> dict:
    """rtl/manifest.json of ``build`` with ``mem_dir`` naming ``mem`` (relative to rtl/): the
    generated Verilog compiled as it is, its memories read from the host's folder."""
    rtl = Path(build) / "rtl"
    man = json.loads((rtl / "manifest.json").read_text(encoding="utf-8"))
    man["mem_dir"] = os.path.relpath(Path(mem).resolve(), rtl.resolve())
    return man


# ------------------------------------------------------------------ training images


def write_train_images(tdir: Path, man: dict, weights: dict, out: Path) -> Path:
    """``out``: the training RTL's ``$readmemh`` images of ``tdir`` (rtl/train) with ``weights``
    ({layer: {"w", "b"} or {"scale", "shift"}}, forward-format raw values, host layout) for
    every replica; images of layers ``weights`` lacks are copied as generated. Each image keeps
    the generated one's length (ValueError naming it otherwise)."""
    from bapipe.codegen.design.training import hex_lines, tile_order, weight_matrix

    tdir, out = Path(tdir), Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in tdir.glob("*.hex"):
        shutil.copyfile(f, out / f.name)
    elem_w = int(man["elem_w"])
    for l in man["dense"]:
        p = weights.get(l["name"])
        if p is None:
            continue
        if l.get("bn"):
            w, b = np.asarray(p["scale"]).reshape(-1), np.asarray(p["shift"]).reshape(-1)
        else:
            w = tile_order(weight_matrix(p["w"]), l["pe"], l["simd"])
            b = p["b"] if p.get("b") is not None else np.zeros(l["mh"], np.int64)   # no bias: the engine's stays 0
        for sfx in man.get("replica_sfx", [""]):   # every replica starts at the same weights
            for part, v in (("w", w), ("b", b)):
                name = f"{l['ident']}{sfx}_{part}.hex"
                text = hex_lines(np.asarray(v).reshape(-1), elem_w)
                if not (tdir / name).is_file() or text.count("\n") != (tdir / name).read_text().count("\n"):
                    raise ValueError(f"{name}: {text.count(chr(10))} values, the training RTL's image "
                                     f"{'is missing' if not (tdir / name).is_file() else 'holds another count'}")
                (out / name).write_text(text, encoding="utf-8")
    return out
