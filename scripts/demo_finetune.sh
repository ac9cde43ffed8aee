#!/usr/bin/env bash
# Fine-tuning demo: start from a Hugging Face model instead of pretraining, on this CPU machine.
#   make a tiny Llama-shaped HF model here (transformers, random weights, chat tokenizer)
#   -> llmctl import hf (megatron-core checkpoint + recipe) -> llmctl data sft (chat JSONL
#   -> packed sequences, response-only loss) -> llmctl train with checkpoint.init_from (weights
#   only) -> llmctl export hf -> llmctl quantize W8A16, with its before/after table.
# Everything lands under $DEMO_DIR (default demo_finetune_out/); nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
LLMCTL=${LLMCTL:-.venv/bin/llmctl}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${DEMO_DIR:-demo_finetune_out}
STEPS=${STEPS:-30}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$OUT"
mkdir -p "$OUT"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "a tiny Llama-shaped Hugging Face model, made here with transformers"
$PYTHON scripts/make_tiny_hf.py "$OUT/base"

step "llmctl import hf --dry-run: the name mapping and the model config it implies"
$LLMCTL import hf "$OUT/base" --dry-run

step "llmctl import hf: megatron-core torch_dist checkpoint + recipe.yaml"
$LLMCTL import hf "$OUT/base" --out "$OUT/imported"

step "llmctl data sft: chat / prompt-completion JSONL -> packed sequences, response-only loss"
$LLMCTL data sft "$OUT/base.chats.jsonl" -o "$OUT/data/sft" -t "$OUT/base" --seq-length 128

step "llmctl train: fine-tune from the imported weights (checkpoint.init_from, step 0)"
$LLMCTL train recipe="$OUT/imported/recipe.yaml" train.run_dir="$OUT/run" \
  "data.prefixes=[$OUT/data/sft]" train.train_iters="$STEPS" train.global_batch_size=8 \
  parallel.micro_batch_size=4 train.lr=1e-3 train.min_lr=1e-4 train.warmup_iters=2 \
  train.eval_interval=10 checkpoint.interval="$STEPS"

step "llmctl export hf: back to a Hugging Face LlamaForCausalLM"
$LLMCTL export hf "$OUT/run" --out "$OUT/hf"

step "llmctl quantize: W8A16 (RTN)"
$LLMCTL quantize "$OUT/run" --preset w8a16_rtn -o "$OUT/quant-w8a16"

step "done: outputs under $OUT/"
