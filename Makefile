# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv when missing and installs what it needs, idempotently:
# torch==2.13.0 first (a CPU wheel; an unpinned torch pulls a multi-GB CUDA build), then the rest.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loadspec-installed
FIND_LINKS := $(if $(wildcard /opt/wheels/torch-2.13.0*),--find-links /opt/wheels,)
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q $(FIND_LINKS)
PROFILE ?= ci
# The conformance suite runs on every core (pytest-xdist), at most 4 processes: its tests are single-threaded
# Python, its gloo jobs' time limits scale with the machine's load. XDIST= runs it in one process.
XDIST ?= -n auto --maxprocesses 4 --dist worksteal

.PHONY: install demo demo-mix test test-reference test-thorough clean lint

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test,lint]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m conformance.walkthrough
	$(BIN)/python -m demos.train_resume

# A two-corpus mixture with validation splits, trained on 2 ranks and resumed on 3 (issue 10's demo).
demo-mix: $(STAMP)
	$(BIN)/python -m demos.mixture

# Lint first (ruff, and mypy strict for reference/, impl/ and demos/), then the suites.
test: $(STAMP) lint
	LOADSPEC_HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest conformance -q -ra --durations=15 $(XDIST)
	LOADSPEC_HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest conformance/tests -q -ra --loadspec-loader conformance.adapters.reference:adapter
	LOADSPEC_BENCH_SIZE=S $(BIN)/python -m pytest benchmarks -q -ra --benchmark-disable

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The reference alone: its meta tests, then the loader suite run on the reference's adapter.
test-reference: $(STAMP)
	LOADSPEC_HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest conformance/meta_tests -q -ra
	LOADSPEC_HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest conformance/tests -q -ra --loadspec-loader conformance.adapters.reference:adapter

test-thorough:
	$(MAKE) test PROFILE=thorough

clean:
	rm -rf $(VENV) .hypothesis .benchmarks

# ---- benchmarks (benchmarks/README.md): a separate venv with the peers (MosaicML streaming, LitData, matplotlib)
.PHONY: bench bench-env bench-compare bench-report test-bench-smoke matrix
BENCH_VENV := .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.loadspec-bench-installed
BENCH_PIP := $(BENCH_BIN)/python -m pip install --disable-pip-version-check -q $(FIND_LINKS)
BENCH_SIZE ?= $(or $(LOADSPEC_BENCH_SIZE),M)
BENCH_JSON = benchmarks/results/bench-$(BENCH_SIZE).json

$(BENCH_STAMP): pyproject.toml benchmarks/requirements-bench.txt
	@test -x $(BENCH_BIN)/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PIP) "torch==2.13.0"
	$(BENCH_PIP) -e ".[conformance]" -r benchmarks/requirements-bench.txt
	@touch $(BENCH_STAMP)

bench-env: $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	LOADSPEC_BENCH_SIZE=$(BENCH_SIZE) $(BENCH_BIN)/python -m pytest benchmarks -q -ra --benchmark-json=$(BENCH_JSON)

bench-compare: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m benchmarks.compare $(BENCH_JSON)

bench-report: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m benchmarks.report $(BENCH_JSON)

# The conformance matrix (conformance/report/MATRIX.md): the kit run on impl, the reference and every peer.
matrix: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m conformance.matrix

test-bench-smoke: $(STAMP)
	LOADSPEC_BENCH_SIZE=S $(BIN)/python -m pytest benchmarks -q -ra --benchmark-disable
