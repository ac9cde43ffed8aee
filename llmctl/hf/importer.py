"""`llmctl import hf`: a Hugging Face model directory -> a megatron-core `torch_dist` checkpoint.

What it writes (under a temporary name, renamed to OUT only once complete)::

    OUT/
      checkpoints/iter_0000000/   megatron's files + llmctl's manifest (a committed checkpoint)
      checkpoints/latest
      config.yaml                 resolved run config (so `llmctl export hf OUT` works)
      recipe.yaml                 continued-pretraining recipe (checkpoint.init_from=OUT)
      model.yaml                  the model config group (copy to configs/model/)
      tokenizer.json ...          the source's tokenizer files
      import.json                 source, mapping, dtype, peak memory

How: one process builds megatron-core's GPTModel at TP=1/PP=1 with uninitialised weights (the
output, in the chosen dtype), then reads the source one layer at a time through safetensors
(only that layer's tensors are in memory), converts each tensor with the shared table in
`llmctl.hf.mapping` and copies it in. The model's own `sharded_state_dict()` is saved with
`dist_checkpointing`: every tensor under its global key and shape, so `dist_checkpointing.load`
reads it back at any TP/PP/VPP layout, exactly as it reads a checkpoint saved by a run. Peak
memory is therefore the output plus about one layer (measured: docs/hf.md).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmctl.errors import UserError
from llmctl.hf import mapping as M
from llmctl.hf.config import family_of, load_hf_config, model_fields
from llmctl.hf.modeldir import TensorInfo, read_safetensors_header
from llmctl.memory import peak_rss_bytes as _peak_rss_bytes
from llmctl.progress import third_party_output_to
from llmctl.staging import check_out, publish

MARKER = "import.json"
_IGNORED = ("rotary_emb.inv_freq",)
_DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportPlan:
    """What an import will do; `--dry-run` prints it."""

    src: Path
    architecture: str
    model: dict[str, Any]
    mapping: list[tuple[str, tuple[str, ...], str]]
    files: dict[str, str] = field(repr=False)  # tensor name -> safetensors file
    dtype: str
    num_parameters: int
    size_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (mapping shown for the top level and layer 0)."""
        first = [m for m in self.mapping if ".layers." not in m[0] or ".layers.0." in m[0]]
        return {
            "src": str(self.src),
            "architecture": self.architecture,
            "dtype": self.dtype,
            "num_parameters": self.num_parameters,
            "size_bytes": self.size_bytes,
            "model": self.model,
            "mapping": [{"megatron": m, "hf": list(h), "op": op} for m, h, op in first],
            "num_layers_mapped": self.model["num_layers"],
        }


def _tensor_files(src: Path) -> dict[str, tuple[str, TensorInfo]]:
    """Tensor name -> (file name, header info) over every safetensors file of `src`."""
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise UserError(f"{src} holds no *.safetensors weights (pytorch .bin is not read)")
    out: dict[str, tuple[str, TensorInfo]] = {}
    for path in files:
        for name, info in read_safetensors_header(path).items():
            out[name] = (path.name, info)
    return out


def _check_tensors(
    found: dict[str, tuple[str, TensorInfo]], mapping: list[Any], tied: bool, src: Path
) -> None:
    wanted = {h for _, names, _ in mapping for h in names}
    missing = sorted(wanted - set(found))
    if missing:
        raise UserError(f"{src}: tensor {missing[0]} is missing ({len(missing)} missing in all)")
    extra = {n for n in set(found) - wanted if not n.endswith(_IGNORED)}
    if tied:
        extra.discard("lm_head.weight")
    if extra:
        first = sorted(extra)[0]
        raise UserError(
            f"{src}: tensor {first} has no megatron-core counterpart ({len(extra)} such)"
        )


def _dtype(found: dict[str, tuple[str, TensorInfo]], requested: str, src: Path) -> str:
    kinds = {info.dtype for _, info in found.values()}
    if requested != "auto":
        return requested
    if len(kinds) != 1 or next(iter(kinds)) not in _DTYPES:
        raise UserError(f"{src}: weights of dtypes {sorted(kinds)}; pass --dtype fp32 or bf16")
    return _DTYPES[next(iter(kinds))]


