# The two commands: `make demo` and `make test`. Both set up what is missing first.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(shell command -v $(PY) || echo python3) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m bapipe.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -p no:cacheprovider

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not verilator and not csim"

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf build .pytest_cache
