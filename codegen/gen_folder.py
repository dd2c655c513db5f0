"""A `bapipe gen` build folder: the plan's project rendered from its one lowering, written
whole, stamped and checked. The library behind `bapipe gen` (codegen/cli_gen.py), the Python
API (bapipe.api) and the host's verilator backend (host/backends/rtl_build.py).

The project is written into a temporary sibling folder and swapped in whole, so an
interrupted or refused gen leaves the previous folder as it was and a finished one holds no
stale file of an earlier, larger plan. ``bapipe-build.json`` in the folder records the
plan's fingerprint and the sha256 of every generated file; csim, rtlsim, synth and run
call :func:`check_build` and refuse a folder whose plan or Design changed since gen.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from bapipe.errors import SpecError
from bapipe.proc import signals_held

from bapipe.codegen.design.record import plan_cycles_per_sample
from bapipe.codegen.design.placement import placement_warnings
from bapipe.codegen.package.kernels import BUILD_STAMP

from bapipe.codegen.design.lower import lower
from bapipe.codegen.rtl.write import write_rtl
from bapipe.codegen.hls.project import write_files, write_images
from bapipe.codegen.package.project import render_files


def check_generable(plan, plan_file: str) -> None:
    """SpecError (one line) for a plan `bapipe gen` has no hardware for: a GPU stage, or
    PipeDream's per-micro-batch weight versions in training."""
    gpu = [s for s in plan.stages if s.style == "gpu"]
    if gpu:  # the generators build FPGA kernels; a GPU stage has no hardware to generate
        raise SpecError(plan_file, None, f"stages[{gpu[0].index}].style",
                        f"expected FPGA stages: stage {gpu[0].index} runs on {gpu[0].board_type} GPUs, "
                        "which `bapipe gen` does not generate for")
    if plan.mode == "train" and plan.schedule == "pipedream":
        # the kernels accumulate gradients and update once per iteration; PipeDream's weight
        # stashing (a weight version per in-flight micro-batch) has no hardware
        raise SpecError(plan_file, None, "schedule", "expected a schedule `bapipe gen` builds (gpipe, 1f1b, "
                                                     "interleaved, eager-1f1b or 2bw); pipedream's stashed weight "
                                                     "versions and per-micro-batch updates have no hardware (plan "
                                                     "with --schedule 2bw or 1f1b)")


