"""Quantization schemes, the algorithms each allows, and the checks that run before any work.

Pure Python (no torch): `llmctl quantize --dry-run` and every bad-input error come from here.

Why the bit counts look the way they do: a weight-only INT-b scheme with group size g stores b
bits per weight plus one 16-bit scale per g weights of a row, so INT4 g128 costs
4 + 16/128 = 4.125 bits and INT8 g128 8.125 (symmetric: no zero point). Per-channel schemes
(W8A8, FP8) store one scale per output row: 8 + 16/in_features bits. The scale width is the
model's dtype, which is why llmctl casts to bf16 before quantizing (fp32 scales would make INT4
g128 cost 4.25 bits). Embeddings, norms and ignored modules (lm_head) stay 16-bit and are not
counted in the per-weight figure, only in the overall size.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import QuantConfig


class Scheme(StrEnum):
    """Weight (and activation) formats written in the compressed-tensors layout."""

    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W8A8 = "W8A8"
    FP8_DYNAMIC = "FP8_DYNAMIC"


class Preset(StrEnum):
    """The shipped presets, configs/quant/<name>.yaml (a test keeps the two in step)."""

    default = "default"
    w8a16_rtn = "w8a16_rtn"
    w4a16_gptq = "w4a16_gptq"
    w4a16_awq = "w4a16_awq"
    w8a8_smoothquant = "w8a8_smoothquant"
    fp8_dynamic = "fp8_dynamic"


class Algorithm(StrEnum):
    """How weights are rounded: round-to-nearest, GPTQ (second order), AWQ (activation-aware)."""

    RTN = "rtn"
    GPTQ = "gptq"
    AWQ = "awq"


ALLOWED: dict[Scheme, tuple[Algorithm, ...]] = {
    Scheme.W8A16: (Algorithm.RTN, Algorithm.GPTQ, Algorithm.AWQ),
    Scheme.W4A16: (Algorithm.RTN, Algorithm.GPTQ, Algorithm.AWQ),
    Scheme.W8A8: (Algorithm.RTN, Algorithm.GPTQ),  # SmoothQuant first, then weights
    Scheme.FP8_DYNAMIC: (Algorithm.RTN,),  # FP8 needs no calibration: scales from the weights
}
WEIGHT_BITS: dict[Scheme, int] = {
    Scheme.W8A16: 8,
    Scheme.W4A16: 4,
    Scheme.W8A8: 8,
    Scheme.FP8_DYNAMIC: 8,
}
# Names of Linear modules in the Hugging Face decoder families llmctl quantizes.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "MixtralForCausalLM",
)


def _parse_enum(enum: type[StrEnum], value: str, what: str) -> Any:
    for member in enum:
        if member.value.lower() == str(value).lower():
            return member
    known = ", ".join(m.value for m in enum)
    raise UserError(f"unknown {what} {value!r}; choose one of {known}")


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSpec:
    """A checked quantization request. Build it with `spec_from_config`.

    `group_size` is None for per-channel weights (W8A8 and FP8 always; W8A16/W4A16 when the
    config's group_size is <= 0).
    """

    scheme: Scheme
    algorithm: Algorithm
    group_size: int | None
    ignore: tuple[str, ...]
    num_calibration_samples: int
    calibration_seq_length: int
    smoothing_strength: float

    @property
    def weight_bits(self) -> int:
        """Bits of one stored weight value (scales not included)."""
        return WEIGHT_BITS[self.scheme]

    @property
    def needs_calibration(self) -> bool:
        """GPTQ, AWQ and SmoothQuant read activations; RTN weight-only and FP8 do not."""
        return self.algorithm != Algorithm.RTN or self.scheme == Scheme.W8A8

    @property
    def strategy(self) -> str:
        """compressed-tensors weight strategy: `group` or `channel`."""
        return "group" if self.group_size else "channel"

    def theoretical_bits(self, in_features: int, scale_bits: int = 16) -> float:
        """Bits per weight of one quantized Linear with `in_features` inputs."""
        per = self.group_size or in_features
        return self.weight_bits + scale_bits / per

    def describe(self) -> str:
        """One line, e.g. `W4A16 gptq group 128, ignore lm_head`."""
        group = f"group {self.group_size}" if self.group_size else "per-channel"
        return f"{self.scheme.value} {self.algorithm.value} {group}, ignore {','.join(self.ignore)}"


def _integer(quant: QuantConfig, name: str) -> int:
    """`quant.<name>` as an int; a string, float or bool is refused, never truncated."""
    value = getattr(quant, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"quant.{name} must be an integer, got {value!r}")
    return value


def spec_from_config(quant: QuantConfig) -> QuantSpec:
    """Check `cfg.quant` (a `QuantConfig` or anything with its fields) and freeze it.

    Raises:
        UserError: Unknown scheme or algorithm, an algorithm the scheme does not allow, or
            out-of-range numbers.
    """
    scheme = _parse_enum(Scheme, quant.scheme, "quant.scheme")
    algorithm = _parse_enum(Algorithm, quant.algorithm, "quant.algorithm")
    if algorithm not in ALLOWED[scheme]:
        allowed = ", ".join(a.value for a in ALLOWED[scheme])
        raise UserError(
            f"quant.algorithm={algorithm.value} cannot produce {scheme.value}; use one of {allowed}"
        )
    weight_only = scheme in (Scheme.W8A16, Scheme.W4A16)
    group_size = _integer(quant, "group_size")
    group = group_size if weight_only and group_size > 0 else None
    for name in ("num_calibration_samples", "calibration_seq_length"):
        if _integer(quant, name) < 1:
            raise UserError(f"quant.{name} must be >= 1, got {getattr(quant, name)}")
    strength = quant.smoothing_strength
    if isinstance(strength, bool) or not isinstance(strength, int | float):
        raise UserError(f"quant.smoothing_strength must be a number, got {strength!r}")
    if not 0.0 < float(strength) < 1.0:
        raise UserError(f"quant.smoothing_strength must be in (0, 1), got {strength}")
    if isinstance(quant.ignore, str) or not all(isinstance(e, str) for e in quant.ignore):
        raise UserError(
            f"quant.ignore must be a list of module names or 're:' patterns, got {quant.ignore!r}"
        )
    for entry in quant.ignore:
        _check_pattern(str(entry))
    return QuantSpec(
        scheme=scheme,
        algorithm=algorithm,
        group_size=group,
        ignore=tuple(str(x) for x in quant.ignore),
        num_calibration_samples=int(quant.num_calibration_samples),
        calibration_seq_length=int(quant.calibration_seq_length),
        smoothing_strength=float(quant.smoothing_strength),
    )


def _check_pattern(entry: str) -> None:
    """An ignore entry `re:PATTERN` must compile.

    Raises:
        UserError: naming the entry and the regular-expression error.
    """
    if not entry.startswith("re:"):
        return
    try:
        re.compile(entry[3:])
    except re.error as exc:
        raise UserError(f"ignore entry {entry!r}: not a valid regular expression ({exc})") from None


def is_ignored(name: str, ignore: Iterable[str]) -> bool:
    """Whether a module name matches an ignore entry, as compressed-tensors matches them.

    An entry is an exact module name, or `re:<pattern>` matched at the start of the name.
    """
    for entry in ignore:
        if entry.startswith("re:"):
            if re.match(entry[3:], name):
                return True
        elif entry == name:
            return True
    return False


MOE_ARCHITECTURES: tuple[str, ...] = ("MixtralForCausalLM",)


def check_moe_scheme(spec: QuantSpec, architecture: str) -> None:
    """Refuse a scheme whose MoE output transformers cannot read back.

    transformers 5.17 decompresses quantized experts while merging them only from packed
    (`weight_packed`, W4A16/W8A16) or FP8 weights; W8A8's plain int8 `weight` fails its
    conversion on load (measured), so the output would be unusable.

    Raises:
        UserError: W8A8 on a MoE architecture.
    """
    if spec.scheme == Scheme.W8A8 and architecture in MOE_ARCHITECTURES:
        raise UserError(
            f"W8A8 on {architecture}: transformers cannot load int8 MoE experts back "
            "(only packed W4A16/W8A16 or FP8); use --scheme w4a16, w8a16 or fp8_dynamic"
        )


GROUP_SIZES = (128, 64, 32, 16)


def _offenders(spec: QuantSpec, linears: Mapping[str, tuple[int, int]], group: int) -> list[str]:
    return [
        f"{name} ({in_f})"
        for name, (_, in_f) in linears.items()
        if not is_ignored(name, spec.ignore) and in_f % group
    ]


def check_group_divisibility(spec: QuantSpec, linears: Mapping[str, tuple[int, int]]) -> None:
    """Every quantized Linear's input dimension must be a multiple of the group size.

    Args:
        spec: The request.
        linears: Module name -> (out_features, in_features) of every Linear.

    Raises:
        UserError: Naming every module that does not divide (with its input dimension) and
            the fixes.
    """
    if not spec.group_size:
        return
    bad = _offenders(spec, linears, spec.group_size)
    if not bad:
        return
    fits = [g for g in GROUP_SIZES if g < spec.group_size and not _offenders(spec, linears, g)]
    fix = f"--group-size {fits[0]}" if fits else "--group-size 0 (per-channel)"
    raise UserError(
        f"{spec.scheme.value} group size {spec.group_size} does not divide the input dimension "
        f"of {len(bad)} module(s): {', '.join(bad)}; use {fix}, leave them unquantized with "
        f"--ignore 're:...', or give the model dimensions that are multiples of "
        f"{spec.group_size}"
    )


def fit_group_size(
    spec: QuantSpec, linears: Mapping[str, tuple[int, int]]
) -> tuple[QuantSpec, str | None]:
    """The preset's group size, or the largest of 128/64/32/16 below it that divides every
    quantized Linear (per channel when none does), with a note saying why it changed."""
    if not spec.group_size or not _offenders(spec, linears, spec.group_size):
        return spec, None
    fits = [g for g in GROUP_SIZES if g < spec.group_size and not _offenders(spec, linears, g)]
    group = fits[0] if fits else None
    bad = _offenders(spec, linears, spec.group_size)
    chosen = f"group size {group}" if group else "per-channel scales"
    note = (
        f"the preset's group size {spec.group_size} does not divide the input dimension of "
        f"{len(bad)} module(s) (first: {bad[0]}); using {chosen} (--group-size to choose)"
    )
    return replace(spec, group_size=group), note


def quantized_linears(spec: QuantSpec, linears: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """Name -> in_features of the Linears the spec quantizes (ignore list applied)."""
    return {n: shape[1] for n, shape in linears.items() if not is_ignored(n, spec.ignore)}


def theoretical_bits_per_weight(spec: QuantSpec, linears: Mapping[str, tuple[int, int]]) -> float:
    """Weight-count-weighted mean of `theoretical_bits` over the quantized Linears."""
    total_bits = total = 0.0
    for name, (out_f, in_f) in linears.items():
        if is_ignored(name, spec.ignore):
            continue
        total += out_f * in_f
        total_bits += out_f * in_f * spec.theoretical_bits(in_f)
    return total_bits / total if total else 0.0
