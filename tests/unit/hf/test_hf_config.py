"""Refusals of `llmctl import hf` / `checkpoint.init_from` that need only a config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.hf.config import load_hf_config, model_fields

pytest.importorskip("transformers")


def test_quantized_model_is_refused_naming_quantization_config(tmp_path: Path) -> None:
    """A compressed-tensors model (what `llmctl quantize` writes) holds packed integer
    weights under other tensor names: the import names `quantization_config` instead of
    listing the 'missing' float tensors."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    config.save_pretrained(tmp_path)
    model_fields(load_hf_config(tmp_path), tmp_path, name="m")  # the plain model imports
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"config\.json: quantization_config .*compressed-tensors"):
        model_fields(load_hf_config(tmp_path), tmp_path, name="m")
