"""Builders shared by the quantization/export tests: a corpus, a tokenizer, an indexed dataset,
a tiny Llama trained a few dozen steps with transformers, and a reference perplexity.

The model's Linear input dims (hidden 128, FFN 256) are multiples of 128 so group-128 schemes
apply to every Linear. Training makes perplexity meaningful (far below the vocabulary size), so
quantization error shows up in it.
"""

from __future__ import annotations

import math
import shutil
import sysconfig
from pathlib import Path

import numpy as np

VOCAB = 512
HIDDEN = 128
FFN = 256
SEQ = 128


def corpus(max_bytes: int = 700_000, doc_chars: int = 4000) -> list[str]:
    """Python standard-library sources (always on disk, no download), cut into documents.

    Many documents, so megatron's 98/2 train/validation split gives both splits some.
    """
    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="ignore")
        texts += [text[i : i + doc_chars] for i in range(0, len(text), doc_chars)]
        size += len(text)
        if size > max_bytes:
            break
    return texts


def build_data(root: Path, vocab: int = VOCAB) -> tuple[Path, str]:
    """Train a BPE tokenizer and write the corpus as an indexed dataset (one doc per file)."""
    from llmctl.data.indexed import ShardWriter
    from llmctl.data.tokenizer import Tokenizer, resolve_tokenizer, train_bpe

    texts = corpus()
    tok_json = train_bpe(texts, root / "tokenizer", vocab_size=vocab)
    tok = Tokenizer(resolve_tokenizer(tok_json))
    docs = [np.asarray([*ids, tok.eod], dtype=np.uint16) for ids in tok.encode_batch(texts)]
    prefix = root / "corpus_text_document"
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(np.concatenate(docs), np.asarray([len(d) for d in docs]))
    writer.close()
    return tok_json, str(prefix)


def train_llama(root: Path, tok_json: Path, prefix: str, steps: int = 300) -> Path:
    """A 2-layer GQA Llama trained with AdamW on the first half of the corpus; saved as HF dir."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmctl.data.indexed import read_documents

    tokens = torch.from_numpy(np.concatenate(read_documents(prefix)).astype(np.int64))
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: oversubscription costs 20x here
    try:
        gen = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(steps):
            starts = torch.randint(0, len(tokens) // 2 - SEQ, (8,), generator=gen)
            batch = torch.stack([tokens[s : s + SEQ] for s in starts])
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad()
    finally:
        torch.set_num_threads(threads)
    out = root / "hf_model"
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_json.parent / name, out / name)
    return out


def reference_perplexity(model_dir: Path, tokens: np.ndarray, seq_len: int) -> float:
    """Perplexity as a user would compute it: transformers' own loss on fp32 reloads."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    n = len(tokens) // seq_len
    windows = torch.from_numpy(np.asarray(tokens[: n * seq_len], dtype=np.int64)).view(n, seq_len)
    total = 0.0
    with torch.no_grad():
        for w in windows:
            loss = model(input_ids=w[None], labels=w[None]).loss  # mean over seq_len - 1
            total += float(loss) * (seq_len - 1)
    return math.exp(total / (n * (seq_len - 1)))


def mean_token_kl(ref_dir: Path, model_dir: Path, tokens: np.ndarray, seq_len: int) -> float:
    """Mean per-token KL(reference || model) of next-token distributions, nats.

    Both models are loaded by transformers in fp32 (the quantized one decompressed by
    compressed-tensors) and scored on the same non-overlapping windows: the fidelity of a
    quantized model to its source, which, unlike perplexity on a tail of text, does not reward
    noise that happens to fit the evaluation text.
    """
    import torch
    from transformers import AutoModelForCausalLM

    def load(path: Path) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        for p in model.parameters():  # transformers 5.17 keeps a compressed Mixtral's router
            if p.is_floating_point():  # and merged experts in their stored bf16
                p.data = p.data.float()
        return model

    ref, model = load(ref_dir), load(model_dir)
    n = len(tokens) // seq_len
    windows = torch.from_numpy(np.asarray(tokens[: n * seq_len], dtype=np.int64)).view(n, seq_len)
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows.split(8):
            p = torch.log_softmax(ref(input_ids=w).logits.float(), dim=-1)
            q = torch.log_softmax(model(input_ids=w).logits.float(), dim=-1)
            total += float((p.exp() * (p - q)).sum())
            count += w.numel()
    return total / count


def megatron_logits(cfg: object, ckpt_dir: Path, tokens: np.ndarray) -> np.ndarray:
    """Logits of megatron's GPTModel (TP=1) loaded from the checkpoint."""
    import torch
    from megatron.core import dist_checkpointing

    from llmctl.plan import Layout, Sharding
    from llmctl.run.precision import recipe_for
    from llmctl.train import cpu_compat, parallel
    from llmctl.train import model as M

    parallel.init_distributed()
    layout = Layout(optimizer_sharding=Sharding.none)
    try:
        parallel.init_model_parallel(layout, 1, False)
        mc = cfg.model  # type: ignore[attr-defined]
        tc = M.transformer_config(
            mc,
            layout,
            cfg.precision,
            recipe_for(cfg.precision),
            on_gpu=False,  # type: ignore[attr-defined]
        )
        [model] = M.build_model_chunks(mc, tc, layout, use_te=False, seed=1)
        state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt_dir))
        model.load_state_dict(state["model"])
        model.eval()
        ids = torch.from_numpy(tokens)
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        with torch.no_grad():
            return model(ids, pos, None).float().numpy()
    finally:
        parallel.teardown(destroy_process_group=True)
        cpu_compat.uninstall()
