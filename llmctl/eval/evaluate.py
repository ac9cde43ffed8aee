"""`llmctl eval SOURCE [--vs OTHER]`: harness tasks and held-out perplexity, one or two models.

What runs, per model: a run directory is exported (the `llmctl export hf` code) into a
temporary folder; the harness's `hf` model loads the directory in fp32 and runs the tasks
(`llmctl.eval.harness`); the same transformers model then scores the held-out tokens with
llmctl's perplexity (`llmctl.quant.metrics.perplexity`: non-overlapping windows of `seq_len`
tokens, each scored alone, exp(total NLL / predicted tokens)). With `--vs`, both models are
evaluated the same way, one after the other (each freed before the next loads), on the same
tasks and held-out data, and the report adds OTHER - SOURCE for every number.

Everything that needs no model is checked first (`plan_eval`, all that `--dry-run` does): both
sources, the task names, the held-out data and its token ids against each model's vocabulary.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.errors import UserError
from llmctl.eval import harness
from llmctl.eval.heldout import HeldOut, run_heldout, tokens_for, user_heldout
from llmctl.eval.sources import ModelSource, SourceKind, resolve_source
from llmctl.eval.tasks import DEFAULT_TASKS, check_tasks
from llmctl.progress import NO_PROGRESS, Progress, third_party_output_to

DEFAULT_SEQ_LEN = 512
DEFAULT_EVAL_TOKENS = 16384


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalRequest:
    """What the command line asked for."""

    source: Path
    vs: Path | None = None
    tasks: tuple[str, ...] = DEFAULT_TASKS
    tasks_dir: Path | None = None
    data: str | None = None
    tokenizer: Path | None = None
    step: int | None = None
    vs_step: int | None = None
    seq_len: int = DEFAULT_SEQ_LEN
    num_eval_tokens: int = DEFAULT_EVAL_TOKENS
    batch_size: int = 1
    limit: int | None = None
    device: str = "cpu"
    perplexity: bool = True
    write_tasks: Path | None = None  # also write llmctl's task YAMLs here (for lm_eval itself)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPlan:
    """One model's part of the plan: its source and its held-out tokens."""

    source: ModelSource
    tokens: np.ndarray | None  # held-out tokens (None: perplexity not scored)
    seq_len: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (token count, not the tokens)."""
        n = 0 if self.tokens is None else len(self.tokens)
        return {
            **self.source.as_dict(),
            "perplexity_tokens": n,
            "perplexity_windows": n // self.seq_len,
            "seq_len": self.seq_len,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalPlan:
    """Everything checked; what `run_eval` will do."""

    request: EvalRequest
    models: tuple[ModelPlan, ...]
    heldout: HeldOut | None
    notes: tuple[str, ...] = ()

    def _command(self, model: ModelPlan) -> list[str]:
        """The harness command line giving this model's task numbers."""
        r, source = self.request, model.source
        shown = (
            Path(f"<export of {source.label}>")
            if source.kind is SourceKind.RUN_DIR
            else source.path.resolve()
        )
        own = r.write_tasks.resolve() if r.write_tasks else Path("LLMCTL_TASKS")
        dirs = [own, *([r.tasks_dir] if r.tasks_dir else [])]
        return harness.command_line(
            shown, r.tasks, dirs, device=r.device, batch_size=r.batch_size, limit=r.limit
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (`--dry-run --json`)."""
        r = self.request
        own = str(r.write_tasks.resolve()) if r.write_tasks else "<llmctl tasks>"
        tasks_dirs = [own, *([str(r.tasks_dir)] if r.tasks_dir else [])]
        return {
            "tasks": list(r.tasks),
            "tasks_dirs": tasks_dirs,
            "heldout": self.heldout.as_dict() if self.heldout else None,
            "models": [m.as_dict() for m in self.models],
            "lm_eval": [" ".join(self._command(m)) for m in self.models],
            "notes": list(self.notes),
        }


def _heldout(request: EvalRequest, first: ModelSource) -> tuple[HeldOut | None, list[str]]:
    if not request.perplexity:
        return None, []
    if request.data is not None:
        return user_heldout(request.data), []
    if first.run_data and first.run_split:
        return run_heldout(first.run_data, first.run_split), []
    note = "no held-out data: perplexity not scored (pass --data FILE.jsonl|FILE.txt|PREFIX)"
    return None, [note]


def _model_plan(request: EvalRequest, source: ModelSource, heldout: HeldOut | None) -> ModelPlan:
    seq_len = min(request.seq_len, source.max_positions)
    if heldout is None:
        return ModelPlan(source=source, tokens=None, seq_len=seq_len)
    tokens = tokens_for(heldout, source.tokenizer, request.num_eval_tokens)
    if len(tokens) < seq_len:
        raise UserError(
            f"held-out data {heldout.data} gives {len(tokens)} tokens for {source.label}, "
            f"fewer than one window of {seq_len}; lower --seq-len or pass more --data"
        )
    largest = int(tokens.max())
    if source.model_vocab and largest >= source.model_vocab:
        raise UserError(
            f"held-out data {heldout.data} has token id {largest} but {source.label} has "
            f"{source.model_vocab} embedding rows: the data was tokenized with another tokenizer"
        )
    return ModelPlan(source=source, tokens=tokens, seq_len=seq_len)


def plan_eval(request: EvalRequest) -> EvalPlan:
    """Every check that needs no model: sources, tasks, held-out data, window length.

    Raises:
        UserError: The first problem found, in one line.
    """
    if request.seq_len < 2:
        raise UserError(f"--seq-len must be >= 2 (got {request.seq_len})")
    if request.batch_size < 1 or (request.limit is not None and request.limit < 1):
        raise UserError("--batch-size and --limit must be >= 1")
    check_tasks(request.tasks, request.tasks_dir)
    if request.write_tasks is not None:
        from llmctl.eval.tasks import write_shipped_tasks

        write_shipped_tasks(request.write_tasks)
    sources = [resolve_source(request.source, request.step, request.tokenizer)]
    if request.vs is not None:
        sources.append(resolve_source(request.vs, request.vs_step, None))
    heldout, notes = _heldout(request, sources[0])
    models = tuple(_model_plan(request, s, heldout) for s in sources)
    toks = {m.source.tokenizer.read_bytes() if m.source.tokenizer else b"" for m in models}
    if heldout is not None and heldout.split is None and len(toks) > 1:
        notes.append("the two models have different tokenizers: perplexities are per token of "
                     "each model's own tokenization")  # fmt: skip
    return EvalPlan(request=request, models=models, heldout=heldout, notes=tuple(notes))


@dataclass(slots=True, kw_only=True)
class ModelResult:
    """One model's numbers."""

    plan: ModelPlan
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    perplexity: float | None = None
    predicted_tokens: int = 0
    lm_eval_s: float = 0.0
    perplexity_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            **self.plan.as_dict(),
            "tasks": self.tasks,
            "perplexity": self.perplexity,
            "predicted_tokens": self.predicted_tokens,
            "lm_eval_s": round(self.lm_eval_s, 3),
            "perplexity_s": round(self.perplexity_s, 3),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalReport:
    """Results of every model; deltas OTHER - SOURCE with `--vs`."""

    plan: EvalPlan
    results: tuple[ModelResult, ...]
    versions: dict[str, str]

    def deltas(self) -> dict[str, Any] | None:
        """OTHER - SOURCE for every task metric and the perplexity (None without `--vs`)."""
        if len(self.results) < 2:
            return None
        a, b = self.results
        tasks = {
            task: {m: b.tasks[task][m] - v for m, v in metrics.items() if m in b.tasks[task]}
            for task, metrics in a.tasks.items()
        }
        ppl = None
        if a.perplexity is not None and b.perplexity is not None:
            ppl = b.perplexity - a.perplexity
        return {"tasks": tasks, "perplexity": ppl}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (`--json`)."""
        plan = self.plan.as_dict()
        return {
            "tasks": plan["tasks"],
            "heldout": plan["heldout"],
            "models": [r.as_dict() for r in self.results],
            "deltas": self.deltas(),
            "notes": plan["notes"],
            "versions": self.versions,
        }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("lm_eval", "transformers", "torch", "compressed-tensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


def _model_dir(plan: ModelPlan, workdir: Path, index: int, progress: Progress) -> Path:
    """The Hugging Face directory to load: the source itself, or an export of the run."""
    source = plan.source
    if source.kind is not SourceKind.RUN_DIR:
        return source.path.resolve()
    from llmctl.hf.export import export_hf

    assert source.checkpoint is not None  # a run directory's source names its checkpoint
    out = workdir / f"export-{index}"
    export_hf(source.checkpoint, out, progress=progress)
    return out.resolve()


def _perplexity(lm: Any, plan: ModelPlan, result: ModelResult, progress: Progress) -> None:
    from llmctl.quant.metrics import num_batches, perplexity

    if plan.tokens is None:
        return
    t0 = time.perf_counter()
    total = num_batches(len(plan.tokens), plan.seq_len)
    with progress.phase(f"perplexity {plan.source.label} (batches)", total) as phase:
        ppl = perplexity(lm.model, plan.tokens, plan.seq_len, on_batch=phase.advance)
    result.perplexity = ppl
    result.predicted_tokens = (len(plan.tokens) // plan.seq_len) * (plan.seq_len - 1)
    result.perplexity_s = time.perf_counter() - t0


def _evaluate_one(
    plan: ModelPlan, request: EvalRequest, workdir: Path, index: int, progress: Progress
) -> ModelResult:
    from llmctl.eval.tasks import write_shipped_tasks

    result = ModelResult(plan=plan)
    model_dir = _model_dir(plan, workdir, index, progress)
    include = [write_shipped_tasks(workdir / "tasks")]
    include += [request.tasks_dir] if request.tasks_dir else []
    with progress.phase(f"load {plan.source.label} (lm-eval hf, {harness.DTYPE})"):
        lm = harness.load_lm(model_dir, request.device, request.batch_size)
    t0 = time.perf_counter()
    with progress.phase(f"lm-eval {','.join(request.tasks)} on {plan.source.label}"):
        result.tasks = harness.evaluate(
            lm, request.tasks, harness.task_manager(include), limit=request.limit
        )
    result.lm_eval_s = time.perf_counter() - t0
    _perplexity(lm, plan, result, progress)
    del lm
    gc.collect()  # the next model loads only after this one is freed
    if plan.source.kind is SourceKind.RUN_DIR:
        shutil.rmtree(model_dir, ignore_errors=True)
    return result


def run_eval(plan: EvalPlan, progress: Progress = NO_PROGRESS) -> EvalReport:
    """Evaluate every model of the plan, one at a time, in a temporary work folder.

    Third-party output (the harness's log lines and bars, transformers' warnings) goes to a
    log in the work folder, not the console, unless `-v`; a failure that is not the user's
    keeps the folder and names the log in its traceback.
    """
    workdir = Path(tempfile.mkdtemp(prefix="llmctl-eval-"))
    log = workdir / "eval.log"
    try:
        with third_party_output_to(log), harness.offline():
            results = tuple(
                _evaluate_one(m, plan.request, workdir, i, progress)
                for i, m in enumerate(plan.models)
            )
    except UserError:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    except Exception as e:  # not the user's to fix: the traceback, and where the log is
        e.add_note(f"llmctl eval: third-party output of this run is in {log}")
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return EvalReport(plan=plan, results=results, versions=_versions())


def evaluate(request: EvalRequest, progress: Progress = NO_PROGRESS) -> EvalReport:
    """`plan_eval` then `run_eval`."""
    return run_eval(plan_eval(request), progress)
