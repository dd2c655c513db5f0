"""`bapipe gen` at zoo scale: wall time, peak memory and bytes written for VGG-16 and ResNet-50.

For each model, plans the planner's default training plan on the cluster (`bapipe plan MODEL
CLUSTER --mode train`, what the README tour and the CLI contract generate), then runs
`bapipe gen PLAN -o BUILD --force` as a child process holding ``/tmp/bigjob.lock`` (one big
job at a time on a shared machine; the wait for it is not timed) and measures, from the child's own rusage (wait4):
wall seconds, user and system CPU seconds, peak resident memory, and bytes written to
storage (rusage ru_oublock x 512 B, /usr/bin/time's "File system outputs"; the size of the
build folder beside it). It also runs gen a second time into another folder and compares every file
(a generated build must be byte-identical across runs), and prints the largest files.

Issue #36 item 5 asks for VGG-16 within 15 s, 1 GB peak RSS and 400 MB written on a
2-core machine. Prints a table; writes bench/results/bench_gen.json.
Run: ``.venv/bin/python bench/bench_gen.py [--models vgg16 resnet50] [--cluster 4xU250-ring]``.
"""
from __future__ import annotations

import argparse
import fcntl
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
LOCK = "/tmp/bigjob.lock"
#: issue #36 item 5's budget for VGG-16 on 4xU250-ring
BUDGET = {"wall_s": 15.0, "peak_rss_mb": 1024.0, "written_mb": 400.0}


def run_gen(plan: Path, out: Path) -> dict:
    """One `bapipe gen` child: wall, CPU, peak RSS (MiB), bytes written (MB), exit code.

    Run holding ``/tmp/bigjob.lock``. The figures are the child's rusage from wait4:
    ``ru_oublock`` counts the 512-byte blocks it caused to be written to storage (what
    /usr/bin/time -v prints as "File system outputs")."""
    cmd = [sys.executable, "-m", "bapipe.cli", "gen", str(plan), "-o", str(out), "--force", "--json"]
    with open(LOCK, "a") as lock, tempfile.TemporaryFile() as err:
        fcntl.flock(lock, fcntl.LOCK_EX)   # one big job at a time on the machine; the wait is not timed
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else 0
    return {"rc": p.returncode, "wall_s": round(wall, 2), "user_s": round(ru.ru_utime, 2),
            "sys_s": round(ru.ru_stime, 2), "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
            "written_mb": round(ru.ru_oublock * 512 / 1e6, 1), "build_mb": round(size / 1e6, 1),
            "stderr_tail": tail}


def same_tree(a: Path, b: Path) -> tuple[bool, list[str]]:
    """Do two builds hold the same files with the same bytes? (and the differing paths)"""
    fa = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    if fa != fb:
        return False, sorted(set(fa) ^ set(fb))[:5]
    diff = [f for f in fa if not filecmp.cmp(a / f, b / f, shallow=False)]
    return not diff, diff[:5]


def main(argv=None) -> int:
    """Run the benchmark, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["vgg16", "resnet50"])
    p.add_argument("--cluster", default="4xU250-ring")
    p.add_argument("--no-repeat", action="store_true", help="skip the second gen (determinism check)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bapipe-bench-gen-"))
    rows = []
    try:
        for m in a.models:
            plan = work / f"{m}.yaml"
            subprocess.run([sys.executable, "-m", "bapipe.cli", "plan", m, a.cluster, "--mode", "train",
                            "-o", str(plan), "--force"], check=True, capture_output=True)
            r = run_gen(plan, work / f"{m}-a")
            row = {"model": m, "cluster": a.cluster, **r}
            if r["rc"] == 0:
                files = sorted(((f.stat().st_size, f.relative_to(work / f"{m}-a").as_posix())
                                for f in (work / f"{m}-a").rglob("*") if f.is_file()), reverse=True)
                row["files"] = len(files)
                row["largest"] = [[n, round(s / 1e6, 1)] for s, n in files[:5]]
                if not a.no_repeat:
                    r2 = run_gen(plan, work / f"{m}-b")
                    row["deterministic"], row["differing"] = same_tree(work / f"{m}-a", work / f"{m}-b")
                    row["second_wall_s"] = r2["wall_s"]
                    shutil.rmtree(work / f"{m}-b", ignore_errors=True)
            shutil.rmtree(work / f"{m}-a", ignore_errors=True)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'model':<10}{'wall s':>8}{'user s':>8}{'sys s':>7}{'peak RSS MiB':>14}{'written MB':>12}"
          f"{'build MB':>10}{'files':>7}  deterministic  largest")
    for r in rows:
        largest = ", ".join(f"{n} {s:g} MB" for n, s in r.get("largest", [])[:3])
        print(f"{r['model']:<10}{r['wall_s']:>8.1f}{r['user_s']:>8.1f}{r['sys_s']:>7.1f}{r['peak_rss_mb']:>14,.0f}"
              f"{r['written_mb']:>12,.1f}{r['build_mb']:>10,.1f}{r.get('files', 0):>7}  "
              f"{str(r.get('deterministic', '-')):<13}  {largest}" + ("" if r["rc"] == 0 else f"  FAILED rc={r['rc']}"))
    vgg = next((r for r in rows if r["model"] == "vgg16"), None)
    if vgg is not None:
        print("issue #36 budget for vgg16: " + ", ".join(
            f"{k} {vgg[k]:g} <= {v:g}: {'yes' if vgg[k] <= v else 'NO'}" for k, v in BUDGET.items()))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_gen.json").write_text(json.dumps({"budget_vgg16": BUDGET, "rows": rows}, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
