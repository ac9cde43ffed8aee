"""Tokenizers from local files, and training a byte-level BPE tokenizer for the demo models.

Three kinds load from disk, never from a hub: a Hugging Face `tokenizer.json` (or a folder
holding one), a SentencePiece `.model`, and a tiktoken BPE ranks file (`*.tiktoken`, base64
token and rank per line, as tiktoken publishes them). Each is wrapped with the same small
surface: `encode_batch`, `eod` and `vocab_size`, and an identity (kind, file, SHA-256) that goes
into manifests.

The end-of-document id follows Megatron: the tokenizer's EOS token (`<|endoftext|>` for the
tokenizers trained here). A tiktoken ranks file carries no special tokens, so `<|endoftext|>`
is given the id right after the last rank.

Speed (issue 12, finding 4). Preprocessing spends nearly all its time in encode, and the
reference encoders build per-token Python objects and offset tables that Megatron's format never
needs. Where the `fastokens` package is installed, a HF or tiktoken tokenizer is also loaded by
it (a Rust BPE engine reading the same files) and its offset-free `encode_batch_flat` returns
one flat uint32 buffer; it is used only after it encodes a probe text (every Unicode block,
whitespace and control characters, contractions, digits, the special tokens) exactly as the
reference library does, else the reference library runs. `engine` says which one runs.

Memory (finding 3). A huge document is encoded in pieces cut where the pre-tokenizer is known
to cut anyway, so ids are identical and the engine's working memory is that of one piece: a cut
goes between an ASCII letter or digit and a following space or newline. Every alternative of the
GPT-2 and tiktoken patterns that matches a letter or digit stops before a space or newline, and
neither pattern looks behind, so pre-tokens (hence ids) never cross such a cut. Cuts are made only
for tokenizers whose whole pipeline is that pre-tokenizer and a per-pre-token model: no
normalizer, a ByteLevel pre-tokenizer with its regex and no added prefix space, no post-processor
that adds tokens, no truncation or padding, and no added token that contains whitespace or eats
whitespace to its right. SentencePiece documents are never cut (it treats every start of text
as a word start).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from llmctl.data.choices import TokenizerKind
from llmctl.data.manifest import file_sha256
from llmctl.errors import UserError

EOD_TOKEN = "<|endoftext|>"
TIKTOKEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"""
    r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Where a tokenizer lives and how to read it; cheap to pickle into workers."""

    path: Path
    kind: TokenizerKind
    eod_token: str | None = None

    def identity(self) -> dict[str, str]:
        """Kind, file and SHA-256: enough to tell whether two runs used the same tokenizer."""
        return {"kind": self.kind.value, "path": str(self.path), "sha256": file_sha256(self.path)}


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


FlatEncode = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]
"""texts -> (all ids concatenated, offsets): text i's ids are ids[offsets[i]:offsets[i + 1]]."""

PIECE_CHARS = 1 << 16
"""Documents longer than this (characters) are encoded in pieces of at most about this size."""
_CALL_CHARS = 1 << 16
_CUT = re.compile(r"[A-Za-z0-9][ \n]")
_PROBED: dict[tuple[Any, ...], bool] = {}


class TextSegments(Protocol):
    """A document's text given as consecutive pieces (a reader's `TextStream`), so that the
    whole text never has to exist as one `str`."""

    def segments(self) -> Iterator[str]:
        """The text, in order, in pieces of any size."""
        ...


Text = str | TextSegments
TokenSink = Callable[[np.ndarray], object]


class Engine(StrEnum):
    """Which library encodes: the tokenizer's own (reference) or fastokens (same ids, faster)."""

    AUTO = "auto"
    REFERENCE = "reference"
    FASTOKENS = "fastokens"


