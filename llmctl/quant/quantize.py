"""`llmctl quantize`: plan (every check, no heavy work), then run llm-compressor and verify.

The run: export the checkpoint when the source is a run directory, load the model in fp32 and
score held-out perplexity, cast to bf16 (so scales are 16-bit: 4.125 bits for INT4 g128), run
llm-compressor's `oneshot` with calibration sequences from the user's indexed dataset, save in
the compressed-tensors format, then reload the output with transformers exactly as a user would
and score it again. The output is written to a hidden staging directory next to `--out` and
renamed only after the report is in it, so an interrupted run leaves nothing that looks like a
finished model.

Memory: llm-compressor's sequential pipeline calibrates one decoder layer at a time, so beyond
the model itself (held once, in bf16, plus the fp32 copy for the baseline score) the peak grows
with one layer's activations for the calibration set, not with the depth.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.hf import modeldir
from llmctl.progress import NO_PROGRESS, Phase, Progress, third_party_output_to
from llmctl.quant import calibration
from llmctl.quant.linears import hf_linear_shapes, linear_shapes, quantized_bits_per_weight
from llmctl.quant.schemes import (
    SUPPORTED_ARCHITECTURES,
    QuantSpec,
    check_group_divisibility,
    check_moe_scheme,
    fit_group_size,
    is_ignored,
    quantized_linears,
    theoretical_bits_per_weight,
)
from llmctl.staging import check_out, publish, staging_dir

if TYPE_CHECKING:
    from llmctl.config.schema import QuantConfig
    from llmctl.hf.export import RunCheckpoint

REPORT_FILE = "quant_report.json"
DEFAULT_EVAL_TOKENS = 16384


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantRequest:
    """What the user asked for (CLI options, resolved config)."""

    source: Path
    out: Path
    spec: QuantSpec
    data: str | None = None  # indexed prefix, or a .jsonl/.txt file
    tokenizer: Path | None = None  # run directories: override of the run's tokenizer
    step: int | None = None
    num_eval_tokens: int = DEFAULT_EVAL_TOKENS
    dtype: str = "bf16"
    force: bool = False
    group_size_given: bool = True  # False: the preset's; adapted to the model if needed
    user_ignore: tuple[str, ...] = ()  # --ignore entries: each must match a Linear module


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantPlan:
    """A checked request: everything the run needs, found without loading a model."""

    request: QuantRequest
    source_kind: str  # "run_dir" or "hf"
    architecture: str
    linears: dict[str, tuple[int, int]]
    data: str | None
    tokenizer: Path | None
    tokenizer_vocab: int
    model_vocab: int
    eval_seq_len: int
    theoretical_bits: float
    checkpoint: RunCheckpoint | None = None  # for run directories
    split: calibration.TokenSplit | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for --dry-run)."""
        spec = self.request.spec
        return {
            "source": str(self.request.source),
            "source_kind": self.source_kind,
            "checkpoint": str(self.checkpoint.path) if self.checkpoint else None,
            "out": str(self.request.out),
            "architecture": self.architecture,
            "scheme": spec.scheme.value,
            "algorithm": spec.algorithm.value,
            "group_size": spec.group_size,
            "ignore": list(spec.ignore),
            "num_quantized_linears": len(quantized_linears(spec, self.linears)),
            "theoretical_bits_per_weight": round(self.theoretical_bits, 4),
            "data": self.data,
            "num_calibration_samples": spec.num_calibration_samples,
            "calibration_seq_length": spec.calibration_seq_length,
            "num_eval_tokens": self.request.num_eval_tokens if self.split is not None else 0,
            "eval_seq_len": self.eval_seq_len,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantReport:
    """Measured result of one quantization (saved as quant_report.json in the output)."""

    source: str
    out: str
    scheme: str
    algorithm: str
    group_size: int | None
    ignore: list[str]
    size_before_bytes: int
    size_after_bytes: int
    source_bits_per_weight: int
    bits_per_weight: float
    theoretical_bits_per_weight: float
    num_quantized_linears: int
    perplexity_before: float | None  # None: no data to score on (RTN/FP8 without --data)
    perplexity_after: float | None
    num_eval_tokens: int
    eval_seq_len: int
    num_calibration_samples: int
    calibration_seq_length: int
    wall_s: float
    phase_s: dict[str, float]
    peak_rss_bytes: int
    versions: dict[str, str]
    notes: list[str] = field(default_factory=list)

    @property
    def perplexity_change_pct(self) -> float | None:
        """Relative perplexity change, in percent (positive = worse); None when not scored."""
        if self.perplexity_before is None or self.perplexity_after is None:
            return None
        return 100.0 * (self.perplexity_after / self.perplexity_before - 1.0)

    def as_dict(self) -> dict[str, Any]:
        """Fields plus the derived perplexity change."""
        data = asdict(self)
        change = self.perplexity_change_pct
        data["perplexity_change_pct"] = None if change is None else round(change, 4)
        return data


def _check_out(request: QuantRequest) -> None:
    check_out(request.out, request.force, REPORT_FILE)
    if request.out.resolve() == request.source.resolve():
        raise UserError("--out must differ from the source directory")


def _plan_hf(request: QuantRequest) -> dict[str, Any]:
    config = modeldir.read_config(request.source)
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(
            f"{request.source}: architecture {arch} is not supported; llmctl quantizes "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if "quantization_config" in config:
        raise UserError(f"{request.source} is already quantized (config.json quantization_config)")
    if request.tokenizer is not None and not request.tokenizer.is_file():
        raise UserError(f"--tokenizer {request.tokenizer} not found (expected a tokenizer.json)")
    tokenizer = request.tokenizer or request.source / "tokenizer.json"
    return {
        "source_kind": "hf",
        "architecture": arch,
        "linears": linear_shapes(modeldir.read_tensors(request.source)),
        "data": request.data,
        "tokenizer": tokenizer if tokenizer.is_file() else None,
        "tokenizer_vocab": _vocab(request.source, request.data),
        "model_vocab": int(config.get("vocab_size", 0)),
        "max_positions": int(config.get("max_position_embeddings") or 1 << 30),
        "checkpoint": None,
    }


def _plan_run(request: QuantRequest) -> dict[str, Any]:
    from llmctl.hf import export

    ckpt = export.find_run_checkpoint(request.source, request.step, request.tokenizer)
    arch = export.check_exportable(ckpt.model)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(
            f"run {request.source} exports as {arch}, which llmctl does not quantize (its "
            f"projections are Conv1D, not Linear); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if ckpt.tokenizer is None:
        raise UserError(f"run {request.source}: tokenizer not found; pass --tokenizer PATH")
    from llmctl.run.data import tokenizer_info

    return {
        "source_kind": "run_dir",
        "architecture": arch,
        "linears": hf_linear_shapes(ckpt.model),
        "data": request.data or ckpt.data_prefix,
        "tokenizer": Path(ckpt.tokenizer),
        "tokenizer_vocab": tokenizer_info(str(ckpt.tokenizer))[0],
        "model_vocab": int(ckpt.model.vocab_size),
        "max_positions": int(ckpt.model.max_position_embeddings or ckpt.model.seq_length),
        "checkpoint": ckpt,
    }


def is_run_dir(path: Path) -> bool:
    """A llmctl run directory holds config.yaml and checkpoints/."""
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def plan_quantization(request: QuantRequest) -> QuantPlan:
    """Run every check that needs no model: source, architecture, group sizes, data, output.

    Raises:
        UserError: The first problem found, in one line.
    """
    if not request.source.is_dir():
        raise UserError(f"source {request.source} is not a directory")
    _check_out(request)
    found = _plan_run(request) if is_run_dir(request.source) else _plan_hf(request)
    # sequences longer than the model's positions would calibrate on extrapolated RoPE
    seq_len = min(request.spec.calibration_seq_length, found.pop("max_positions"))
    spec = replace(request.spec, calibration_seq_length=seq_len)
    notes: list[str] = []
    if not request.group_size_given:
        spec, note = fit_group_size(spec, found["linears"])
        notes += [note] if note else []
    check_group_divisibility(spec, found["linears"])
    check_moe_scheme(spec, found["architecture"])
    _check_user_ignore(request.user_ignore, found["linears"])
    request = replace(request, spec=spec)
    split = _split(request, found)
    if split is None:
        notes.append("no data: perplexity not scored (pass --data PREFIX|FILE.jsonl|FILE.txt)")
    return QuantPlan(
        request=request,
        eval_seq_len=seq_len,
        theoretical_bits=theoretical_bits_per_weight(spec, found["linears"]),
        split=split,
        notes=tuple(notes),
        **found,
    )


def _check_user_ignore(entries: tuple[str, ...], linears: dict[str, tuple[int, int]]) -> None:
    """A typo'd `--ignore` would leave the module it meant quantized: refuse it.

    Raises:
        UserError: An entry that matches no Linear module (naming a few that exist).
    """
    for entry in entries:
        if not any(is_ignored(name, [entry]) for name in linears):
            some = ", ".join(sorted(linears)[:3])
            raise UserError(
                f"--ignore {entry!r} matches no Linear module of the model (e.g. {some}; "
                "'re:PATTERN' matches names from their start)"
            )


def _vocab(model_dir: Path, data: str | None) -> int:
    """Tokenizer vocabulary of a model directory (0 when there is no data to check)."""
    return modeldir.tokenizer_vocab_size(model_dir) if data else 0


def _split(request: QuantRequest, found: dict[str, Any]) -> calibration.TokenSplit | None:
    """Calibration and held-out tokens, checked against both vocabularies; None without data.

    Raises:
        UserError: No data where the algorithm calibrates, too few tokens, or foreign ids.
    """
    spec, data = request.spec, found["data"]
    if not data:
        if spec.needs_calibration:
            raise UserError(
                f"{spec.scheme.value} {spec.algorithm.value} calibrates on data: pass --data "
                "PREFIX (indexed dataset) or FILE.jsonl|FILE.txt (tokenized with the model's "
                "tokenizer); RTN weight-only and FP8 need none"
            )
        return None
    tokens = calibration.load_tokens(data, found["tokenizer"])
    num_samples = spec.num_calibration_samples if spec.needs_calibration else 0
    if request.num_eval_tokens < spec.calibration_seq_length:
        raise UserError(f"--eval-tokens must be >= the window length {spec.calibration_seq_length}")
    split = calibration.split_tokens(
        tokens, num_samples, spec.calibration_seq_length, request.num_eval_tokens
    )
    calibration.check_vocab(split, found["tokenizer_vocab"], found["model_vocab"], str(data))
    return split


def _quiet_progress() -> None:
    """Before any heavy import (both are read at import time): no tqdm bars, and no
    llm-compressor log lines, which it writes to stdout and would corrupt `--json` output.
    `LLMCTL_VERBOSE=1` keeps both."""
    if not os.environ.get("LLMCTL_VERBOSE"):
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("LLM_COMPRESSOR_LOG_DISABLED", "true")


def _offline() -> None:
    """Never reach a hub (saving re-reads config.json and falls back to a download otherwise);
    keep llm-compressor's per-module log lines and progress bars out of the user's terminal."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not os.environ.get("LLMCTL_VERBOSE"):
        from loguru import logger
        from transformers.utils import logging as hf_logging

        logger.disable("llmcompressor")
        try:  # with its logging disabled llm-compressor skips registering the level it
            logger.level("METRIC")  # still logs GPTQ timings at, which loguru then rejects
        except ValueError:
            logger.level("METRIC", no=38)
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("llmcompressor", "compressed-tensors", "transformers", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


def load_model(model_dir: Path, dtype: str = "fp32") -> Any:
    """Load a (possibly compressed) causal LM on CPU from an absolute local path."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir.resolve()), dtype=torch_dtype)
    for param in model.parameters():  # transformers 5.17 keeps a compressed MoE's router and
        if param.is_floating_point() and param.dtype != torch_dtype:  # merged experts in
            param.data = param.data.to(torch_dtype)  # their stored dtype (bf16) under fp32
    return model


def calibration_dataset(split: calibration.TokenSplit) -> Any:
    """The calibration sequences as a `datasets.Dataset` of input_ids/attention_mask."""
    from datasets import Dataset

    ids = split.calibration.tolist()
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})


def run_oneshot(model: Any, model_dir: Path, dataset: Any, spec: QuantSpec) -> Any:
    """Apply the recipe with llm-compressor's `oneshot` (calibrated when the spec needs it)."""
    from llmcompressor import oneshot  # type: ignore[attr-defined]

    from llmctl.quant.recipes import build_recipe

    kwargs: dict[str, Any] = {}
    if spec.needs_calibration:
        kwargs = {
            "dataset": dataset,
            "num_calibration_samples": spec.num_calibration_samples,
            "max_seq_length": spec.calibration_seq_length,
            "tokenizer": str(model_dir.resolve()),
        }
    return oneshot(model=model, recipe=build_recipe(spec), **kwargs)


# llm-compressor 0.14 quantizes a Mixtral's experts as separate Linears and saves them as
# `experts.N.{gate,up,down}_proj`, names transformers 5.17 does not load (it reports the merged
# experts missing and initialises them at random); Mixtral checkpoints, which transformers
# decompresses and merges on load (and vLLM reads), call them w1, w3 and w2.
EXPERT_NAMES: dict[str, dict[str, str]] = {
    "MixtralForCausalLM": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"},
}


def rename_experts(model_dir: Path, architecture: str) -> int:
    """Rename saved expert tensors to the family's checkpoint names (one shard in memory at a
    time; the index follows). Returns the number of tensors renamed."""
    names = EXPERT_NAMES.get(architecture)
    if not names:
        return 0
    import re

    from safetensors import safe_open
    from safetensors.torch import save_file

    pattern = re.compile(r"(\.experts\.\d+\.)(" + "|".join(names) + r")\.")

    def new(key: str) -> str:
        return pattern.sub(lambda m: m.group(1) + names[m.group(2)] + ".", key)

    count = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            meta, tensors = f.metadata(), {new(k): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            count += sum(new(k) != k for k in f.keys())  # noqa: SIM118
        save_file(tensors, str(path), metadata=meta)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {new(k): v for k, v in data.get("weight_map", {}).items()}
        index.write_text(json.dumps(data, indent=2) + "\n")
    return count


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in modeldir.TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def _set_config_dtype(model_dir: Path, dtype: str) -> None:
    """Record the dtype the model was quantized in (llm-compressor keeps the source's)."""
    name = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    path.write_text(json.dumps(config, indent=2) + "\n")


class _Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def time(self, name: str) -> _Timer:
        return _Timer(self.seconds, name)


class _Timer:
    def __init__(self, sink: dict[str, float], name: str) -> None:
        self.sink, self.name = sink, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.sink[self.name] = round(time.perf_counter() - self.t0, 3)


LOG_FILE = "quantize.log"


def _source_model_dir(plan: QuantPlan, workdir: Path, progress: Progress) -> Path:
    if plan.source_kind == "hf":
        return plan.request.source.resolve()
    from llmctl.hf.export import export_hf

    assert plan.checkpoint is not None  # a run directory's plan names its checkpoint
    export_hf(plan.checkpoint, workdir / "export", progress=progress)
    return (workdir / "export").resolve()


def _score(plan: QuantPlan, model: Any, progress: Progress, name: str) -> float | None:
    """Held-out perplexity (None without data), one progress step per forward pass."""
    from llmctl.quant.metrics import num_batches, perplexity

    if plan.split is None:
        return None
    with progress.phase(name, num_batches(len(plan.split.heldout), plan.eval_seq_len)) as p:
        return perplexity(model, plan.split.heldout, plan.eval_seq_len, on_batch=p.advance)


def _layer_progress(model: Any, phase: Phase) -> list[Any]:
    """Forward hooks that move `phase` to the deepest decoder layer reached (llm-compressor's
    sequential pipeline calibrates one layer after another)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []

    def hook(index: int) -> Any:
        return lambda *_: phase.update(index + 1)

    return [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]


def _quantize_into(
    plan: QuantPlan, staging: Path, phases: _Phases, model_dir: Path, progress: Progress
) -> float | None:
    """Load, score, quantize and save into `staging`. Returns the baseline perplexity."""
    spec = plan.request.spec
    with phases.time("load"), progress.phase("load fp32 model"):
        model = load_model(model_dir, "fp32")
    with phases.time("eval_before"):
        ppl_before = _score(plan, model, progress, "perplexity before")
    with phases.time("quantize"):
        if plan.request.dtype != "fp32":  # 16-bit scales: reload rather than cast (config dtype)
            del model
            model = load_model(model_dir, plan.request.dtype)
        split = plan.split if spec.needs_calibration else None
        dataset = calibration_dataset(split) if split is not None else None
        num_layers = len(getattr(getattr(model, "model", None), "layers", None) or [])
        with progress.phase(f"{spec.algorithm.value} by layer", num_layers or None) as p:
            hooks = _layer_progress(model, p) if spec.needs_calibration else []
            model = run_oneshot(model, model_dir, dataset, spec)
            p.update(num_layers)
            for h in hooks:
                h.remove()
    with phases.time("save"), progress.phase("save compressed"):
        model.save_pretrained(str(staging), save_compressed=True)
        rename_experts(staging, plan.architecture)
        _copy_tokenizer(model_dir, staging)
        _set_config_dtype(staging, plan.request.dtype)
    del model
    return ppl_before


def _run_steps(plan: QuantPlan, staging: Path, progress: Progress) -> QuantReport:
    from llmctl.memory import PeakRss

    req, phases, t0 = plan.request, _Phases(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".llmctl-export-", dir=req.out.parent) as work:
        with PeakRss() as peak:
            with phases.time("export"):
                model_dir = _source_model_dir(plan, Path(work), progress)
            if plan.source_kind == "hf":
                phases.seconds.pop("export")
            ppl_before = _quantize_into(plan, staging, phases, model_dir, progress)
            with phases.time("eval_after"):
                with progress.phase("reload output"):
                    reloaded = load_model(staging, "fp32")
                ppl_after = _score(plan, reloaded, progress, "perplexity after")
                del reloaded
        before = _source_stats(model_dir, plan)
    return _report(plan, staging, ppl_before, ppl_after, before, phases, peak, t0)


def log_path(out: Path) -> Path:
    """Where third-party warnings and bars go while `out` is written (moved into it after)."""
    return out.parent / f".{out.name}.{LOG_FILE}"


def run_quantization(plan: QuantPlan, progress: Progress = NO_PROGRESS) -> QuantReport:
    """Quantize, save, reload, score, and publish the output directory with its report.

    Third-party warnings and progress bars go to `OUT/quantize.log` (kept next to OUT as
    `.OUT.quantize.log` if the run fails), not the console, unless `-v`.

    Raises:
        UserError: Problems only the library finds (reported in one line).
    """
    _offline()
    req = plan.request
    staging = staging_dir(req.out)
    log = log_path(req.out)
    try:
        with third_party_output_to(log):
            report = _run_steps(plan, staging, progress)
        (staging / REPORT_FILE).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        if log.is_file():
            log.replace(staging / LOG_FILE)
        publish(staging, req.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _source_stats(model_dir: Path, plan: QuantPlan) -> dict[str, Any]:
    """Size of the source weights and the storage bits of its Linear weights."""
    tensors = modeldir.read_tensors(model_dir)
    first = next(iter(plan.linears))
    info = tensors.get(f"{first}.weight")
    return {
        "size_bytes": modeldir.dir_size_bytes(model_dir),
        "bits": modeldir.DTYPE_BITS.get(info.dtype, 0) if info is not None else 0,
    }


def _report(
    plan: QuantPlan,
    staging: Path,
    ppl_before: float | None,
    ppl_after: float | None,
    before: dict[str, Any],
    phases: _Phases,
    peak: Any,
    t0: float,
) -> QuantReport:
    spec, req = plan.request.spec, plan.request
    bits, count = quantized_bits_per_weight(modeldir.read_tensors(staging), spec.weight_bits)
    return QuantReport(
        source=str(req.source),
        out=str(req.out),
        scheme=spec.scheme.value,
        algorithm=spec.algorithm.value,
        group_size=spec.group_size,
        ignore=list(spec.ignore),
        size_before_bytes=int(before["size_bytes"]),
        size_after_bytes=modeldir.dir_size_bytes(staging),
        source_bits_per_weight=int(before["bits"]),
        bits_per_weight=round(bits, 4),
        theoretical_bits_per_weight=round(plan.theoretical_bits, 4),
        num_quantized_linears=count,
        perplexity_before=ppl_before,
        perplexity_after=ppl_after,
        num_eval_tokens=len(plan.split.heldout) if plan.split is not None else 0,
        eval_seq_len=plan.eval_seq_len,
        num_calibration_samples=spec.num_calibration_samples,
        calibration_seq_length=spec.calibration_seq_length,
        wall_s=round(time.perf_counter() - t0, 3),
        phase_s=dict(phases.seconds),
        peak_rss_bytes=int(peak.peak_bytes),
        versions=_versions(),
        notes=list(plan.notes),
    )


def quantize(
    request: QuantRequest, *, dry_run: bool = False, progress: Progress = NO_PROGRESS
) -> QuantPlan | QuantReport:
    """Plan, then (unless `dry_run`) run."""
    plan = plan_quantization(request)
    return plan if dry_run else run_quantization(plan, progress)


def _read_preset(path: Path) -> dict[str, Any]:
    """The fields of a preset YAML file.

    Raises:
        UserError: Not UTF-8, not valid YAML (PyYAML's problem and line) or not a mapping.
    """
    import yaml

    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid YAML (invalid UTF-8 at byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UserError(f"{path}: not valid YAML ({where}{problem})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of quant fields, got a {type(data).__name__}")
    if isinstance(data.get("ignore"), str):  # merged with --ignore before the spec checks it
        raise UserError(
            f"{path}: quant.ignore must be a list of module names or 're:' patterns, "
            f"got {data['ignore']!r}"
        )
    return data


def load_preset(name: str, overrides: dict[str, Any] | None = None) -> QuantConfig:
    """`QuantConfig` from `configs/quant/<name>.yaml` (or a YAML path), then `overrides`.

    Raises:
        UserError: Unknown preset or field.
    """
    import dataclasses

    from llmctl.config.schema import QuantConfig
    from llmctl.resources import list_options, resource_dir

    path = Path(name) if name.endswith((".yaml", ".yml")) else None
    if path is not None and not path.is_file():
        raise UserError(f"unknown quantization preset {name!r}: file not found")
    if path is None:
        path = resource_dir("configs") / "quant" / f"{name}.yaml"
        if not path.is_file():
            known = ", ".join(list_options("quant"))
            raise UserError(f"unknown quantization preset {name!r}; choose one of {known}")
    data = {**_read_preset(path), **(overrides or {})}
    fields = {f.name for f in dataclasses.fields(QuantConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise UserError(f"{path}: unknown quant field(s) {', '.join(unknown)}")
    return QuantConfig(**data)


def check_hardware(spec: QuantSpec) -> None:
    """Refuse what this machine cannot run, before any heavy work.

    Raises:
        UserError: AWQ without CUDA: llm-compressor 0.14's AWQ pins host memory, which
            needs an accelerator (measured: "Cannot access accelerator device").
    """
    if spec.algorithm.value != "awq":
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            "--algorithm awq needs a CUDA device (llm-compressor's AWQ pins host memory); "
            "on CPU use --algorithm gptq"
        )


def quantize_source(
    source: Path,
    out: Path,
    *,
    preset: str = "default",
    overrides: dict[str, Any] | None = None,
    scheme: str | None = None,
    algorithm: str | None = None,
    group_size: int | None = None,
    ignore: list[str] | None = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    data: str | None = None,
    tokenizer: Path | None = None,
    step: int | None = None,
    num_eval_tokens: int = DEFAULT_EVAL_TOKENS,
    force: bool = False,
    dry_run: bool = False,
    progress: Progress = NO_PROGRESS,
) -> QuantPlan | QuantReport:
    """`llmctl quantize`: preset + options -> checked spec -> plan -> run.

    Args:
        source: A llmctl run directory or a Hugging Face model directory.
        out: Output directory (created complete, or not at all).
        preset: Name in configs/quant/ (or a YAML path).
        overrides: QuantConfig fields to set (None values are dropped; `ignore` entries are
            added to the preset's list); the named options below are the same fields.
        scheme: `quant.scheme`.
        algorithm: `quant.algorithm`.
        group_size: `quant.group_size`; when not given, the preset's is adapted to the model.
        ignore: Modules added to the preset's `ignore` list.
        num_samples: `quant.num_calibration_samples`.
        seq_len: `quant.calibration_seq_length`.
        data: Indexed dataset prefix, or a .jsonl/.txt file tokenized with the model's own
            tokenizer (default: the run's data; none needed for RTN weight-only and FP8).
        tokenizer: Run directories: tokenizer.json to use instead of the run's.
        step: Checkpoint step for run directories (default: latest).
        num_eval_tokens: Held-out tokens scored before and after.
        force: Replace an existing output directory that llmctl wrote.
        dry_run: Check and plan only.
        progress: Where phases are reported.
    """
    from llmctl.quant.schemes import spec_from_config

    _quiet_progress()
    named = {
        "scheme": scheme, "algorithm": algorithm, "group_size": group_size, "ignore": ignore,
        "num_calibration_samples": num_samples, "calibration_seq_length": seq_len,
    }  # fmt: skip
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    given |= {k: v for k, v in named.items() if v is not None}
    extra_ignore = given.pop("ignore", None) or []
    config = load_preset(preset, given)
    config.ignore = list(dict.fromkeys([*config.ignore, *extra_ignore]))  # added, not replaced
    spec = spec_from_config(config)
    if num_eval_tokens < 1:
        raise UserError(f"--eval-tokens must be >= 1, got {num_eval_tokens}")
    check_hardware(spec)
    request = QuantRequest(
        source=source,
        out=out,
        spec=spec,
        data=data,
        tokenizer=tokenizer,
        step=step,
        num_eval_tokens=num_eval_tokens,
        force=force,
        group_size_given="group_size" in given,
        user_ignore=tuple(extra_ignore),
    )
    return quantize(request, dry_run=dry_run, progress=progress)
