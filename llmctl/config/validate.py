"""Checks that need several fields at once, run after overrides (STYLE rule 6)."""

from __future__ import annotations

import re

from llmctl.config.schema import (
    Activation,
    Dtype,
    Fp8Recipe,
    ModelFamily,
    PositionEmbedding,
    RootConfig,
)
from llmctl.errors import UserError


def validate(cfg: RootConfig) -> None:
    """Raise UserError naming the first inconsistent field."""
    _validate_model(cfg)
    _validate_parallel(cfg)
    _validate_precision(cfg)
    _validate_minimums(cfg)
    _validate_cluster(cfg)
    _validate_plan(cfg)
    _validate_metrics(cfg)
    _validate_checkpoint_dir(cfg)
    _validate_health(cfg)
    _validate_straggler(cfg)
    _validate_lora(cfg)
    _validate_dpo(cfg)
    if cfg.data.weights is not None and len(cfg.data.weights) != len(cfg.data.prefixes):
        raise UserError(
            f"data.weights has {len(cfg.data.weights)} entries but data.prefixes has "
            f"{len(cfg.data.prefixes)}"
        )


# (group, field, smallest valid value) of the schedule and checkpoint policy.
_MINIMUMS = (
    ("train", "train_iters", 1), ("train", "global_batch_size", 1), ("train", "warmup_iters", 0),
    ("train", "log_interval", 1), ("train", "eval_interval", 0), ("train", "eval_iters", 0),
    ("checkpoint", "interval", 0), ("checkpoint", "keep_last", 1), ("checkpoint", "keep_every", 1),
    ("checkpoint", "max_failed_saves", 1), ("checkpoint", "save_retries", 0),
)  # fmt: skip


def _validate_minimums(cfg: RootConfig) -> None:
    for group, name, least in _MINIMUMS:
        value = getattr(getattr(cfg, group), name)
        if value is not None and value < least:
            raise UserError(f"{group}.{name} must be >= {least}, got {value}")
    t = cfg.train
    if t.eval_interval > 0 and t.eval_iters < 1:
        raise UserError(
            f"train.eval_iters must be >= 1 when train.eval_interval > 0, got {t.eval_iters}"
        )
    if t.lr_decay_iters is not None and t.lr_decay_iters < 1:
        raise UserError(f"train.lr_decay_iters must be >= 1 or null, got {t.lr_decay_iters}")


def _validate_dpo(cfg: RootConfig) -> None:
    """DPO's frozen reference is the starting model, so DPO needs one (docs/finetune.md)."""
    if cfg.train.objective != "dpo":
        return
    d = cfg.train.dpo
    if not cfg.checkpoint.init_from:
        raise UserError(
            "train.objective=dpo needs a reference model: set checkpoint.init_from=RUN_DIR|"
            "CKPT_DIR|hf:DIR (the starting model is the frozen reference)"
        )
    if d.beta <= 0:
        raise UserError(f"train.dpo.beta must be > 0, got {d.beta}")
    if not 0 <= d.label_smoothing < 0.5:
        raise UserError(f"train.dpo.label_smoothing must be in [0, 0.5), got {d.label_smoothing}")
    if d.label_smoothing and d.loss != "sigmoid":
        raise UserError(f"train.dpo.label_smoothing applies to loss=sigmoid, not {d.loss}")
    if cfg.parallel.cp not in (None, 1):
        raise UserError(f"train.objective=dpo supports parallel.cp=1 only, got {cfg.parallel.cp}")


def _validate_checkpoint_dir(cfg: RootConfig) -> None:
    c = cfg.checkpoint
    if c.dir is not None and not re.match(r"^s3://[^/]+", str(c.dir)):
        raise UserError(
            f"checkpoint.dir must be null (RUN_DIR/checkpoints) or s3://BUCKET/PREFIX, got {c.dir}"
        )
    if c.upload_timeout_s <= 0:
        raise UserError(f"checkpoint.upload_timeout_s must be > 0, got {c.upload_timeout_s}")


def _validate_metrics(cfg: RootConfig) -> None:
    mc = cfg.train.metrics
    if not 0 <= mc.port <= 65535:
        raise UserError(f"train.metrics.port must be 0 (off) or a TCP port, got {mc.port}")
    if mc.push_interval_s <= 0:
        raise UserError(f"train.metrics.push_interval_s must be > 0, got {mc.push_interval_s}")