def generate_plan(plan, model, cluster, out_dir: str | Path, plan_text: str | None = None,
                  plan_file: str = "plan.yaml", engines: str = "hls", sgd=None) -> dict:
    """Generate from in-memory objects (tests build plans by hand). ``engines``: which kernels
    the Makefile and link configs build, the HLS ones or the packaged RTL ones (codegen.package).
    ``sgd``: the training RTL's SGD constants or rate schedule (default: codegen.design.training's;
    the host's verilator backend passes a run's own, which its update engines hold as parameters)."""
    from bapipe.codegen.package import kernels as package

    package.check_engines_plan(engines, plan)
    design = lower(plan, model, cluster, plan_file, engines, sgd=sgd)   # the one lowering of this gen
    ctx = design.project
    ctx.plan_file = plan_file   # the placement pass's errors name the plan file (codegen.design.placement)
    package.check_engines(engines, ctx, True, None)
    if engines == "rtl":
        package.check_engines(engines, ctx, design.pipeline is not None,
                              None if design.pipeline is not None else str(design.pipeline_error))
        # RTL kernels hold their weights on chip: no m_axi weight ports to wire
        ctx = replace(ctx, boards=package.strip_rtl_weight_ports(ctx.boards, ctx.stages))
    files = render_files(ctx, plan_text if plan_text is not None else plan.dumps(), cluster, engines=engines)
    out = Path(out_dir)
    # one weight image per stage, read by the HLS testbenches, the host and the RTL alike
    # (codegen.design.weight_image), streamed to disk
    images = write_images(ctx, out)
    # design.json is written once, with the placement pass's section (codegen.design.placement)
    rtl_paths, ddict = write_rtl(design, out / "rtl", placement=json.loads(files["placement.json"]))
    rtl_files: list[Path] = list(rtl_paths)
    kernels = []
    if engines == "rtl":
        main = {p.name: p.read_text(encoding="utf-8") for p in (out / "rtl").glob("*.v")}
        kernels, kfiles = package.rtl_kernels(design, main)
        rtl_files += write_files({n: t.encode() for n, t in kfiles.items()}, out)
        # Vivado's package_xo reads the MVUs' $readmemh text: a tool that needs it, so it is written now
        from bapipe.codegen.rtl.mem_images import ensure_memories
        rtl_files += ensure_memories(out / "rtl")
    paths = write_files(files, out)
    for line in placement_warnings(json.loads(files["placement.json"])):
        sys.stderr.write(f"bapipe gen: warning: {line}\n")
    write_stamp(out, ctx.fingerprint, [*paths, *images, *rtl_files], {"engines": engines,
                                                           "xrt": package.xrt_manifest(ctx, engines)})
    design = _design_cycles(ddict)
    for line in cycle_warnings(plan, ctx.stages, design):
        sys.stderr.write(f"bapipe gen: warning: {line}\n")
    return {
        "output": str(out), "fingerprint": ctx.fingerprint, "files": len(paths) + len(images), "rtl_files": len(rtl_files),
        "format": ctx.fmt.name,
        "stages": [{"name": s.name, "layers": len(s.layers), "boards": s.boards, "inputs": len(s.inputs),
                    "outputs": len(s.outputs), "weights": s.weight_elements,
                    # the Design's forward cycles per sample (the engines the kernels are rendered
                    # from; `bapipe csim` counts the kernels' loops, `bapipe rtlsim` measures the RTL),
                    # next to the planner's for the same stage
                    "design_cycles_per_sample": design.get(s.index),
                    "plan_fwd_cycles_per_sample": _plan_cycles(plan, s.index)} for s in ctx.stages],
        "boards": [b.name for b in ctx.boards],
        "skipped": ctx.skipped,
        "engines": engines, "rtl_kernels": [k.name for k in kernels],
    }


#: the build's record of its plan and files (written last, so a half-written folder has none)
STAMP = BUILD_STAMP


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_stamp(out: Path, plan_fingerprint: str, paths: list[Path], extra: dict | None = None) -> Path:
    """Record the plan fingerprint and every generated file's size and sha256 in ``out/STAMP``
    (``extra``: more top-level keys, e.g. the engines and the xrt section of codegen.package)."""
    out = Path(out)
    files = {}
    for p in sorted(set(Path(x) for x in paths)):
        if p.is_file():
            files[p.relative_to(out).as_posix()] = [p.stat().st_size, _sha256(p)]
    stamp = out / STAMP
    stamp.write_text(json.dumps({"generator": "bapipe gen", "plan_fingerprint": plan_fingerprint, "files": files,
                                 **(extra or {})},
                                indent=1, sort_keys=True), encoding="utf-8")
    return stamp


