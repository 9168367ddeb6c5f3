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

.PHONY: install demo test test-reference test-thorough clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m conformance.walkthrough

test: $(STAMP)
	LOADSPEC_HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest conformance -q -ra --durations=15
	LOADSPEC_HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest conformance/tests -q -ra --loader conformance.adapters.reference:adapter

test-thorough:
	$(MAKE) test PROFILE=thorough

clean:
	rm -rf $(VENV) .hypothesis .benchmarks
