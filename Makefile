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

demo-finetune: venv ## HF model made here: import, eval, SFT with LoRA, DPO, export, quantize, eval (CPU)
	bash scripts/demo_finetune.sh

cluster-up: ## Start the local one-node SLURM cluster (root; Debian packages)
	bash scripts/slurm_local.sh up

cluster-down: ## Stop the local SLURM cluster
	bash scripts/slurm_local.sh down

XDIST ?= -n 2 --dist loadgroup

# The integration tests run one after the other (real clusters, namespaces, timed runs); the
# unit tests on two workers (XDIST=) except those tests/conftest.py puts in the serial group.
# Both parts always run; the target fails if either did.
test: venv lint ## Install what the tests need (incl. local SLURM), lint, run the whole suite
	bash scripts/slurm_local.sh up
	bash scripts/prometheus_local.sh
	rc=0; \
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest tests/unit $(XDIST) $(PYTEST_ARGS) || rc=$$?; \
	exit $$rc

test-fast: venv ## Unit tests only
	$(BIN)/python -m pytest tests/unit -q -m "not slow and not multiproc and not slurm"

lint: venv ## ruff (lint + format check) and mypy
	$(BIN)/ruff check llmctl tests benchmarks scripts
	$(BIN)/ruff format --check llmctl tests benchmarks scripts
	$(BIN)/mypy llmctl

format: venv ## Apply ruff formatting and safe fixes
	$(BIN)/ruff check --fix llmctl tests benchmarks scripts
	$(BIN)/ruff format llmctl tests benchmarks scripts

bench: bench-plan bench-train bench-ckpt bench-data bench-quant ## Run every side-by-side benchmark

bench-plan: venv ## Planner speed and accuracy against published tables
	$(BIN)/python benchmarks/plan_speed.py && $(BIN)/python benchmarks/plan_accuracy.py

bench-train: venv ## llmctl train against a hand-written megatron-core loop (CPU)
	$(BIN)/python benchmarks/train_overhead.py

bench-ckpt: venv ## Asynchronous against synchronous checkpoint saves (>= 1 GiB state)
	$(BIN)/python benchmarks/ckpt_async.py

bench-data: venv ## Dedup against rensa/datasketch; preprocess (Megatron-LM side by side if MEGATRON_LM=path)
	RAYON_NUM_THREADS=1 $(BIN)/python benchmarks/data_dedup.py
	$(BIN)/python benchmarks/data_preprocess.py $(if $(MEGATRON_LM),--megatron-lm $(MEGATRON_LM),)

bench-quant: venv ## llmctl quantize against calling llm-compressor directly
	$(BIN)/python benchmarks/quant_compare.py

gpu-smoke: venv ## On a GPU machine: TE FP8/bf16 training vs the plan (see docs/benchmarks.md)
	bash scripts/gpu_smoke.sh

clean: ## Remove build outputs and caches (keeps .venv)
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache

.PHONY: help venv demo demo-finetune cluster-up cluster-down test test-fast lint format bench bench-plan \
	bench-train bench-ckpt bench-data bench-quant gpu-smoke clean
