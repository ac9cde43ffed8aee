"""Held-out tokens for perplexity: a user's file or a run's own validation split.

Why the validation split is cut this way: megatron-core's dataset builder splits a GPT indexed
dataset by sequences (one per document in llmctl's data), at `int(round(c * num_sequences))`
for the cumulative normalized parts c of `data.split` ("98,2,0": sequences [0, round(.98 n))
train, [round(.98 n), round(n)) validate). So the run's validation split is the token range of
those sequences, read through a memory map (memory does not grow with the corpus); the first
`--eval-tokens` of it are scored.

Other data (`--data`): a JSONL (`{"text": ...}` per line) or text file is tokenized with each
model's own tokenizer, documents joined by its end-of-document token (the reader of `llmctl
quantize --data`); an indexed dataset prefix is used as stored, from its first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.errors import UserError


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOut:
    """Where held-out tokens come from (the tokens are loaded per model: `tokens_for`)."""

    data: str
    what: str  # "validation split of PREFIX (docs a-b of n)", "FILE", "PREFIX"
    split: str | None = None  # data.split, for a run's own validation split

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"data": self.data, "what": self.what}


def validation_range(num_sequences: int, split: str) -> tuple[int, int]:
    """Sequences [begin, end) of the validation part, as megatron-core's builder cuts them."""
    parts = [float(x) for x in split.replace("/", ",").split(",")]
    parts = [*parts, 0.0, 0.0, 0.0][:3]
    train, valid = parts[0] / sum(parts), parts[1] / sum(parts)
    return round(train * num_sequences), round((train + valid) * num_sequences)


def validation_tokens(prefix: str, split: str) -> np.ndarray:
    """The tokens of the validation sequences of an indexed dataset (a memory-map slice).

    Raises:
        UserError: Missing files, or a split whose validation part holds no sequence.
    """
    from llmctl.data.indexed import read_lengths
    from llmctl.quant.calibration import open_tokens
    from llmctl.run.data import check_split

    check_split(prefix, split)  # the one wording of a malformed split
    lengths = read_lengths(prefix)
    begin, end = validation_range(len(lengths), split)
    if end <= begin:
        raise UserError(f"data prefix {prefix}: the validation part of data.split={split} is empty")
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return open_tokens(prefix)[int(offsets[begin]) : int(offsets[end])]


def run_heldout(prefix: str, split: str) -> HeldOut:
    """A run's own held-out data: the validation split of its first prefix."""
    from llmctl.data.indexed import read_header

    n = read_header(prefix).num_sequences
    begin, end = validation_range(n, split)
    what = f"validation split of {prefix} (sequences {begin}-{end - 1} of {n}, split {split})"
    return HeldOut(data=prefix, what=what, split=split)


def user_heldout(data: str) -> HeldOut:
    """`--data`: a JSONL/text file or an indexed prefix.

    Raises:
        UserError: A missing file or prefix.
    """
    from llmctl.quant.calibration import is_text_data

    if is_text_data(data):
        if not Path(data).is_file():
            raise UserError(f"--data {data} not found")
        return HeldOut(data=data, what=f"{data} (tokenized with each model's tokenizer)")
    from llmctl.quant.calibration import open_tokens

    open_tokens(data)  # the files exist and are an index
    return HeldOut(data=data, what=f"{data} (indexed, from its first token)")


def tokens_for(heldout: HeldOut, tokenizer: Path | None, num_tokens: int) -> np.ndarray:
    """Up to `num_tokens` held-out tokens as int64, for a model with this tokenizer.

    Raises:
        UserError: Text data and no tokenizer, or no tokens at all.
    """
    from llmctl.quant.calibration import load_tokens

    if heldout.split is not None:
        stream = validation_tokens(heldout.data, heldout.split)
    else:
        stream = load_tokens(heldout.data, tokenizer)
    out = np.asarray(stream[:num_tokens], dtype=np.int64)
    if not len(out):
        raise UserError(f"held-out data {heldout.data} has no tokens")
    return out