def _validate_health(cfg: RootConfig) -> None:
    h = cfg.train.health
    if h.hang_factor <= 0 or h.hang_floor_s <= 0:
        raise UserError(
            "train.health.hang_factor and train.health.hang_floor_s must be > 0, got "
            f"{h.hang_factor} and {h.hang_floor_s}"
        )
    if h.spike_factor != 0 and h.spike_factor <= 1:
        raise UserError(f"train.health.spike_factor must be 0 (off) or > 1, got {h.spike_factor}")
    if h.spike_window < 1 or h.max_divergences < 0:
        raise UserError(
            "train.health.spike_window must be >= 1 and train.health.max_divergences >= 0, got "
            f"{h.spike_window} and {h.max_divergences}"
        )


def _validate_straggler(cfg: RootConfig) -> None:
    sc = cfg.train.straggler
    if sc.window_steps < 0:
        raise UserError(
            f"train.straggler.window_steps must be >= 0 (0 = off), got {sc.window_steps}"
        )
    if not sc.margin > 0:
        raise UserError(f"train.straggler.margin must be > 0 (0.25 = 25 % slower), got {sc.margin}")
    if sc.windows < 1:
        raise UserError(f"train.straggler.windows must be >= 1, got {sc.windows}")


def _validate_model(cfg: RootConfig) -> None:
    m = cfg.model
    for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                 "num_query_groups", "vocab_size", "seq_length"):  # fmt: skip
        if getattr(m, name) < 1:
            raise UserError(f"model.{name} must be >= 1, got {getattr(m, name)}")
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise UserError(
            f"model.hidden_size {m.hidden_size} not divisible by "
            f"model.num_attention_heads {m.num_attention_heads} (set model.kv_channels)"
        )
    if m.num_attention_heads % m.num_query_groups:
        raise UserError(
            f"model.num_attention_heads {m.num_attention_heads} not divisible by "
            f"model.num_query_groups {m.num_query_groups}"
        )
    if m.hf_sliding_window and m.seq_length > m.hf_sliding_window:
        raise UserError(
            f"model.seq_length={m.seq_length} exceeds model.hf_sliding_window="
            f"{m.hf_sliding_window}: llmctl trains full causal attention, which equals the "
            f"imported model's sliding-window attention only within the window; use "
            f"model.seq_length<={m.hf_sliding_window}"
        )
    if m.num_experts and m.moe_router_topk > m.num_experts:
        raise UserError(f"model.moe_router_topk {m.moe_router_topk} > num_experts {m.num_experts}")
    if m.family == ModelFamily.gpt and m.position_embedding == PositionEmbedding.rope:
        pass  # allowed: GPT-style blocks with rotary positions


def _validate_parallel(cfg: RootConfig) -> None:
    p = cfg.parallel
    for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size"):
        value = getattr(p, name)
        if value is not None and value < 1:
            raise UserError(f"parallel.{name} must be >= 1, got {value}")
    if cfg.cluster.num_nodes < 1 or cfg.cluster.gpus_per_node < 1:
        raise UserError("cluster.num_nodes and cluster.gpus_per_node must be >= 1")
    if cfg.cluster.nodes_per_switch is not None and cfg.cluster.nodes_per_switch < 1:
        raise UserError(
            f"cluster.nodes_per_switch must be >= 1 (or null), got {cfg.cluster.nodes_per_switch}"
        )
    _validate_moe_parallel(cfg)


def _validate_moe_parallel(cfg: RootConfig) -> None:
    """Expert-only settings on a dense model, and megatron-core's own checks of
    overlap_moe_expert_parallel_comm that need no layout."""
    if cfg.parallel.etp is not None and not cfg.model.num_experts:
        raise UserError("parallel.etp needs an MoE model (model.num_experts > 0)")
    if not cfg.parallel.moe_a2a_overlap:
        return
    if not cfg.model.num_experts:
        raise UserError("parallel.moe_a2a_overlap=true needs an MoE model (model.num_experts > 0)")
    if cfg.precision.dtype not in (Dtype.bf16, Dtype.fp16, Dtype.fp8):
        raise UserError(
            "parallel.moe_a2a_overlap=true needs precision bf16, fp16 or fp8 (megatron-core "
            f"overlaps only 16-bit models), got precision.dtype={cfg.precision.dtype}"
        )


