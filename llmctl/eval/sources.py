"""What `llmctl eval SOURCE` can evaluate, found before any model is loaded.

Three kinds of source, told apart by their files:

- a llmctl run directory (`config.yaml`, `checkpoints/`): its checkpoint is validated here and
  exported to a Hugging Face directory in a temporary folder when the evaluation runs (the
  export code of `llmctl export hf`); its own held-out data is the validation split of its
  first data prefix;
- a Hugging Face model directory (`config.json`, `*.safetensors`), e.g. an `llmctl export hf`
  output;
- a quantized model (`config.json` with a `quantization_config`, e.g. an `llmctl quantize`
  output): transformers decompresses compressed-tensors weights on load, on CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.hf.export import RunCheckpoint


class SourceKind(StrEnum):
    """Where the weights come from."""

    RUN_DIR = "run_dir"
    HF = "hf"
    QUANTIZED = "quantized"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSource:
    """One model to evaluate, as found on disk."""

    path: Path
    kind: SourceKind
    architecture: str
    tokenizer: Path | None  # tokenizer.json of the model (or of the run)
    model_vocab: int
    max_positions: int
    checkpoint: RunCheckpoint | None = None  # run directories only
    run_data: str | None = None  # the run's first data prefix
    run_split: str | None = None  # the run's data.split
    quantization: str | None = None  # quantization_config.format of a quantized model

    @property
    def label(self) -> str:
        """How tables name this model."""
        step = f"@{self.checkpoint.step}" if self.checkpoint else ""
        return f"{self.path.name}{step}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "path": str(self.path),
            "kind": self.kind.value,
            "architecture": self.architecture,
            "step": self.checkpoint.step if self.checkpoint else None,
            "tokenizer": str(self.tokenizer) if self.tokenizer else None,
            "quantization": self.quantization,
        }


WHAT = "a llmctl run directory, a Hugging Face model directory or a `llmctl quantize` output"


def _is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def _own_data(cfg: Any, resolved: str | None) -> str | None:
    """The run's held-out data prefix: its first `data.prefixes`, or the demo corpus when the
    run trains on it with its tokenizer (neither set); an imported model with its own
    tokenizer and no data has none."""
    if cfg.data.prefixes:
        return str(cfg.data.prefixes[0])
    return resolved if cfg.data.tokenizer is None else None


def _run_source(path: Path, step: int | None, tokenizer: Path | None) -> ModelSource:
    from llmctl.config import load_resolved
    from llmctl.hf import export

    ckpt = export.find_run_checkpoint(path, step, tokenizer)
    arch = export.check_exportable(ckpt.model)
    if ckpt.tokenizer is None or not Path(ckpt.tokenizer).is_file():
        raise UserError(f"run {path}: tokenizer not found; pass --tokenizer PATH")
    cfg = load_resolved(path / "config.yaml")
    return ModelSource(
        path=path,
        kind=SourceKind.RUN_DIR,
        architecture=arch,
        tokenizer=Path(ckpt.tokenizer),
        model_vocab=int(ckpt.model.vocab_size),
        max_positions=int(ckpt.model.max_position_embeddings or ckpt.model.seq_length),
        checkpoint=ckpt,
        run_data=_own_data(cfg, ckpt.data_prefix),
        run_split=cfg.data.split,
    )


def _hf_source(path: Path, tokenizer: Path | None) -> ModelSource:
    from llmctl.hf import modeldir

    config = modeldir.read_config(path)
    modeldir.read_tensors(path)  # weights present and readable
    archs = config.get("architectures") or []
    arch = str(archs[0]) if archs else "none"
    if not arch.endswith("ForCausalLM") and "LMHead" not in arch:
        raise UserError(f"{path}: config.json names no causal LM architecture ({arch})")
    if tokenizer is not None and not tokenizer.is_file():
        raise UserError(f"--tokenizer {tokenizer} not found (expected a tokenizer.json)")
    tok = tokenizer or path / "tokenizer.json"
    quant = config.get("quantization_config")
    return ModelSource(
        path=path,
        kind=SourceKind.QUANTIZED if quant else SourceKind.HF,
        architecture=arch,
        tokenizer=tok if tok.is_file() else None,
        model_vocab=int(config.get("vocab_size") or 0),
        max_positions=int(config.get("max_position_embeddings") or config.get("n_positions") or 0)
        or 1 << 30,
        quantization=str(quant.get("format") or quant.get("quant_method")) if quant else None,
    )


def resolve_source(
    path: Path, step: int | None = None, tokenizer: Path | None = None
) -> ModelSource:
    """The model at `path`, checked (checkpoint validated, config and weights read).

    Raises:
        UserError: Missing, not a folder, or not one of the three kinds, in one line.
    """
    if not path.exists():
        raise UserError(f"source {path} not found (expected {WHAT})")
    if not path.is_dir():
        raise UserError(f"source {path} is not a directory (expected {WHAT})")
    if _is_run_dir(path):
        return _run_source(path, step, tokenizer)
    if not (path / "config.json").is_file():
        raise UserError(
            f"source {path} is not a model: no config.json or config.yaml (expected {WHAT})"
        )
    if step is not None:
        raise UserError(f"--step applies to run directories; {path} is a model directory")
    return _hf_source(path, tokenizer)
