"""Training data: Megatron indexed datasets through GPTDataset and BlendedMegatronDatasetBuilder.

`resolve_data` runs before any training process starts (no torch): it checks that every
`.bin/.idx` prefix is readable, builds or finds the demo corpus when no prefix is given, and
checks the tokenizer's vocabulary against the model's (from `data.tokenizer`, else from the
`<prefix>.manifest.json` that `llmctl data preprocess` writes). The per-rank side (`build_datasets`,
`MicroBatches`) follows megatron's pretraining sampler: every optimizer step consumes
`global_batch_size` consecutive samples of the (shuffled) dataset; micro-batch k of step t on
DP rank r holds samples `t*gbs + k*mbs*dp + r*mbs ... + mbs`. Every layout therefore sees the
same samples in each step, which is what makes TP/PP/DP runs comparable with TP=1.

Supervised fine-tuning data (`llmctl data sft`, manifest kind "sft-packed") takes another
dataset class, `SftSamples`: each pack becomes one sample whose loss mask keeps only response
tokens, whose position ids restart in every example, and whose attention mask keeps every
token inside its own example (megatron's local attention replaces its causal mask with the
one given, so the mask given is causal and block-diagonal).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.run.data import DataSpec, data_fingerprint

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig


class _TokenizerInfo:
    """The two tokenizer facts GPTDataset uses: vocab size and the end-of-document id."""

    def __init__(self, vocab_size: int, eod: int, fingerprint: str = "") -> None:
        self.vocab_size = vocab_size
        self.eod = eod
        # Part of the dataset's cache key (megatron hashes it into the index file names).
        self.unique_identifiers = {
            "class": "llmctl",
            "vocab_size": vocab_size,
            "eod": eod,
            "data": fingerprint,
        }


def build_datasets(
    cfg: RootConfig, spec: DataSpec, num_train_samples: int, num_valid_samples: int
) -> tuple[Any, Any]:
    """Train and validation datasets (megatron GPTDataset, blended when several prefixes).

    Must be called on every rank (the builder synchronises index caching across ranks).
    """
    if getattr(spec, "pairs", False):  # DPO pairs (llmctl.train.dpo)
        from llmctl.train.dpo import build_pair_datasets

        return build_pair_datasets(cfg, spec, num_train_samples, num_valid_samples)
    if spec.sft:
        return build_sft_datasets(cfg, spec, num_train_samples, num_valid_samples)
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    weights = list(spec.weights) if spec.weights else None
    config = GPTDatasetConfig(
        random_seed=cfg.train.seed,
        sequence_length=cfg.model.seq_length,
        blend=(list(spec.prefixes), weights),
        split=cfg.data.split,
        path_to_cache=str(Path(spec.cache_dir) / "index-cache"),
        tokenizer=_TokenizerInfo(
            spec.tokenizer_vocab_size or cfg.model.vocab_size,
            spec.eod_id,
            data_fingerprint(spec.prefixes),
        ),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mid_level_dataset_surplus=0.005,
    )
    sizes = [num_train_samples, num_valid_samples, 0]
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return train, valid


EXTRA_KEYS = ("doc_ids", "ref_logps")
"""Sample fields batched when present: DPO's (llmctl.train.dpo)."""


class MicroBatches:
    """Iterator over this DP rank's micro-batches, megatron pretraining-sampler order.

    Args:
        dataset: A megatron dataset (indexable, dict samples with tokens/labels/...).
        micro_batch_size: Samples per micro-batch.
        dp_rank: Data-parallel rank.
        dp: Data-parallel size.
        consumed_samples: Global samples consumed before the first batch (for resume).
    """

    def __init__(
        self, dataset: Any, micro_batch_size: int, dp_rank: int, dp: int, consumed_samples: int = 0
    ) -> None:
        self.dataset = dataset
        self.mbs, self.dp_rank, self.dp = micro_batch_size, dp_rank, dp
        self.consumed_samples = consumed_samples

    def __iter__(self) -> MicroBatches:
        return self

    def __next__(self) -> dict[str, Any]:
        import torch

        start = self.consumed_samples + self.dp_rank * self.mbs
        n = len(self.dataset)
        samples = [self.dataset[(start + i) % n] for i in range(self.mbs)]
        self.consumed_samples += self.mbs * self.dp
        keys = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask", *EXTRA_KEYS)
        return {
            k: torch.stack([torch.as_tensor(s[k]) for s in samples])
            for k in keys
            if k in samples[0]
        }

    def state_dict(self) -> dict[str, int]:
        """Position in the sample stream (what a checkpoint must keep)."""
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position."""
        self.consumed_samples = int(state["consumed_samples"])


def split_range(n: int, split: str, part: int) -> tuple[int, int]:
    """[start, end) of split `part` (0 train, 1 valid) of n items, megatron's rounding."""
    parts = [float(x) for x in split.replace("/", ",").split(",")]
    parts = [*parts, 0.0, 0.0, 0.0][:3]
    bookends = [0]
    for p in parts:
        bookends.append(bookends[-1] + round(p / sum(parts) * n))
    return bookends[part], bookends[part + 1]


