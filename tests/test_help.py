"""Every command's --help: defaults shown once and true, no default on a flag, the exit codes."""
from __future__ import annotations

import argparse
import re

import pytest

from bapipe.cli import COMMANDS, build_parser
from bapipe.options import EXIT_CODES


def _helps() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p.format_help() for name, p in sub.choices.items()} | {"": parser.format_help()}


@pytest.fixture(scope="module")
def helps():
    return _helps()


def test_every_help_states_the_exit_codes(helps):
    assert set(helps) == set(COMMANDS) | {""}
    flat = " ".join(EXIT_CODES.split())
    for name, text in helps.items():
        assert flat in " ".join(text.split()), name


def test_flags_show_no_default_and_defaults_show_once(helps):
    for name, text in helps.items():
        flat = " ".join(text.split())
        assert "(default: True)" not in flat and "(default: False)" not in flat, name
        for opt in re.split(r"\s(?=--?[a-z])", flat):   # one chunk per option
            assert opt.count("(default") <= 1, (name, opt)


def test_rtlsim_iterations_help_matches_its_constants(helps):
    from bapipe.codegen.cli_rtlsim import DEFAULT_ITERATIONS, TRAIN_BUDGET_CYCLES

    flat = " ".join(helps["rtlsim"].split())
    assert f"default: {DEFAULT_ITERATIONS} when they take at most {TRAIN_BUDGET_CYCLES // 10**6} M" in flat
    assert "codegen." not in flat and "TRAIN_BUDGET" not in flat
    from bapipe.codegen.cli_rtlsim import BENCH_LANES
    assert f"at most {BENCH_LANES:,} lanes" in flat   # the stage benches' budget, as --stages states it


def test_training_defaults_agree():
    """csim --iterations and run start from the same rate for a plan (bapipe.training)."""
    from bapipe.options import defaults
    from bapipe.host.optim import default_lr

    assert defaults("csim")["lr"] is None and defaults("run")["lr"] is None
    assert defaults("run")["precision"] == "plan"
    assert default_lr("sgd", 32) == pytest.approx(0.05 * 0.5 ** 0.5, rel=1e-12)   # exact formula; 1e-12: float rounding