class Tokenizer:
    """A loaded tokenizer: `encode_docs`, `encode_batch`, `eod`, `vocab_size`, `engine`."""

    def __init__(
        self, spec: TokenizerSpec, engine: Engine | str = Engine.AUTO, piece_chars: int = 0
    ) -> None:
        """Load `spec`.

        Args:
            spec: the tokenizer file and kind.
            engine: auto (fastokens where it agrees with the reference on the probe),
                reference, or fastokens (fail unless it loads and agrees).
            piece_chars: cut size for long documents (0: `PIECE_CHARS`).

        Raises:
            UserError: the file cannot be loaded, or a required engine is unavailable.
        """
        self.spec = spec
        self.eod = self.vocab_size = 0
        self.engine = Engine.REFERENCE
        self.piece_chars = piece_chars or PIECE_CHARS
        self._splittable = False
        self._encode: Callable[[list[str]], list[list[int]]]
        self._flat: FlatEncode
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
        self._flat = _flat_from_lists(self._encode)
        if Engine(engine) is not Engine.REFERENCE:
            self._try_fastokens(Engine(engine) is Engine.FASTOKENS)

    def _load_hf(self) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(str(self.spec.path))
        eod_token = self.spec.eod_token or _hf_eos_token(self.spec.path) or EOD_TOKEN
        eod = tok.token_to_id(eod_token)
        if eod is None:
            raise UserError(f"tokenizer {self.spec.path} has no end-of-document token {eod_token}")
        self.eod, self.vocab_size = int(eod), int(tok.get_vocab_size(with_added_tokens=True))
        # No post-processor specials (a Llama/Mistral BOS): Megatron-LM's HuggingFaceTokenizer
        # tokenizes without them unless --tokenizer-hf-include-special-tokens is given.
        self._encode = lambda texts: [
            e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)
        ]
        self._splittable = hf_splittable(json.loads(self.spec.path.read_text(encoding="utf-8")))

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
        self._splittable = True

    def _try_fastokens(self, required: bool) -> None:
        """Switch to fastokens if it loads this file and encodes the probe as the reference."""
        fast = _fastokens_flat(self.spec, self.eod)
        if fast is not None and self._agrees(fast):
            self._flat, self.engine = fast, Engine.FASTOKENS
            return
        if required:
            raise UserError(
                f"tokenizer {self.spec.path}: fastokens is not installed, cannot read it, or "
                "does not encode it exactly as the reference library; use engine auto"
            )

    def _agrees(self, fast: FlatEncode) -> bool:
        """Whether `fast` encodes the probe as the reference does, one text at a time (bounded
        memory). Remembered per file state, so forked preprocess workers inherit the parent's
        answer instead of probing again."""
        st = self.spec.path.stat()
        key = (str(self.spec.path), self.spec.kind, self.eod, st.st_size, st.st_mtime_ns)
        if key not in _PROBED:
            _PROBED[key] = all(_same(self._flat([t]), fast([t])) for t in probe_texts())
        return _PROBED[key]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without an EOD (the writer appends it)."""
        out: list[list[int]] = self._encode(texts)
        return out

    @property
    def splittable(self) -> bool:
        """Whether long documents are encoded in pieces (and segment streams are not joined)."""
        return self._splittable

    def encode_docs(
        self, texts: list[Text], *, append_eod: bool = True, dtype: Any = np.int32
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents into one flat `dtype` array and per-document lengths (int32).

        As `encode_into`, with the ids collected into one array.
        """
        parts: list[np.ndarray] = []
        lengths = self.encode_into(texts, parts.append, append_eod=append_eod, dtype=dtype)
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        return flat, lengths

    def encode_into(
        self, texts: list[Text], sink: TokenSink, *, append_eod: bool = True, dtype: Any = np.int32
    ) -> np.ndarray:
        """Encode documents, handing the ids to `sink` one engine call at a time; return the
        per-document lengths (int32, EOD included).

        The ids reach `sink` in document order, in `dtype`, with the EOD after each document
        that has tokens and never after one without (Megatron-LM's preprocess_data.py). Long
        documents and segment streams are encoded in pieces (see the module docstring), so
        memory is that of one call (about 64 Ki characters), whatever the document size.
        """
        lengths = np.zeros(len(texts), dtype=np.int64)
        eod = np.asarray(self.eod, dtype=dtype)
        for units, owner, last in self._calls(texts):
            ids, off = self._flat(units)
            del units
            np.add.at(lengths, owner, np.diff(off))
            out = ids.astype(dtype)
            del ids
            if append_eod and (ends := off[1:][last & (lengths[owner] > 0)]).size:
                out = np.insert(out, ends, eod)
            sink(out)
            del out
        if append_eod:
            lengths += lengths > 0
        return lengths.astype(np.int32)

    def _calls(self, texts: list[Text]) -> Iterator[tuple[list[str], np.ndarray, np.ndarray]]:
        """Engine calls of about `_CALL_CHARS` characters: the units (texts, or pieces of long
        ones, cut lazily so at most one call's pieces exist at a time), each unit's document,
        and whether it is its document's last unit."""
        strs = [t for t in texts if isinstance(t, str)]
        if len(strs) == len(texts) and (
            not self._splittable or all(len(t) <= self.piece_chars for t in strs)
        ):
            yield strs, np.arange(len(strs)), np.ones(len(strs), dtype=bool)
            return
        del strs
        units: list[str] = []
        owner: list[int] = []
        last: list[bool] = []
        size = 0
        for i, text in enumerate(texts):
            for piece, is_last in _with_last(self._pieces(text)):
                if size and size + len(piece) > max(_CALL_CHARS, self.piece_chars):
                    yield units, np.asarray(owner, dtype=np.int64), np.asarray(last, dtype=bool)
                    units, owner, last, size = [], [], [], 0
                units.append(piece)
                owner.append(i)
                last.append(is_last)
                size += len(piece)
        if units:
            yield units, np.asarray(owner, dtype=np.int64), np.asarray(last, dtype=bool)

    def _pieces(self, text: Text) -> Iterator[str]:
        if isinstance(text, str):
            return iter_pieces(text, self.piece_chars) if self._splittable else iter([text])
        if self._splittable:
            return iter_stream_pieces(text.segments(), self.piece_chars)
        return iter(["".join(text.segments())])


