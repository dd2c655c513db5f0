# The two commands: `make demo` and `make test`. Both set up what is missing first.
#
# `make setup` installs exactly requirements.lock (versions and hashes) into .venv with uv,
# so every fresh machine runs the suite on the versions it was run with. pyproject.toml
# keeps ranges for people who `pip install` the package into their own environment;
# `make lock` re-resolves those ranges to today's newest versions (see README).
PY ?= python3.11
UV_VERSION := 0.13.9
VENV := .venv
BIN := $(VENV)/bin
# uv lives beside the environment, not in it, so `pip freeze` lists exactly the lock.
UV := $(VENV)/uv/bin/uv
STAMP := $(VENV)/.installed

.PHONY: setup lock demo test test-all test-fast bench clean

$(UV):
	@test -x $(BIN)/python || $(shell command -v $(PY) || echo python3) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --target $(VENV)/uv uv==$(UV_VERSION)

$(STAMP): requirements.lock pyproject.toml | $(UV)
	$(UV) pip sync --quiet --python $(BIN)/python --require-hashes requirements.lock
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)

# Re-resolve pyproject.toml's ranges to the newest versions the registry serves, for
# Python 3.11 on x86-64 Linux. Run it when a dependency is added or on purpose to move
# to newer versions; then run `make test` and commit requirements.lock with the result.
lock: | $(UV)
	$(UV) pip compile pyproject.toml --quiet --upgrade --generate-hashes \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o requirements.lock

demo: $(STAMP)
	$(BIN)/python -m bapipe.demo

# the whole suite but the soak runs (under 10 minutes on 2 cores); test-all adds them
# PYCACHE: see test-fast below (every suite starts hundreds of Python processes)
PYCACHE := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache

test: $(STAMP)
	$(PYCACHE) $(BIN)/python -m pytest -q -n 2 --dist loadgroup -p no:cacheprovider -m "not soak"

test-all: $(STAMP)
	$(PYCACHE) $(BIN)/python -m pytest -q -n 2 --dist loadgroup -p no:cacheprovider

# Under a minute on 2 cores (docs/testing.md). Bytecode is cached under .venv/pycache even where
# PYTHONDONTWRITEBYTECODE is set: without it every Python process the tests start (two workers,
# fork servers, CLI and board-worker subprocesses) recompiles numpy, pytest, hypothesis, ... from
# source and pytest rewrites every test module again: 87 s of CPU instead of 57 s.
test-fast: $(STAMP)
	$(PYCACHE) $(BIN)/python -m pytest -q -n 2 --dist loadgroup -p no:cacheprovider -m "not slow and not soak and not verilator and not csim"

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf build .pytest_cache