def check_build(build: str | Path, plan_fingerprint: str | None = None, option: str = "BUILD") -> dict:
    """Refuse (SpecError, one line) a folder that is not exactly what `bapipe gen` wrote.

    A folder without ``plan.yaml`` and stamp (RTL rendered through the Python API) has
    nothing to be tied to: ``{}`` is returned and the command's own checks apply.

    Checks the stamp, that ``plan.yaml`` in the folder still has the fingerprint the files
    were generated from, that every generated file is present with its size and sha256
    (a replaced plan, an edited Design, a truncated weight file or a half-copied folder all
    fail here), and, given ``plan_fingerprint``, that the build is of that plan. Returns the stamp.
    """
    from bapipe.plan import load_plan

    build = Path(build)
    if not build.is_dir():
        raise SpecError(str(build), None, option, "expected a folder written by `bapipe gen`"
                        + (" (it does not exist)" if not build.exists() else " (it is a file)"))
    path = build / STAMP
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(stamp, dict) or not isinstance(stamp.get("files"), dict) \
                or not isinstance(stamp.get("plan_fingerprint"), str):
            raise ValueError("not a build stamp")
    except FileNotFoundError:
        if not (build / "plan.yaml").exists():
            # no plan to be tied to: an RTL folder rendered through the Python API (codegen.rtl),
            # or not a project at all, which the command's own checks then name
            return {}
        raise SpecError(str(build), None, STAMP, "expected a folder written whole by `bapipe gen` "
                                                 f"(no {STAMP}); re-run `bapipe gen PLAN -o {build} --force`") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError(str(path), None, "(document)", f"expected the JSON written by `bapipe gen` "
                                                       f"({type(e).__name__}); re-run it") from None
    plan_path = build / "plan.yaml"
    plan = load_plan(plan_path)
    if plan.fingerprint() != stamp["plan_fingerprint"]:
        raise SpecError(str(plan_path), None, "plan_fingerprint",
                        "expected the plan this folder was generated from (it was replaced or edited); "
                        "re-run `bapipe gen`")
    if plan_fingerprint is not None and plan_fingerprint != stamp["plan_fingerprint"]:
        raise SpecError(str(build), None, option, "expected a build of this plan (it was generated from another "
                                                   "plan or an earlier version); re-run `bapipe gen`")
    for rel, entry in sorted(stamp["files"].items()):
        f = build / rel
        ok = isinstance(entry, list) and len(entry) == 2 and f.is_file()
        if ok and f.stat().st_size == entry[0]:
            ok = _sha256(f) == entry[1]
        elif ok:
            ok = False
        if not ok:
            what = "missing" if not f.is_file() else "changed"
            raise SpecError(str(f), None, "sha256", f"expected the file `bapipe gen` wrote (it is {what} since); "
                                                    "re-run `bapipe gen`")
    return stamp


def generate_folder(plan, model, cluster, output: str | Path, plan_text: str, plan_file: str,
                    engines: str = "hls", force: bool = False, allow_rule_violations: bool = True,
                    sgd=None) -> dict:
    """Generate ``plan`` (loaded, with its model and cluster) into the folder ``output``: into a
    temporary sibling folder first, swapped in whole, so a refused or interrupted gen leaves the
    previous folder as it was. An existing non-empty folder is replaced only with ``force``.
    bapipe.api's Plan.generate and `bapipe gen` both come here; returns the --json object. The
    physical rules (`bapipe check`) run on the new build; one a board breaks is refused unless
    ``allow_rule_violations``. ``sgd``: as :func:`generate_plan`'s."""
    text = str(output)
    if not text.strip():
        raise SpecError(None, None, "-o", "expected a folder name, got an empty string")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise SpecError(text, None, "-o", "expected a writable folder: it is a file")
    target = out.resolve()
    if target == Path.cwd().resolve() or target in Path.cwd().resolve().parents or target.parent == target:
        raise SpecError(text, None, "-o", "expected a project folder, not the current folder or one above it")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise SpecError(text, None, "-o", "expected an empty or new folder (add --force to replace it)")
    if not target.parent.is_dir():
        raise SpecError(text, None, "-o", f"expected a writable folder: '{target.parent}' does not exist")
    check_generable(plan, plan_file)
    if sys.stderr.isatty():  # big plans take tens of seconds and write gigabytes: say so first
        sys.stderr.write(f"bapipe gen: rendering {plan_file} into {text} (VGG-sized plans: ~1 minute, ~1.5 GB)\n")
    tmp = target.with_name(f".{target.name}.gen-{os.getpid()}")
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        result = generate_plan(plan, model, cluster, tmp, plan_text, plan_file, engines, sgd)
        result["check"] = _physical_check(tmp, allow_rule_violations, text)
        with signals_held():   # both renames or neither: a signal between them lost the build
            if target.exists():
                target.rename(old)  # the previous build stays whole until the new one is in place
            tmp.rename(target)
    except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError, FileNotFoundError) as e:
        # the output folder cannot be made or written: bad -o, not a bug
        raise SpecError(text, None, "-o", f"expected a writable folder: {e.strerror or e}") from None
    finally:  # interrupted, refused or done: no half-written folder is left behind
        with signals_held():   # a SIGTERM during the removal left a hidden .<name>.old-PID behind
            if old.exists() and not target.exists():
                old.rename(target)
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
    result["output"] = text
    return result