def _with_last(items: Iterator[str]) -> Iterator[tuple[str, bool]]:
    """Each item with whether it is the last one (an empty input gives one empty item)."""
    prev = next(items, "")
    for item in items:
        yield prev, False
        prev = item
    yield prev, True


def iter_stream_pieces(segments: Iterable[str], piece_chars: int) -> Iterator[str]:
    """`iter_pieces` over text that arrives in segments: pieces of about `piece_chars` cut at
    the same kind of safe cut (anywhere in the text, segment boundaries included); segment
    boundaries themselves are not cuts."""
    buf, scanned = "", 0
    for seg in segments:
        buf += seg
        while len(buf) > piece_chars:
            lo = max(piece_chars // 2, scanned - 1)
            m = _CUT.search(buf, lo, piece_chars + 1) if lo <= piece_chars else None
            m = m or _CUT.search(buf, max(piece_chars, scanned - 1))
            if m is None:
                scanned = len(buf)
                break
            yield buf[: m.start() + 1]
            buf, scanned = buf[m.start() + 1 :], 0
    yield buf


def iter_pieces(text: str, piece_chars: int) -> Iterator[str]:
    """Cut `text` into pieces of about `piece_chars` (half to full) at safe cuts only.

    A cut lies between an ASCII letter or digit and a space or newline. Where no cut exists
    within a window, the piece runs on to the next one (or to the end).
    """
    start = 0
    while len(text) - start > piece_chars:
        m = _CUT.search(text, start + piece_chars // 2, start + piece_chars + 1)
        m = m or _CUT.search(text, start + piece_chars)
        if m is None:
            break
        yield text[start : m.start() + 1]
        start = m.start() + 1
    yield text[start:] if start else text


def hf_splittable(config: dict[str, Any]) -> bool:
    """Whether a tokenizer.json's pipeline keeps pre-tokens from crossing `split_text` cuts."""
    pre = config.get("pre_tokenizer") or {}
    post = config.get("post_processor")
    byte_level = (
        pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
    )
    added_ok = all(
        not t.get("rstrip") and not t.get("single_word") and not re.search(r"\s", t["content"])
        for t in config.get("added_tokens") or []
    )
    return (
        byte_level
        and added_ok
        and config.get("normalizer") is None
        and (post is None or post.get("type") == "ByteLevel")
        and config.get("truncation") is None
        and config.get("padding") is None
    )


def _same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    return bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))


def _flat_from_lists(encode: Callable[[list[str]], list[list[int]]]) -> FlatEncode:
    def flat(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = encode(texts)
        off = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, ids), np.int64, count=len(ids)), out=off[1:])
        chain = itertools.chain.from_iterable(ids)
        return np.fromiter(chain, dtype=np.int64, count=int(off[-1])), off

    return flat


def _fastokens_flat(spec: TokenizerSpec, eod: int) -> FlatEncode | None:
    """fastokens' offset-free batch encode for this file, or None where it cannot load it."""
    try:
        import fastokens
    except ImportError:
        return None
    # one thread: llmctl runs one worker process per core (the default spawns a second thread)
    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
    try:
        if spec.kind is TokenizerKind.HF:
            tok = fastokens.Tokenizer.from_file(str(spec.path))
            special, split = False, False  # as the reference: no post-processor specials
        else:
            tok = fastokens.Tokenizer.from_tiktoken(
                str(spec.path),
                pattern=TIKTOKEN_PATTERN,
                special_tokens={spec.eod_token or EOD_TOKEN: eod},
            )
            special, split = False, True
    except Exception:  # any failure means: use the reference library
        return None

    def flat(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, off = tok.encode_batch_flat(
            texts, add_special_tokens=special, split_special_tokens=split
        )
        return np.frombuffer(ids, dtype=np.uint32), np.frombuffer(off, np.uint64).astype(np.int64)

    return flat


def probe_texts() -> list[str]:
    """Texts on which a second engine must match the reference before it is used: a sample of
    every Unicode plane next to letters, digits, spaces and apostrophes, whitespace and control
    characters, contractions, digit runs and the usual special-token spellings."""
    cps = [c for c in range(0, 0x110000, 127) if not 0xD800 <= c < 0xE000]
    rows = ["".join(f"a{chr(c)}1 {chr(c)}{chr(c)}x'{chr(c)}s  {chr(c)}\n" for c in cps[i : i + 256])
            for i in range(0, len(cps), 256)]  # fmt: skip
    return [*rows, "", " ", "\n", "  \n\t ", "x\r\n\r\n\x0b\x0c\x85\u2028\u00a0\u3000y\x00\x7f",
            "I'm 's 'S 'LL 're 've 'd don't", "1 12 123 1234 12345 \u00bd \u0663\u0664 \u2167",
            "<|endoftext|>", "a<|endoftext|>b <s></s> [CLS] <|im_start|>",
            "def f(x):\n    return x  # \u00e9\u00e8 \U0001f600\U0001f3fd\u200d"]  # fmt: skip


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
