# Engram Memory — the obvious targets. `make run` and `make test` are all a newcomer needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
# The first Python >= 3.11 on PATH (3.12 is the Lambda runtime; 3.11 works for everything local).
PYTHON ?= $(shell for p in python3.12 python3.13 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { command -v $$p; break; }; done)
BIN := $(VENV)/bin
DATA_DIR ?= .engram

.PHONY: help venv run test lint typecheck unit contract format clean

help:
	@echo "make run        start Engram Memory on the embedded default (data in $(DATA_DIR)/)"
	@echo "make test       lint, type-check and run every test tier"
	@echo "make unit | contract | lint | typecheck | format | clean"

$(BIN)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "Engram Memory needs Python >= 3.11 on PATH (python3.12, python3.11 or python3)." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed

run: venv
	$(BIN)/engram-memory tour --data-dir $(DATA_DIR)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit -q

contract: venv
	$(BIN)/pytest tests/contract -q

test: lint typecheck
	$(BIN)/pytest -q -n auto

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
