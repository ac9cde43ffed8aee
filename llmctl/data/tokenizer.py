"""Tokenizers from local files, and training a byte-level BPE tokenizer for the demo models.

Three kinds load from disk, never from a hub: a Hugging Face `tokenizer.json` (or a folder
holding one), a SentencePiece `.model`, and a tiktoken BPE ranks file (`*.tiktoken`, base64
token and rank per line, as tiktoken publishes them). Each is wrapped with the same small
surface: `encode_batch`, `eod` and `vocab_size`, and an identity (kind, file, SHA-256) that goes
into manifests.

The end-of-document id follows Megatron: the tokenizer's EOS token (`<|endoftext|>` for the
tokenizers trained here). A tiktoken ranks file carries no special tokens, so `<|endoftext|>`
is given the id right after the last rank.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

EOD_TOKEN = "<|endoftext|>"
TIKTOKEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"""
    r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


class TokenizerKind(StrEnum):
    """Tokenizer file formats llmctl reads."""

    HF = "hf"
    SENTENCEPIECE = "sentencepiece"
    TIKTOKEN = "tiktoken"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Where a tokenizer lives and how to read it; cheap to pickle into workers."""

    path: Path
    kind: TokenizerKind
    eod_token: str | None = None

    def identity(self) -> dict[str, str]:
        """Kind, file and SHA-256: enough to tell whether two runs used the same tokenizer."""
        return {"kind": self.kind.value, "path": str(self.path), "sha256": _sha256(self.path)}


def resolve_tokenizer(path: str | Path, kind: str | None = None) -> TokenizerSpec:
    """Find the tokenizer file and its kind (from the name unless `kind` is given).

    Raises:
        UserError: the path does not exist or its kind cannot be told.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UserError(f"tokenizer {path} not found (want tokenizer.json, .model or .tiktoken)")
    if kind is not None:
        return TokenizerSpec(p, TokenizerKind(kind))
    if p.suffix == ".json":
        return TokenizerSpec(p, TokenizerKind.HF)
    if p.suffix == ".model":
        return TokenizerSpec(p, TokenizerKind.SENTENCEPIECE)
    if p.suffix == ".tiktoken":
        return TokenizerSpec(p, TokenizerKind.TIKTOKEN)
    raise UserError(f"tokenizer {p}: unknown kind; pass --tokenizer-kind hf|sentencepiece|tiktoken")


class Tokenizer:
    """A loaded tokenizer: `encode_batch(texts) -> list[list[int]]`, `eod`, `vocab_size`."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        self.eod = self.vocab_size = 0
        self._encode: Callable[[list[str]], list[list[int]]]
        loader = {
            TokenizerKind.HF: self._load_hf,
            TokenizerKind.SENTENCEPIECE: self._load_sentencepiece,
            TokenizerKind.TIKTOKEN: self._load_tiktoken,
        }[spec.kind]
        try:
            loader()
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"tokenizer {spec.path}: cannot load as {spec.kind.value} ({e})") from e

    def _load_hf(self) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(str(self.spec.path))
        eod_token = self.spec.eod_token or _hf_eos_token(self.spec.path) or EOD_TOKEN
        eod = tok.token_to_id(eod_token)
        if eod is None:
            raise UserError(f"tokenizer {self.spec.path} has no end-of-document token {eod_token}")
        self.eod, self.vocab_size = int(eod), int(tok.get_vocab_size(with_added_tokens=True))
        self._encode = lambda texts: [e.ids for e in tok.encode_batch_fast(texts)]

    def _load_sentencepiece(self) -> None:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(self.spec.path))
        eod = sp.piece_to_id(self.spec.eod_token) if self.spec.eod_token else sp.eos_id()
        if eod < 0 or (self.spec.eod_token and eod == sp.unk_id()):
            raise UserError(f"tokenizer {self.spec.path} has no end-of-document token")
        self.eod, self.vocab_size = int(eod), int(sp.get_piece_size())
        self._encode = lambda texts: sp.encode(list(texts))

    def _load_tiktoken(self) -> None:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(str(self.spec.path))
        eod_token = self.spec.eod_token or EOD_TOKEN
        enc = tiktoken.Encoding(
            name=self.spec.path.stem,
            pat_str=TIKTOKEN_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={eod_token: len(ranks)},
        )
        self.eod, self.vocab_size = len(ranks), len(ranks) + 1
        self._encode = lambda texts: enc.encode_ordinary_batch(list(texts), num_threads=1)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without an EOD (the writer appends it)."""
        out: list[list[int]] = self._encode(texts)
        return out


def _hf_eos_token(tokenizer_json: Path) -> str | None:
    config = tokenizer_json.with_name("tokenizer_config.json")
    if not config.is_file():
        return None
    eos = json.loads(config.read_text()).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def train_bpe(
    texts: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 4096,
    min_frequency: int = 2,
    special_tokens: tuple[str, ...] = (EOD_TOKEN,),
) -> Path:
    """Train a byte-level BPE tokenizer (HF `tokenizers`) and save it as a loadable folder.

    The folder holds `tokenizer.json` plus a `tokenizer_config.json` naming the EOS token, so
    both llmctl and `transformers.AutoTokenizer` (hence Megatron-LM's `HuggingFaceTokenizer`)
    load it offline. Returns the path of `tokenizer.json`.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    tmp.replace(out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(_hf_config(special_tokens[0]), indent=2))
    return out / "tokenizer.json"


def _hf_config(eos: str) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,
        "eos_token": eos,
        "unk_token": eos,
        "model_max_length": 1 << 30,
        "clean_up_tokenization_spaces": False,
    }


def batched(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    """Group texts into lists of `size`."""
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def train_tokenizer(
    inputs: list[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 4096,
    text_field: str = "text",
    min_frequency: int = 2,
    on_error: str = "fail",
) -> dict[str, Any]:
    """Train a byte-level BPE tokenizer on the documents of `inputs`; return a summary.

    Raises:
        UserError: bad input under on_error=fail, or no documents.
    """
    from llmctl.data.readers import (
        BadInputError,
        OnError,
        ProblemLog,
        discover,
        iter_documents,
        plan_chunks,
    )

    chunks, _ = plan_chunks(discover(list(inputs)))
    log, counts = ProblemLog(), {"docs": 0, "bytes": 0}

    def texts() -> Iterator[str]:
        for chunk in chunks:
            for doc in iter_documents(
                chunk, text_field=text_field, on_error=OnError(on_error), log=log
            ):
                counts["docs"] += 1
                counts["bytes"] += doc.num_bytes
                yield doc.text

    try:
        path = train_bpe(texts(), out_dir, vocab_size=vocab_size, min_frequency=min_frequency)
    except BadInputError as e:
        raise UserError(f"{e}; use --on-error skip to skip and count such documents") from None
    if counts["docs"] == 0:
        raise UserError(f"no documents in {', '.join(inputs)}")
    tok = Tokenizer(TokenizerSpec(path, TokenizerKind.HF))
    return {
        "tokenizer": str(path),
        "vocab_size": tok.vocab_size,
        "eod": tok.eod,
        "num_docs": counts["docs"],
        "num_bytes": counts["bytes"],
        "problems": log.as_dict(),
    }
