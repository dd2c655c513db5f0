# The two commands: `make demo` and `make test`. Both set up what is missing first.
#
# `make setup` installs exactly requirements.lock (versions and hashes: the core and every extra)
# into .venv with uv, so every fresh machine runs the suite on the versions it was run with.
# pyproject.toml keeps ranges for people who `pip install` the package (core or with extras)
# into their own environment; `make lock` re-resolves them keeping the locked versions that
# still fit, and `make lock-upgrade` moves everything to the newest versions (see README).
PY ?= python3.11
UV_VERSION := 0.13.9
VENV := .venv
BIN := $(VENV)/bin
# uv lives beside the environment, not in it, so `pip freeze` lists exactly the lock.
UV := $(VENV)/uv/bin/uv
STAMP := $(VENV)/.installed
# Local wheels (this machine's pip config: find-links=/opt/wheels). The `torch` extra is locked
# to the CPU build found here (torch==2.13.0+cpu, 190 MB) instead of the index's CUDA build
# (2.5 GB with its nvidia-* wheels); uv reads the folder for both `lock` and `setup`.
WHEELS ?= /opt/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS)/*.whl),--find-links $(WHEELS))
LOCK_FLAGS := --all-extras --quiet --generate-hashes $(FIND_LINKS) --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 -o requirements.lock

.PHONY: setup lock lock-upgrade demo test test-all test-fast bench clean

$(UV):
	@test -x $(BIN)/python || $(shell command -v $(PY) || echo python3) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --target $(VENV)/uv uv==$(UV_VERSION)

$(STAMP): requirements.lock pyproject.toml | $(UV)
	$(UV) pip sync --quiet --python $(BIN)/python --require-hashes $(FIND_LINKS) requirements.lock
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)

# Re-resolve pyproject.toml (core and every extra) for Python 3.11 on x86-64 Linux after a
# dependency was added, removed or its range changed. uv keeps every version pinned in
# requirements.lock that still satisfies the ranges (the lock is its preference), so only what
# must move moves. `make lock-upgrade` moves everything to the newest versions on purpose.
# Either way: run `make test`, then commit requirements.lock with the result.
lock: | $(UV)
	$(UV) pip compile pyproject.toml $(LOCK_FLAGS)

lock-upgrade: | $(UV)
	$(UV) pip compile pyproject.toml --upgrade $(LOCK_FLAGS)

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
