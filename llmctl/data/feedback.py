"""The feedback format: production bad cases as the next fine-tuning set (docs/finetune.md).

One JSONL line per case a reviewer corrected::

    {"prompt": "...",                      # or "messages": [...] (the turns before the reply)
     "bad_response": "...",                # what the model answered
     "corrected_response": "...",          # what it should have answered
     "source": "prod:2026-12-01#4711",     # optional: where the case came from
     "model": "runs/sft-v3"}               # optional: the model that gave the bad response

`llmctl data sft` reads it with the corrected response as the target; `llmctl data prefs`
reads it as a preference pair, corrected (chosen) vs bad (rejected). Both manifests record, per
input file, its SHA-256, how many lines of each format it held and the `source` and `model`
values counted (the 50 most frequent, and how many distinct), so a data set names the cases
(and the model) it was made from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

BAD, CORRECTED = "bad_response", "corrected_response"
MAX_VALUES = 50
"""`source`/`model` values a manifest lists per input (the most frequent)."""


@dataclass(frozen=True, slots=True)
class FeedbackCase:
    """One corrected case: the conversation before the reply, the bad and the corrected reply."""

    prompt: list[dict[str, str]]
    bad: str
    corrected: str


def is_feedback(obj: dict[str, Any]) -> bool:
    """Whether a parsed line is in the feedback format."""
    return BAD in obj or CORRECTED in obj


def prompt_messages(obj: dict[str, Any], where: str) -> list[dict[str, str]]:
    """The conversation before the reply: `prompt` (one user turn) or `messages` (ending with a
    user or tool turn).

    Raises:
        UserError: neither given, or a malformed conversation, naming `where`.
    """
    from llmctl.data.sft import _check_message

    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise UserError(f"{where}: 'messages' must be a non-empty list")
        out = [_check_message(m, i, where) for i, m in enumerate(msgs)]
        if out[-1]["role"] not in ("user", "tool"):
            raise UserError(
                f"{where}: 'messages' must end with a user turn (the reply is given separately)"
            )
        return out
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f"{where}: expected 'prompt' (a string) or 'messages' (a list)")
    return [{"role": "user", "content": prompt}]


def _reply(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        raise UserError(
            f"{where}: '{key}' is missing (a feedback line needs {BAD} and {CORRECTED})"
        )
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: '{key}' must be a non-empty string")
    return value


def parse_feedback(obj: dict[str, Any], where: str) -> FeedbackCase:
    """The case of one feedback line.

    Raises:
        UserError: a missing or empty reply, a corrected reply equal to the bad one, or a bad
            prompt, naming `where`.
    """
    prompt = prompt_messages(obj, where)
    bad, corrected = _reply(obj, BAD, where), _reply(obj, CORRECTED, where)
    if bad == corrected:
        raise UserError(f"{where}: '{CORRECTED}' equals '{BAD}': nothing was corrected")
    for key in ("source", "model"):
        if key in obj and not isinstance(obj[key], str):
            raise UserError(f"{where}: '{key}' must be a string")
    return FeedbackCase(prompt=prompt, bad=bad, corrected=corrected)


class Provenance:
    """Per input file: lines of each format, and the `source`/`model` values they name."""

    def __init__(self) -> None:
        self.formats: dict[Path, Counter[str]] = {}
        self.sources: dict[Path, Counter[str]] = {}
        self.models: dict[Path, Counter[str]] = {}

    def note(self, path: Path, fmt: str, obj: dict[str, Any]) -> None:
        """Count one line of `path`."""
        self.formats.setdefault(path, Counter())[fmt] += 1
        for key, table in (("source", self.sources), ("model", self.models)):
            if isinstance(obj.get(key), str):
                table.setdefault(path, Counter())[obj[key]] += 1

    def of(self, path: Path) -> dict[str, Any]:
        """The manifest fields of one input (sources/models only when lines named them; the
        `MAX_VALUES` most frequent of each, with the number of distinct values)."""
        out: dict[str, Any] = {"formats": dict(sorted(self.formats.get(path, Counter()).items()))}
        for key, table in (("sources", self.sources), ("models", self.models)):
            if path in table:
                top = table[path].most_common(MAX_VALUES)
                out[key] = dict(sorted(top))
                if len(table[path]) > MAX_VALUES:
                    out[f"distinct_{key}"] = len(table[path])
        return out
