# The two commands of the README: `make run` (set up, then run the default experiment) and
# `make test` (set up, then run the test suite). `.ci/run` calls `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ITERATIONS ?= 3

.PHONY: run test setup ui clean

run: setup
	$(BIN)/crucible run --experiment default --iterations $(ITERATIONS)

test: setup
	$(BIN)/python -m pytest

ui: setup
	$(BIN)/crucible ui

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock scripts/install-system-packages
	scripts/install-system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

clean:
	rm -rf .crucible
