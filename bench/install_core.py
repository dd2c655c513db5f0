"""The core install as a new user gets it: `pip install .` of this tree into a fresh venv.

Measures the install's wall time, what it adds to the venv (bytes of the venv minus those of
an empty one), the packages it brings, `import bapipe` time, and that the core plans,
simulates and generates from the API while each extra's absence is refused in one line.
Uses pip as a user would (the package index, or the machine's pip configuration): not part of
`make bench` (its bench_*.py) because it downloads; run it by hand:

    .venv/bin/python bench/install_core.py [--cache]     # --cache: let pip use its wheel cache

Prints a table and writes bench/results/install_core.json.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = "python3.11"

#: run in the new venv: the API's core flow, and the refusal of each missing extra
PROBE = r'''
import json, sys, time, tempfile, os
t0 = time.perf_counter(); import bapipe; t_import = time.perf_counter() - t0
os.chdir(tempfile.mkdtemp())
p = bapipe.plan("vgg16", "4xU250-ring"); s = p.simulate(); p.save("vgg16.yaml")
t = bapipe.plan("tiny-mlp", "4xU250-ring", cap=0.02); b = t.generate("build")
refused = {}
for name, call in (("csim", b.csim), ("sim", b.rtlsim), ("synth", b.synth),
                   ("ray", lambda: bapipe.run(t, ray=True)), ("plot", lambda: p.gantt("g.png"))):
    try:
        call(); refused[name] = None
    except bapipe.BapipeError as e:
        refused[name] = str(e)
print(json.dumps({"import_ms": t_import * 1e3, "vgg16_iteration_s": s.iteration_time_s,
                  "tiny_mlp_files": b.result.files, "refused": refused}))
'''


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def main() -> int:
    """Build both venvs, install, probe; print the table and write the JSON."""
    cache = "--cache" in sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="bapipe-install-") as tmp:
        empty, core = Path(tmp) / "empty", Path(tmp) / "core"
        for v in (empty, core):
            subprocess.run([PY, "-m", "venv", str(v)], check=True)
        t0 = time.perf_counter()
        subprocess.run([str(core / "bin" / "pip"), "install", "--quiet", *([] if cache else ["--no-cache-dir"]),
                        str(ROOT)], check=True)
        install_s = time.perf_counter() - t0
        added = _bytes(core) - _bytes(empty)
        pkgs = json.loads(subprocess.run([str(core / "bin" / "pip"), "list", "--format", "json"],
                                         capture_output=True, text=True, check=True).stdout)
        probe = json.loads(subprocess.run([str(core / "bin" / "python"), "-c", PROBE], capture_output=True,
                                          text=True, check=True, cwd=tmp).stdout.strip().splitlines()[-1])
    names = sorted(p["name"] for p in pkgs if p["name"] not in ("pip", "setuptools"))
    res = {"install_s": round(install_s, 1), "added_bytes": added, "added_MiB": round(added / 2**20, 1),
           "packages": names, "cache": cache, **probe}
    print(f"{'pip install . (core)':<28}{install_s:>8.1f} s wall{'' if cache else ', no pip cache'}")
    print(f"{'added to a fresh venv':<28}{added / 2**20:>8.1f} MiB")
    print(f"{'packages':<28}{len(names):>8}  {' '.join(names)}")
    print(f"{'import bapipe':<28}{probe['import_ms']:>8.1f} ms")
    print(f"{'vgg16 plan + sim':<28}{probe['vgg16_iteration_s']:>8.4f} s/iteration predicted")
    for k, v in probe["refused"].items():
        print(f"  extra {k:<8} {'NOT REFUSED' if v is None else v}")
    out = ROOT / "bench" / "results" / "install_core.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    return 0 if all(v is not None for v in probe["refused"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
