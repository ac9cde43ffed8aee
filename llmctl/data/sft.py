"""`llmctl data sft`: chat or prompt/completion JSONL -> packed sequences with a loss mask.

Each input line is one example, either a chat (`{"messages": [{"role": ..., "content": ...}]}`,
roles system/user/assistant/tool) or a prompt/completion pair (`{"prompt": ..., "completion":
...}`, rendered as one user turn and one assistant turn). Every example is rendered with the
model's own chat template (`chat_template` of the tokenizer folder's `tokenizer_config.json`,
through transformers' `apply_chat_template`), so fine-tuning sees exactly the text the model
will see at inference.

Which tokens are trained: for the i-th message, if it is an assistant turn, the template is
rendered for `messages[:i]` with the generation prompt and for `messages[:i+1]`; the text
between the two is the response (content plus whatever the template closes the turn with,
e.g. `<|im_end|>` or EOS). Both renderings must be prefixes of the whole conversation's
rendering (true of ordinary templates); a template that rewrites earlier turns is refused.
The whole conversation is tokenized once, and a token is trained when its first character
lies in a response span. Everything else (system prompt, user turns, role headers, the
generation prompt) has loss mask 0.

Packing: examples are placed best-fit into packs of `seq_length + 1` tokens (a window of open
packs, so memory stays bounded), padded at the end. An example longer than a pack is cut to
the pack size (counted; dropped if no trained token survives).

Output, three Megatron indexed datasets (`.bin` + `.idx`, one sequence per pack, all of
length `seq_length + 1`) and a manifest::

    <prefix>.bin/.idx               token ids (uint16, or int32 for vocabularies >= 65500)
    <prefix>_loss_mask.bin/.idx     uint8, 1 where the token is a trained target
    <prefix>_doc_ids.bin/.idx       uint16, 1, 2, ... numbering the examples of the pack;
                                    0 marks padding
    <prefix>.manifest.json          kind "sft-packed", seq_length, tokenizer, counts

Training turns a pack into tokens `x[:-1]`, labels `x[1:]`, loss mask
`mask[1:] & (doc[1:] == doc[:-1])`, position ids restarting at 0 in every example, and an
attention mask that lets a token see only earlier tokens of its own example (see
`llmctl.run.data`). Outputs are written under temporary names and renamed into place,
manifest last; a bad line leaves nothing under the final names.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.data import indexed
from llmctl.data.manifest import (
    commit,
    file_sha256,
    manifest_path,
    read_json,
    stamp,
    write_json_atomic,
)
from llmctl.errors import UserError
from llmctl.staging import exists_error, not_ours_error

KIND = "sft-packed"
ROLES = ("system", "user", "assistant", "tool")
MASK_SUFFIX = "_loss_mask"
DOCS_SUFFIX = "_doc_ids"
OPEN_PACKS = 64


@dataclass(kw_only=True)
class SftConfig:
    """Options of one `llmctl data sft` run."""

    inputs: list[str]
    """JSONL files (optionally .gz): chat (`messages`) or `prompt`/`completion` lines."""
    output_prefix: str
    """Output path without suffix (see the module docstring for the files written)."""
    tokenizer: str
    """Tokenizer folder (tokenizer.json + tokenizer_config.json with a `chat_template`)."""
    seq_length: int
    """Training sequence length; packs hold seq_length + 1 tokens."""
    pack: bool = True
    """Pack several examples per sequence; False puts one example per sequence."""
    dry_run: bool = False
    """Read, render, tokenize and pack, but write nothing."""
    force: bool = False
    """Replace llmctl's earlier outputs at the prefix (files llmctl did not write are kept)."""


