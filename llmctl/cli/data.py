"""`llmctl data preprocess|dedup|tokenizer train|corpus|demo`: the data path into training."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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
    int, typer.Option("--workers", "-j", help="Worker processes (0: one per CPU core).")
]
OnErrorOpt = Annotated[
    str, typer.Option("--on-error", help="Bad documents: fail (default) or skip and count.")
]


def _progress(enabled: bool, label: str) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[rates]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
    return progress, progress.add_task(label, total=None, rates="")


def _rates(start: float, docs: int, tokens: int | None, num_bytes: int) -> str:
    t = max(time.perf_counter() - start, 1e-6)
    tok = f"  {tokens / t:,.0f} tok/s" if tokens is not None else ""
    return f"{docs / t:,.0f} docs/s{tok}  {num_bytes / t / 1e6:,.1f} MB/s"


def _show(summary: dict[str, Any], title: str) -> None:
    table = Table("field", "value", title=title)
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:,.2f}"
        table.add_row(key, value if isinstance(value, str) else json.dumps(value, default=str))
    Console().print(table)


@app.command("preprocess")
def preprocess_cmd(
    inputs: InputsArg,
    output_prefix: Annotated[
        str, typer.Option("--output-prefix", "-o", help="Writes PREFIX.bin/.idx/.manifest.json.")
    ],
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", "-t", help="tokenizer.json (or dir), .model, .tiktoken.")
    ],
    tokenizer_kind: Annotated[
        str | None, typer.Option("--tokenizer-kind", help="hf, sentencepiece or tiktoken.")
    ] = None,
    text_field: TextFieldOpt = "text",
    workers: WorkersOpt = 0,
    on_error: OnErrorOpt = "fail",
    append_eod: Annotated[
        bool, typer.Option("--append-eod/--no-append-eod", help="Append EOD to each document.")
    ] = True,
    chunk_mb: Annotated[int, typer.Option("--chunk-mb", help="Input MB per work unit.")] = 32,
    vocab_size: Annotated[
        int | None, typer.Option("--vocab-size", help="Fail if the tokenizer exceeds this vocab.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Tokenize INPUTS into a Megatron indexed dataset (.bin/.idx), resumably."""
    from llmctl.data.preprocess import PreprocessConfig, preprocess
    from llmctl.data.readers import OnError
    from llmctl.errors import UserError

    if on_error not in ("fail", "skip"):
        raise UserError(f"--on-error {on_error!r}: expected fail or skip")
    cfg = PreprocessConfig(
        inputs=inputs,
        output_prefix=output_prefix,
        tokenizer=tokenizer,
        tokenizer_kind=tokenizer_kind,
        text_field=text_field,
        num_workers=workers,
        on_error=OnError(on_error),
        append_eod=append_eod,
        chunk_bytes=chunk_mb << 20,
        model_vocab_size=vocab_size,
    )
    progress, task = _progress(not as_json and sys.stderr.isatty(), "tokenizing")
    done = {"docs": 0, "tokens": 0, "bytes": 0}
    start = time.perf_counter()

    def update(u: Any) -> None:
        if u.total_bytes:
            progress.update(task, total=u.total_bytes)
            return
        done["docs"] += u.docs
        done["tokens"] += u.tokens
        done["bytes"] += u.num_bytes
        rates = _rates(start, done["docs"], done["tokens"], done["bytes"])
        progress.update(task, advance=u.num_bytes, rates=rates)

    with progress:
        summary = preprocess(cfg, on_progress=update).as_dict()
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _show(summary, f"preprocess -> {output_prefix}")


