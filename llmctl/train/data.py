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

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<eod>", "<|end_of_text|>")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """Checked inputs of the data pipeline."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None
    tokenizer_path: str | None
    tokenizer_vocab_size: int | None
    eod_id: int
    cache_dir: str
    sft: bool = False
    """The prefixes are packed SFT datasets (`llmctl data sft`)."""


def default_cache_dir(cfg: Any) -> Path:
    """`data.cache_dir`, or ~/.cache/llmctl/demo."""
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir).expanduser()
    return Path.home() / ".cache" / "llmctl" / "demo"


def check_prefix(prefix: str) -> None:
    """Raise `UserError` unless `prefix.bin` and `prefix.idx` exist and are readable."""
    for ext in (".bin", ".idx"):
        path = Path(prefix + ext)
        if not path.is_file():
            raise UserError(
                f"data prefix {prefix}: {path} not found; build it with `llmctl data preprocess`"
            )
        if not os.access(path, os.R_OK):
            raise UserError(f"data prefix {prefix}: {path} is not readable (check permissions)")


def num_documents(prefix: str) -> int:
    """Documents in an indexed dataset, read from the `.idx` header (magic, version, dtype,
    sequence count, document count) without mapping the file."""
    with open(prefix + ".idx", "rb") as f:
        header = f.read(34)
    if len(header) < 34 or not header.startswith(b"MMIDIDX"):
        raise UserError(f"data prefix {prefix}: {prefix}.idx is not a Megatron index file")
    # the document index starts with a 0 bookend, so it holds documents + 1 entries
    return int.from_bytes(header[26:34], "little") - 1


def check_split(prefix: str, split: str) -> None:
    """Refuse a split that leaves the train or validation part without documents.

    megatron-core's GPTDataset never returns when asked for samples from an empty split, so
    this is checked up front with the same rounding megatron uses for the split bookends.
    """
    try:
        parts = [float(x) for x in split.replace("/", ",").split(",")]
    except ValueError:
        raise UserError(f"data.split={split!r}: expected numbers like '98,2,0'") from None
    parts = [*parts, 0.0, 0.0, 0.0][:3]
    if sum(parts) <= 0 or min(parts) < 0:
        raise UserError(f"data.split={split!r}: parts must be >= 0 with a positive sum")
    n = num_documents(prefix)
    bookends = [0]
    for part in parts:
        bookends.append(bookends[-1] + round(part / sum(parts) * n))
    for name, i in (("train", 0), ("validation", 1)):
        if bookends[i + 1] - bookends[i] < 1:
            raise UserError(
                f"data prefix {prefix}: {n} documents leave the {name} split of "
                f"data.split={split} empty; use more documents or change data.split"
            )


def tokenizer_info(path: str) -> tuple[int, int]:
    """(vocab size including added tokens, end-of-document id) of a `tokenizer.json`.

    Raises:
        UserError: If the file is missing or not a tokenizers JSON file.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"data.tokenizer={path} not found (expected a tokenizer.json)")
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(p))
    except Exception as e:
        raise UserError(f"data.tokenizer={path} is not a readable tokenizer.json: {e}") from e
    eod = next((i for t in EOD_CANDIDATES if (i := tok.token_to_id(t)) is not None), 0)
    return tok.get_vocab_size(with_added_tokens=True), eod


def _demo_data(cfg: Any) -> str:
    """Build (or reuse) the demo corpus under the cache directory; returns its prefix."""
    from llmctl.data.demo import prepare_demo_data

    return str(prepare_demo_data(default_cache_dir(cfg)))


def manifest_tokenizer(prefix: str) -> dict[str, Any] | None:
    """The tokenizer record `llmctl data preprocess` left in `<prefix>.manifest.json`, if any."""
    path = Path(prefix + ".manifest.json")
    if not path.is_file():
        return None
    try:
        tok = json.loads(path.read_text()).get("tokenizer")
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not readable JSON ({e}); rerun `llmctl data preprocess`") from e
    return tok if isinstance(tok, dict) else None


def _tokenizer_facts(
    prefixes: list[str], tok_path: str | None
) -> tuple[str | None, int | None, int]:
    """(tokenizer path, vocab size, EOD id) from data.tokenizer or the datasets' manifests."""
    if tok_path:
        vocab, eod = tokenizer_info(tok_path)
        return tok_path, vocab, eod
    records = [(p, t) for p in prefixes if (t := manifest_tokenizer(p)) is not None]
    digests = {t.get("sha256") for _, t in records}
    if len(digests) > 1:
        names = ", ".join(p for p, _ in records)
        raise UserError(f"data.prefixes were tokenized with different tokenizers: {names}")
    if not records:
        return None, None, 0
    tok = records[0][1]
    return tok.get("path"), int(tok["vocab_size"]), int(tok.get("eod", 0))