@dataclass(kw_only=True)
class SftSummary:
    """What a run did."""

    output_prefix: str
    seq_length: int
    num_examples: int = 0
    num_packs: int = 0
    num_tokens: int = 0
    num_trained_tokens: int = 0
    num_padding_tokens: int = 0
    num_truncated: int = 0
    num_dropped: int = 0
    max_examples_per_pack: int = 0
    formats: dict[str, int] = field(
        default_factory=lambda: {"chat": 0, "prompt_completion": 0, "feedback": 0}
    )
    dry_run: bool = False

    @property
    def fill_fraction(self) -> float:
        """Share of pack tokens that are not padding."""
        total = self.num_packs * (self.seq_length + 1)
        return 1.0 - self.num_padding_tokens / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output and the manifest."""
        return {**asdict(self), "fill_fraction": round(self.fill_fraction, 4)}


# ---------------------------------------------------------------- parsing (pure)


def _bad(where: str, what: str) -> UserError:
    return UserError(f"{where}: {what}")


def _check_message(msg: Any, i: int, where: str) -> dict[str, str]:
    if not isinstance(msg, dict):
        raise _bad(where, f"messages[{i}] is not an object")
    role = msg.get("role")
    if role is None:
        raise _bad(where, f"messages[{i}] has no 'role' (expected one of {', '.join(ROLES)})")
    if role not in ROLES:
        raise _bad(where, f"messages[{i}] role {role!r} is not one of {', '.join(ROLES)}")
    content = msg.get("content")
    if not isinstance(content, str):
        raise _bad(where, f"messages[{i}] ({role}) has no string 'content'")
    if role == "assistant" and not content.strip():
        raise _bad(where, f"messages[{i}] (assistant) has empty content: nothing to train on")
    return {"role": role, "content": content}


def _chat(messages: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _bad(where, "'messages' must be a non-empty list")
    out = [_check_message(m, i, where) for i, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in out):
        raise _bad(where, "no assistant message: nothing to train on")
    return out


def _prompt_completion(obj: dict[str, Any], where: str) -> list[dict[str, str]]:
    prompt, completion = obj.get("prompt"), obj.get("completion")
    if not isinstance(prompt, str):
        raise _bad(where, "'prompt' must be a string")
    if not isinstance(completion, str) or not completion.strip():
        raise _bad(where, "'completion' is missing or empty: nothing to train on")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


def load_object(line: str, where: str) -> dict[str, Any]:
    """The JSON object of one line.

    Raises:
        UserError: invalid JSON or not an object, naming `where`.
    """
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _bad(where, f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise _bad(where, "expected a JSON object")
    return obj


def parse_example(line: str, where: str) -> tuple[str, list[dict[str, str]]]:
    """(format, messages) of one JSONL line; `where` is `FILE:LINE` for error messages.

    A feedback line (`llmctl.data.feedback`: prompt, bad response, corrected response) is read
    with the corrected response as the target.

    Raises:
        UserError: invalid JSON, a missing or unknown role, an empty completion or assistant
            turn, no assistant turn, or neither format.
    """
    return example_from_object(load_object(line, where), where)


def example_from_object(obj: dict[str, Any], where: str) -> tuple[str, list[dict[str, str]]]:
    """(format, messages) of one parsed line (see `parse_example`)."""
    from llmctl.data.feedback import is_feedback, parse_feedback

    if is_feedback(obj):
        case = parse_feedback(obj, where)
        return "feedback", [*case.prompt, {"role": "assistant", "content": case.corrected}]
    if "chosen" in obj or "rejected" in obj:
        raise _bad(where, "a preference line (chosen/rejected): use `llmctl data prefs`")
    if "messages" in obj:
        return "chat", _chat(obj["messages"], where)
    if "prompt" in obj or "completion" in obj:
        return "prompt_completion", _prompt_completion(obj, where)
    raise _bad(where, "expected 'messages' (chat) or 'prompt' and 'completion'")


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The file's lines; `.gz`/`.zst` decompressed as `data preprocess` reads them."""
    from llmctl.data.readers import compressed_lines

    if path.suffix.lower() in (".gz", ".zst"):
        yield from compressed_lines(path)
        return
    with open(path, "rb") as f:
        yield from f


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line; each line decoded on its own.

    Raises:
        UserError: a line that is not UTF-8, or a compressed file cut short (the lines before
            the cut were read; the partial one is not parsed).
    """
    from llmctl.data.readers import TruncatedError

    n = 0
    try:
        for n, raw in enumerate(_raw_lines(path), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{path}:{n}: not UTF-8 text") from None
            if line.strip():
                yield n, line
    except TruncatedError as e:
        raise UserError(
            f"{path}:{n + 1}: truncated archive ({e}; lines up to {n} were read)"
        ) from None


def iter_objects(paths: list[Path]) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(file, where, JSON object) for every non-blank line of every input, in order.

    Raises:
        UserError: an unreadable file, a line that is not UTF-8 or not a JSON object, named by
            file and line.
    """
    for path in paths:
        try:
            for n, line in _lines(path):
                yield path, f"{path}:{n}", load_object(line, f"{path}:{n}")
        except (OSError, EOFError) as e:  # EOFError: a truncated .gz
            raise UserError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None