def _physical_check(build: Path, allow: bool, name: str) -> dict:
    """`bapipe check` on the freshly written build (codegen.check.physical_rules): each board that
    breaks a rule is named on stderr; with ``allow`` False (`--strict-rules`) the build is refused
    (SpecError, one line; the caller removes the folder)."""
    from bapipe.codegen.check.physical_rules import check_build as physical_check

    result = physical_check(build)
    if not result["ok"] and not allow:
        raise SpecError(name, None, "--strict-rules", refusal(result))
    for b in result["boards"]:
        if not all(b["rules"].values()):
            sys.stderr.write(f"bapipe gen: warning: {b['board']} breaks the physical rules "
                             f"{', '.join(r for r, ok in b['rules'].items() if not ok)} (bapipe check)\n")
    broken = {b["board"]: [r for r, ok in b["rules"].items() if not ok] for b in result["boards"]}
    return {"ok": result["ok"], "failed_rules": result["failed_rules"],
            "boards": {k: v for k, v in broken.items() if v}}


def _design_cycles(design: dict | None) -> dict[int, float]:
    """Stage index -> the Design's forward cycles per sample (the Design the RTL lowering
    wrote as build/design.json; empty when it built none for this plan)."""
    stages = (design or {}).get("stages", [])
    return {s["index"]: s["design_cycles_per_sample"] for s in stages if "design_cycles_per_sample" in s}


#: |Design / plan - 1| above which gen says the Design does not run at the plan's pace: the
#: agreement bound of issue 15 (rtlsim holds every stage to it, tests/test_agreement.py)
CYCLE_WARN = 0.02


def cycle_warnings(plan, stages, design: dict[int, float]) -> list[str]:
    """One line per stage whose Design cycles per sample are off the plan's by more than
    :data:`CYCLE_WARN` (a plan whose foldings were edited without re-pricing, or priced from
    a profile of other hardware): the build is still written, but not silently. The Design's
    cycles include a time-multiplexed stage's off-chip weight fetches (codegen.design.dataflow
    .WeightFetch, which the HLS kernels and the RTL both build), as the plan prices them."""
    out = []
    for s in stages:
        d, p = design.get(s.index), _plan_cycles(plan, s.index)
        if d is None or not p:
            continue
        err = d / p - 1
        if abs(err) > CYCLE_WARN:
            out.append(f"stage {s.index}: the Design runs {d:,.1f} forward cycles per sample, the plan "
                       f"promises {p:,.1f} ({100 * err:+.1f}%): the plan's times do not come from its "
                       f"foldings (re-plan, or expect rtlsim's plan_error to say so)")
    return out


def _plan_cycles(plan, index: int) -> float | None:
    """The planner's forward cycles per sample in steady state of stage ``index`` (None when
    the plan has no cycles: hand-made plans)."""
    pos = next((i for i, x in enumerate(plan.stages) if x.index == index), None)
    if pos is None or not plan.stages[pos].cycles:
        return None
    return plan_cycles_per_sample(plan, pos)


def refusal(result: dict) -> str:
    """The one line `bapipe gen` refuses a build with."""
    bad = [b for b in result["boards"] if not all(b["rules"].values())]
    first = bad[0] if bad else None
    where = (f"{first['board']} breaks {', '.join(r for r, ok in first['rules'].items() if not ok)}"
             if first else "a rule fails")
    return (f"expected a build every board can hold: {len(bad)} of {len(result['boards'])} boards break the "
            f"physical rules ({where}; `bapipe check` on a build made without --strict-rules lists them)")


def train_unsupported(build: Path) -> str | None:
    """Why `bapipe gen` wrote no training RTL for the mode: train plan of ``build``
    (design.json's ``train_unsupported``), else None."""
    try:
        return json.loads((Path(build) / "design.json").read_text()).get("train_unsupported")
    except (OSError, ValueError):
        return None