def plan_import(
    src: Path,
    *,
    name: str | None = None,
    vocab_multiple: int = 128,
    tp: int = 1,
    dtype: str = "auto",
) -> ImportPlan:
    """Read config.json and the safetensors headers; check everything before any weight is read.

    Args:
        src: The Hugging Face model directory.
        name: `model.name` of the result (default: the directory name).
        vocab_multiple: Pad the vocabulary to a multiple of this.
        tp: Largest tensor-parallel size the checkpoint must load at.
        dtype: auto (the weights' dtype), fp32 or bf16.

    Raises:
        UserError: No config.json or weights, an architecture or field GPTModel cannot express,
            tensors missing or left over, a vocabulary the layout cannot pad.
    """
    if not src.is_dir():
        raise UserError(f"{src} is not a directory")
    if dtype not in ("auto", "fp32", "bf16"):
        raise UserError(f"--dtype must be auto, fp32 or bf16, got {dtype}")
    config = load_hf_config(src)
    family = family_of(config, src)
    fields = model_fields(config, src, name=name or src.name, vocab_multiple=vocab_multiple, tp=tp)
    found = _tensor_files(src)
    mapping = M.expand(
        family, fields["num_layers"], fields["num_experts"], fields["tied_embeddings"]
    )
    _check_tensors(found, mapping, fields["tied_embeddings"], src)
    embed = found["model.embed_tokens.weight"][1].shape
    if embed[0] != fields["hf_vocab_size"]:
        raise UserError(
            f"{src}: model.embed_tokens.weight has {embed[0]} rows, config.json vocab_size "
            f"is {fields['hf_vocab_size']}"
        )
    _check_tokenizer(src, fields["hf_vocab_size"])
    used = {h for _, names, _ in mapping for h in names}
    return ImportPlan(
        src=src,
        architecture=family.architecture,
        model=fields,
        mapping=[(m, h, str(op)) for m, h, op in mapping],
        files={n: f for n, (f, _) in found.items() if n in used},
        dtype=_dtype(found, dtype, src),
        num_parameters=sum(_numel(found[n][1].shape) for n in used),
        size_bytes=sum(found[n][1].num_bytes for n in used),
    )  # fmt: skip


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_tokenizer(src: Path, vocab: int) -> None:
    path = src / "tokenizer.json"
    if not path.is_file():
        return
    from tokenizers import Tokenizer

    size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    if size > vocab:
        raise UserError(
            f"{path}: {size} tokens but config.json vocab_size is {vocab}; the embedding "
            "cannot hold them"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """What `import_hf` wrote, with the measured cost."""

    out: Path
    architecture: str
    num_parameters: int
    checkpoint_bytes: int
    source_bytes: int
    seconds: float
    peak_rss_bytes: int
    base_rss_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with peak memory beyond the start relative to the checkpoint size."""
        extra = self.peak_rss_bytes - self.base_rss_bytes
        return {
            "out": str(self.out),
            "architecture": self.architecture,
            "num_parameters": self.num_parameters,
            "checkpoint_bytes": self.checkpoint_bytes,
            "source_bytes": self.source_bytes,
            "seconds": round(self.seconds, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
            "base_rss_bytes": self.base_rss_bytes,
            "peak_over_base_per_model": round(extra / max(self.checkpoint_bytes, 1), 3),
        }


def _staging(out: Path) -> Path:
    return out.parent / f".{out.name}.tmp-{os.getpid()}"


def check_import_out(out: Path, force: bool) -> None:
    """OUT must be absent, empty, or (with `force`) an earlier import's output.

    Raises:
        UserError: The shared "exists" or "not written by llmctl" line.
    """
    check_out(out, force, MARKER)


def import_hf(
    plan: ImportPlan, out: Path, *, force: bool = False, on_progress: Progress | None = None
) -> ImportResult:
    """Write the checkpoint and recipe pieces; OUT appears only once everything is complete.

    Raises:
        UserError: OUT exists (without --force, or not written by llmctl), or a tensor's shape
            disagrees with the model the config describes.
    """
    check_import_out(out, force)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = _staging(out)
    t0 = time.perf_counter()
    log = out.parent / f".{out.name}.import.log"  # third-party warnings, moved into OUT
    try:
        with third_party_output_to(log):
            base, num_params = _write(plan, staging, out, on_progress)
        if log.is_file():
            log.replace(staging / "import.log")
        (staging / MARKER).write_text(json.dumps(_info(plan, base), indent=1) + "\n")
        publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    ckpt = out / "checkpoints" / "iter_0000000"
    return ImportResult(
        out=out,
        architecture=plan.architecture,
        num_parameters=num_params,
        checkpoint_bytes=sum(p.stat().st_size for p in ckpt.glob("*.distcp")),
        source_bytes=plan.size_bytes,
        seconds=time.perf_counter() - t0,
        peak_rss_bytes=_peak_rss_bytes(),
        base_rss_bytes=base,
    )


def _info(plan: ImportPlan, base_rss: int) -> dict[str, Any]:
    return plan.as_dict() | {"peak_rss_bytes": _peak_rss_bytes(), "base_rss_bytes": base_rss}


def _write(
    plan: ImportPlan, staging: Path, out: Path, on_progress: Progress | None
) -> tuple[int, int]:
    """Everything under `staging`; returns (RSS before the model was allocated, parameters)."""
    staging.mkdir(parents=True)
    _copy_tokenizer(plan.src, staging)
    recipe = write_recipe(plan, staging, out)
    from llmctl.config import cfg_to_yaml, compose

    cfg = compose(str(recipe))
    (staging / "config.yaml").write_text(cfg_to_yaml(cfg))
    from llmctl.hf.convert import convert

    return convert(plan, cfg, staging / "checkpoints", on_progress)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "tokenizer.model", "chat_template.jinja", "generation_config.json")  # fmt: skip


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def _yaml_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def model_yaml(plan: ImportPlan) -> str:
    """The model config group (configs/model/NAME.yaml) the import implies."""
    head = f"# {plan.architecture} imported from {plan.src} by `llmctl import hf`.\n"
    if plan.model["hf_vocab_size"] != plan.model["vocab_size"]:
        pad = f"{plan.model['hf_vocab_size']} padded to {plan.model['vocab_size']}"
        head += f"# vocab {pad} (zero rows).\n"
    return head + "".join(f"{k}: {_yaml_value(v)}\n" for k, v in plan.model.items())


def write_recipe(plan: ImportPlan, staging: Path, out: Path) -> Path:
    """model.yaml and a continued-pretraining recipe.yaml (CPU defaults; change cluster etc.)."""
    (staging / "model.yaml").write_text(model_yaml(plan))
    tok = (
        f"  tokenizer: {out / 'tokenizer.json'}\n" if (staging / "tokenizer.json").is_file() else ""
    )
    model = "".join(f"  {k}: {_yaml_value(v)}\n" for k, v in plan.model.items())
    text = (
        f"# Continued pretraining of {plan.architecture} from {plan.src}.\n"
        "# Written by `llmctl import hf`; change cluster/parallel/train for a real run.\n"
        "# Weights come from checkpoint.init_from (step 0, fresh optimizer and LR schedule).\n"
        "defaults:\n  - model: tiny\n  - cluster: local_cpu\n  - precision: fp32\n  - _self_\n"
        f"model:\n{model}" + (f"data:\n{tok}" if tok else "") + f"checkpoint:\n  init_from: {out}\n"
        "train:\n  train_iters: 20\n  lr: 1.0e-4\n  min_lr: 1.0e-5\n  warmup_iters: 0\n"
        "parallel:\n  tp: 1\n  pp: 1\n  cp: 1\n  micro_batch_size: 1\n"
    )
    path = staging / "recipe.yaml"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m llmctl.hf.importer SRC OUT [--tp N]`: import SRC into OUT (kept when it is
    already there) and print OUT; rank 0 runs it for `checkpoint.init_from=hf:SRC`."""
    import argparse
    import sys

    from llmctl.errors import UserError

    parser = argparse.ArgumentParser(prog="python -m llmctl.hf.importer")
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        out = import_hf(plan_import(args.src, tp=args.tp), args.out).out
    except UserError as exc:
        print(f"llmctl: {exc.message}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
