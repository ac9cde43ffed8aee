"""Calibration/evaluation slices of an indexed dataset and the vocabulary check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmctl.data.indexed import ShardWriter
from llmctl.errors import UserError
from llmctl.quant.calibration import check_vocab, open_tokens, split_tokens


def _dataset(tmp_path: Path, tokens: np.ndarray) -> str:
    prefix = tmp_path / "d_text_document"
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(tokens, np.asarray([len(tokens) // 2, len(tokens) - len(tokens) // 2]))
    writer.close()
    return str(prefix)


def test_head_calibrates_tail_evaluates_without_overlap(tmp_path: Path) -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    split = split_tokens(open_tokens(_dataset(tmp_path, tokens)), 4, 16, 100)
    assert split.calibration.shape == (4, 16) and split.calibration.dtype == np.int64
    assert split.calibration[0, 0] == 0 and split.calibration[-1, -1] == 63
    assert split.heldout.tolist() == list(range(900, 1000))
    check_vocab(split, tokenizer_vocab=1000, model_vocab=1024, source="d")


def test_too_little_data_and_foreign_token_ids_are_user_errors(tmp_path: Path) -> None:
    tokens = open_tokens(_dataset(tmp_path, np.arange(1000, dtype=np.uint16)))
    with pytest.raises(UserError, match="1000 tokens but 64 samples x 16 tokens"):
        split_tokens(tokens, 64, 16, 100)
    split = split_tokens(tokens, 4, 16, 100)
    with pytest.raises(UserError, match="token id 999 but the tokenizer has 512 tokens"):
        check_vocab(split, tokenizer_vocab=512, model_vocab=1024, source="d")


def test_missing_dataset_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        open_tokens(tmp_path / "nope")
