"""The clean steps one by one: hand-made documents for each rule, PII, decontamination,
language ID, the word splitter and the option surface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmctl.data.clean_config import CleanConfig, Step, apply_overrides, steps_from_options
from llmctl.data.filters.decontam import DecontamConfig, contaminated
from llmctl.data.filters.pii import PiiConfig
from llmctl.data.filters.quality import (
    GOPHER_STOP_WORDS,
    C4Config,
    Doc,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    duplicated_ngram_chars,
    top_ngram_chars,
)
from llmctl.data.filters.text import count_sentences, split_words
from llmctl.errors import UserError

PROSE = (
    "The committee met on Tuesday to review the budget and to discuss the plans that have "
    "been proposed for the new library. Members agreed with the general direction of the "
    "work, and several of them asked for more detail on the costs of the building. "
) * 2


def test_split_words_follows_spacy_rules() -> None:
    assert split_words("Don't stop-it, e.g. U.S. now.") == [
        "Do", "n't", "stop", "-", "it", ",", "e.g.", "U.S.", "now", ".",
    ]  # fmt: skip
    assert split_words("see <https://x.org/a> (cannot)") == [
        "see", "<", "https://x.org/a", ">", "(", "can", "not", ")",
    ]  # fmt: skip
    assert count_sentences(split_words("One. Two! Three...")) == 3
    assert count_sentences(split_words("It was... fine then.")) == 1


def test_gopher_quality_rules() -> None:
    cfg = GopherQualityConfig()
    assert cfg.check(Doc(PROSE)) is None
    assert cfg.check(Doc("too short but has the and of")) == "gopher_short_doc"
    assert cfg.check(Doc(PROSE + " #tag" * 20)) == "gopher_too_many_hashes"
    bullets = "\n".join(f"- {line}" for line in PROSE.split(". "))
    assert cfg.check(Doc(bullets)) == "gopher_too_many_bullets"
    assert GopherQualityConfig(max_bullet_lines_ratio=None).check(Doc(bullets)) is None
    no_stop = " ".join(w for w in PROSE.split() if w not in GOPHER_STOP_WORDS)
    assert cfg.check(Doc(no_stop)) == "gopher_enough_stop_words"


def test_gopher_repetition_counts() -> None:
    words = ["a", "b", "a", "b", "a", "b"]
    assert top_ngram_chars(words, 2) == 3 * 3  # "a b" three times
    assert duplicated_ngram_chars(["x", "y", "z", "x", "y", "z"], 3) == 3  # "xyz" repeated once
    cfg = GopherRepetitionConfig()
    assert cfg.check(Doc(PROSE)) is not None  # the prose repeats itself twice
    assert cfg.check(Doc(PROSE[: len(PROSE) // 2])) is None
    assert cfg.check(Doc("same line\nsame line\nsame line\nother")) == "dup_line_frac"


def test_c4_drops_lines_and_pages() -> None:
    cfg = C4Config()
    text = (PROSE * 2).replace(". ", ".\n") + "\nmenu\nPlease enable JavaScript to see this page."
    doc = Doc(text)
    assert cfg.check(doc) is None
    assert "menu" not in doc.text and "JavaScript" not in doc.text
    assert cfg.check(Doc(PROSE + "\nLorem ipsum dolor sit amet.")) == "lorem_ipsum"
    assert cfg.check(Doc("One sentence only here.")) == "too_few_sentences"


def test_fineweb_rules() -> None:
    cfg = FineWebConfig()
    assert cfg.check(Doc(PROSE.strip())) is None
    assert cfg.check(Doc(PROSE)) == "line_punct_ratio"  # its one line ends in a space
    assert cfg.check(Doc("\n".join(["short"] * 5 + ["A long line that ends well."]))) in (
        "short_line_ratio", "char_dup_ratio",
    )  # fmt: skip
    assert cfg.check(Doc("no punctuation at all here\nnor here in this line")) == (
        "line_punct_ratio"
    )


PLANTED = {
    "email": ["john.doe@example.com", "a_b+tag@mail.co.uk", "x@sub.example.org"],
    "ip": ["192.168.1.10", "8.8.8.8", "2001:db8::1", "fe80::1ff:fe23:4567:890a"],
    "phone": ["+1 415 555 2671", "(415) 555-2671", "415-555-2671", "+44 20 7946 0958"],
}
LOOKALIKES = [
    "version 3.11.4", "1.2.3-rc1", "v10.0.2", "2024-05-01", "01/02/2024", "10:30:00",
    "sha256:9f86d081884c7d659a2feaa0c55ad015", "commit 1234567890abcdef1234", "std::vector",
    "a::b", "ISBN 978-3-16-148410-0", "pi is 3.14159", "build 20240501.1", "user@localhost",
    "12:34", "256.1.1.1", "port 8080", "1.2.3.4.5",
]  # fmt: skip


def test_pii_replaces_every_planted_value() -> None:
    for kind, values in PLANTED.items():
        for v in values:
            text, counts = PiiConfig().redact(f"Contact: {v}, thanks.")
            assert v not in text and counts[kind] == 1, (kind, v, text)


def test_pii_leaves_lookalikes_alone() -> None:
    for v in LOOKALIKES:
        text, counts = PiiConfig().redact(f"See {v} here.")
        assert text == f"See {v} here." and sum(counts.values()) == 0, (v, text)


def test_decontamination(tmp_path: Path) -> None:
    item = "What is the capital of France? The capital of France is Paris, a city on the Seine."
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"question": item, "id": 3}) + "\n")
    cfg = DecontamConfig(eval_files=[str(evals)])
    hashes = cfg.load()
    assert contaminated(f"Intro text. {item.upper()} More text.", 13, hashes)
    assert not contaminated(PROSE, 13, hashes)
    with pytest.raises(UserError, match="does not exist"):
        DecontamConfig(eval_files=[str(tmp_path / "missing.jsonl")]).load()


def test_language_id_on_real_sentences() -> None:
    pytest.importorskip("py3langid")
    from llmctl.data.filters.langid import LanguageConfig

    cfg = LanguageConfig(languages=["de"])
    assert cfg.check("Das ist ein ganz normaler deutscher Satz über das Wetter.")[0] is None
    reason, lang, _ = cfg.check(PROSE)
    assert reason == "language_en" and lang == "en"


def test_overrides_and_steps(tmp_path: Path) -> None:
    cfg = CleanConfig(inputs=["x"])
    apply_overrides(cfg, ["gopher_quality.min_doc_words=30", "c4.filter_policy=false",
                          "fineweb.stop_chars=null", "steps=[c4, pii]"], None)  # fmt: skip
    assert cfg.gopher_quality.min_doc_words == 30 and cfg.c4.filter_policy is False
    assert cfg.steps == [Step.C4, Step.PII]
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("gopher_repetition:\n  dup_line_frac: 0.5\n")
    apply_overrides(cfg, [], str(yaml_file))
    assert cfg.gopher_repetition.dup_line_frac == 0.5
    for bad in ["nosuch.x=1", "c4.nosuch=1", "c4.filter_policy=maybe", "gopher_quality=3"]:
        with pytest.raises(UserError):
            apply_overrides(cfg, [bad], None)
    assert steps_from_options("c4", "en", ["e.jsonl"], True) == [
        Step.C4, Step.LANGUAGE, Step.DECONTAM, Step.PII,
    ]  # fmt: skip
    with pytest.raises(UserError, match="unknown filter"):
        steps_from_options("c5", None, None, False)
