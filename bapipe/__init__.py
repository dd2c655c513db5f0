"""BaPipe: plan, simulate, generate and run pipeline-parallel DNN training on FPGA clusters.

The Python API (bapipe.api; README "Python API" shows a session)::

    import bapipe
    p = bapipe.plan("vgg16", "4xU250-ring")      # -> bapipe.Plan
    p.simulate(); p.breakdown(); p.gantt("g.png"); p.save("plan.yaml")
    b = p.generate("build")                       # -> bapipe.Build: .csim() .rtlsim() .synth()
    bapipe.run(p, backend="numpy", epochs=1)

``bapipe.plan`` is the API's function, not the submodule bapipe/plan.py (the plan file's
dataclass; import from it by name: ``from bapipe.plan import load_plan``).

Importing bapipe loads nothing else: each name is imported on first use (module
``__getattr__``), so ``import bapipe`` stays fast and pulls in neither codegen nor host.

Run as the `bapipe` console script, this is the first of the toolkit's code to execute:
Ctrl-C or SIGTERM before ``bapipe.cli.main`` takes over (while Python imports the command
line) ends the process with one line and exit 130 / 143 instead of a traceback or a silent
kill. Nothing has started or been written yet, so there is nothing to clean up.
"""
from __future__ import annotations

import os as _os
import signal as _signal
import sys as _sys
import types


def _early_exit(signum, _frame):
    name = "terminated (SIGTERM)" if signum == _signal.SIGTERM else "interrupted"
    _os.write(2, f"bapipe: {name}\n".encode())
    _os._exit(143 if signum == _signal.SIGTERM else 130)


if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "bapipe":
    for _s in (_signal.SIGINT, _signal.SIGTERM):
        if _signal.getsignal(_s) is not _signal.SIG_IGN:   # an ignored signal stays ignored (nohup, &)
            _signal.signal(_s, _early_exit)

#: public name -> the module that defines it
_API = {
    "plan": "bapipe.api", "load_plan": "bapipe.api", "load_model": "bapipe.api", "load_cluster": "bapipe.api",
    "profile": "bapipe.api", "run": "bapipe.api", "Plan": "bapipe.api", "Build": "bapipe.api",
    "StageTime": "bapipe.api",
    "BapipeError": "bapipe.errors", "SpecError": "bapipe.errors",
    "PlanResult": "bapipe.results", "SimResult": "bapipe.results", "ProfileResult": "bapipe.results",
    "GenResult": "bapipe.results", "CsimResult": "bapipe.results", "RtlsimResult": "bapipe.results",
    "SynthResult": "bapipe.results", "RunResult": "bapipe.results",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    """Import a public name on first use (PEP 562)."""
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'bapipe' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value   # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))


#: API functions that share their name with a submodule (bapipe/plan.py): importing the
#: submodule must not replace the function on the package
_SHADOWED = frozenset({"plan"})


class _Package(types.ModuleType):
    """The bapipe package: keeps an API function when a same-named submodule is imported."""

    def __setattr__(self, name, value):
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return   # the submodule stays reachable in sys.modules and by `from bapipe.plan import x`
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
