"""A tiny Hugging Face Llama with the chat tokenizer of `llmctl.data.sft_demo`, imported into
megatron-core, and preference packs of the synthetic echo task, for the DPO tests."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

SHAPE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "vocab_size": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}  # fmt: skip


def make_hf_llama(out: Path, tok_dir: Path, seed: int = 0, noise_of: Path | None = None) -> Path:
    """Save a random Llama (or `noise_of`'s weights plus N(0, 0.02) noise) with the tokenizer."""
    import torch
    import transformers as T

    torch.manual_seed(seed)
    config = T.LlamaConfig(**SHAPE, bos_token_id=0, eos_token_id=2, pad_token_id=0)
    if noise_of is None:
        model = T.LlamaForCausalLM(config)
    else:
        model = T.LlamaForCausalLM.from_pretrained(str(noise_of), dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(str(out))
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


def import_model(src: Path, out: Path) -> Path:
    """`llmctl import hf SRC --out OUT` (fp32) in this process; returns OUT."""
    from llmctl.hf.importer import import_hf, plan_import

    import_hf(plan_import(src, vocab_multiple=128, tp=1, dtype="fp32"), out)
    return out


def pairs_prefix(root: Path, tok_dir: Path, rows: list[dict[str, Any]], seq: int = 64) -> str:
    """`llmctl data prefs` of `rows` into ROOT/pairs."""
    from llmctl.data.prefs import PrefsConfig, build_prefs
    from llmctl.data.sft_demo import write_jsonl

    src = write_jsonl(root / "pairs.jsonl", rows)
    prefix = str(root / "pairs")
    build_prefs(PrefsConfig(inputs=[str(src)], output_prefix=prefix, tokenizer=str(tok_dir),
                            seq_length=seq))  # fmt: skip
    return prefix
