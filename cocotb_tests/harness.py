"""Compatibility name: the build/run harness lives in codegen.sim_harness (rtlsim uses it too)."""
from codegen.sim_harness import CACHE, ROOT, build, run, tb_config, verilator_available  # noqa: F401
