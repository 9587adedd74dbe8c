# The two commands of the README quick start: `make demo` and `make test`; `make test-long` runs the rest of the
# suite (the tests marked `long`: the real-process matrices, soak, floods, emulated hosts, calibration runs).
PY ?= python3
# The tests start hundreds of Python processes that import ringflow: let them reuse compiled bytecode
# (__pycache__, git-ignored) even where the environment turns it off.
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-long lint venv clean

$(STAMP): pyproject.toml setup.py $(wildcard ringflow/runtime/native/*.c ringflow/runtime/native/*.h)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# torch is optional; a local CPU wheel exists on this machine family, elsewhere the torch tests skip. Its
	# bytecode is compiled for what torch.distributed users import (not all of its 2,300 modules: half a minute saved)
	-$(BIN)/pip install -q --no-compile torch==2.13.0 \
		&& $(BIN)/python -c "import torch, torch.distributed, torch.distributed.fsdp, torch.nn.parallel" \
		|| echo "torch not installed: torch tests will skip"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m ringflow.demo

# lint runs first: style (ruff), types (mypy, strict on algorithms/topology/hardware), then the one-way layers
# (import-linter, `[tool.importlinter]` in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check ringflow tests benchmarks
	$(BIN)/mypy ringflow
	$(BIN)/lint-imports --no-cache

# `make test` and `make test-long` together run every test once; `make test` runs the lint beside the fast tests
# (two jobs: mypy works on one core while the tests' processes wait on each other)
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 lint test-fast

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x -m "not long" --durations=15

test-long: $(STAMP)
	$(BIN)/python -m pytest -q -x -m long --durations=15

clean:
	rm -rf $(VENV) build *.egg-info
