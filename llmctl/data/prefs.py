"""`llmctl data prefs`: preference JSONL -> packed, masked (chosen, rejected) pairs for DPO.

Each input line is one pair, in one of three forms:

- prompt: `{"prompt": "...", "chosen": ..., "rejected": ...}`, the prompt one user turn;
- chat: `{"messages": [...], "chosen": ..., "rejected": ...}`, the turns before the reply;
- feedback (`llmctl.data.feedback`): `{"prompt"|"messages", "bad_response",
  "corrected_response"}`, read as chosen = corrected, rejected = bad.

`chosen` and `rejected` are strings (one assistant reply) or lists of messages (TRL's
conversational form, e.g. `[{"role": "assistant", "content": "..."}]`). Both sequences are
rendered with the model's own chat template exactly as `llmctl data sft` renders an example
(`ChatRenderer`), prompt + reply; only the reply's tokens (content and the template's end of
turn) have loss mask 1, prompt tokens 0.

Packing: a pair is placed whole (chosen then rejected) into a pack of `seq_length + 1` tokens,
best fit, as two examples: in every pack the examples are numbered 1, 2, 3, ... and example
2k-1 is the chosen, 2k the rejected sequence of pair k. A pair longer than a pack is dropped
(counted; cutting it would compare partial replies). The files and the manifest are those of
`llmctl data sft` (kind "prefs-packed"), so the SFT readers, checks and attention masks apply.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.data.feedback import Provenance, is_feedback, parse_feedback, prompt_messages
from llmctl.data.sft import (
    ChatRenderer,
    Packer,
    SftConfig,
    Writers,
    _check_message,
    check_config,
    commit_packs,
    iter_objects,
    packed_manifest,
    staged_build,
)
from llmctl.errors import UserError

KIND = "prefs-packed"


@dataclass(kw_only=True)
class PrefsConfig(SftConfig):
    """Options of one `llmctl data prefs` run: those of `data sft` (the inputs are preference
    or feedback lines; `pack=False` puts one pair per pack)."""


@dataclass(kw_only=True)
class PrefsSummary:
    """What a run did."""

    output_prefix: str
    seq_length: int
    num_pairs: int = 0
    num_packs: int = 0
    num_tokens: int = 0
    num_trained_tokens: int = 0
    num_padding_tokens: int = 0
    num_dropped: int = 0
    max_pairs_per_pack: int = 0
    formats: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "chat": 0, "feedback": 0})
    dry_run: bool = False

    @property
    def max_examples_per_pack(self) -> int:
        """Sequences per pack at most (two per pair), the SFT manifest's field."""
        return 2 * self.max_pairs_per_pack

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output and the manifest."""
        total = self.num_packs * (self.seq_length + 1)
        fill = 1.0 - self.num_padding_tokens / total if total else 0.0
        return {
            **asdict(self),
            "max_examples_per_pack": self.max_examples_per_pack,
            "fill_fraction": round(fill, 4),
        }


@dataclass(frozen=True, slots=True)
class Pair:
    """One preference pair as conversations: prompt turns + chosen / + rejected reply."""

    fmt: str
    prompt: list[dict[str, str]]
    chosen: list[dict[str, str]]
    rejected: list[dict[str, str]]


def _reply(value: Any, key: str, where: str) -> list[dict[str, str]]:
    if value is None:
        raise UserError(
            f"{where}: '{key}' is missing (a preference line needs prompt or messages, "
            "chosen and rejected)"
        )
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where}: '{key}' is empty")
        return [{"role": "assistant", "content": value}]
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: '{key}' must be a string or a non-empty list of messages")
    msgs = [_check_message(m, i, where) for i, m in enumerate(value)]
    if msgs[-1]["role"] != "assistant":
        raise UserError(f"{where}: '{key}' must end with an assistant message")
    return msgs


def parse_pair(obj: dict[str, Any], where: str) -> Pair:
    """The pair of one parsed line (see the module docstring).

    Raises:
        UserError: no prompt, a missing or empty chosen/rejected, chosen equal to rejected,
            naming `where`.
    """
    if is_feedback(obj):
        case = parse_feedback(obj, where)
        return Pair(
            "feedback",
            case.prompt,
            [{"role": "assistant", "content": case.corrected}],
            [{"role": "assistant", "content": case.bad}],
        )
    if "chosen" not in obj and "rejected" not in obj and "completion" in obj:
        raise UserError(f"{where}: a prompt/completion line has no preference; use `data sft`")
    prompt = prompt_messages(obj, where)
    chosen = _reply(obj.get("chosen"), "chosen", where)
    rejected = _reply(obj.get("rejected"), "rejected", where)
    if chosen == rejected:
        raise UserError(f"{where}: 'chosen' equals 'rejected': no preference to learn")
    return Pair("chat" if "messages" in obj else "prompt", prompt, chosen, rejected)


def encode_pair(
    renderer: ChatRenderer, pair: Pair, where: str
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((ids, mask) chosen, (ids, mask) rejected): mask 1 on the reply's tokens only.

    Raises:
        UserError: the two render to the same tokens, or the template refuses them.
    """
    first = len(pair.prompt)
    chosen = renderer.encode([*pair.prompt, *pair.chosen], where, first=first)
    rejected = renderer.encode([*pair.prompt, *pair.rejected], where, first=first)
    if np.array_equal(chosen[0], rejected[0]):
        raise UserError(f"{where}: chosen and rejected render to the same tokens")
    return chosen, rejected


