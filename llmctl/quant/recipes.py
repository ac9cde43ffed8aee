"""llm-compressor modifiers for a `QuantSpec` (imports llm-compressor; call only when running).

The schemes are spelled out as compressed-tensors `QuantizationScheme`s rather than taken from
the library's presets, because the presets change between releases (in llm-compressor 0.14 the
`W8A16` preset is INT8 group-128, not per-channel) and llmctl promises the group size its
config states. All integer weights are symmetric (no zero point), which is what vLLM's
Marlin/Machete INT4/INT8 weight-only kernels and its W8A8 kernels read.
"""

from __future__ import annotations

from typing import Any

from llmctl.quant.schemes import Algorithm, QuantSpec, Scheme


def quantization_scheme(spec: QuantSpec) -> Any:
    """The compressed-tensors `QuantizationScheme` (targets: every Linear)."""
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationScheme,
        preset_name_to_scheme,
    )

    if spec.scheme == Scheme.FP8_DYNAMIC:
        return preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    weights = QuantizationArgs(
        num_bits=spec.weight_bits,
        type="int",
        symmetric=True,
        strategy=spec.strategy,
        group_size=spec.group_size,
    )
    activations = None
    if spec.scheme == Scheme.W8A8:  # int8 per-token activations, quantized at run time
        activations = QuantizationArgs(
            num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True
        )
    return QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)


def build_recipe(spec: QuantSpec) -> list[Any]:
    """The modifiers `oneshot` applies, in order."""
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    groups = {"group_0": quantization_scheme(spec)}
    ignore = list(spec.ignore)
    recipe: list[Any] = []
    if spec.scheme == Scheme.W8A8:
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        recipe.append(SmoothQuantModifier(smoothing_strength=spec.smoothing_strength))
    if spec.algorithm == Algorithm.GPTQ:
        recipe.append(GPTQModifier(config_groups=groups, ignore=ignore))
    elif spec.algorithm == Algorithm.AWQ:
        recipe.append(AWQModifier(config_groups=groups, ignore=ignore))  # type: ignore[no-untyped-call]
    else:
        recipe.append(QuantizationModifier(config_groups=groups, ignore=ignore))
    return recipe