def _validate_precision(cfg: RootConfig) -> None:
    pr = cfg.precision
    if (pr.dtype == Dtype.fp8) != (pr.fp8_recipe != Fp8Recipe.none):
        raise UserError(
            f"precision.dtype={pr.dtype} needs precision.fp8_recipe "
            f"{'delayed or current' if pr.dtype == Dtype.fp8 else 'none'}, got {pr.fp8_recipe}"
        )
    if pr.params_dtype not in (Dtype.fp32, Dtype.bf16, Dtype.fp16):
        raise UserError(f"precision.params_dtype must be fp32, bf16 or fp16, got {pr.params_dtype}")


def _validate_cluster(cfg: RootConfig) -> None:
    """The hardware numbers the planner divides by must be positive (a `topo --out` file of an
    unknown GPU holds zeros until the user fills them in)."""
    c = cfg.cluster
    values = {"hbm_gib": c.hbm_gib, "hbm_bandwidth_gb_s": c.hbm_bandwidth_gb_s}
    values |= {f"peak_tflops.{k}": v for k, v in c.peak_tflops.items()}
    values |= {f"achievable_fraction.{k}": v for k, v in c.achievable_fraction.items()}
    for key, value in values.items():
        if not value > 0:
            raise UserError(
                f"cluster.{key} must be > 0, got {value} (cluster {c.name}): set it in the "
                "cluster file; `llmctl topo --gpu NAME -o FILE` fills it for a known GPU"
            )
    if c.nvlink_domain_size < 1 or c.sm_count < 0:
        raise UserError(
            f"cluster.nvlink_domain_size must be >= 1 and cluster.sm_count >= 0 (0 = ignore), "
            f"got {c.nvlink_domain_size} and {c.sm_count} (cluster {c.name})"
        )


def _validate_plan(cfg: RootConfig) -> None:
    """The search settings (checked here so that a bad one is a line, not a traceback)."""
    s = cfg.plan
    if s.top_k < 1:
        raise UserError(f"plan.top_k must be >= 1, got {s.top_k}")
    if not 0 <= s.headroom_fraction < 1:
        raise UserError(f"plan.headroom_fraction must be in [0, 1), got {s.headroom_fraction}")
    if not s.micro_batch_sizes or min(s.micro_batch_sizes) < 1:
        raise UserError(
            f"plan.micro_batch_sizes must be a non-empty list of sizes >= 1, "
            f"got {list(s.micro_batch_sizes)}"
        )


def _validate_lora(cfg: RootConfig) -> None:
    """`train.peft=lora`: adapter shape, known Hugging Face targets, a base to adapt."""
    from llmctl.config.schema import LORA_TARGETS, PeftMethod

    if cfg.train.peft != PeftMethod.lora:
        return
    lora, m = cfg.train.lora, cfg.model
    if lora.rank < 1:
        raise UserError(f"train.lora.rank must be >= 1, got {lora.rank}")
    if not lora.alpha > 0:
        raise UserError(f"train.lora.alpha must be > 0, got {lora.alpha}")
    if not 0.0 <= lora.dropout < 1.0:
        raise UserError(f"train.lora.dropout must be in [0, 1), got {lora.dropout}")
    if not lora.target_modules:
        raise UserError(
            f"train.lora.target_modules is empty (expected some of {', '.join(LORA_TARGETS)})"
        )
    for name in lora.target_modules:
        if name not in LORA_TARGETS:
            raise UserError(
                f"train.lora.target_modules: {name!r} is not a module of this model "
                f"(expected some of {', '.join(LORA_TARGETS)})"
            )
    if "gate_proj" in lora.target_modules and m.activation != Activation.swiglu:
        raise UserError(
            f"train.lora.target_modules: 'gate_proj' is not a module of this model "
            f"(model.activation={m.activation.value} has no gate; use up_proj for linear_fc1)"
        )
    if m.num_experts:
        raise UserError("train.peft=lora: MoE models (model.num_experts > 0) are not supported")
    if not cfg.checkpoint.init_from:
        raise UserError(
            "train.peft=lora needs the base model: set checkpoint.init_from "
            "(hf:DIR, an `llmctl import hf` output or a run directory)"
        )
