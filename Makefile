# llmctl developer commands. `make help` lists them.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

help: ## List the make targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP) ## Create .venv with torch 2.13.0 (CPU), megatron-core and every extra

demo: venv ## Run the demo on this CPU machine (topology, plan, data, training, quantization)
	bash scripts/demo.sh

cluster-up: ## Start the local one-node SLURM cluster (root; Debian packages)
	bash scripts/slurm_local.sh up

cluster-down: ## Stop the local SLURM cluster
	bash scripts/slurm_local.sh down

test: venv ## Install what the tests need (incl. local SLURM) and run the whole suite
	@if [ -f scripts/slurm_local.sh ]; then bash scripts/slurm_local.sh up; fi
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: venv ## Unit tests only
	$(BIN)/python -m pytest tests/unit -q -m "not slow and not multiproc and not slurm"

lint: venv ## ruff (lint + format check) and mypy
	$(BIN)/ruff check llmctl tests benchmarks scripts
	$(BIN)/ruff format --check llmctl tests benchmarks scripts
	$(BIN)/mypy llmctl

format: venv ## Apply ruff formatting and safe fixes
	$(BIN)/ruff check --fix llmctl tests benchmarks scripts
	$(BIN)/ruff format llmctl tests benchmarks scripts

bench: venv ## Run the side-by-side benchmarks (writes figures to stdout; see docs/benchmarks.md)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean: ## Remove build outputs and caches (keeps .venv)
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache

.PHONY: help venv demo cluster-up cluster-down test test-fast lint format bench clean
