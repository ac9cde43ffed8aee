"""The shared name/shape table of `llmctl import hf` / `llmctl export hf`, without megatron.

Oracles: the tensor names transformers' `save_pretrained` writes (a model built from a config)
must be exactly the Hugging Face side of the table; megatron's QKV layout is checked against an
explicit construction of its group-interleaved order (per group: its query heads, one key, one
value).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.hf import mapping as M
from llmctl.hf.config import padded_vocab


@pytest.mark.parametrize("arch", list(M.FAMILIES))
def test_table_covers_exactly_what_save_pretrained_writes(arch: str, tmp_path: Path) -> None:
    import transformers as T
    from safetensors import safe_open

    config_cls = getattr(T, arch.replace("ForCausalLM", "Config"))
    extra = {"num_local_experts": 3} if arch.startswith("Mixtral") else {}
    config = config_cls(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, **extra)  # fmt: skip
    getattr(T, arch)(config).save_pretrained(str(tmp_path))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    family = M.FAMILIES[arch]
    table = M.expand(family, 2, extra.get("num_local_experts", 0), tied=False)
    covered = {h for _, hf, _ in table for h in hf}
    assert covered == names


def test_qkv_fusion_is_megatrons_group_order_and_inverts() -> None:
    import torch

    heads = M.Heads(num_heads=4, num_groups=2, head_dim=3)
    q = torch.arange(4 * 3 * 5, dtype=torch.float32).reshape(12, 5)
    k = -torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(6, 5) - 1
    v = 1000 + torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(6, 5)
    fused = M.fuse_qkv(q, k, v, heads)
    expected = torch.cat([q[0:6], k[0:3], v[0:3], q[6:12], k[3:6], v[3:6]])
    assert torch.equal(fused, expected)
    back = M.split_qkv(fused, heads)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v), strict=True))
    bias = M.fuse_qkv(q[:, 0], k[:, 0], v[:, 0], heads)
    assert torch.equal(bias, expected[:, 0])


def test_gate_up_round_trip() -> None:
    import torch

    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    fused = M.to_megatron(M.Op.gate_up, [gate, up], M.Heads(1, 1, 1))
    assert torch.equal(fused[:6], gate) and torch.equal(fused[6:], up)
    assert all(torch.equal(a, b) for a, b in zip(M.to_hf(M.Op.gate_up, fused, M.Heads(1, 1, 1)),
                                                 (gate, up), strict=True))  # fmt: skip


def test_vocab_padding() -> None:
    assert padded_vocab(32000, 128, 8) == 32000
    assert padded_vocab(151646, 128, 4) == 151680
    assert padded_vocab(300, 128, 2) == 384
    with pytest.raises(UserError, match="does not split over tp=5; pass --vocab-multiple 640"):
        padded_vocab(300, 128, 5)
    with pytest.raises(UserError, match="--vocab-multiple must be >= 1"):
        padded_vocab(300, 0, 1)
    with pytest.raises(UserError, match="--tp must be >= 1, got 0"):  # was ZeroDivisionError
        padded_vocab(300, 128, 0)
