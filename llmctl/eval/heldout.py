"""Held-out tokens for perplexity: a user's file or a run's own validation split.

Why the validation split is cut this way: megatron-core's GPTDataset splits an indexed dataset
by documents, with bookends `round(part / sum(parts) * num_documents)` accumulated over the
parts of `data.split` ("98,2,0": the first 98 % of documents train, the next 2 % validate), the
rounding `llmctl.run.data.check_split` already mirrors. So the run's validation split is the
token range of documents [bookend 1, bookend 2), read through a memory map (memory does not grow
with the corpus); the first `--eval-tokens` of it are scored.

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


def split_bookends(num_documents: int, split: str) -> list[int]:
    """Document bookends of megatron-core's split (train, validation, test)."""
    parts = [float(x) for x in split.replace("/", ",").split(",")]
    parts = [*parts, 0.0, 0.0, 0.0][:3]
    bookends = [0]
    for part in parts:
        bookends.append(bookends[-1] + round(part / sum(parts) * num_documents))
    return bookends


def validation_tokens(prefix: str, split: str) -> np.ndarray:
    """The tokens of the validation documents of an indexed dataset (a memory map slice).

    Raises:
        UserError: Missing files, or a split whose validation part holds no document.
    """
    from llmctl.data.indexed import read_doc_indices, read_lengths
    from llmctl.quant.calibration import open_tokens
    from llmctl.run.data import check_split

    check_split(prefix, split)  # the one wording of a split that leaves validation empty
    tokens = open_tokens(prefix)
    doc_index, lengths = read_doc_indices(prefix), read_lengths(prefix)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    first, end = split_bookends(len(doc_index) - 1, split)[1:3]
    return tokens[int(offsets[doc_index[first]]) : int(offsets[doc_index[end]])]


def run_heldout(prefix: str, split: str) -> HeldOut:
    """A run's own held-out data: the validation split of its first prefix."""
    from llmctl.run.data import num_documents

    n = num_documents(prefix)
    first, end = split_bookends(n, split)[1:3]
    what = f"validation split of {prefix} (documents {first}-{end - 1} of {n}, split {split})"
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
