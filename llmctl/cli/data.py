"""`llmctl data preprocess|dedup|clean|tokenizer train|corpus|demo`: the data path into training.

Thin: each command parses its options, makes one call into `llmctl.data.commands` and renders
the result. Every output location is `--out/-o` (the old `--output-dir`, `--output-prefix` and
the corpus positional still work, hidden, for one release); `--force` is the only way to
replace earlier outputs, and then only llmctl's own.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer

from llmctl.data.choices import DedupMode, Launcher, TokenizerKind, Unit, Verify
from llmctl.data.readers import OnError

app = typer.Typer(
    help="Preprocess text into Megatron's indexed format, deduplicate it, train tokenizers.",
    no_args_is_help=True,
)
tokenizer_app = typer.Typer(help="Tokenizers for the demo and tiny models.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")

InputsArg = Annotated[
    list[str], typer.Argument(help="Input files or folders: JSONL (.gz/.zst), Parquet, text.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON summary.")]
TextFieldOpt = Annotated[
    str, typer.Option("--text-field", help="JSONL key or Parquet column holding the text.")
]
WorkersOpt = Annotated[
    int,
    typer.Option("--workers", "-j", help="Worker processes (0: one per core; capped at cores)."),
]
OnErrorOpt = Annotated[
    OnError, typer.Option("--on-error", help="Bad documents: fail, or skip and count them.")
]
ForceOpt = Annotated[
    bool,
    typer.Option("--force", help="Replace llmctl's earlier outputs there (other files are kept)."),
]
LauncherOpt = Annotated[
    Launcher, typer.Option("--launcher", help="local (this machine) or slurm (array job).")
]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", help="SLURM partition (launcher slurm).")
]
MaxParallelOpt = Annotated[
    int | None, typer.Option("--max-parallel", help="SLURM: array tasks running at once.")
]
PrintScriptOpt = Annotated[
    bool, typer.Option("--print-script", help="With slurm: print the sbatch scripts only.")
]


def _out_opt(help_text: str) -> Any:
    return typer.Option("--out", "-o", help=help_text)


def _show(summary: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("field", "value", title=title)
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:,.2f}"
        table.add_row(key, value if isinstance(value, str) else json.dumps(value, default=str))
    Console().print(table)


def _render(result: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    elif "text" in result and "job_dir" in result:  # a SLURM submission or script
        typer.echo(result["text"])
    else:
        _show(result, title)


def _progress(label: str, as_json: bool) -> Any:
    from llmctl.progress import ByteProgress

    return ByteProgress(label, enabled=not as_json)


@app.command("preprocess")
def preprocess_cmd(
    inputs: InputsArg,
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", "-t", help="tokenizer.json (or dir), .model, .tiktoken.")
    ],
    out: Annotated[str | None, _out_opt("Writes OUT.bin/.idx/.manifest.json.")] = None,
    output_prefix: Annotated[str | None, typer.Option("--output-prefix", hidden=True)] = None,
    tokenizer_kind: Annotated[
        TokenizerKind | None, typer.Option("--tokenizer-kind", help="Default: from the name.")
    ] = None,
    text_field: TextFieldOpt = "text",
    workers: WorkersOpt = 0,
    on_error: OnErrorOpt = OnError.FAIL,
    append_eod: Annotated[
        bool, typer.Option("--append-eod/--no-append-eod", help="Append EOD to each document.")
    ] = True,
    drop_empty: Annotated[
        bool,
        typer.Option(
            "--drop-empty", help="Skip empty/whitespace-only documents (Megatron-LM keeps them)."
        ),
    ] = False,
    max_doc_mb: Annotated[
        int, typer.Option("--max-doc-mb", help="Larger documents are bad input.")
    ] = 64,
    chunk_mb: Annotated[int, typer.Option("--chunk-mb", help="Input MB per work unit.")] = 32,
    vocab_size: Annotated[
        int | None, typer.Option("--vocab-size", help="Fail if the tokenizer exceeds this vocab.")
    ] = None,
    force: ForceOpt = False,
    launcher: LauncherOpt = Launcher.LOCAL,
    partition: PartitionOpt = None,
    max_parallel: MaxParallelOpt = None,
    print_script: PrintScriptOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Tokenize INPUTS into a Megatron indexed dataset (.bin/.idx), resumably."""
    from llmctl.data.commands import SlurmRequest, require_out, run_preprocess
    from llmctl.data.preprocess import PreprocessConfig

    prefix = require_out(out, output_prefix, "--output-prefix")
    cfg = PreprocessConfig(
        inputs=inputs, output_prefix=prefix, tokenizer=tokenizer,
        tokenizer_kind=tokenizer_kind, text_field=text_field, num_workers=workers,
        on_error=on_error, append_eod=append_eod, chunk_bytes=chunk_mb << 20,
        max_doc_bytes=max_doc_mb << 20, model_vocab_size=vocab_size, drop_empty=drop_empty,
        force=force,
    )  # fmt: skip
    slurm = SlurmRequest(partition=partition, max_parallel=max_parallel, print_script=print_script)
    result = run_preprocess(cfg, _progress("preprocess", as_json), launcher, slurm)
    _render(result, as_json, f"preprocess -> {prefix}")


