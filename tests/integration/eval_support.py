"""Builders shared by the `llmctl eval` tests: a tiny Llama whose tokenizer covers the shipped
task's digits, and perplexity as transformers computes it (the oracle)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from llmctl.eval.tasks import TASK_FILES

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "to be or not to be that is the question",
    "all that glitters is not gold and all who wander are not lost",
]


def _tokenizer_texts() -> list[str]:
    rows = [json.loads(x) for x in (TASK_FILES / "llmctl_arith.jsonl").read_text().splitlines()]
    arith = [f"Question: {r['question']} Answer: {' '.join(r['choices'])}" for r in rows]
    return TEXT * 10 + arith


def make_llama(out: Path, seed: int) -> Path:
    """A random 2-layer Llama with a BPE tokenizer (eos </s>), saved as a model directory."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(_tokenizer_texts(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(str(out))
    fast.save_pretrained(str(out))
    return out


def transformers_perplexity(model_dir: Path, held: Path, seq_len: int, limit: int) -> float:
    """Documents tokenized with `tokenizers` (no specials), each followed by </s>; windows of
    seq_len scored one at a time by transformers' own loss (labels=input_ids)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    ids: list[int] = []
    for line in held.read_text().splitlines():
        ids += [*tok.encode(json.loads(line)["text"], add_special_tokens=False).ids, eos]
    ids = ids[:limit]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    n, total = len(ids) // seq_len, 0.0
    with torch.no_grad():
        for w in range(n):
            window = torch.tensor([ids[w * seq_len : (w + 1) * seq_len]])
            total += float(model(input_ids=window, labels=window).loss) * (seq_len - 1)
    return math.exp(total / (n * (seq_len - 1)))
