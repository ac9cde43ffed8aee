#!/usr/bin/env bash
# The demo: what llmctl does on this CPU machine, end to end, on embedded defaults.
#   topology -> plan (Llama-3 70B on 64 H100s) -> corpus -> clean -> dedup -> tokenizer
#   -> preprocess
#   -> train the tiny model (megatron-core, local launcher, planned for this CPU as probed) -> export to Hugging Face
#   -> quantize W8A16 and W4A16 (llm-compressor), each with a before/after table.
# Everything lands under $DEMO_DIR (default demo_out/); nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
LLMCTL=${LLMCTL:-.venv/bin/llmctl}
OUT=${DEMO_DIR:-demo_out}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$OUT"
mkdir -p "$OUT/data"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "llmctl topo (this machine)"
$LLMCTL topo

step "llmctl plan: Llama-3 70B pretraining on 64 H100s, FP8"
$LLMCTL plan recipe=llama3_70b_pretrain_64gpu_h100_fp8

step "llmctl data corpus: the Python standard library's sources as JSONL documents"
$LLMCTL data corpus -o "$OUT/data/corpus.jsonl"

# The corpus is source code: the prose filters (Gopher, C4, FineWeb) would reject all of it, so
# the demo runs the character-class limits and PII replacement (e-mails, IPs, phone numbers).
step "llmctl data clean: character-class limits + PII replacement, before dedup"
$LLMCTL data clean "$OUT/data/corpus.jsonl" -o "$OUT/data/clean" --filters charset --pii \
  --set charset.max_non_ascii_ratio=0.01 --set charset.max_digit_ratio=0.25

step "llmctl data dedup: exact + MinHash near-duplicates"
$LLMCTL data dedup "$OUT/data/clean/corpus.jsonl" -o "$OUT/data/dedup"

step "llmctl data tokenizer train: byte-level BPE, 4096 tokens"
$LLMCTL data tokenizer train "$OUT/data/dedup/corpus.jsonl" -o "$OUT/data/tokenizer"

step "llmctl data preprocess: Megatron .bin/.idx"
$LLMCTL data preprocess "$OUT/data/dedup/corpus.jsonl" --tokenizer "$OUT/data/tokenizer" \
  -o "$OUT/data/stdlib"

step "llmctl train: tiny Llama-style model, megatron-core on CPU (local launcher)"
$LLMCTL train recipe=tiny_cpu cluster=probe train.run_dir="$OUT/run" \
  "data.prefixes=[$OUT/data/stdlib]" data.tokenizer="$OUT/data/tokenizer/tokenizer.json" \
  checkpoint.interval=25

step "llmctl checkpoints"
$LLMCTL checkpoints "$OUT/run"

step "llmctl export hf: Hugging Face LlamaForCausalLM"
$LLMCTL export hf "$OUT/run" --out "$OUT/hf"

# The tiny model's hidden size is 64: quantize fits the presets' group size 128 down to 64.
step "llmctl quantize: W8A16 (RTN)"
$LLMCTL quantize "$OUT/run" --preset w8a16_rtn -o "$OUT/quant-w8a16"

step "llmctl quantize: W4A16 (GPTQ)"
$LLMCTL quantize "$OUT/run" --preset w4a16_gptq -o "$OUT/quant-w4a16"

step "done: outputs under $OUT/"