class PairPacker(Packer):
    """Best-fit packing of whole pairs: chosen and rejected go into the same pack, in order."""

    def add_pair(
        self, chosen: tuple[np.ndarray, np.ndarray], rejected: tuple[np.ndarray, np.ndarray]
    ) -> None:
        """Place one pair (at most `size` tokens together)."""
        target = self._place(len(chosen[0]) + len(rejected[0]))
        for ids, mask in (chosen, rejected):
            target.tokens.append(ids)
            target.masks.append(mask)
            target.used += len(ids)


def build_prefs(
    cfg: PrefsConfig, on_progress: Callable[[int, int], None] | None = None
) -> PrefsSummary:
    """Render, tokenize, mask and pack the pairs of `cfg.inputs` into `cfg.output_prefix`.

    Raises:
        UserError: bad input (one line naming the file and line); nothing is left under the
            final names.
    """
    check_config(cfg)
    summary = PrefsSummary(
        output_prefix=cfg.output_prefix, seq_length=cfg.seq_length, dry_run=cfg.dry_run
    )
    staged_build(cfg, partial(_run, cfg, summary=summary, on_progress=on_progress))
    return summary


def _run(
    cfg: PrefsConfig,
    paths: list[Path],
    renderer: ChatRenderer,
    work: Path,
    writers: Writers | None,
    *,
    summary: PrefsSummary,
    on_progress: Callable[[int, int], None] | None,
) -> None:
    def emit(tokens: np.ndarray, mask: np.ndarray, docs: np.ndarray) -> None:
        summary.num_packs += 1
        summary.num_padding_tokens += int((docs == 0).sum())
        summary.max_pairs_per_pack = max(summary.max_pairs_per_pack, int(docs.max()) // 2)
        if writers is not None:
            writers.write(tokens, mask, docs)

    packer = PairPacker(cfg.seq_length + 1, renderer.pad_id, emit, pack=cfg.pack)
    provenance = Provenance()
    for path, where, obj in iter_objects(paths):
        pair = parse_pair(obj, where)
        provenance.note(path, pair.fmt, obj)
        chosen, rejected = encode_pair(renderer, pair, where)
        summary.num_pairs += 1
        summary.formats[pair.fmt] += 1
        n = len(chosen[0]) + len(rejected[0])
        if n > packer.size or not (chosen[1][1:].any() and rejected[1][1:].any()):
            summary.num_dropped += 1
        else:
            summary.num_tokens += n
            summary.num_trained_tokens += int(chosen[1][1:].sum() + rejected[1][1:].sum())
            packer.add_pair(chosen, rejected)
        if on_progress is not None:
            on_progress(summary.num_pairs, summary.num_tokens)
    packer.close()
    if summary.num_packs == 0:
        inputs = ", ".join(cfg.inputs)
        if not summary.num_pairs:
            raise UserError(f"no preference pairs in {inputs}")
        raise UserError(
            f"all {summary.num_pairs} pairs in {inputs} were dropped: chosen + rejected do not "
            f"fit in --seq-length {cfg.seq_length} + 1 tokens; raise --seq-length"
        )
    if writers is not None:
        writers.close()
        manifest = packed_manifest(KIND, cfg, paths, renderer, provenance, summary.as_dict())
        commit_packs(cfg.output_prefix, work, writers, manifest)


def run_prefs(
    cfg: PrefsConfig, show_progress: bool = True, interval_s: float = 10.0
) -> dict[str, Any]:
    """`llmctl data prefs`: `build_prefs` with a plain progress line on stderr (every
    `interval_s` seconds, every 256 pairs at most); returns the summary."""
    start = last = time.monotonic()

    def update(pairs: int, tokens: int) -> None:
        nonlocal last
        now = time.monotonic()
        if not show_progress or pairs % 256 or now - last < interval_s:
            return
        last = now
        print(
            f"prefs: {pairs:,} pairs {tokens:,} tokens {pairs / (now - start):,.0f} pairs/s",
            file=sys.stderr,
        )

    return build_prefs(cfg, on_progress=update).as_dict()
