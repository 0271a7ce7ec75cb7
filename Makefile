# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint unit e2e clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m specls complete demo/example.py --line 23 --character 0 --stats

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	bash scripts/typecheck.sh

unit: setup
	$(VENV)/bin/pytest -q tests --ignore=tests/e2e

e2e: setup
	bash scripts/e2e.sh

test: lint
	bash scripts/setup-editors.sh
	$(VENV)/bin/pytest -q tests --durations=15 -rs

clean:
	rm -rf $(VENV) build *.egg-info
