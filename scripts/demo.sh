#!/usr/bin/env bash
# The demo: what llmctl does on this machine, end to end, on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
LLMCTL=.venv/bin/llmctl
echo "== llmctl topo (this machine)"
$LLMCTL topo
echo "== llmctl plan: Llama-3 70B on 64 H100s"
$LLMCTL plan recipe=llama3_70b_pretrain_64gpu_h100_fp8
