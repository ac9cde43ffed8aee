#!/usr/bin/env bash
# Fine-tuning demo: start from a Hugging Face model instead of pretraining, on this CPU machine,
# and go round the fine-tuning loop once (docs/finetune.md, "The demo end to end"):
#   make a tiny Llama-shaped HF model here (transformers, random weights, chat tokenizer)
#   -> llmctl import hf -> llmctl eval of the base (shipped task + held-out perplexity)
#   -> feedback JSONL (prompt, bad, corrected) + preference JSONL, the closed loop's inputs
#   -> llmctl data sft (chats + feedback: corrected as target) -> SFT with LoRA (init_from)
#   -> llmctl export hf --adapter (PEFT) and merged -> llmctl data prefs (prefs + feedback:
#   corrected vs bad) -> DPO from the merged SFT model (a LoRA checkpoint is not an init_from)
#   -> llmctl export hf -> llmctl eval base --vs dpo (before/after) -> llmctl quantize W8A16
#   -> llmctl eval of the quantized model against the fp export.
# Everything lands under $DEMO_DIR (default demo_finetune_out/); nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
LLMCTL=${LLMCTL:-.venv/bin/llmctl}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${DEMO_DIR:-demo_finetune_out}
STEPS=${STEPS:-30}
DPO_STEPS=${DPO_STEPS:-25}
LIMIT=${EVAL_LIMIT:-50}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$OUT"
mkdir -p "$OUT"
T0=$SECONDS
step() { printf '\n\033[1m== [%ss] %s\033[0m\n' "$((SECONDS - T0))" "$*"; }
EVAL=(--data "$OUT/held.jsonl" --limit "$LIMIT" --seq-len 128 --eval-tokens 4096)

step "a tiny Llama-shaped Hugging Face model, made here with transformers"
$PYTHON scripts/make_tiny_hf.py "$OUT/base"

step "llmctl import hf: megatron-core torch_dist checkpoint + recipe.yaml"
$LLMCTL import hf "$OUT/base" --out "$OUT/imported"

step "the loop's inputs: held-out text, preference pairs, and production feedback (bad -> corrected)"
$PYTHON - "$OUT" <<'PY'
import sys
from pathlib import Path

from llmctl.data.prefs_demo import name_pairs
from llmctl.data.sft_demo import translate_examples, write_jsonl

out = Path(sys.argv[1])
# held-out: new translate examples, rendered as the chat template renders them (the SFT format)
held = translate_examples(200, example_seed=7, chat_share=0.0)
turn = "<|im_start|>{}\n{}<|im_end|>\n"
text = [turn.format("user", e["prompt"]) + turn.format("assistant", e["completion"]) for e in held]
write_jsonl(out / "held.jsonl", [{"text": t} for t in text])
pairs = name_pairs(400, seed=0, feedback_share=0.25)
fb = [dict(p, model="demo/base") for p in pairs if "bad_response" in p]
write_jsonl(out / "prefs.jsonl", [p for p in pairs if "chosen" in p])
write_jsonl(out / "feedback.jsonl", fb)
print(f"held.jsonl 200 lines, prefs.jsonl {len(pairs) - len(fb)} pairs, feedback.jsonl {len(fb)} cases")
print("a feedback line:", (out / "feedback.jsonl").read_text().splitlines()[0])
PY

step "llmctl eval of the base: llmctl_arith (lm-eval, shipped) + held-out perplexity"
$LLMCTL eval "$OUT/base" "${EVAL[@]}" --json >"$OUT/eval_base.json"
$PYTHON - "$OUT/eval_base.json" <<'PY'
import json, sys

(m,) = json.load(open(sys.argv[1]))["models"]
acc = {k: v for k, v in m["tasks"]["llmctl_arith"].items() if k in ("acc", "acc_norm")}
print(f"base: llmctl_arith {acc}, perplexity {m['perplexity']:.2f} -> {sys.argv[1]}")
PY

step "llmctl data sft: chats + feedback (the corrected reply is the target), response-only loss"
$LLMCTL data sft "$OUT/base.chats.jsonl" "$OUT/feedback.jsonl" -o "$OUT/data/sft" -t "$OUT/base" \
  --seq-length 128

step "llmctl train: SFT with LoRA on the imported weights (train.peft=lora, checkpoint.init_from)"
$LLMCTL train recipe="$OUT/imported/recipe.yaml" train.run_dir="$OUT/sft" \
  checkpoint.init_from="$OUT/imported" train.peft=lora train.lora.rank=8 train.lora.alpha=16 \
  "train.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]" \
  "data.prefixes=[$OUT/data/sft]" train.train_iters="$STEPS" train.global_batch_size=8 \
  parallel.micro_batch_size=4 train.lr=5e-3 train.min_lr=5e-4 train.warmup_iters=2 \
  train.eval_interval="$STEPS" checkpoint.interval="$STEPS"

step "llmctl export hf: the LoRA run as a PEFT adapter directory, and merged (W + alpha/r B A)"
$LLMCTL export hf "$OUT/sft" --adapter --out "$OUT/sft-adapter"
$LLMCTL export hf "$OUT/sft" --out "$OUT/sft-merged"
du -sh "$OUT/sft-adapter" "$OUT/sft-merged"

step "llmctl data prefs: preference pairs + feedback (corrected = chosen, bad = rejected)"
$LLMCTL data prefs "$OUT/prefs.jsonl" "$OUT/feedback.jsonl" -o "$OUT/data/pairs" -t "$OUT/base" \
  --seq-length 64

step "llmctl train: DPO from the merged SFT model (a LoRA checkpoint is not an init_from: merged first)"
$LLMCTL train recipe="$OUT/imported/recipe.yaml" train.run_dir="$OUT/dpo" train.objective=dpo \
  checkpoint.init_from="hf:$OUT/sft-merged" "data.prefixes=[$OUT/data/pairs]" \
  "data.split='85,15,0'" train.train_iters="$DPO_STEPS" train.global_batch_size=16 \
  parallel.micro_batch_size=4 train.lr=1e-2 train.min_lr=1e-3 train.warmup_iters=2 \
  train.weight_decay=0 train.dpo.beta=0.5 train.eval_interval="$DPO_STEPS" train.eval_iters=4 \
  checkpoint.interval="$DPO_STEPS"
tail -n 1 "$OUT/dpo/metrics.jsonl"

step "llmctl export hf: the DPO model"
$LLMCTL export hf "$OUT/dpo" --out "$OUT/dpo-hf"

step "llmctl eval: before (base) / after (SFT LoRA + DPO)"
$LLMCTL eval "$OUT/base" --vs "$OUT/dpo-hf" "${EVAL[@]}"

step "llmctl quantize: W8A16 (RTN) of the DPO model"
$LLMCTL quantize "$OUT/dpo" --preset w8a16_rtn -o "$OUT/quant-w8a16"

step "llmctl eval: fp export vs its W8A16 quantization"
$LLMCTL eval "$OUT/dpo-hf" --vs "$OUT/quant-w8a16" "${EVAL[@]}"

step "done: outputs under $OUT/ in $((SECONDS - T0)) s"
