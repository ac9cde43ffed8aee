"""LoRA runs to Hugging Face: a PEFT adapter directory, or the merged model.

An adapter checkpoint (`train.peft=lora`, llmctl.train.lora) holds per layer and Hugging Face
target `t` the global `lora_A` (r x in) and `lora_B` (out x r), whatever layout saved them, and
records its base (`train_state.json` "lora": source, checkpoint, sha256 of its manifest).

- `llmctl export hf RUN --adapter`: `adapter_config.json` (peft_type LORA, r, lora_alpha,
  lora_dropout, target_modules, base_model_name_or_path) and `adapter_model.safetensors` with
  PEFT's names, `base_model.model.model.layers.{i}.{self_attn|mlp}.{t}.lora_{A|B}.weight`:
  `PeftModel.from_pretrained(base, DIR)` loads it onto the base model.
- `llmctl export hf RUN`: the base checkpoint's tensors converted as any export, then every
  target weight `W += (alpha / r) B A` (PEFT's `merge_and_unload`), computed in fp32.

The base must still be the one recorded: its manifest's sha256 is compared first.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:
    from llmctl.hf.export import RunCheckpoint

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterRecord:
    """The LoRA record of a checkpoint: hyper-parameters and the base it belongs to."""

    rank: int
    alpha: float
    dropout: float
    targets: list[str]
    source: str
    base_checkpoint: Path
    fingerprint: str

    @property
    def scale(self) -> float:
        """alpha / rank, as PEFT scales (no rsLoRA)."""
        return self.alpha / self.rank

    @property
    def base_name(self) -> str:
        """`base_model_name_or_path`: the Hugging Face directory, or the base checkpoint."""
        from llmctl.run.init_from import HF_PREFIX

        if self.source.startswith(HF_PREFIX):
            return str(Path(self.source[len(HF_PREFIX) :]).expanduser().resolve())
        return str(self.base_checkpoint)


def adapter_record(ckpt_dir: Path, run_dir: Path) -> AdapterRecord | None:
    """The LoRA record of a committed checkpoint of `run_dir` (a relative base path is the
    run's own `init_from/` import); None for a full-parameter checkpoint."""
    from llmctl.run import ckpt_store as store
    from llmctl.train.lora import RECORD_KEY

    saved = json.loads((ckpt_dir / store.TRAIN_STATE).read_text())
    rec = saved.get(RECORD_KEY)
    if not isinstance(rec, dict):
        return None
    return AdapterRecord(
        rank=int(rec["rank"]),
        alpha=float(rec["alpha"]),
        dropout=float(rec["dropout"]),
        targets=list(rec["target_modules"]),
        source=str(rec["source"]),
        base_checkpoint=run_dir / rec["checkpoint"],
        fingerprint=str(rec["fingerprint"]),
    )


def check_base(rec: AdapterRecord, where: Path) -> None:
    """The recorded base checkpoint is still there and unchanged.

    Raises:
        UserError: Missing, or its manifest's sha256 differs (an adapter for another base).
    """
    from llmctl.train.lora import fingerprint

    try:
        fp = fingerprint(rec.base_checkpoint)
    except OSError as e:
        raise UserError(
            f"{where}: the base of its LoRA adapters, {rec.base_checkpoint}, is not readable ({e})"
        ) from e
    if fp != rec.fingerprint:
        raise UserError(
            f"{where}: its LoRA adapters belong to base fingerprint {rec.fingerprint[:12]}, "
            f"but {rec.base_checkpoint} now has {fp[:12]} (another base)"
        )


def adapter_tensors(loaded: dict[str, Any], num_layers: int) -> dict[tuple[int, str], Any]:
    """{(layer, target): (A, B)} from a checkpoint's model tensors (stacked or numbered)."""
    from llmctl.hf.export import _layer_tensors
    from llmctl.train.lora import SUFFIX, is_adapter_key

    out: dict[tuple[int, str], Any] = {}
    adapters = {k: v for k, v in loaded.items() if is_adapter_key(k)}
    for i, layer in enumerate(_layer_tensors(adapters, num_layers)):
        for key, tensor in layer.items():
            # e.g. self_attention.linear_qkv_lora.q_proj.lora_A
            target, which = key.split(f"{SUFFIX}.", 1)[1].split(".")
            a, b = out.get((i, target), (None, None))
            out[(i, target)] = (tensor, b) if which == "lora_A" else (a, tensor)
    return out


def peft_key(layer: int, target: str, which: str) -> str:
    """PEFT's name of an adapter tensor of a Llama-style causal LM."""
    from llmctl.train.lora import TARGETS

    parent = TARGETS[target].hf_parent
    return f"base_model.model.model.layers.{layer}.{parent}.{target}.{which}.weight"


def hf_weight_key(layer: int, target: str) -> str:
    """Transformers' name of the weight a target adapts."""
    from llmctl.train.lora import TARGETS

    return f"model.layers.{layer}.{TARGETS[target].hf_parent}.{target}.weight"


def split_lora(
    ckpt: RunCheckpoint, loaded: dict[str, Any], progress: Progress = NO_PROGRESS
) -> tuple[dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]]]:
    """(megatron tensors to convert, merge of the converted Hugging Face state dict).

    A full-parameter checkpoint: its own tensors and no merge. An adapter checkpoint: the
    recorded base's tensors and `W += scale * B A` on every adapted weight.
    """
    rec = adapter_record(ckpt.path, ckpt.run_dir)
    if rec is None:
        return loaded, lambda state: state
    from llmctl.hf.export import load_model_tensors

    check_base(rec, ckpt.path)
    adapters = adapter_tensors(loaded, ckpt.model.num_layers)
    base = load_model_tensors(rec.base_checkpoint, progress)

    def merge(state: dict[str, Any]) -> dict[str, Any]:
        for (layer, target), (a, b) in adapters.items():
            key = hf_weight_key(layer, target)
            w = state[key]
            delta = rec.scale * (b.double() @ a.double())
            state[key] = (w.double() + delta).to(w.dtype).contiguous()
        return state

    return base, merge


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterExport:
    """What `export_adapter` wrote."""

    out: Path
    step: int
    num_parameters: int
    size_bytes: int
    base: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "out": str(self.out),
            "step": self.step,
            "kind": "peft-lora-adapter",
            "num_parameters": self.num_parameters,
            "size_bytes": self.size_bytes,
            "base_model_name_or_path": self.base,
        }