@app.command("dedup")
def dedup_cmd(
    inputs: InputsArg,
    out: Annotated[str | None, _out_opt("Kept documents + dedup_report.json.")] = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", hidden=True)] = None,
    mode: Annotated[DedupMode, typer.Option("--mode", help="Which duplicates.")] = DedupMode.BOTH,
    ngram: Annotated[int, typer.Option("--ngram", help="Shingle size.")] = 5,
    unit: Annotated[Unit, typer.Option("--unit", help="Shingles of words or chars.")] = Unit.WORD,
    bands: Annotated[int, typer.Option("--bands", help="LSH bands.")] = 20,
    rows: Annotated[int, typer.Option("--rows", help="Rows per band (num_perm=bands*rows).")] = 6,
    threshold: Annotated[float, typer.Option("--threshold", help="Jaccard threshold.")] = 0.8,
    verify: Annotated[
        Verify, typer.Option("--verify", help="How candidates are checked.")
    ] = Verify.EXACT,
    text_field: TextFieldOpt = "text",
    workers: WorkersOpt = 0,
    on_error: OnErrorOpt = OnError.FAIL,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only; write nothing.")] = False,
    force: ForceOpt = False,
    launcher: LauncherOpt = Launcher.LOCAL,
    partition: PartitionOpt = None,
    max_parallel: MaxParallelOpt = None,
    print_script: PrintScriptOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove exact and near-duplicate documents (MinHash + LSH) from INPUTS."""
    # dedup does no linear algebra: spare the CPU of numpy's BLAS thread pool (set before
    # numpy loads; a user's own setting wins)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from llmctl.data.commands import SlurmRequest, run_dedup
    from llmctl.data.dedup import DedupConfig
    from llmctl.data.minhash import ShingleUnit

    cfg = DedupConfig(
        inputs=inputs, output_dir=out or output_dir, mode=mode, ngram=ngram,
        unit=ShingleUnit(unit.value), bands=bands, rows=rows, threshold=threshold,
        verify=verify, text_field=text_field, num_workers=workers, on_error=on_error,
        dry_run=dry_run, force=force,
    )  # fmt: skip
    slurm = SlurmRequest(partition=partition, max_parallel=max_parallel, print_script=print_script)
    report = run_dedup(cfg, _progress("dedup", as_json), launcher, slurm)
    if as_json or "job_dir" in report:
        _render(report, as_json, "dedup")
        return
    examples = report.pop("examples")
    _show(report, "dedup" + (" (dry run)" if dry_run else f" -> {cfg.output_dir}"))
    from rich.console import Console

    for ex in examples[:5]:
        Console().print(f"[bold]{ex['size']}x[/] kept {ex['kept']}: {ex['snippet'][:80]!r}")


@app.command("clean")
def clean_cmd(
    inputs: InputsArg,
    out: Annotated[str | None, _out_opt("Kept documents (JSONL) + clean_report.json.")] = None,
    filters: Annotated[
        str,
        typer.Option("--filters", help="Quality filters, comma-separated (none: no filter)."),
    ] = "gopher_repetition,gopher_quality,c4,fineweb",
    languages: Annotated[
        str | None, typer.Option("--languages", help="Keep these languages (en,de,...).")
    ] = None,
    decontam: Annotated[
        list[str] | None,
        typer.Option("--decontam", help="Evaluation file (JSONL/text) to decontaminate against."),
    ] = None,
    pii: Annotated[
        bool, typer.Option("--pii/--no-pii", help="Replace e-mails, IPs, phone numbers.")
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="SECTION.FIELD=VALUE, e.g. gopher_quality.min_doc_words=30."),
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="YAML file of sections and fields.")
    ] = None,
    rejected: Annotated[
        bool, typer.Option("--rejected", help="Also write rejected.jsonl (step and reason).")
    ] = False,
    text_field: TextFieldOpt = "text",
    workers: WorkersOpt = 0,
    on_error: OnErrorOpt = OnError.FAIL,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Clean a sample and report; write nothing.")
    ] = False,
    sample: Annotated[int, typer.Option("--sample", help="Documents a dry run looks at.")] = 10000,
    force: ForceOpt = False,
    launcher: LauncherOpt = Launcher.LOCAL,
    partition: PartitionOpt = None,
    max_parallel: MaxParallelOpt = None,
    print_script: PrintScriptOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Quality filters, language ID, decontamination and PII over INPUTS (before dedup)."""
    from llmctl.data.clean_config import CleanConfig, apply_overrides, steps_from_options
    from llmctl.data.commands import SlurmRequest, run_clean

    steps = steps_from_options(filters, languages, decontam, pii)
    cfg = CleanConfig(
        inputs=inputs, output_dir=out, steps=steps, text_field=text_field, num_workers=workers,
        on_error=on_error, dry_run=dry_run, sample_docs=sample, write_rejected=rejected,
        force=force,
    )  # fmt: skip
    cfg.language.languages = languages.split(",") if languages else []
    cfg.decontam.eval_files = list(decontam or [])
    apply_overrides(cfg, list(overrides or []), config)
    slurm = SlurmRequest(partition=partition, max_parallel=max_parallel, print_script=print_script)
    report = run_clean(cfg, _progress("clean", as_json), launcher, slurm)
    if as_json or "job_dir" in report:
        _render(report, as_json, "clean")
        return
    _show_clean(report, "clean" + (" (dry run)" if dry_run else f" -> {out}"))


def _show_clean(report: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("step", "removed", "share", "top reasons", title=title)
    for name, s in report["steps"].items():
        reasons = ", ".join(f"{k} {v}" for k, v in list(s["reasons"].items())[:3])
        table.add_row(name, f"{s['num_removed']:,}", f"{s['share_removed']:.1%}", reasons)
    kept = f"{report['num_kept']:,} of {report['num_docs']:,} documents kept"
    table.add_row("total", f"{report['num_removed']:,}", f"{report['share_removed']:.1%}", kept)
    console = Console()
    console.print(table)
    if report["pii_replaced"]:
        console.print(f"PII replaced: {report['pii_replaced']}")
    for name, s in report["steps"].items():
        for ex in s["examples"][:2]:
            console.print(f"[bold]{name}[/] {ex['reason']} {ex['where']}: {ex['snippet'][:80]!r}")


@tokenizer_app.command("train")
def tokenizer_train_cmd(
    inputs: InputsArg,
    out: Annotated[str | None, _out_opt("Writes tokenizer.json + config here.")] = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", hidden=True)] = None,
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Vocabulary size.")] = 4096,
    min_frequency: Annotated[int, typer.Option("--min-frequency", help="Merge cutoff.")] = 2,
    text_field: TextFieldOpt = "text",
    on_error: OnErrorOpt = OnError.FAIL,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Train a byte-level BPE tokenizer (EOD <|endoftext|>) on INPUTS."""
    from llmctl.data.commands import require_out, run_tokenizer_train

    target = require_out(out, output_dir, "--output-dir")
    summary = run_tokenizer_train(
        inputs, target, force=force, vocab_size=vocab_size, min_frequency=min_frequency,
        text_field=text_field, on_error=on_error.value,
    )  # fmt: skip
    _render(summary, as_json, f"tokenizer -> {target}")


@app.command("corpus")
def corpus_cmd(
    output: Annotated[str | None, typer.Argument(hidden=True)] = None,
    out: Annotated[str | None, _out_opt("JSONL file to write.")] = None,
    max_docs: Annotated[int, typer.Option("--max-docs", help="Number of files to keep.")] = 400,
    force: Annotated[bool, typer.Option("--force", help="Replace the file if it exists.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the demo corpus: the Python standard library's sources, as JSONL."""
    from llmctl.data.commands import require_out, run_corpus

    target = require_out(out, output, "the positional OUTPUT")
    summary = run_corpus(target, max_docs=max_docs, force=force)
    typer.echo(json.dumps(summary) if as_json else f"{summary['num_docs']} documents -> {target}")


PackedOutOpt = Annotated[str, typer.Option("--out", "-o", help="Writes OUT.bin/.idx + companions.")]
ChatTokenizerOpt = Annotated[
    str, typer.Option("--tokenizer", "-t", help="Tokenizer folder with a chat_template.")
]
SeqLengthOpt = Annotated[int, typer.Option("--seq-length", help="Training sequence length.")]


def _packed_report(summary: dict[str, Any], label: str, dry_run: bool, as_json: bool) -> None:
    """What `data sft` / `data prefs` did: JSON, or the summary table."""
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _show(summary, label + (" (dry run)" if dry_run else ""))


@app.command("sft")
def sft_cmd(
    inputs: Annotated[
        list[str], typer.Argument(help="JSONL files or folders: chat or prompt/completion.")
    ],
    out: PackedOutOpt,
    tokenizer: ChatTokenizerOpt,
    seq_length: SeqLengthOpt,
    pack: Annotated[
        bool, typer.Option("--pack/--no-pack", help="Several examples per sequence.")
    ] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only; write nothing.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier `data sft` output there.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Chat/prompt-completion JSONL -> packed sequences with a response-only loss mask."""
    from llmctl.data.sft import SftConfig, run_sft

    cfg = SftConfig(
        inputs=inputs, output_prefix=out, tokenizer=tokenizer, seq_length=seq_length,
        pack=pack, dry_run=dry_run, force=force,
    )  # fmt: skip
    _packed_report(run_sft(cfg, show_progress=not as_json), f"sft -> {out}", dry_run, as_json)


@app.command("prefs")
def prefs_cmd(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="JSONL files or folders: prompt/messages + chosen/rejected, or feedback."
        ),
    ],
    out: PackedOutOpt,
    tokenizer: ChatTokenizerOpt,
    seq_length: SeqLengthOpt,
    pack: Annotated[
        bool, typer.Option("--pack/--no-pack", help="Several pairs per sequence.")
    ] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only; write nothing.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier `data sft/prefs` output there.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Preference JSONL -> packed chosen/rejected pairs, reply-only loss mask (DPO)."""
    from llmctl.data.prefs import PrefsConfig, run_prefs

    cfg = PrefsConfig(
        inputs=inputs, output_prefix=out, tokenizer=tokenizer, seq_length=seq_length,
        pack=pack, dry_run=dry_run, force=force,
    )  # fmt: skip
    _packed_report(run_prefs(cfg, show_progress=not as_json), f"prefs -> {out}", dry_run, as_json)


@app.command("demo")
def demo_cmd(
    workdir: Annotated[str, typer.Argument(help="Folder for the demo data (cached).")],
    as_json: JsonOpt = False,
) -> None:
    """Build the demo dataset: corpus -> dedup -> tokenizer -> preprocess (cached)."""
    from llmctl.data.demo import prepare_demo_data

    prefix = prepare_demo_data(workdir)
    typer.echo(json.dumps({"prefix": prefix}) if as_json else prefix)
