"""Make a tiny Llama-shaped Hugging Face model here (for `make demo-finetune`); no download.

Writes OUT/ as `save_pretrained` does (config.json, model.safetensors) with a chat tokenizer
(byte-level BPE with a ChatML template, `llmctl.data.sft_demo.chat_tokenizer`), and
OUT.chats.jsonl: the synthetic "translate" task as chat and prompt/completion examples.
The weights are random: the demo shows the path (import, fine-tune, export, quantize), not a
useful model.

Usage: python scripts/make_tiny_hf.py OUT [--examples N]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--examples", type=int, default=2000)
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmctl.data.sft_demo import chat_tokenizer, translate_examples, write_jsonl

    chat_tokenizer(args.out, vocab_size=512)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(str(args.out))
    chats = args.out.with_name(args.out.name + ".chats.jsonl")
    write_jsonl(chats, translate_examples(args.examples))
    print(f"wrote {args.out} (LlamaForCausalLM, random weights) and {chats}")


if __name__ == "__main__":
    main()