@app.command("dedup")
def dedup_cmd(
    inputs: InputsArg,
    output_dir: Annotated[
        str | None, typer.Option("--output-dir", "-o", help="Kept documents + dedup_report.json.")
    ] = None,
    mode: Annotated[str, typer.Option("--mode", help="exact, fuzzy or both.")] = "both",
    ngram: Annotated[int, typer.Option("--ngram", help="Shingle size.")] = 5,
    unit: Annotated[str, typer.Option("--unit", help="Shingles of word or char.")] = "word",
    bands: Annotated[int, typer.Option("--bands", help="LSH bands.")] = 20,
    rows: Annotated[int, typer.Option("--rows", help="Rows per band (num_perm=bands*rows).")] = 6,
    threshold: Annotated[float, typer.Option("--threshold", help="Jaccard threshold.")] = 0.8,
    verify: Annotated[
        str, typer.Option("--verify", help="Candidates: none, signature or exact.")
    ] = "exact",
    text_field: TextFieldOpt = "text",
    workers: WorkersOpt = 0,
    on_error: OnErrorOpt = "fail",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only; write nothing.")] = False,
    launcher: Annotated[
        str, typer.Option("--launcher", help="local (this machine) or slurm (array job).")
    ] = "local",
    partition: Annotated[
        str | None, typer.Option("--partition", help="SLURM partition (launcher slurm).")
    ] = None,
    print_script: Annotated[
        bool, typer.Option("--print-script", help="With slurm: print the sbatch scripts only.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove exact and near-duplicate documents (MinHash + LSH) from INPUTS."""
    from llmctl.data.dedup import DedupConfig, DedupMode, Verify, dedup
    from llmctl.data.minhash import ShingleUnit
    from llmctl.data.readers import OnError
    from llmctl.errors import UserError

    try:
        cfg = DedupConfig(
            inputs=inputs,
            output_dir=output_dir,
            mode=DedupMode(mode),
            ngram=ngram,
            unit=ShingleUnit(unit),
            bands=bands,
            rows=rows,
            threshold=threshold,
            verify=Verify(verify),
            text_field=text_field,
            num_workers=workers,
            on_error=OnError(on_error),
            dry_run=dry_run,
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    if launcher == "slurm":
        from llmctl.data.slurm import SlurmOptions, submit_dedup

        result = submit_dedup(cfg, SlurmOptions(partition=partition), render_only=print_script)
        typer.echo(json.dumps(result, indent=2) if as_json else result.get("text", result))
        return
    if launcher != "local":
        raise UserError(f"launcher {launcher!r}: expected local or slurm")
    progress, task = _progress(not as_json and sys.stderr.isatty(), "hashing")
    start = time.perf_counter()
    done = {"docs": 0, "bytes": 0}

    def update(total: int, docs: int, num_bytes: int) -> None:
        done["docs"] += docs
        done["bytes"] += num_bytes
        rates = _rates(start, done["docs"], None, done["bytes"])
        progress.update(task, total=total, advance=num_bytes, rates=rates)

    with progress:
        report = dedup(cfg, on_progress=update).as_dict()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    examples = report.pop("examples")
    _show(report, "dedup" + (" (dry run)" if dry_run else f" -> {output_dir}"))
    for ex in examples[:5]:
        Console().print(f"[bold]{ex['size']}x[/] kept {ex['kept']}: {ex['snippet'][:80]!r}")


@tokenizer_app.command("train")
def tokenizer_train_cmd(
    inputs: InputsArg,
    output_dir: Annotated[
        str, typer.Option("--output-dir", "-o", help="Writes tokenizer.json + config here.")
    ],
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Vocabulary size.")] = 4096,
    min_frequency: Annotated[int, typer.Option("--min-frequency", help="Merge cutoff.")] = 2,
    text_field: TextFieldOpt = "text",
    on_error: OnErrorOpt = "fail",
    as_json: JsonOpt = False,
) -> None:
    """Train a byte-level BPE tokenizer (EOD <|endoftext|>) on INPUTS."""
    from llmctl.data.tokenizer import train_tokenizer

    summary = train_tokenizer(
        inputs,
        output_dir,
        vocab_size=vocab_size,
        text_field=text_field,
        min_frequency=min_frequency,
        on_error=on_error,
    )
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _show(summary, f"tokenizer -> {output_dir}")


@app.command("corpus")
def corpus_cmd(
    output: Annotated[str, typer.Argument(help="JSONL file to write.")],
    max_docs: Annotated[int, typer.Option("--max-docs", help="Number of files to keep.")] = 400,
    as_json: JsonOpt = False,
) -> None:
    """Write the demo corpus: the Python standard library's sources, as JSONL."""
    from llmctl.data.corpus import build_demo_corpus

    summary = build_demo_corpus(output, max_docs=max_docs)
    typer.echo(json.dumps(summary) if as_json else f"{summary['num_docs']} documents -> {output}")


@app.command("demo")
def demo_cmd(
    workdir: Annotated[str, typer.Argument(help="Folder for the demo data (cached).")],
    as_json: JsonOpt = False,
) -> None:
    """Build the demo dataset: corpus -> dedup -> tokenizer -> preprocess (cached)."""
    from llmctl.data.demo import prepare_demo_data

    prefix = prepare_demo_data(workdir)
    typer.echo(json.dumps({"prefix": prefix}) if as_json else prefix)
