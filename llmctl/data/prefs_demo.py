"""A synthetic preference task for tests and the CPU demo (docs/finetune.md).

"name": the words of `llmctl.data.sft_demo.WORDS` fall in four kinds of eight (colours,
fruits, numbers, directions and animals); the user asks `name a KIND`, the chosen reply is a
word of that kind, the rejected one a word of another kind. Every word is as often chosen as
rejected over the task, so a model that ignores the prompt prefers the chosen reply of about
half of the pairs, whatever its taste in words; one that learned which words answer which
question prefers it in every pair, held-out pairs (new combinations) included.
"""

from __future__ import annotations

import random

from llmctl.data.sft_demo import WORDS

KINDS = ("colour", "fruit", "number", "thing")
"""The four kinds: WORDS in blocks of eight."""


def kind_words() -> dict[str, tuple[str, ...]]:
    """kind -> its eight words."""
    return {k: WORDS[8 * i : 8 * i + 8] for i, k in enumerate(KINDS)}


def name_pairs(num: int, *, seed: int = 0, feedback_share: float = 0.0) -> list[dict[str, str]]:
    """`num` preference lines (`prompt`, `chosen`, `rejected`); about `feedback_share` of them
    in the feedback format (`bad_response`, `corrected_response`, `source`)."""
    words = kind_words()
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    for i in range(num):
        kind = rng.choice(KINDS)
        other = rng.choice([k for k in KINDS if k != kind])
        good, bad = rng.choice(words[kind]), rng.choice(words[other])
        prompt = f"name a {kind}"
        if rng.random() < feedback_share:
            out.append({"prompt": prompt, "bad_response": bad, "corrected_response": good,
                        "source": f"demo#{i}"})  # fmt: skip
        else:
            out.append({"prompt": prompt, "chosen": good, "rejected": bad})
    return out