def adapter_config(rec: AdapterRecord) -> dict[str, Any]:
    """PEFT's `adapter_config.json` for the record."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": rec.base_name,
        "r": rec.rank,
        "lora_alpha": rec.alpha,
        "lora_dropout": rec.dropout,
        "target_modules": sorted(rec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def export_adapter(
    ckpt: RunCheckpoint, out: Path, progress: Progress = NO_PROGRESS
) -> AdapterExport:
    """Write the PEFT adapter directory of a LoRA run's checkpoint (published whole).

    Raises:
        UserError: The run trained no adapters, or their base changed.
    """
    from llmctl.hf.export import check_exportable, load_model_tensors
    from llmctl.staging import publish, staging_dir

    rec = adapter_record(ckpt.path, ckpt.run_dir)
    if rec is None:
        raise UserError(
            f"{ckpt.path}: no LoRA adapters (the run did not train with train.peft=lora); "
            "export the full model without --adapter"
        )
    check_exportable(ckpt.model)
    check_base(rec, ckpt.path)
    from safetensors.torch import save_file

    loaded = load_model_tensors(ckpt.path, progress)
    tensors: dict[str, Any] = {}
    for (layer, target), (a, b) in sorted(adapter_tensors(loaded, ckpt.model.num_layers).items()):
        tensors[peft_key(layer, target, "lora_A")] = a.contiguous()
        tensors[peft_key(layer, target, "lora_B")] = b.contiguous()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(out)
    try:
        (staging / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(rec), indent=2) + "\n")
        save_file(tensors, str(staging / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return AdapterExport(
        out=out,
        step=ckpt.step,
        num_parameters=sum(int(t.numel()) for t in tensors.values()),
        size_bytes=(out / ADAPTER_WEIGHTS).stat().st_size,
        base=rec.base_name,
    )
