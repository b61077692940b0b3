# Engram Memory — the obvious targets. `make run` and `make test` are all a newcomer needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
BIN := $(VENV)/bin
DATA_DIR ?= .engram

.PHONY: help venv run test lint typecheck unit contract format clean conformance sam-check cloud-check

help:
	@echo "make run        = ./run   start Engram Memory on the embedded default (data in $(DATA_DIR)/)"
	@echo "make test       = ./test  lint, type-check and run every test tier"
	@echo "make unit | contract | lint | typecheck | format | clean"
	@echo "make cloud-check    the AWS stack as built: translated template (cfn-lint, checkov), sam build,"
	@echo "                    every function run from the build on python3.12 against moto"

venv:
	@python3 scripts/devenv.py

run:
	./run --data-dir $(DATA_DIR)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit -q

contract: venv
	$(BIN)/pytest tests/contract -q

test:
	./test

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The MCP conformance suite (@modelcontextprotocol/conformance, pinned in conformance/) against the
# embedded server on loopback; needs npm (the suite runs on Node >= 22, bundled if older). See conformance/README.md.
conformance: venv
	ENGRAM_BIN=$(BIN) bash conformance/run.sh

# The SAM toolchain on template.yaml (sam validate --lint, sam build) from its own venv (.venv-sam/);
# sam build needs python3.12 (found on PATH or under pyenv). See scripts/sam_check.sh.
sam-check:
	bash scripts/sam_check.sh

# The cloud gate on the artifact (includes sam-check): the SAM-translated template through cfn-lint
# (no cycle), checkov and cfn-guard (Control Tower, well-architected; infra/accepted-findings.yaml),
# sam build, then every function run from .aws-sam-style build folders on python3.12 -I against
# moto out of process, and the end-to-end MCP flow. Tools in .venv-cloud/, .venv-sam/ and
# .cfn-guard/ (npm). See scripts/cloud_check.sh.
cloud-check:
	bash scripts/cloud_check.sh
