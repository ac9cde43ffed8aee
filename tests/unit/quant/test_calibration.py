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


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmctl.data.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("tok") / "tok"
    train_bpe(["red green blue fox owl"] * 50, out, vocab_size=300)
    return out


def test_compressed_and_json_data_read_like_data_preprocess(bpe_dir: Path, tmp_path: Path) -> None:
    """`--data` takes the JSONL spellings `llmctl data preprocess` takes (.json, .ndjson, .gz,
    .zst), each tokenized exactly as the plain .jsonl (the oracle: HF tokenizers itself)."""
    import gzip
    import json

    import zstandard
    from tokenizers import Tokenizer

    from llmctl.quant.calibration import is_text_data, load_tokens

    texts = ["red fox", "green owl blue", "blue"]
    body = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    tok = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    expected = [i for t in texts for i in (*tok.encode(t).ids, eod)]
    files = {
        "a.json": body,
        "a.ndjson": body,
        "a.jsonl.gz": gzip.compress(body),
        "a.jsonl.zst": zstandard.ZstdCompressor().compress(body),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        assert is_text_data(tmp_path / name), name
        assert load_tokens(tmp_path / name, bpe_dir).tolist() == expected, name


def test_bad_bytes_in_text_data_are_named_not_replaced(bpe_dir: Path, tmp_path: Path) -> None:
    """Invalid UTF-8 is one line naming the file (and line), as in `llmctl data preprocess`;
    it is never silently replaced by U+FFFD in the text the model is calibrated and scored on."""
    from llmctl.quant.calibration import load_tokens

    (tmp_path / "a.txt").write_bytes(b"red fox " * 40 + b"\xff blue")
    with pytest.raises(UserError, match=r"a\.txt: invalid UTF-8 \(byte 320\)"):
        load_tokens(tmp_path / "a.txt", bpe_dir)
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "red"}\n{"text": "bl\xffue"}\n')
    with pytest.raises(UserError, match=r"b\.jsonl:2: invalid UTF-8"):
        load_tokens(tmp_path / "b.jsonl", bpe_dir)
    (tmp_path / "c.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "red"}\n')
    with pytest.raises(UserError, match=r"c\.jsonl:1: invalid JSON \(Unexpected UTF-8 BOM"):
        load_tokens(tmp_path / "c.jsonl", bpe_dir)


def test_short_data_without_calibration_asks_only_for_fewer_eval_tokens(tmp_path: Path) -> None:
    """RTN/FP8 take 0 calibration samples: lowering --num-samples or --seq-len cannot help."""
    tokens = open_tokens(_dataset(tmp_path, np.arange(10, dtype=np.uint16)))
    with pytest.raises(UserError, match=r"lower --eval-tokens$") as err:
        split_tokens(tokens, 0, 16, 32)
    assert "--num-samples" not in str(err.value) and "0 samples" not in str(err.value)
    with pytest.raises(UserError, match="lower --num-samples, --seq-len or --eval-tokens"):
        split_tokens(tokens, 2, 16, 4)


def test_prefix_given_with_its_suffix_or_a_folder(tmp_path: Path) -> None:
    """`--data d.bin` (or `.idx`) reads the dataset `d`, as megatron-core's IndexedDataset
    would from the prefix; a folder is one line saying what is expected."""
    from llmctl.quant.calibration import load_tokens

    prefix = _dataset(tmp_path, np.arange(100, dtype=np.uint16))
    for suffix in (".bin", ".idx"):
        assert load_tokens(prefix + suffix, None).tolist() == list(range(100))
    with pytest.raises(UserError, match=r"is a folder; pass an indexed dataset prefix"):
        load_tokens(tmp_path, None)


def test_cut_off_archive_is_refused(bpe_dir: Path, tmp_path: Path) -> None:
    """A .zst/.gz cut short is one line, never silently a shorter calibration set."""
    import gzip
    import json

    import zstandard

    from llmctl.quant.calibration import load_tokens

    body = "".join(json.dumps({"text": f"red fox {i}"}) + "\n" for i in range(3000)).encode()
    for name, packed in [
        ("a.jsonl.zst", zstandard.ZstdCompressor().compress(body)),
        ("a.jsonl.gz", gzip.compress(body)),
        ("a.txt.zst", zstandard.ZstdCompressor().compress(body)),
    ]:
        (tmp_path / name).write_bytes(packed[: len(packed) // 2])
        with pytest.raises(UserError, match=rf"{name}: truncated archive"):
            load_tokens(tmp_path / name, bpe_dir)
