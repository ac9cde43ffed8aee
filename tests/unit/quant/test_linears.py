"""The Linears of a model directory and the bits per weight of an output, from headers only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmctl.hf import modeldir
from llmctl.quant.linears import linear_shapes, quantized_bits_per_weight


def test_headers_give_linear_shapes_and_sizes(hf_dir: Path) -> None:
    tensors = modeldir.read_tensors(hf_dir)
    assert tensors["lm_head.weight"].shape == (300, 128)
    assert tensors["lm_head.weight"].num_bytes == 300 * 128 * 4
    linears = linear_shapes(tensors)
    assert linears["model.layers.0.mlp.down_proj"] == (128, 256)
    assert "model.embed_tokens" not in linears and "model.norm" not in linears
    assert set(linears) == {
        "lm_head",
        *(f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"),
        *(f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")),
    }
    assert modeldir.tokenizer_vocab_size(hf_dir) <= 300


def test_bits_per_weight_of_a_compressed_layout(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    # the compressed-tensors pack-quantized layout of one 4-bit g128 Linear [256, 512]
    save_file(
        {
            "l.weight_packed": np.zeros((256, 512 // 8), np.int32),
            "l.weight_scale": np.zeros((256, 4), np.float16),
            "l.weight_shape": np.array([256, 512], np.int64),
            "dense.weight": np.zeros((10, 10), np.float16),
        },
        str(tmp_path / "model.safetensors"),
    )
    bits, count = quantized_bits_per_weight(modeldir.read_tensors(tmp_path), 4)
    assert (bits, count) == (4.125, 1)
