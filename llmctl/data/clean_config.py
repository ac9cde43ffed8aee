"""Options of `llmctl data clean`: which steps run, each step's thresholds, and overrides.

Every threshold is a field of a step's config dataclass (`llmctl.data.filters.*`), set from
the CLI with `--set SECTION.FIELD=VALUE` (the value is YAML: `30`, `null`, `[en, de]`) or
from a YAML file (`--config FILE`, a mapping of sections), the same dotted names either way:

    llmctl data clean raw/ -o clean/ --set gopher_quality.min_doc_words=30 \\
        --set c4.filter_no_terminal_punct=false
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from llmctl.data.filters.decontam import DecontamAction, DecontamConfig
from llmctl.data.filters.langid import LanguageConfig
from llmctl.data.filters.pii import PiiConfig
from llmctl.data.filters.quality import (
    C4Config,
    CharsetConfig,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
)
from llmctl.data.readers import OnError
from llmctl.errors import UserError


class Step(StrEnum):
    """Pipeline steps, in the order they run (FineWeb's order for the quality filters)."""

    LANGUAGE = "language"
    GOPHER_REPETITION = "gopher_repetition"
    GOPHER_QUALITY = "gopher_quality"
    C4 = "c4"
    FINEWEB = "fineweb"
    CHARSET = "charset"
    DECONTAM = "decontam"
    PII = "pii"


DEFAULT_STEPS = (Step.GOPHER_REPETITION, Step.GOPHER_QUALITY, Step.C4, Step.FINEWEB)
SECTIONS = tuple(s.value for s in Step)


@dataclass(kw_only=True)
class CleanConfig:
    """Options of one clean run."""

    inputs: list[str]
    """Input files or folders (JSONL, .gz/.zst, Parquet, text)."""
    output_dir: str | None = None
    """Folder for the kept documents and clean_report.json; not needed with dry_run."""
    steps: list[Step] = field(default_factory=lambda: list(DEFAULT_STEPS))
    """Steps to run (they always run in `Step` order)."""
    language: LanguageConfig = field(default_factory=LanguageConfig)
    """Language identification settings."""
    gopher_repetition: GopherRepetitionConfig = field(default_factory=GopherRepetitionConfig)
    """Gopher repetition thresholds."""
    gopher_quality: GopherQualityConfig = field(default_factory=GopherQualityConfig)
    """Gopher quality thresholds."""
    c4: C4Config = field(default_factory=C4Config)
    """C4 line and page rules."""
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)
    """FineWeb quality thresholds."""
    charset: CharsetConfig = field(default_factory=CharsetConfig)
    """Character-class limits."""
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    """Evaluation sets and n-gram size."""
    pii: PiiConfig = field(default_factory=PiiConfig)
    """Which PII kinds to replace."""
    text_field: str = "text"
    """JSONL key or Parquet column holding the text."""
    on_error: OnError = OnError.FAIL
    """Bad input: fail, or skip and count."""
    num_workers: int = 0
    """Worker processes; 0 means one per CPU core."""
    chunk_bytes: int = 32 << 20
    """Input bytes per work unit."""
    dry_run: bool = False
    """Clean a sample and report; write nothing."""
    sample_docs: int = 10_000
    """Documents a dry run looks at."""
    num_examples: int = 3
    """Rejected documents shown per step in the report."""
    write_rejected: bool = False
    """Also write rejected.jsonl: each rejected document with the step and reason."""
    force: bool = False
    """Replace llmctl's earlier outputs in a non-empty output folder."""

    def __post_init__(self) -> None:
        try:
            self.steps = [Step(s) for s in self.steps]
            self.on_error = OnError(self.on_error)
            self.decontam.action = DecontamAction(self.decontam.action)
        except ValueError as e:
            raise UserError(f"clean: {e}") from None

    def ordered_steps(self) -> list[Step]:
        """The chosen steps in pipeline order."""
        return [s for s in Step if s in self.steps]

    def params(self) -> dict[str, Any]:
        """What decides the result (for the report, and so a resumed run never mixes two)."""
        out: dict[str, Any] = {"steps": [s.value for s in self.ordered_steps()]}
        for s in self.ordered_steps():
            out[s.value] = {
                k: (str(v) if isinstance(v, StrEnum) else v)
                for k, v in asdict(getattr(self, s.value)).items()
            }
        out["text_field"] = self.text_field
        return out


