"""Compatibility name: the build/run harness lives in codegen.check.sim_harness (rtlsim uses it too)."""
from bapipe.codegen.check.sim_harness import CACHE, ROOT, build, run, tb_config, verilator_available  # noqa: F401
