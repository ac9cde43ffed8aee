"""A fake-but-real Hugging Face directory (safetensors headers, config, tokenizer) and data.

No torch: weights are written with `safetensors.numpy`; the tokenizer is a real BPE trained on
a few lines. Enough for every check that runs before quantization starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HIDDEN, FFN, VOCAB = 128, 256, 300


def write_hf_dir(
    path: Path, *, ffn: int = FFN, arch: str = "LlamaForCausalLM", layers: int = 1
) -> Path:
    from safetensors.numpy import save_file

    from llmctl.data.tokenizer import train_bpe

    path.mkdir(parents=True)
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for i in range(layers):
        shapes |= {
            f"model.layers.{i}.input_layernorm.weight": (HIDDEN,),
            f"model.layers.{i}.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            f"model.layers.{i}.self_attn.k_proj.weight": (64, HIDDEN),
            f"model.layers.{i}.self_attn.v_proj.weight": (64, HIDDEN),
            f"model.layers.{i}.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            f"model.layers.{i}.mlp.gate_proj.weight": (ffn, HIDDEN),
            f"model.layers.{i}.mlp.up_proj.weight": (ffn, HIDDEN),
            f"model.layers.{i}.mlp.down_proj.weight": (HIDDEN, ffn),
        }
    save_file(
        {k: np.zeros(s, np.float32) for k, s in shapes.items()}, str(path / "model.safetensors")
    )
    config = {"architectures": [arch], "vocab_size": VOCAB, "max_position_embeddings": 256}
    (path / "config.json").write_text(json.dumps(config))
    texts = [f"def f{i}(x):\n    return x + {i}\n" * 20 for i in range(50)]
    tok = train_bpe(texts, path / "tok", vocab_size=VOCAB, min_frequency=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((tok.parent / name).read_bytes())
    return path


def write_data(prefix: Path, high: int, n: int = 40_000) -> str:
    from llmctl.data.indexed import ShardWriter

    tokens = (np.arange(n) * 7919 % high).astype(np.uint16)
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(tokens, np.asarray([n // 2, n - n // 2]))
    writer.close()
    return str(prefix)
