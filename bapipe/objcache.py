"""A compiler cache for Verilator's run-time library, run as make's ``OBJCACHE`` prefix.

Every verilated model links the same run-time objects (verilated.o, verilated_threads.o and,
under cocotb, verilated_vpi.o and verilated_dpi.o), and Verilator's makefile compiles them
again in every build folder: about 8 s of g++ a build at -O0, a fifth of what the test suite
spends in g++ (docs/testing.md). ``bapipe.toolchain.wire_verilator`` sets ``OBJCACHE`` to this
script (``verilated.mk`` puts ``$(OBJCACHE)`` before every compile), unless the user set
``OBJCACHE`` already (ccache, say).

Only a compile of a source in Verilator's own include folder is cached: the key is the whole
command line (the compiler, every flag, the source's path) with the output's name, plus the
compiler's and the source's size and modification time, so another flag, another compiler or
another Verilator is another entry. The object and its ``-MMD`` dependency file (which names
only the include folder's headers) are copied into place. Any other compile runs unchanged.

Standard library only: it runs as ``python -I objcache.py CXX ARGS...`` for each compile.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: the cache folder when BAPIPE_OBJCACHE_DIR is not set
DEFAULT_DIR = Path.home() / ".cache" / "bapipe" / "verilator-objs"


def runtime_source(args: list[str]) -> Path | None:
    """The Verilator run-time source this compile builds (a .cpp beside verilated.mk), or None."""
    for a in args:
        if a.endswith(".cpp"):
            p = Path(a)
            if p.is_absolute() and (p.parent / "verilated.mk").exists():
                return p
    return None


def output_of(args: list[str]) -> str | None:
    """The object a ``-c -o OUT`` compile writes, or None (no ``-o`` given)."""
    if "-c" not in args or "-o" not in args:
        return None
    i = args.index("-o")
    return args[i + 1] if i + 1 < len(args) else None


def _stamp(path: str | Path) -> list:
    s = os.stat(path)
    return [str(path), s.st_size, s.st_mtime_ns]


def cache_key(cmd: list[str], src: Path, out: str) -> str:
    """The cache entry of compile ``cmd`` (see the module docstring for what it holds)."""
    compiler = shutil.which(cmd[0]) or cmd[0]
    what = [cmd, _stamp(compiler) if os.path.exists(compiler) else compiler, _stamp(src), out]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]


def compile_cached(cmd: list[str], cache: Path) -> int:
    """Run compile ``cmd``, or copy its object and dependency file from ``cache``; the exit code."""
    src, out = runtime_source(cmd), output_of(cmd)
    if src is None or out is None:
        return subprocess.call(cmd)
    dep = str(Path(out).with_suffix(".d"))
    key = cache_key(cmd, src, out)
    obj_c, dep_c = cache / f"{key}.o", cache / f"{key}.d"
    if obj_c.exists() and dep_c.exists():
        shutil.copyfile(obj_c, out)
        shutil.copyfile(dep_c, dep)
        return 0
    rc = subprocess.call(cmd)
    if rc == 0 and os.path.exists(dep):
        cache.mkdir(parents=True, exist_ok=True)
        # another build may store the same entry at the same time: each writes its own file, then renames
        for have, keep in ((dep, dep_c), (out, obj_c)):   # the object last: its presence means both are there
            tmp = keep.with_name(f"{keep.name}.{os.getpid()}.tmp")
            shutil.copyfile(have, tmp)
            os.replace(tmp, keep)
    return rc


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is the compile command make would have run."""
    if not argv:
        print("objcache: no compile command given", file=sys.stderr)
        return 2
    cache = Path(os.environ.get("BAPIPE_OBJCACHE_DIR") or DEFAULT_DIR)
    return compile_cached(argv, cache)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