def sft_sample(tokens: Any, mask: Any, docs: Any) -> dict[str, Any]:
    """Training sample of one pack (numpy arrays of length seq_length + 1).

    tokens/labels are the pack shifted by one; a label is trained when it is a response token
    of the same example as its input; position ids restart at 0 in every example; the
    attention mask (True = masked, megatron's convention) is causal and block-diagonal.
    """
    import numpy as np
    import torch

    x = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    d = torch.from_numpy(np.asarray(docs, dtype=np.int64))
    m = torch.from_numpy(np.asarray(mask, dtype=np.int64))
    din, dout = d[:-1], d[1:]
    loss_mask = ((m[1:] > 0) & (dout == din) & (dout != 0)).float()
    s = len(din)
    idx = torch.arange(s)
    new = torch.ones(s, dtype=torch.bool)
    new[1:] = din[1:] != din[:-1]
    starts = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), dim=0).values
    allowed = (din[:, None] == din[None, :]) & torch.ones(s, s, dtype=torch.bool).tril()
    return {
        "tokens": x[:-1],
        "labels": x[1:],
        "loss_mask": loss_mask,
        "position_ids": idx - starts,
        "attention_mask": ~allowed.unsqueeze(0),
    }


class SftSamples:
    """`num_samples` samples drawn epoch by epoch (reshuffled each epoch) from SFT packs.

    Args:
        packs: (dataset, pack indices) pairs; the indices select this split.
        num_samples: Length of the sample stream.
        seed: Shuffle seed.
    """

    def __init__(self, packs: list[tuple[Any, range]], num_samples: int, seed: int) -> None:
        self.items = [(ds, i) for ds, r in packs for i in r]
        self.num_samples, self.seed = num_samples, seed
        self._orders: dict[int, Any] = {}

    def __len__(self) -> int:
        return self.num_samples if self.items else 0

    def _order(self, epoch: int) -> Any:
        import numpy as np

        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, epoch])
            self._orders = {epoch: rng.permutation(len(self.items))}
        return self._orders[epoch]

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self.items)
        ds, j = self.items[int(self._order(i // n)[i % n])]
        return sft_sample(*ds[j])


def _refuse_te_packing(packs: list[Any]) -> None:
    """Transformer Engine's causal attention ignores an explicit mask: packs of several
    examples would attend across examples there, so they are refused on that path."""
    import torch

    from llmctl.data.sft import sft_manifest
    from llmctl.run.precision import has_transformer_engine

    if not (torch.cuda.is_available() and has_transformer_engine()):
        return
    for ds in packs:
        manifest = sft_manifest(ds.prefix) or {}
        if manifest.get("counts", {}).get("max_examples_per_pack", 1) > 1:
            raise UserError(
                f"data prefix {ds.prefix}: packs hold several examples, and Transformer "
                "Engine attention would let them see each other; rebuild with "
                "`llmctl data sft --no-pack`"
            )


def build_sft_datasets(
    cfg: RootConfig, spec: DataSpec, num_train_samples: int, num_valid_samples: int
) -> tuple[Any, Any]:
    """Train and validation `SftSamples` over the packs of every prefix, split by data.split."""
    from llmctl.data.sft import PackedSft

    datasets = [PackedSft(p) for p in spec.prefixes]
    _refuse_te_packing(datasets)
    splits = [
        [(ds, range(*split_range(len(ds), cfg.data.split, part))) for ds in datasets]
        for part in (0, 1)
    ]
    seed = cfg.train.seed
    return (
        SftSamples(splits[0], num_train_samples, seed),
        SftSamples(splits[1], num_valid_samples, seed + 1),
    )
