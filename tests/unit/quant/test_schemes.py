"""Scheme/algorithm rules, bit arithmetic and the group-size check (pure Python)."""

from __future__ import annotations

import pytest

from llmctl.config.schema import QuantConfig
from llmctl.errors import UserError
from llmctl.quant.schemes import (
    Algorithm,
    Scheme,
    check_group_divisibility,
    is_ignored,
    spec_from_config,
    theoretical_bits_per_weight,
)


def test_defaults_are_w4a16_gptq_g128_ignoring_lm_head() -> None:
    spec = spec_from_config(QuantConfig())
    assert (spec.scheme, spec.algorithm, spec.group_size) == (Scheme.W4A16, Algorithm.GPTQ, 128)
    assert spec.ignore == ("lm_head",)
    assert spec.needs_calibration


@pytest.mark.parametrize(
    ("scheme", "algorithm", "message"),
    [
        ("W3A16", "rtn", "unknown quant.scheme"),
        ("W4A16", "magic", "unknown quant.algorithm"),
        ("FP8_DYNAMIC", "gptq", "cannot produce FP8_DYNAMIC; use one of rtn"),
        ("W8A8", "awq", "cannot produce W8A8"),
    ],
)
def test_impossible_requests_are_user_errors(scheme: str, algorithm: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        spec_from_config(QuantConfig(scheme=scheme, algorithm=algorithm))


def test_scheme_names_are_case_insensitive_and_per_channel_schemes_drop_groups() -> None:
    spec = spec_from_config(QuantConfig(scheme="w8a8", algorithm="RTN", group_size=128))
    assert spec.scheme == Scheme.W8A8 and spec.group_size is None and spec.strategy == "channel"
    assert spec.needs_calibration  # SmoothQuant reads activations even with RTN weights
    assert not spec_from_config(QuantConfig(scheme="W8A16", algorithm="rtn")).needs_calibration
    assert spec_from_config(QuantConfig(scheme="W4A16", group_size=0)).group_size is None


def test_theoretical_bits() -> None:
    g128 = spec_from_config(QuantConfig(scheme="W4A16"))
    assert g128.theoretical_bits(in_features=4096) == 4.125
    w8 = spec_from_config(QuantConfig(scheme="W8A16", algorithm="rtn", group_size=64))
    assert w8.theoretical_bits(4096) == 8.25
    chan = spec_from_config(QuantConfig(scheme="FP8_DYNAMIC", algorithm="rtn"))
    # one 16-bit scale per row: 256 inputs -> 8 + 16/256; lm_head ignored
    linears = {"a": (10, 256), "b": (10, 256), "lm_head": (1000, 7)}
    assert theoretical_bits_per_weight(chan, linears) == pytest.approx(8.0625)


def test_group_size_that_does_not_divide_names_module_and_fix() -> None:
    spec = spec_from_config(QuantConfig(scheme="W4A16"))
    linears = {"model.layers.0.mlp.down_proj": (64, 688), "lm_head": (100, 100)}
    with pytest.raises(UserError, match=r"down_proj \(688\); use --group-size 16"):
        check_group_divisibility(spec, linears)
    ok = spec_from_config(QuantConfig(scheme="W4A16", ignore=["lm_head", "re:.*down_proj$"]))
    check_group_divisibility(ok, linears)  # ignored modules are not checked


def test_ignore_matching_follows_compressed_tensors() -> None:
    assert is_ignored("lm_head", ["lm_head"])
    assert not is_ignored("model.lm_head_x", ["lm_head"])
    assert is_ignored("model.layers.3.mlp.down_proj", ["re:.*mlp\\.down_proj$"])


def test_w8a8_on_moe_is_refused_naming_the_architecture() -> None:
    """transformers 5.17 cannot load int8 (not packed) Mixtral experts back: refused up front."""
    from llmctl.quant.schemes import check_moe_scheme

    w8a8 = spec_from_config(QuantConfig(scheme="W8A8", algorithm="gptq"))
    with pytest.raises(UserError, match="W8A8 on MixtralForCausalLM"):
        check_moe_scheme(w8a8, "MixtralForCausalLM")
    check_moe_scheme(w8a8, "MistralForCausalLM")
    for scheme in ("W4A16", "W8A16", "FP8_DYNAMIC"):
        check_moe_scheme(
            spec_from_config(QuantConfig(scheme=scheme, algorithm="rtn")), "MixtralForCausalLM"
        )
