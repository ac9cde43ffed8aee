"""Precision recipes by name: what each needs (CUDA, Transformer Engine) and the megatron flags.

Why the CPU rule is strict: fp32 is the only recipe that runs on CPU. bf16 and fp16 would run
through megatron's mixed-precision optimizer on CPU only via the compatibility layer's type
spoofing, with CPU bf16 GEMMs several times slower than fp32 and no numerics worth checking,
so a half-precision run on CPU is refused rather than silently run in a mode nobody uses.
FP8 needs Transformer Engine and a Hopper/Blackwell GPU. A GPU-only recipe requested on CPU is
a `UserError` before any process starts, never a silent fallback to fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import PrecisionConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionRecipe:
    """A named precision recipe and its hardware requirements."""

    name: str
    requires_cuda: bool
    requires_te: bool
    description: str


RECIPES: dict[str, PrecisionRecipe] = {
    r.name: r
    for r in (
        PrecisionRecipe(name="fp32", requires_cuda=False, requires_te=False, description="fp32"),
        PrecisionRecipe(
            name="bf16", requires_cuda=True, requires_te=False, description="bf16 + fp32 main"
        ),
        PrecisionRecipe(
            name="fp16", requires_cuda=True, requires_te=False, description="fp16 + loss scaling"
        ),
        PrecisionRecipe(
            name="fp8_delayed",
            requires_cuda=True,
            requires_te=True,
            description="TE FP8, delayed scaling (amax history)",
        ),
        PrecisionRecipe(
            name="fp8_current",
            requires_cuda=True,
            requires_te=True,
            description="TE FP8, per-tensor current scaling",
        ),
    )
}


def _value(x: object) -> str:
    return str(getattr(x, "value", x))


def recipe_for(precision: PrecisionConfig) -> PrecisionRecipe:
    """Look up the recipe of a `PrecisionConfig`, by its compute dtype and FP8 recipe.

    Raises:
        UserError: If the combination names no known recipe.
    """
    dtype, fp8 = _value(precision.dtype), _value(precision.fp8_recipe)
    name = f"fp8_{fp8}" if dtype == "fp8" else dtype
    if name not in RECIPES:
        known = ", ".join(RECIPES)
        raise UserError(f"unknown precision dtype={dtype} fp8_recipe={fp8}; known: {known}")
    return RECIPES[name]


def check_precision(precision: PrecisionConfig, *, has_cuda: bool, has_te: bool) -> PrecisionRecipe:
    """Check that this machine can run the precision recipe.

    Args:
        precision: `cfg.precision`.
        has_cuda: Whether the processes will have a CUDA device.
        has_te: Whether Transformer Engine imports.

    Returns:
        The recipe.

    Raises:
        UserError: If the recipe needs a GPU or Transformer Engine that is not there.
    """
    recipe = recipe_for(precision)
    if recipe.requires_cuda and not has_cuda:
        raise UserError(
            f"precision={recipe.name} needs a CUDA GPU (none found); use precision=fp32 on CPU"
        )
    if recipe.requires_te and not has_te:
        raise UserError(
            f"precision={recipe.name} needs Transformer Engine: pip install 'llmctl[gpu]'"
        )
    asked = _value(precision.attention_backend)
    if asked in ("flash", "fused") and not has_te:
        raise UserError(
            f"precision.attention_backend={asked} needs a CUDA GPU with Transformer Engine; "
            "without them only the unfused kernel runs: use precision.attention_backend=unfused "
            "(or auto)"
        )
    return recipe


def megatron_attention_backend(precision: PrecisionConfig, *, use_te: bool) -> str:
    """megatron-core's `AttnBackend` name for `precision.attention_backend`.

    Why: without Transformer Engine the layer spec is megatron's local one, whose core
    attention is megatron's own unfused `DotProductAttention` (`local`); with TE the choice
    goes to TE's `DotProductAttention` (flash, fused, unfused; auto lets TE pick). Backends
    that cannot run are refused earlier, by `check_precision`.
    """
    if not use_te:
        return "local"
    return _value(precision.attention_backend)


def megatron_precision_kwargs(
    precision: PrecisionConfig, recipe: PrecisionRecipe
) -> dict[str, Any]:
    """TransformerConfig keyword arguments for a recipe (params_dtype, bf16/fp16, fp8)."""
    import torch

    params = _value(precision.params_dtype)
    kwargs: dict[str, Any] = {
        "params_dtype": torch.bfloat16 if params == "bf16" else torch.float32,
        "bf16": recipe.name in ("bf16", "fp8_delayed", "fp8_current"),
        "fp16": recipe.name == "fp16",
    }
    if recipe.requires_te:
        kwargs["fp8"] = "hybrid"  # e4m3 forward, e5m2 gradients
        kwargs["fp8_recipe"] = "delayed" if recipe.name == "fp8_delayed" else "tensorwise"
        kwargs["fp8_amax_history_len"] = int(precision.fp8_amax_history_len)
        kwargs["fp8_amax_compute_algo"] = "max"
    if kwargs["bf16"] or kwargs["fp16"]:
        kwargs["params_dtype"] = torch.bfloat16 if kwargs["bf16"] else torch.float16
    return kwargs


def has_transformer_engine() -> bool:
    """Whether Transformer Engine's PyTorch extension imports here."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True