def iter_examples(paths: list[Path]) -> Iterator[tuple[str, str, list[dict[str, str]]]]:
    """(where, format, messages) for every non-blank line of every input, in order.

    Raises:
        UserError: an unreadable file, a line that is not UTF-8, or bad content (see
            `parse_example`), named by file and line.
    """
    for _, where, obj in iter_objects(paths):
        yield (where, *example_from_object(obj, where))


# ---------------------------------------------------------------- rendering and masks


class ChatRenderer:
    """A transformers tokenizer from a local folder, with its chat template.

    Args:
        folder: Tokenizer folder (or a tokenizer.json inside it).

    Raises:
        UserError: no folder, no loadable tokenizer, or no chat template.
    """

    def __init__(self, folder: str) -> None:
        path = Path(folder).expanduser()
        self.folder = path.parent if path.is_file() else path
        if not (self.folder / "tokenizer_config.json").is_file():
            raise UserError(f"--tokenizer {folder}: no tokenizer_config.json in {self.folder}")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UserError(
                "llmctl data sft needs transformers: pip install 'llmctl[sft]'"
            ) from None
        try:
            self.tok = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        except Exception as e:  # transformers raises many types for a broken folder
            raise UserError(f"--tokenizer {folder}: not loadable by transformers ({e})") from None
        if not getattr(self.tok, "chat_template", None):
            raise UserError(
                f"--tokenizer {folder}: tokenizer_config.json has no chat_template; "
                "SFT renders examples with the model's own template"
            )
        if not self.tok.is_fast:
            raise UserError(f"--tokenizer {folder}: needs a fast tokenizer (tokenizer.json)")
        _check_template(self.tok, folder)
        self.vocab_size = len(self.tok)
        self.pad_id = next(
            (i for i in (self.tok.pad_token_id, self.tok.eos_token_id) if i is not None), 0
        )

    def render(
        self, messages: list[dict[str, str]], where: str, generation_prompt: bool = False
    ) -> str:
        """The template's text for `messages`.

        Raises:
            UserError: the template refuses the conversation (e.g. `raise_exception` for a
                role order it does not support), naming `where`.
        """
        try:
            text = self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as e:  # jinja2 TemplateError, or the template's raise_exception
            raise _bad(where, f"the chat template refused this conversation: {e}") from None
        return str(text)

    def response_spans(
        self, messages: list[dict[str, str]], where: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """(whole text, character spans of the assistant responses)."""
        full = self.render(messages, where)
        spans = []
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            before = self.render(messages[:i], where, generation_prompt=True) if i else ""
            upto = self.render(messages[: i + 1], where)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise _bad(
                    where,
                    f"the chat template renders messages[{i}] differently once later turns "
                    "follow (not prefix-stable); response tokens cannot be located",
                )
            spans.append((len(before), len(upto)))
        return full, spans

    def encode(
        self, messages: list[dict[str, str]], where: str, first: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, loss mask) of one example: mask 1 on the response tokens of the
        assistant messages from index `first` on (DPO: earlier turns are the prompt)."""
        text, spans = self.response_spans(messages, where)
        spans = spans[sum(m["role"] == "assistant" for m in messages[:first]) :]
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
        mask = np.zeros(len(ids), dtype=np.uint8)
        for lo, hi in spans:
            mask[(starts >= lo) & (starts < hi)] = 1
        return ids, mask

    def identity(self) -> dict[str, Any]:
        """Tokenizer record for the manifest (the shape `llmctl data preprocess` writes)."""
        tok_json = self.folder / "tokenizer.json"
        template = str(self.tok.chat_template)
        return {
            "kind": "hf",
            "path": str(tok_json if tok_json.is_file() else self.folder),
            "sha256": file_sha256(tok_json) if tok_json.is_file() else "",
            "vocab_size": self.vocab_size,
            "eod": self.tok.eos_token_id if self.tok.eos_token_id is not None else self.pad_id,
            "pad": self.pad_id,
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        }


def _check_template(tok: Any, folder: str) -> None:
    """Compile the tokenizer's default chat template the way transformers does.

    A template that does not compile is the tokenizer's fault, found before any input is
    read (rendering would otherwise blame line 1 of the data).

    Raises:
        UserError: the template is not a string or does not compile, naming `folder`.
    """
    try:
        template = tok.get_chat_template()
    except Exception as e:  # no default among several named templates
        raise UserError(f"--tokenizer {folder}: chat_template: {e}") from None
    if not isinstance(template, str):
        raise UserError(
            f"--tokenizer {folder}: chat_template is a {type(template).__name__}, "
            "not a Jinja template string"
        )
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers layout: rendering reports it per line
        return
    try:
        _compile_jinja_template(template)
    except Exception as e:  # jinja2 TemplateSyntaxError / TemplateAssertionError
        raise UserError(f"--tokenizer {folder}: the chat template does not compile ({e})") from None


# ---------------------------------------------------------------- packing


@dataclass(eq=False)
class _Pack:
    tokens: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    used: int = 0


class Packer:
    """Best-fit packing over a window of open packs; emits finished packs through `emit`.

    Args:
        size: Tokens per pack (seq_length + 1).
        pad_id: Token id of padding.
        emit: Called with (tokens, loss mask, doc ids) of each finished pack.
        pack: False = one example per pack.
    """

    def __init__(
        self,
        size: int,
        pad_id: int,
        emit: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
        pack: bool = True,
    ) -> None:
        self.size, self.pad_id, self.emit = size, pad_id, emit
        self.window = OPEN_PACKS if pack else 1
        self.open: list[_Pack] = []

    def add(self, tokens: np.ndarray, mask: np.ndarray) -> None:
        """Place one example (already cut to at most `size` tokens)."""
        target = self._place(len(tokens))
        target.tokens.append(tokens)
        target.masks.append(mask)
        target.used += len(tokens)

    def _place(self, n: int) -> _Pack:
        """The open pack that takes `n` more tokens (best fit; a new one if none fits)."""
        fits = [p for p in self.open if p.used + n <= self.size]
        if self.window == 1:
            fits = [p for p in fits if not p.tokens]
        if fits:
            target = max(fits, key=lambda p: p.used)
        else:
            if len(self.open) >= self.window:
                fullest = max(self.open, key=lambda p: p.used)
                self.open.remove(fullest)
                self._finish(fullest)
            target = _Pack()
            self.open.append(target)
        return target

    def close(self) -> None:
        """Emit every open pack, in the order they were opened."""
        for p in self.open:
            self._finish(p)
        self.open = []

    def _finish(self, p: _Pack) -> None:
        pad = self.size - p.used
        tokens = np.concatenate([*p.tokens, np.full(pad, self.pad_id, dtype=np.int64)])
        mask = np.concatenate([*p.masks, np.zeros(pad, dtype=np.uint8)])
        docs = np.concatenate(
            [np.full(len(t), i + 1, dtype=np.uint16) for i, t in enumerate(p.tokens)]
            + [np.zeros(pad, dtype=np.uint16)]
        )
        self.emit(tokens, mask, docs)


# ---------------------------------------------------------------- driver


SFT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
"""Files an input folder is searched for."""


def input_paths(inputs: list[str]) -> list[Path]:
    paths = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            paths.extend(sorted(x for x in p.iterdir() if x.name.endswith(SFT_SUFFIXES)))
        elif p.is_file():
            paths.append(p)
        else:
            raise UserError(f"input {item} not found")
    if not paths:
        raise UserError(f"no .jsonl files in {', '.join(inputs)}")
    return paths


def output_prefixes(prefix: str | Path) -> tuple[str, str, str]:
    """(tokens, loss mask, doc ids) dataset prefixes of an SFT output prefix."""
    return str(prefix), f"{prefix}{MASK_SUFFIX}", f"{prefix}{DOCS_SUFFIX}"


def check_outputs(prefix: str, force: bool) -> None:
    """Refuse existing outputs unless `force`, files llmctl did not write always, and a place
    that cannot be written."""
    from llmctl.staging import check_writable_parent

    check_writable_parent(Path(f"{prefix}.llmctl-tmp"))
    record = read_json(manifest_path(prefix))
    ours = record is not None and record.get("kind") in PACKED_KINDS
    paths = [manifest_path(prefix)]
    for p in output_prefixes(prefix):
        paths += [indexed.bin_path(p), indexed.idx_path(p)]
    for path in paths:
        if path.exists() and not force:
            raise exists_error(path)
        if path.exists() and not ours:
            raise not_ours_error(path)


class Writers:
    """The three shard writers under the work folder."""

    def __init__(self, work: Path, token_dtype: type) -> None:
        self.prefixes = output_prefixes(work / "out")
        self.writers = [
            indexed.ShardWriter(self.prefixes[0], token_dtype),
            indexed.ShardWriter(self.prefixes[1], np.uint8),
            indexed.ShardWriter(self.prefixes[2], np.uint16),
        ]

    def write(self, *arrays: np.ndarray) -> None:
        for w, a in zip(self.writers, arrays, strict=True):
            w.add_documents(a, np.asarray([len(a)]))

    def close(self) -> None:
        for w in self.writers:
            w.close()


def check_config(cfg: Any) -> None:
    if cfg.seq_length < 2:
        raise UserError(f"--seq-length {cfg.seq_length}: expected at least 2")
    if cfg.seq_length + 1 > np.iinfo(np.uint16).max:
        raise UserError(f"--seq-length {cfg.seq_length}: at most 65534")


def staged_build(
    cfg: Any, body: Callable[[list[Path], ChatRenderer, Path, Writers | None], None]
) -> None:
    """The frame `data sft` and `data prefs` share around `body(paths, renderer, work,
    writers)`: the inputs listed, existing outputs refused (unless a dry run), the model's
    chat renderer, and the staging folder `OUT.llmctl-tmp` with its writers (None on a dry
    run), removed whatever way `body` fails so nothing partial stays behind.

    `cfg` is an `SftConfig` or a `PrefsConfig` (inputs, output_prefix, tokenizer, force,
    dry_run).
    """
    paths = input_paths(cfg.inputs)
    if not cfg.dry_run:
        check_outputs(cfg.output_prefix, cfg.force)
    renderer = ChatRenderer(cfg.tokenizer)
    work = Path(f"{cfg.output_prefix}.llmctl-tmp")
    try:
        writers = None
        if not cfg.dry_run:
            shutil.rmtree(work, ignore_errors=True)
            try:
                work.mkdir(parents=True)
            except OSError as e:
                raise UserError(
                    f"--out {cfg.output_prefix}: cannot write there ({e.strerror})"
                ) from None
            writers = Writers(work, indexed.token_dtype(renderer.vocab_size))
        body(paths, renderer, work, writers)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def build_sft(cfg: SftConfig, on_progress: Callable[[int, int], None] | None = None) -> SftSummary:
    """Render, tokenize, mask and pack `cfg.inputs` into `cfg.output_prefix` (see module doc).

    Args:
        cfg: The run's options.
        on_progress: Called with (examples done, tokens done) after each example.

    Raises:
        UserError: bad input (one line naming the file and line); nothing is left under the
            final names.
    """
    check_config(cfg)
    summary = SftSummary(
        output_prefix=cfg.output_prefix, seq_length=cfg.seq_length, dry_run=cfg.dry_run
    )
    staged_build(cfg, partial(_run, cfg, summary=summary, on_progress=on_progress))
    return summary


def _run(
    cfg: SftConfig,
    paths: list[Path],
    renderer: ChatRenderer,
    work: Path,
    writers: Writers | None,
    *,
    summary: SftSummary,
    on_progress: Callable[[int, int], None] | None,
) -> None:
    def emit(tokens: np.ndarray, mask: np.ndarray, docs: np.ndarray) -> None:
        summary.num_packs += 1
        summary.num_padding_tokens += int((docs == 0).sum())
        summary.max_examples_per_pack = max(summary.max_examples_per_pack, int(docs.max()))
        if writers is not None:
            writers.write(tokens, mask, docs)

    from llmctl.data.feedback import Provenance

    packer = Packer(cfg.seq_length + 1, renderer.pad_id, emit, pack=cfg.pack)
    provenance = Provenance()
    for path, where, obj in iter_objects(paths):
        fmt, messages = example_from_object(obj, where)
        provenance.note(path, fmt, obj)
        _add_example(renderer, packer, summary, where, fmt, messages)
        if on_progress is not None:
            on_progress(summary.num_examples, summary.num_tokens)
    packer.close()
    if summary.num_packs == 0:
        raise UserError(_nothing_kept(cfg, summary))
    if writers is not None:
        writers.close()
        _commit(cfg, paths, renderer, work, writers, summary, provenance)


def _nothing_kept(cfg: SftConfig, summary: SftSummary) -> str:
    inputs = ", ".join(cfg.inputs)
    if not summary.num_examples:
        return f"no examples in {inputs}"
    return (
        f"all {summary.num_examples} examples in {inputs} were dropped: no response token "
        f"survives --seq-length {cfg.seq_length} (or the chat template renders no assistant "
        "text); raise --seq-length or check the template"
    )


def _add_example(
    renderer: ChatRenderer,
    packer: Packer,
    summary: SftSummary,
    where: str,
    fmt: str,
    messages: list[dict[str, str]],
) -> None:
    ids, mask = renderer.encode(messages, where)
    summary.num_examples += 1
    summary.formats[fmt] += 1
    if len(ids) > packer.size:
        summary.num_truncated += 1
        ids, mask = ids[: packer.size], mask[: packer.size]
    if not mask[1:].any():  # the first token is never a target
        summary.num_dropped += 1
        return
    summary.num_tokens += len(ids)
    summary.num_trained_tokens += int(mask[1:].sum())
    packer.add(ids, mask)


def _commit(
    cfg: SftConfig,
    paths: list[Path],
    renderer: ChatRenderer,
    work: Path,
    writers: Writers,
    summary: SftSummary,
    provenance: Any,
) -> None:
    manifest = packed_manifest(KIND, cfg, paths, renderer, provenance, summary.as_dict())
    commit_packs(cfg.output_prefix, work, writers, manifest)


def packed_manifest(
    kind: str, cfg: Any, paths: list[Path], renderer: ChatRenderer, provenance: Any, counts: Any
) -> dict[str, Any]:
    """The manifest of packs at `cfg.output_prefix` (`data sft` and `data prefs`)."""
    finals = output_prefixes(cfg.output_prefix)
    return {
        **stamp(),
        "kind": kind,
        "prefix": Path(cfg.output_prefix).name,
        "seq_length": cfg.seq_length,
        "pack": cfg.pack,
        "dtype": np.dtype(indexed.token_dtype(renderer.vocab_size)).name,
        "companions": {"loss_mask": Path(finals[1]).name, "doc_ids": Path(finals[2]).name},
        "inputs": [
            {
                "path": str(p),
                "num_bytes": p.stat().st_size,
                "sha256": file_sha256(p),
                **provenance.of(p),
            }
            for p in paths
        ],
        "tokenizer": renderer.identity(),
        "counts": counts,
    }


def commit_packs(prefix: str, work: Path, writers: Writers, manifest: dict[str, Any]) -> None:
    """Rename the packs under `work` to `prefix`, manifest last."""
    finals = output_prefixes(prefix)
    write_json_atomic(work / "manifest.json", manifest)
    moves = []
    for tmp, final in zip(writers.prefixes, finals, strict=True):
        moves.append((indexed.bin_path(tmp), indexed.bin_path(final)))
        moves.append((indexed.idx_path(tmp), indexed.idx_path(final)))
    commit(moves, work / "manifest.json", manifest_path(prefix))
    shutil.rmtree(work)


def run_sft(cfg: SftConfig, show_progress: bool = True, interval_s: float = 10.0) -> dict[str, Any]:
    """`llmctl data sft`: `build_sft` with progress on stderr; returns the summary.

    On a terminal a rich line redraws in place; otherwise (logs, SLURM) a plain line is printed
    every `interval_s` seconds, so long runs show they are alive.
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    tty = sys.stderr.isatty()
    bar = Progress(
        SpinnerColumn(),
        TextColumn("[bold]sft[/] {task.fields[info]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not (show_progress and tty),
    )
    task = bar.add_task("sft", total=None, info="")
    start = last = time.monotonic()

    def update(examples: int, tokens: int) -> None:
        nonlocal last
        if examples % 256:
            return
        info = f"{examples:,} examples {tokens:,} tokens"
        bar.update(task, info=info)
        now = time.monotonic()
        if show_progress and not tty and now - last >= interval_s:
            last = now
            print(f"sft: {info} {examples / (now - start):,.0f} examples/s", file=sys.stderr)

    with bar:
        summary = build_sft(cfg, on_progress=update)
    return summary.as_dict()


# ---------------------------------------------------------------- readers (no torch)


PACKED_KINDS = (KIND, "prefs-packed")
"""Manifest kinds of masked packs: SFT examples, and DPO pairs (`llmctl.data.prefs`)."""


def sft_manifest(prefix: str) -> dict[str, Any] | None:
    """The manifest of an SFT (or DPO pairs) dataset at `prefix`, or None if it is neither."""
    record = read_json(manifest_path(prefix))
    return record if record is not None and record.get("kind") in PACKED_KINDS else None


def packed_seq_length(prefixes: list[str]) -> int | None:
    """The sequence length the SFT datasets among `prefixes` were packed for (None if none).

    Raises:
        UserError: SFT datasets packed for different lengths, or mixed with pretraining data.
    """
    found = {p: m["seq_length"] for p in prefixes if (m := sft_manifest(p)) is not None}
    if not found:
        return None
    if len(found) != len(prefixes):
        other = next(p for p in prefixes if p not in found)
        raise UserError(f"data.prefixes mixes SFT packs with pretraining data ({other})")
    if len(set(found.values())) > 1:
        raise UserError(f"data.prefixes were packed for different seq lengths: {found}")
    return int(next(iter(found.values())))


class PackedSft:
    """Read access to one SFT dataset: (tokens, loss mask, doc ids) of pack i, as numpy."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.parts = [_Mapped(p) for p in output_prefixes(prefix)]
        counts = {len(p) for p in self.parts}
        if len(counts) != 1:
            raise UserError(f"data prefix {prefix}: loss-mask/doc-id files do not match tokens")

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tokens, mask, docs = (p[i] for p in self.parts)
        return tokens, mask, docs


class _Mapped:
    """One indexed dataset, memory-mapped."""

    def __init__(self, prefix: str) -> None:
        head = indexed.read_header(prefix)
        self.lengths = indexed.read_lengths(prefix).astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.data = np.memmap(indexed.bin_path(prefix), dtype=head.dtype, mode="r")

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        s = self.starts[i]
        return np.asarray(self.data[s : s + self.lengths[i]])
