"""A labelled test corpus for `llmctl data clean`, made from real text found on this machine.

The parity test, the language-ID measurement and the benchmark need documents that no filter
was tuned on, in several languages and shapes: licence texts (/usr/share/common-licenses),
Debian changelogs (/usr/share/doc/*/changelog*.gz), the Python standard library (docstrings
as prose, source as code), the translations in the gettext catalogues under
/usr/share/locale (one language per catalogue: the labels for language ID), and synthetic
boilerplate (cookie banners, lorem ipsum, lists, repeated lines) built from those texts.
Documents are windows of random length over each source, so many sit near the thresholds.
Everything is deterministic for a given seed; sources missing here are skipped.
"""

from __future__ import annotations

import ast
import gettext
import gzip
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOCALE_DIR = Path("/usr/share/locale")
LANGUAGES = ("en", "de", "fr", "es", "it", "pt", "nl", "sv", "pl", "cs", "ru", "uk", "tr", "fi",
             "hu", "ja", "zh_CN")  # fmt: skip
"""Catalogue languages used (py3langid's codes, except zh_CN -> zh)."""


@dataclass(frozen=True, slots=True)
class LabelledDoc:
    """One corpus document: its text, where it came from, and its language if known."""

    text: str
    source: str
    language: str | None = None


def _windows(parts: list[str], rng: random.Random, sep: str, max_len: int) -> Iterator[str]:
    i = 0
    while i < len(parts):
        n = rng.randint(1, max_len)
        yield sep.join(parts[i : i + n])
        i += n


def licence_docs(rng: random.Random) -> Iterator[LabelledDoc]:
    """Paragraph windows of the licence texts."""
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if not path.is_file():
            continue
        paras = [p.strip() for p in path.read_text(errors="replace").split("\n\n") if p.strip()]
        for text in _windows(paras, rng, "\n\n", 12):
            yield LabelledDoc(text, f"licence:{path.name}", "en")


def changelog_docs(rng: random.Random, max_files: int = 300) -> Iterator[LabelledDoc]:
    """Entry windows of Debian changelogs (lists, names, versions, dates, e-mail addresses)."""
    paths = sorted(Path("/usr/share/doc").glob("*/changelog*.gz"))[:max_files]
    for path in paths:
        try:
            text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError):
            continue
        entries = [e for e in text.split("\n\n") if e.strip()][:40]
        for doc in _windows(entries, rng, "\n\n", 8):
            yield LabelledDoc(doc, f"changelog:{path.parent.name}")


def python_docs(rng: random.Random, max_files: int = 400) -> Iterator[LabelledDoc]:
    """Docstrings (prose, English) and source windows (code) of the standard library."""
    root = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for path in sorted(root.glob("*.py"))[:max_files]:
        source = path.read_text(errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    yield LabelledDoc(doc, f"docstring:{path.name}", "en")
        for text in _windows(source.splitlines(), rng, "\n", 80):
            if text.strip():
                yield LabelledDoc(text, f"code:{path.name}")


def catalogue_messages(language: str, max_files: int = 40) -> list[str]:
    """Translated messages (msgstr) of the gettext catalogues of one language."""
    folder = LOCALE_DIR / language / "LC_MESSAGES"
    out: list[str] = []
    for path in sorted(folder.glob("*.mo"))[:max_files]:
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
        except (OSError, ValueError, KeyError):  # a malformed catalogue is skipped
            continue
        for key, value in catalog.items():
            if isinstance(value, str) and key and value != key and len(value) > 20:
                out.append(value.strip())
    return out


def catalogue_docs(rng: random.Random) -> Iterator[LabelledDoc]:
    """Windows of translated messages, labelled with the catalogue's language."""
    for lang in LANGUAGES:
        label = lang.split("_")[0]
        messages = catalogue_messages(lang)
        rng.shuffle(messages)
        for text in _windows(messages, rng, "\n", 25):
            yield LabelledDoc(text, f"catalogue:{lang}", label)


_BANNERS = (
    "This website uses cookies to improve your experience.",
    "By continuing you agree to our Terms of Use and Privacy Policy.",
    "Please enable JavaScript to view this page.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "Click here to subscribe to our newsletter...",
    "Copyright 2024 All rights reserved.",
)


def boilerplate_docs(rng: random.Random, prose: list[str], num: int) -> Iterator[LabelledDoc]:
    """Pages made of real sentences mixed with banners, bullet lists, repeated lines,
    ellipses, hashes and curly brackets."""
    for i in range(num):
        lines = [rng.choice(prose) for _ in range(rng.randint(2, 30))]
        kind = i % 6
        if kind == 0:
            lines = [f"{rng.choice('-•*')} {line[:60]}" for line in lines]
        elif kind == 1:
            lines += [rng.choice(_BANNERS) for _ in range(rng.randint(1, 4))]
        elif kind == 2:
            lines += [lines[0]] * rng.randint(1, 10)
        elif kind == 3:
            lines = [line[: rng.randint(10, 80)] + "..." for line in lines]
        elif kind == 4:
            lines = [f"#{w}" for line in lines for w in line.split()[:3]] + lines
        elif kind == 5 and lines:
            lines.insert(rng.randrange(len(lines)), "function f() { return 1; }")
        yield LabelledDoc("\n".join(lines), f"boilerplate:{kind}", "en")


def build_corpus(max_docs: int = 3000, seed: int = 0) -> list[LabelledDoc]:
    """Up to `max_docs` documents from every source available here, interleaved."""
    rng = random.Random(seed)
    pools = [
        list(licence_docs(rng)),
        list(changelog_docs(rng)),
        list(python_docs(rng)),
        list(catalogue_docs(rng)),
    ]
    prose = [line for d in pools[0] for line in d.text.splitlines() if len(line) > 30]
    pools.append(list(boilerplate_docs(rng, prose or ["A line of text."], max_docs // 6)))
    for pool in pools:
        rng.shuffle(pool)
    out: list[LabelledDoc] = []
    while len(out) < max_docs and any(pools):
        for pool in pools:
            if pool and len(out) < max_docs:
                out.append(pool.pop())
    return out