def resolve_data(cfg: Any) -> DataSpec:
    """Check the data config and return what the ranks need. Runs before processes start.

    Raises:
        UserError: Missing/unreadable prefix, weight count mismatch, or a tokenizer whose
            vocabulary is larger than `model.vocab_size`.
    """
    check_sft_wanted(cfg)
    prefixes = list(cfg.data.prefixes) or [_demo_data(cfg)]
    for prefix in prefixes:
        check_prefix(prefix)
        check_split(prefix, cfg.data.split)
    weights = cfg.data.weights
    if weights is not None and len(weights) != len(prefixes):
        raise UserError(
            f"data.weights has {len(weights)} entries but data.prefixes has {len(prefixes)}"
        )
    sft = _check_sft(cfg, prefixes)
    tok_path, vocab, eod = _tokenizer_facts(prefixes, cfg.data.tokenizer)
    if vocab is not None and vocab > cfg.model.vocab_size:
        raise UserError(
            f"tokenizer {tok_path} has {vocab} tokens but model.vocab_size="
            f"{cfg.model.vocab_size}; set model.vocab_size >= {vocab} or retokenize"
        )
    return DataSpec(
        prefixes=tuple(prefixes),
        weights=None if weights is None else tuple(float(w) for w in weights),
        tokenizer_path=tok_path,
        tokenizer_vocab_size=vocab,
        eod_id=eod,
        cache_dir=str(default_cache_dir(cfg)),
        sft=sft,
    )


def check_sft_wanted(cfg: Any) -> None:
    """`data.sft=true` (recipe tiny_cpu_sft) needs explicit data.prefixes: the demo corpus is
    pretraining text, on which SFT would silently train every token.

    Raises:
        UserError: data.sft=true with empty data.prefixes.
    """
    if getattr(cfg.data, "sft", None) is True and not cfg.data.prefixes:
        raise UserError(
            "data.sft=true needs data.prefixes: SFT packs from `llmctl data sft` (the demo "
            "corpus is pretraining data); or pass data.sft=null to train on every token"
        )


def _check_sft(cfg: Any, prefixes: list[str]) -> bool:
    """Whether the prefixes are SFT packs; checks them against `data.sft`, their companions
    and their sequence length."""
    from llmctl.data.sft import output_prefixes, packed_seq_length

    seq = packed_seq_length(prefixes)
    wanted = getattr(cfg.data, "sft", None)
    if seq is None and wanted is True:
        raise UserError(
            f"data.sft=true but data prefix {prefixes[0]} is not an SFT pack (no sft-packed "
            "manifest): its loss would cover every token; make packs with `llmctl data sft`, "
            "or pass data.sft=null to train on every token"
        )
    if seq is not None and wanted is False:
        raise UserError(
            f"data.sft=false but data prefix {prefixes[0]} is an SFT pack (`llmctl data sft`); "
            "pass data.sft=true or data.sft=null to fine-tune on it"
        )
    if seq is None:
        return False
    if seq != cfg.model.seq_length:
        raise UserError(
            f"data.prefixes were packed for seq_length {seq} but model.seq_length="
            f"{cfg.model.seq_length}; set model.seq_length={seq} or rerun `llmctl data sft`"
        )
    if cfg.data.weights is not None:
        raise UserError("data.weights: SFT packs are concatenated, not blended; drop weights")
    for prefix in prefixes:
        for part in output_prefixes(prefix)[1:]:
            check_prefix(part)
    return True


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


def data_fingerprint(prefixes: tuple[str, ...]) -> str:
    """Digest of the `.idx` files, so indices cached for data rebuilt at the same path are not
    reused (megatron keys its index cache on the path and the config, not the content)."""
    digest = hashlib.sha256()
    for prefix in prefixes:
        with open(prefix + ".idx", "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def build_datasets(
    cfg: Any, spec: DataSpec, num_train_samples: int, num_valid_samples: int
) -> tuple[Any, Any]:
    """Train and validation datasets (megatron GPTDataset, blended when several prefixes).

    Must be called on every rank (the builder synchronises index caching across ranks).
    """
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
        keys = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")
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
    from llmctl.train.precision import has_transformer_engine

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
    cfg: Any, spec: DataSpec, num_train_samples: int, num_valid_samples: int
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
