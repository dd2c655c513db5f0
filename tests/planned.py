"""Planner-made plans of the built-in models and clusters, each searched once per test run.

Several test modules ask the planner for the same plan (tiny-mlp on 4xU250-ring at the default
request is asked for six times: 3-4 s of CPU each, 149 placements x 18 (schedule, m) pairs).
:func:`cached_plan` returns ``make_plan``'s result for (model, cluster, request), searched the
first time it is asked for in the run and then read back: from memory in the same process,
from a pickle the other xdist worker wrote (one folder per run, named by xdist's run id). Each
call unpickles its own copy (25 ms; a deep copy takes 150 ms), so a test may change what it gets.

Tests of the planner's determinism or of the CLI call ``make_plan`` or the CLI themselves, and
so do tests that patch the planner's module constants (the key is the request alone); this is
for tests that check properties of the plan the planner makes.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import tempfile
from pathlib import Path

_MEMO: dict[str, bytes] = {}   # key -> the pickled result


def _folder() -> Path | None:
    """The run's shared folder (xdist workers of one run share PYTEST_XDIST_TESTRUNUID), or None
    outside xdist (then the memory cache alone)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return None
    d = Path(tempfile.gettempdir()) / f"bapipe-planned-{uid}"
    d.mkdir(exist_ok=True)
    return d


def cached_plan(model_name: str, cluster_name: str, **req):
    """``make_plan(load_model(model_name), load_cluster(cluster_name), model_name, cluster_name,
    Request(**req))``, searched once per run (see the module's docstring)."""
    from bapipe.fpga_models.cluster import load_cluster
    from bapipe.models import load_model
    from bapipe.planner.planning import make_plan
    from bapipe.planner.search import Request

    request = Request(**req)
    key = hashlib.sha256(repr((model_name, cluster_name, request)).encode()).hexdigest()[:32]
    if key not in _MEMO:
        d = _folder()
        if d is None:
            _MEMO[key] = pickle.dumps(make_plan(load_model(model_name), load_cluster(cluster_name), model_name,
                                                cluster_name, request))
        else:
            with open(d / f"{key}.lock", "w") as lock:   # the other worker waits, then reads
                fcntl.flock(lock, fcntl.LOCK_EX)
                f = d / f"{key}.pickle"
                if f.exists():
                    _MEMO[key] = f.read_bytes()
                else:
                    _MEMO[key] = pickle.dumps(make_plan(load_model(model_name), load_cluster(cluster_name),
                                                        model_name, cluster_name, request))
                    tmp = f.with_suffix(".tmp")
                    tmp.write_bytes(_MEMO[key])
                    tmp.replace(f)
    return pickle.loads(_MEMO[key])
