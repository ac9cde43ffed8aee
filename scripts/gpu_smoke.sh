#!/usr/bin/env bash
# GPU smoke check for `llmctl train`: a ~1.1B-parameter Llama-style model (Llama-3.2-1B shape,
# 32k vocabulary) on ONE GPU for a few dozen steps in bf16, TE FP8 delayed scaling and TE FP8
# current scaling. Each run goes through `llmctl train` (planner check, run directory, torchrun,
# megatron-core with the Transformer Engine layer spec) and leaves RUN_DIR/perf.json with the
# plan's predictions next to the measured step time, tokens/s, TFLOP/s/GPU, MFU and peak memory.
# The summary compares them with the targets of issue 4 section 5:
#   bf16 MFU >= 40%; FP8 tokens/s >= 1.3x bf16; predicted step time and peak memory within 10%.
#
# Needs: a CUDA GPU, `pip install -e '.[train,gpu,data]'` (torch with CUDA, megatron-core,
# Transformer Engine). Usage:
#   scripts/gpu_smoke.sh [OUT_DIR]          (default: runs/gpu_smoke-<UTC stamp>)
# Environment: PYTHON (default python), STEPS (default 30), GBS (default 32), MBS (default 4),
#   SEQ (default 2048), RECIPES (default "bf16 fp8_delayed fp8_current"),
#   CLUSTER (default dgx_h200; the cluster config whose peak TFLOP/s the MFU is measured against).
set -euo pipefail

PYTHON=${PYTHON:-python}
STEPS=${STEPS:-30}
GBS=${GBS:-32}
MBS=${MBS:-4}
SEQ=${SEQ:-2048}
RECIPES=${RECIPES:-"bf16 fp8_delayed fp8_current"}
CLUSTER=${CLUSTER:-dgx_h200}
OUT=${1:-runs/gpu_smoke-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"

"$PYTHON" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_smoke: no CUDA device visible to torch")
print(f"gpu_smoke: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
try:
    import transformer_engine.pytorch  # noqa: F401
    import transformer_engine
    print(f"gpu_smoke: Transformer Engine {transformer_engine.__version__}")
except Exception as e:  # FP8 runs will fail with a clear UserError; bf16 still runs
    print(f"gpu_smoke: Transformer Engine not importable ({e}); FP8 runs will be refused")
EOF

# Demo corpus (stdlib sources -> BPE 4096 -> .bin/.idx), built once.
"$PYTHON" -c "from llmctl.data.demo import prepare_demo_data; prepare_demo_data('$OUT/demo')"

MODEL=(
  model.name=llama_1b model.num_layers=16 model.hidden_size=2048 model.ffn_hidden_size=8192
  model.num_attention_heads=32 model.num_query_groups=8 model.vocab_size=32768
  "model.seq_length=$SEQ" model.rotary_base=500000.0
)

for recipe in $RECIPES; do
  echo "gpu_smoke: === $recipe ==="
  "$PYTHON" -m llmctl train recipe=tiny_cpu "cluster=$CLUSTER" cluster.num_nodes=1 \
    cluster.gpus_per_node=1 "precision=$recipe" "${MODEL[@]}" \
    parallel.tp=1 parallel.pp=1 parallel.cp=1 parallel.dp=1 "parallel.micro_batch_size=$MBS" \
    parallel.recompute=none parallel.optimizer_sharding=distributed \
    "train.global_batch_size=$GBS" "train.train_iters=$STEPS" train.warmup_iters=5 \
    train.eval_interval=0 train.log_interval=5 "data.cache_dir=$OUT/demo" \
    "train.run_dir=$OUT/$recipe" --force \
    || echo "gpu_smoke: $recipe FAILED (see $OUT/$recipe/logs)"
done

"$PYTHON" - "$OUT" $RECIPES <<'EOF'
import json
import sys
from pathlib import Path

out, recipes = Path(sys.argv[1]), sys.argv[2:]
rows = {}
for r in recipes:
    p = out / r / "perf.json"
    rows[r] = json.loads(p.read_text()) if p.is_file() else None


def pct(pred, meas):
    return None if pred is None or meas in (None, 0) else 100.0 * (pred - meas) / meas


summary = {"runs": rows, "checks": {}}
print(f"\n{'recipe':12s} {'step_s':>8s} {'pred_s':>8s} {'err%':>6s} {'tok/s':>9s} "
      f"{'TFLOP/s':>8s} {'MFU':>6s} {'mem GiB':>8s} {'pred GiB':>8s} {'err%':>6s}")
for r, d in rows.items():
    if d is None:
        print(f"{r:12s} (no perf.json)")
        continue
    es, em = pct(d["predicted_step_s"], d["measured_step_s"]), pct(
        d["predicted_peak_mem_gib"], d["measured_peak_mem_gib"])
    f = lambda x, s: "n/a" if x is None else format(x, s)  # noqa: E731
    print(f"{r:12s} {d['measured_step_s']:8.3f} {f(d['predicted_step_s'], '8.3f')} "
          f"{f(es, '6.1f')} {d['tokens_per_s']:9.0f} {d['tflops_per_device']:8.1f} "
          f"{f(d['mfu'] and 100 * d['mfu'], '5.1f')}% {f(d['measured_peak_mem_gib'], '8.1f')} "
          f"{f(d['predicted_peak_mem_gib'], '8.1f')} {f(em, '6.1f')}")
    summary["checks"][r] = {"step_time_err_pct": es, "peak_mem_err_pct": em}
bf16 = rows.get("bf16")
if bf16:
    summary["checks"]["bf16_mfu_ge_40pct"] = (bf16["mfu"] or 0) >= 0.40
    for r in ("fp8_delayed", "fp8_current"):
        if rows.get(r):
            ratio = rows[r]["tokens_per_s"] / bf16["tokens_per_s"]
            summary["checks"][f"{r}_speedup_vs_bf16"] = ratio
            print(f"{r} / bf16 tokens/s: {ratio:.2f}x (target >= 1.3x)")
(out / "gpu_smoke_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"\ngpu_smoke: summary in {out / 'gpu_smoke_summary.json'}")
EOF
