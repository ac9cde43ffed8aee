"""Small Hugging Face models made here with transformers (random weights, save_pretrained).

One per supported family, each with a real tokenizer (a word-level BPE trained here on a few
sentences) so that the directory is what a user would download: config.json, safetensors,
tokenizer.json, tokenizer_config.json. Norm weights and biases are randomised too, so a wrong
mapping of any tensor shows in the logits, and Q/K are scaled up so attention is sharp enough
for positions (RoPE and its Llama 3.1 scaling) to move the logits well past the tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "to be or not to be that is the question",
    "all that glitters is not gold and all who wander are not lost",
    "the rain in spain stays mainly in the plain",
] * 20
COMMON = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def family_specs() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (config class, model class, extra config fields)."""
    import transformers as T

    llama31_rope = {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    }  # fmt: skip
    v256 = {"vocab_size": 256}
    return {
        "llama": (T.LlamaConfig, T.LlamaForCausalLM, {"vocab_size": 300}),  # padded to 384
        "llama31": (T.LlamaConfig, T.LlamaForCausalLM, v256 | {"rope_parameters": llama31_rope}),
        "mistral": (T.MistralConfig, T.MistralForCausalLM, v256 | {"sliding_window": None}),
        "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, v256 | {"tie_word_embeddings": True}),
        "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                    {"vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2}),
    }  # fmt: skip


def save_tokenizer(out: Path, vocab_size: int = 200) -> None:
    """A BPE tokenizer trained on TEXT, saved the way transformers saves one (eos = </s>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator(
        TEXT, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special)
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(out))


def make_model(name: str, out: Path, seed: int = 0) -> Path:
    """Save a random model of family `name` (see family_specs) with a tokenizer to `out`."""
    import torch

    config_cls, model_cls, extra = family_specs()[name]
    torch.manual_seed(seed)
    config = config_cls(**COMMON, **extra, bos_token_id=1, eos_token_id=2)
    model = model_cls(config)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.normal_(1.0, 0.1)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.1)
            if pname.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)  # sharp attention: positions (RoPE, its scaling) change logits
    model.save_pretrained(str(out))
    save_tokenizer(out)
    return out


def hf_logits(model_dir: Path, ids: Any) -> Any:
    """Logits of the Hugging Face model in fp32 (the oracle)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def megatron_logits(out: Path, ids: Any) -> Any:
    """Logits of megatron-core's GPTModel (TP=1, fp32) loaded from an import's checkpoint."""
    import torch

    from llmctl.config import load_resolved
    from llmctl.hf.convert import empty_model, one_rank_megatron
    from llmctl.run.init_from import checkpoint_dir
    from llmctl.train.init_from import load_model_weights

    cfg = load_resolved(out / "config.yaml")
    with one_rank_megatron() as layout:
        model = empty_model(cfg, layout, "fp32")
        load_model_weights([model], checkpoint_dir(out))
        model.eval()
        with torch.no_grad():
            pos = torch.arange(ids.shape[1]).expand_as(ids)
            return model(ids, pos, None).float()


def load_safetensors_dir(path: Path) -> dict[str, Any]:
    """Every tensor of a directory's safetensors files."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def imported_with_data(tmp_path: Path, family: str = "mistral") -> tuple[Path, Path]:
    """Make a `family` model in tmp_path/hf, `llmctl import hf` it into tmp_path/mc, and
    preprocess TEXT with its own tokenizer into tmp_path/data/docs. Returns (hf dir, prefix)."""
    import json

    from typer.testing import CliRunner

    from llmctl.cli.main import app

    src = make_model(family, tmp_path / "hf")
    res = CliRunner().invoke(app, ["import", "hf", str(src), "--out", str(tmp_path / "mc")])
    assert res.exit_code == 0, res.output
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT))
    prefix = tmp_path / "data" / "docs"
    res = CliRunner().invoke(
        app, ["data", "preprocess", str(docs), "-t", str(src), "-o", str(prefix)]
    )
    assert res.exit_code == 0, res.output
    return src, prefix