def steps_from_options(
    filters: str, languages: str | None, eval_files: list[str] | None, pii: bool
) -> list[Step]:
    """The steps the CLI options name: `--filters` (comma-separated, `none`), plus language
    with `--languages`, decontam with `--decontam`, pii with `--pii`.

    Raises:
        UserError: an unknown filter name.
    """
    names = [n.strip() for n in filters.split(",") if n.strip() and n.strip() != "none"]
    try:
        steps = [Step(n) for n in names]
    except ValueError:
        bad = next(n for n in names if n not in SECTIONS)
        raise UserError(
            f"--filters: unknown filter {bad!r} (one of {', '.join(SECTIONS)})"
        ) from None
    steps += [Step.LANGUAGE] if languages else []
    steps += [Step.DECONTAM] if eval_files else []
    steps += [Step.PII] if pii else []
    return steps


def _coerce(section: str, name: str, current: Any, hint: str, value: Any) -> Any:
    """`value` checked against the field's current value and annotation."""
    where = f"{section}.{name}"
    if value is None:
        if "None" in hint:
            return None
        raise UserError(f"{where} cannot be null")
    if isinstance(current, bool) or hint == "bool":
        if not isinstance(value, bool):
            raise UserError(f"{where} must be true or false, got {value!r}")
        return value
    if "float" in hint and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if "int" not in hint else value
    if "int" in hint and isinstance(value, int) and not isinstance(value, bool):
        return value
    if "list" in hint:
        return value if isinstance(value, list) else [value]
    if "str" in hint or isinstance(current, StrEnum):
        return str(value)
    raise UserError(f"{where}: expected {hint}, got {value!r}")


def set_option(cfg: CleanConfig, key: str, value: Any) -> None:
    """Set `SECTION.FIELD` (or a top-level field such as `steps`) to a parsed value.

    Raises:
        UserError: an unknown key or a value of the wrong type.
    """
    section, _, name = key.partition(".")
    target: Any = cfg
    if name:
        if section not in SECTIONS:
            raise UserError(f"unknown section {section!r} in {key!r} (one of {SECTIONS})")
        target = getattr(cfg, section)
    else:
        name, section = section, "clean"
    fields = {f.name: f for f in dataclasses.fields(target)}
    if name not in fields or (target is cfg and name in ("inputs", "output_dir")):
        raise UserError(f"unknown option {key!r}; known: {', '.join(sorted(fields))}")
    hint = str(fields[name].type)
    setattr(target, name, _coerce(section, name, getattr(target, name), hint, value))


def apply_overrides(cfg: CleanConfig, overrides: list[str], config_file: str | None) -> None:
    """Apply a YAML file of sections, then `KEY=VALUE` overrides (values parsed as YAML).

    Raises:
        UserError: a malformed override or file, an unknown key, a value of the wrong type.
    """
    import yaml

    if config_file:
        try:
            data = yaml.safe_load(Path(config_file).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise UserError(f"--config {config_file}: {e}") from None
        if not isinstance(data, dict):
            raise UserError(f"--config {config_file}: expected a mapping of sections")
        for section, values in data.items():
            if isinstance(values, dict):
                for name, value in values.items():
                    set_option(cfg, f"{section}.{name}", value)
            else:
                set_option(cfg, str(section), values)
    for item in overrides:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        set_option(cfg, key.strip(), value)
    cfg.__post_init__()
