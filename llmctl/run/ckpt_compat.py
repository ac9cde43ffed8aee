"""Whether a checkpoint can load into a run, decided before any process starts (no torch).

The model fields must match; the optimizer sharding must match; the layout dims that changed
are returned (megatron-core's distributed checkpoints reshard across them on load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value as _v
from llmctl.errors import UserError
from llmctl.plan.layout import Layout
from llmctl.run.layout import layout_record

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

# Model fields that must match between a checkpoint and the run that loads it.
ARCH_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "vocab_size", "normalization", "activation", "position_embedding",
    "tied_embeddings", "add_bias_linear", "num_experts",
)  # fmt: skip
LAYOUT_DIMS = ("tp", "pp", "vpp", "cp", "ep", "dp")


def uses_torch_adam() -> bool:
    """Whether megatron's optimizer runs on torch's Adam (no Transformer Engine, no Apex)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        try:
            import apex  # noqa: F401
        except Exception:
            return True
    return False


def check_optimizer_checkpointable(layout: Layout) -> None:
    """Refuse distributed-optimizer checkpoints where megatron-core cannot reload them.

    Raises:
        UserError: On the torch-Adam path (CPU, or GPU without TE/Apex) with sharding on.
    """
    if layout.optimizer_sharding == "distributed" and uses_torch_adam():
        raise UserError(
            "checkpoint: parallel.optimizer_sharding=distributed cannot be checkpointed on "
            "megatron-core's torch-Adam path (no Transformer Engine or Apex, e.g. CPU): its "
            "checkpoints do not reload there; use parallel.optimizer_sharding=none or "
            "checkpoint.interval=0"
        )


def check_compatible(saved: dict[str, Any], cfg: RootConfig, layout: Layout) -> list[str]:
    """Compare a checkpoint's train_state with this run. Returns the layout dims that changed.

    Raises:
        UserError: If a model field differs (no layout change can load other weights), or the
            optimizer sharding changed.
    """
    saved_model = saved.get("model", {})
    for name in ARCH_FIELDS:
        have = getattr(cfg.model, name, None)
        if name in saved_model and _v(saved_model[name]) != _v(have):
            raise UserError(
                f"checkpoint was saved with model.{name}={saved_model[name]}, this run has "
                f"{have}; a checkpoint only loads into the same model"
            )
    old, now = saved.get("layout", {}), layout_record(layout, cfg.train.global_batch_size)
    if old.get("optimizer_sharding", "none") != now["optimizer_sharding"]:
        raise UserError(
            f"checkpoint: parallel.optimizer_sharding changed ({old.get('optimizer_sharding')} -> "
            f"{layout.optimizer_sharding}); the optimizer state cannot be converted"
        )
    changed = [d for d in LAYOUT_DIMS if d in old and old[d] != now[d]]  # in the saved form
    if layout.optimizer_sharding == "full" and changed:
        moved = [d for d in changed if d in fsdp_fixed_dims()]
        if moved:
            dims = ", ".join(f"{d} {old[d]}->{now[d]}" for d in moved)
            raise UserError(
                f"checkpoint: an FSDP checkpoint does not reshard ({dims}): {FSDP_RESHARD_WHY}; "
                "resume with the layout it was saved with"
            )
    return changed


#: Why an FSDP checkpoint keeps the dimensions of `fsdp_fixed_dims` (docs/train.md).
FSDP_RESHARD_WHY = (
    "only TP, PP and DP changes of an FSDP checkpoint were measured to resume correctly"
)

#: What an FSDP checkpoint may change on resume, as measured (docs/train.md): from DP=2 a
#: SwiGLU model resumed at DP=1 and PP=2 bit for bit, at DP=4, TP=2 and TP=2 x DP=2 within
#: 1e-6 of the losses; GELU likewise.
FSDP_RESHARDABLE = ("tp", "pp", "dp")


def fsdp_fixed_dims() -> tuple[str, ...]:
    """Layout dimensions an FSDP checkpoint must keep (those not in `FSDP_RESHARDABLE`)."""
    return tuple(d for d in LAYOUT_DIMS if d not in FSDP_RESHARDABLE)
