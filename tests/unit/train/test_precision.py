from __future__ import annotations

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.precision import check_precision, recipe_for


@pytest.mark.parametrize("name", ["bf16", "fp8_delayed", "fp8_current"])
def test_gpu_only_precision_on_cpu_is_a_user_error(name):
    cfg = compose("tiny_cpu", [f"precision={name}"])
    with pytest.raises(UserError, match=f"precision={name} needs a CUDA GPU"):
        check_precision(cfg.precision, has_cuda=False, has_te=False)


def test_fp8_without_transformer_engine_names_the_extra():
    cfg = compose("tiny_cpu", ["precision=fp8_delayed"])
    with pytest.raises(UserError, match=r"llmctl\[gpu\]"):
        check_precision(cfg.precision, has_cuda=True, has_te=False)


def test_recipes_resolve_by_dtype_and_fp8_recipe():
    for name in ("fp32", "bf16", "fp8_delayed", "fp8_current"):
        assert recipe_for(compose("tiny_cpu", [f"precision={name}"]).precision).name == name
    assert check_precision(
        compose("tiny_cpu", []).precision, has_cuda=False, has_te=False
    ).name == ("fp32")


def test_megatron_kwargs_for_fp8_current_scaling():
    from llmctl.run.precision import megatron_precision_kwargs

    cfg = compose("tiny_cpu", ["precision=fp8_current"])
    kw = megatron_precision_kwargs(cfg.precision, recipe_for(cfg.precision))
    assert kw["fp8"] == "hybrid" and kw["fp8_recipe"] == "tensorwise" and kw["bf16"] is True
