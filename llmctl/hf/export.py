"""`llmctl export hf`: a megatron-core distributed checkpoint to a Hugging Face model directory.

How the weights are gathered: megatron-core's `torch_dist` checkpoints store every tensor under
a global key with its global shape, whatever TP/PP/VPP/DP layout saved it (decoder layers are
stacked along a leading layer axis). llmctl reads the tensor metadata, keeps the model's keys and
asks `dist_checkpointing.load` for each whole tensor, in one process with a one-rank gloo group:
no model is built, and any saved layout reads the same way.

How names map (Llama-style families: `LlamaForCausalLM`, `MistralForCausalLM`,
`Qwen2ForCausalLM` with Q/K/V biases, `MixtralForCausalLM` with stacked experts): through the
one table in `llmctl.hf.mapping`, which `llmctl import hf` uses the other way round; vocab rows
past `model.hf_vocab_size` (import padding) are dropped. In short:

- `embedding.word_embeddings.weight` -> `model.embed_tokens.weight`; `output_layer.weight` ->
  `lm_head.weight` (or tied); `decoder.final_layernorm.weight` -> `model.norm.weight`.
- `linear_qkv.layer_norm_weight` (or local-spec `input_layernorm.weight`) ->
  `input_layernorm.weight`; `linear_fc1.layer_norm_weight` (or `pre_mlp_layernorm.weight`) ->
  `post_attention_layernorm.weight`.
- `linear_qkv.weight` is fused per query group: for each of the G groups, its H/G query heads,
  then one key head, then one value head (each `head_dim` rows). Reshaped to
  [G, H/G + 2, head_dim, hidden] and split, which also gives Hugging Face's GQA order (query
  head i uses key/value head i // (H/G)).
- `linear_fc1.weight` holds [gate; up] (SwiGLU), split in halves -> `gate_proj`, `up_proj`;
  `linear_fc2.weight` -> `down_proj`; `linear_proj.weight` -> `o_proj`. Biases follow weights.

RoPE: megatron's default (non-interleaved halves, `rotary_percent` 1) is Hugging Face Llama's
`rotate_half` convention, so no permutation of Q/K rows is needed.

GPT-style models (LayerNorm, GeLU, learned absolute positions) map to `GPT2LMHeadModel` when
GPT-2 can hold their shapes: multi-head attention (num_query_groups == num_attention_heads) and
head_dim * heads == hidden. GPT-2 uses Conv1D ([in, out], so weights are transposed), a
[q | k | v] fused attention projection, `ln_1`/`ln_2` with biases, `wpe` for positions, and the
exact-erf GeLU megatron's `F.gelu` computes; missing biases (add_bias_linear=False) are written as
zeros. MoE models, GQA GPT-style models and any mix of the two styles are refused.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value as _v
from llmctl.errors import UserError
from llmctl.hf.config import architecture_of, hf_config_dict
from llmctl.hf.mapping import FAMILIES, head_dim, heads_of, megatron_to_hf, split_qkv
from llmctl.progress import NO_PROGRESS, Progress, third_party_output_to
from llmctl.run.ckpt_safe import weights_only_loads
from llmctl.staging import check_out

if TYPE_CHECKING:
    from llmctl.config.schema import ModelConfig, RootConfig

log = logging.getLogger("llmctl.hf")

DEFAULT_MAX_SHARD_BYTES = 2 << 30
_MODEL_KEY = re.compile(r"^(?:model\d*\.)?((?:embedding|decoder|output_layer)\..+)$")
_LAYER_KEY = re.compile(r"^decoder\.layers\.(?:(\d+)\.)?(.+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCheckpoint:
    """A committed, validated checkpoint of a llmctl run, and what the run trained with."""

    run_dir: Path
    path: Path
    step: int
    model: ModelConfig  # cfg.model of the run
    tokenizer: Path | None
    data_prefix: str | None


def _run_data(cfg: RootConfig) -> tuple[str | None, str | None]:
    """(first data prefix, tokenizer.json path) the run trained with, when they can be found."""
    prefix = cfg.data.prefixes[0] if cfg.data.prefixes else None
    tokenizer = cfg.data.tokenizer
    if prefix is None or tokenizer is None:
        try:
            from llmctl.run.data import resolve_data

            spec = resolve_data(cfg)
            prefix, tokenizer = prefix or spec.prefixes[0], tokenizer or spec.tokenizer_path
        except UserError:
            pass
    return prefix, tokenizer


def _fetch_from_store(location: str, ckpt_root: Path, timeout_s: float) -> int:
    """The store's newest valid committed checkpoint, made a local committed directory (the
    run's local copies may have been pruned after upload, or this is another machine);
    returns its step."""
    from llmctl.run import ckpt_store as store
    from llmctl.run.ckpt_upload import fetch_newest

    ckpt_root.mkdir(parents=True, exist_ok=True)
    fetched, skipped, _ = fetch_newest(location, ckpt_root, timeout_s=timeout_s)
    for line in skipped:
        log.warning("skipped %s", line)
    if fetched is None:
        raise UserError(f"no valid committed checkpoint in {location}")
    log.info("checkpoint %s of %s: %s", store.iter_name(fetched.step), location, fetched.source)
    return fetched.step


def _pick_step(ckpt_root: Path, step: int | None) -> int:
    from llmctl.run import ckpt_store as store

    steps = store.committed_steps(ckpt_root)
    if not steps:
        raise UserError(
            f"no committed checkpoint in {ckpt_root}; train with checkpoint.interval > 0"
        )
    if step is None:
        latest = store.read_latest(ckpt_root)
        return latest if latest in steps else steps[-1]
    if step not in steps:
        raise UserError(f"no checkpoint for step {step} in {ckpt_root}; saved steps: {steps}")
    return step


def _newest_complete_other_than(ckpt_root: Path, bad_step: int) -> int | None:
    """The newest step, other than `bad_step`, whose checkpoint passes the full check (CRC32s:
    a size-only check would pass a checkpoint corrupted in place)."""
    from llmctl.run import ckpt_store as store

    for step in reversed(store.committed_steps(ckpt_root)):
        if step != bad_step and store.validate(ckpt_root / store.iter_name(step), full=True).ok:
            return step
    return None


def find_run_checkpoint(
    run_dir: Path, step: int | None = None, tokenizer: Path | None = None
) -> RunCheckpoint:
    """Find and validate (sizes, checksums, shard list) the checkpoint to export.

    Args:
        run_dir: The run directory (config.yaml, checkpoints/).
        step: The step to export; None = the `latest` pointer.
        tokenizer: Override of the tokenizer used in training.

    Raises:
        UserError: Not a run directory, no checkpoint, or the checkpoint is incomplete/corrupt.
    """
    from llmctl.config import load_resolved
    from llmctl.run import ckpt_store as store
    from llmctl.run.rundir import require_run_dir

    require_run_dir(run_dir)  # the one "not a run directory" wording
    cfg = load_resolved(run_dir / "config.yaml")
    ckpt_root = run_dir / "checkpoints"
    if cfg.checkpoint.dir and step is None:
        chosen = _fetch_from_store(cfg.checkpoint.dir, ckpt_root, cfg.checkpoint.upload_timeout_s)
    else:
        chosen = _pick_step(ckpt_root, step)
    check = store.validate(ckpt_root / store.iter_name(chosen), full=True)
    if not check.ok:
        good = _newest_complete_other_than(ckpt_root, chosen)
        hint = f"; --step {good} is complete" if good is not None else ""
        raise UserError(f"checkpoint {check.path} is not usable: {check.reason}{hint}")
    prefix, tok = _run_data(cfg)
    tok_path = tokenizer or (Path(tok) if tok else None)
    if tok_path is not None and tok_path.is_file():
        _eos_token(tok_path)  # a file that is no tokenizer: one line now, not after the weights
    return RunCheckpoint(
        run_dir=run_dir,
        path=check.path,
        step=chosen,
        model=cfg.model,
        tokenizer=tok_path,
        data_prefix=prefix,
    )


LLAMA = "LlamaForCausalLM"
GPT2 = "GPT2LMHeadModel"
_STYLES = {
    LLAMA: {"normalization": "rmsnorm", "activation": "swiglu", "position_embedding": "rope"},
    GPT2: {
        "normalization": "layernorm",
        "activation": "gelu",
        "position_embedding": "learned_absolute",
    },
}


def _check_gpt2_shapes(model: ModelConfig) -> None:
    if model.num_query_groups != model.num_attention_heads:
        raise UserError(
            f"model {model.name} is GPT-style with GQA (num_query_groups="
            f"{model.num_query_groups} != num_attention_heads={model.num_attention_heads}): "
            "GPT2LMHeadModel has multi-head attention only; no Hugging Face export"
        )
    if head_dim(model) * model.num_attention_heads != model.hidden_size:
        raise UserError(
            f"model {model.name}: kv_channels*heads != hidden_size, which GPT2LMHeadModel "
            "cannot express; no Hugging Face export"
        )


def check_exportable(model: ModelConfig) -> str:
    """The Hugging Face class the model maps onto (`LlamaForCausalLM` or `GPT2LMHeadModel`).

    Raises:
        UserError: MoE, a mix of the two styles, or GPT-style shapes GPT-2 cannot hold.
    """
    have = {k: _v(getattr(model, k)) for k in _STYLES[LLAMA]}
    for arch, fields in _STYLES.items():
        if have == fields and arch == GPT2:
            if model.num_experts:
                raise UserError(
                    f"model {model.name}: MoE export (num_experts={model.num_experts}) is "
                    "supported for Llama-style (Mixtral) models only"
                )
            _check_gpt2_shapes(model)
            return arch
        if have == fields:
            return architecture_of(model)  # Llama, Mistral, Qwen2 or Mixtral
    got = ", ".join(f"{k}={v}" for k, v in have.items())
    raise UserError(
        f"model {model.name} has {got}: no Hugging Face architecture matches this mix; llmctl "
        "exports Llama-style (rmsnorm, swiglu, rope) and GPT-style (layernorm, gelu, "
        "learned_absolute) models"
    )


@contextmanager
def _one_rank_group() -> Iterator[None]:
    """A one-rank gloo group for megatron's loader (reuses one that is already running)."""
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        created = True
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


MIB = 1 << 20


def _mib(num_bytes: int) -> int:
    """Progress unit of the load and write phases (at least 1, so a bar always completes)."""
    return max(1, -(-num_bytes // MIB))


def _nbytes(meta: Any) -> int:
    """Bytes of a whole tensor from its checkpoint metadata (global shape and dtype)."""
    import math

    return int(math.prod(meta.global_shape) * meta.dtype.itemsize)


def load_model_tensors(ckpt_dir: Path, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Whole model tensors of a torch_dist checkpoint, by megatron key (optimizer state skipped).

    One `dist_checkpointing.load` per key (stacked layers make that a dozen or so calls, each a
    large read), so the phase advances per tensor, in MiB: its ETA follows the bytes read.
    """
    with warnings.catch_warnings():  # "TE/Apex not installed": irrelevant to reading tensors
        warnings.simplefilter("ignore")
        from megatron.core import dist_checkpointing

    with _one_rank_group(), weights_only_loads():
        metadata = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
        wanted = {k: v for k, v in metadata.items() if _MODEL_KEY.match(k)}
        if not wanted:
            raise UserError(f"checkpoint {ckpt_dir} holds no model tensors")
        total = sum(_nbytes(v) for v in wanted.values())
        loaded: dict[str, Any] = {}
        with progress.phase(f"load {len(wanted)} tensors (MiB)", _mib(total)) as phase:
            done = 0
            for key, meta in wanted.items():
                with warnings.catch_warnings():  # torch's DCP deprecation notice in megatron
                    warnings.simplefilter("ignore", FutureWarning)
                    part = dist_checkpointing.load(
                        {key: meta}, str(ckpt_dir), validate_access_integrity=False
                    )
                loaded[key] = part[key]
                done += _nbytes(meta)
                phase.update(_mib(done))
    return {m.group(1): t for k, t in loaded.items() if (m := _MODEL_KEY.match(k))}


def _layer_tensors(state: dict[str, Any], num_layers: int) -> list[dict[str, Any]]:
    """Per-layer dicts {suffix: tensor} from stacked ([L, ...]) or numbered keys."""
    layers: list[dict[str, Any]] = [{} for _ in range(num_layers)]
    for key, tensor in state.items():
        m = _LAYER_KEY.match(key)
        if m is None:
            continue
        if m.group(1) is not None:
            layers[int(m.group(1))][m.group(2)] = tensor
        else:
            if tensor.shape[0] != num_layers:
                raise UserError(
                    f"{key}: {tensor.shape[0]} stacked layers, config says {num_layers}"
                )
            for i in range(num_layers):
                layers[i][m.group(2)] = tensor[i]
    return layers


def megatron_to_hf_llama(state: dict[str, Any], model: ModelConfig) -> dict[str, Any]:
    """Hugging Face state dict of a Llama-style family (`llmctl.hf.mapping`, shared with import).

    Raises:
        UserError: A tensor with no counterpart in the family, or one it needs that is missing.
    """
    arch = architecture_of(model)
    try:
        return megatron_to_hf(state, FAMILIES[arch], model)
    except (KeyError, ValueError) as e:
        raise UserError(f"{arch} export: {e.args[0]}") from None


_GPT2_RENAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "ln_1.weight",
    "self_attention.linear_qkv.layer_norm_bias": "ln_1.bias",
    "input_layernorm.weight": "ln_1.weight",
    "input_layernorm.bias": "ln_1.bias",
    "mlp.linear_fc1.layer_norm_weight": "ln_2.weight",
    "mlp.linear_fc1.layer_norm_bias": "ln_2.bias",
    "pre_mlp_layernorm.weight": "ln_2.weight",
    "pre_mlp_layernorm.bias": "ln_2.bias",
    "self_attention.linear_proj.weight": "attn.c_proj.weight",
    "self_attention.linear_proj.bias": "attn.c_proj.bias",
    "mlp.linear_fc1.weight": "mlp.c_fc.weight",
    "mlp.linear_fc1.bias": "mlp.c_fc.bias",
    "mlp.linear_fc2.weight": "mlp.c_proj.weight",
    "mlp.linear_fc2.bias": "mlp.c_proj.bias",
}


def _convert_gpt2_layer(i: int, tensors: dict[str, Any], model: ModelConfig) -> dict[str, Any]:
    """GPT-2 uses Conv1D ([in, out]: weights transposed) and a [q | k | v] fused projection."""
    import torch

    p, out = f"transformer.h.{i}.", dict[str, Any]()
    for suffix, tensor in tensors.items():
        if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            fused = torch.cat(split_qkv(tensor, heads_of(model)), dim=0)
            kind = suffix.rsplit(".", 1)[-1]
            out[f"{p}attn.c_attn.{kind}"] = fused.t() if kind == "weight" else fused
        elif suffix in _GPT2_RENAMES:
            name = _GPT2_RENAMES[suffix]
            is_conv = name.endswith(".weight") and not name.startswith("ln_")
            out[p + name] = tensor.t() if is_conv else tensor
        else:
            raise UserError(f"checkpoint tensor decoder.layers.{suffix} has no GPT-2 counterpart")
    for module, width in (
        ("attn.c_attn", 3 * model.hidden_size),
        ("attn.c_proj", model.hidden_size),
        ("mlp.c_fc", model.ffn_hidden_size),
        ("mlp.c_proj", model.hidden_size),
    ):
        if f"{p}{module}.bias" not in out:  # add_bias_linear=False: GPT-2 always has biases
            out[f"{p}{module}.bias"] = torch.zeros(width, dtype=out[f"{p}{module}.weight"].dtype)
    return out


def megatron_to_hf_gpt2(state: dict[str, Any], model: ModelConfig) -> dict[str, Any]:
    """Hugging Face GPT-2 state dict from megatron's global tensors (GPT-style models)."""
    if "embedding.position_embeddings.weight" not in state:
        raise UserError("GPT-style checkpoint has no embedding.position_embeddings.weight")
    out: dict[str, Any] = {
        "transformer.wte.weight": state["embedding.word_embeddings.weight"],
        "transformer.wpe.weight": state["embedding.position_embeddings.weight"],
        "transformer.ln_f.weight": state["decoder.final_layernorm.weight"],
        "transformer.ln_f.bias": state["decoder.final_layernorm.bias"],
    }
    if not model.tied_embeddings:
        out["lm_head.weight"] = state["output_layer.weight"]
    for i, tensors in enumerate(_layer_tensors(state, model.num_layers)):
        out |= _convert_gpt2_layer(i, tensors, model)
    known = _TOP_LEVEL_KEYS | {
        "embedding.position_embeddings.weight",
        "decoder.final_layernorm.bias",
    }
    leftovers = sorted(k for k in state if not _LAYER_KEY.match(k) and k not in known)
    if leftovers:
        raise UserError(f"checkpoint tensors with no GPT-2 counterpart: {', '.join(leftovers)}")
    return {k: v.contiguous() for k, v in out.items()}


_TOP_LEVEL_KEYS = {
    "embedding.word_embeddings.weight",
    "decoder.final_layernorm.weight",
    "output_layer.weight",
}


def _torch_dtype_name(tensor: Any) -> str:
    import torch

    dtype = tensor.dtype
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")


# Generic PretrainedConfig fields that say nothing about a causal LM checkpoint.
_NOISE_KEYS = {
    "id2label", "label2id", "return_dict", "output_hidden_states", "output_attentions",
    "chunk_size_feed_forward", "problem_type", "is_encoder_decoder", "_name_or_path",
}  # fmt: skip


def llama_config(model: ModelConfig, dtype: str, eos_id: int | None) -> dict[str, Any]:
    """config.json of a Llama-style family (Llama, Mistral, Qwen2, Mixtral), via transformers."""
    return hf_config_dict(model, eos_id, dtype)


def gpt2_config(model: ModelConfig, dtype: str, eos_id: int | None) -> dict[str, Any]:
    """config.json contents for `GPT2LMHeadModel` (exact-erf GeLU, as megatron's F.gelu)."""
    from transformers import GPT2Config

    config = GPT2Config(
        vocab_size=model.vocab_size,
        n_positions=model.max_position_embeddings or model.seq_length,
        n_embd=model.hidden_size,
        n_layer=model.num_layers,
        n_head=model.num_attention_heads,
        n_inner=model.ffn_hidden_size,
        activation_function="gelu",
        layer_norm_epsilon=model.norm_epsilon,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=bool(model.tied_embeddings),
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        architectures=[GPT2],
    )
    data = {k: v for k, v in config.to_dict().items() if k not in _NOISE_KEYS}
    data["dtype"] = data["torch_dtype"] = dtype
    return data


def write_safetensors(
    state: dict[str, Any],
    out: Path,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress = NO_PROGRESS,
) -> list[str]:
    """Shards `model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json`; the
    phase advances per shard, in MiB."""
    from safetensors.torch import save_file

    shards: list[dict[str, Any]] = [{}]
    size = total = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = state[name]
        size += nbytes
        total += nbytes
    names: list[str] = []
    weight_map: dict[str, str] = {}
    with progress.phase(f"write {len(shards)} shard(s) (MiB)", _mib(total)) as phase:
        done = 0
        for k, shard in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / fname), metadata={"format": "pt"})
            names.append(fname)
            weight_map |= dict.fromkeys(shard, fname)
            done += sum(t.numel() * t.element_size() for t in shard.values())
            phase.update(_mib(done))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names


def _eos_token(tokenizer_json: Path) -> tuple[str | None, int | None]:
    from tokenizers import Tokenizer

    from llmctl.run.data import EOD_CANDIDATES

    config = tokenizer_json.with_name("tokenizer_config.json")
    names: list[str] = []
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        names = [eos] if isinstance(eos, str) else []
    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as exc:  # the tokenizers library raises a bare Exception
        raise UserError(f"tokenizer {tokenizer_json} is not a tokenizer.json ({exc})") from None
    for name in [*names, *EOD_CANDIDATES]:
        if (i := tok.token_to_id(name)) is not None:
            return name, int(i)
    return None, None


def write_tokenizer(tokenizer_json: Path, out: Path, max_length: int) -> int | None:
    """Copy tokenizer.json and write a tokenizer_config.json naming its EOS token.

    Returns:
        The EOS id (None when the tokenizer has no recognizable EOS token).
    """
    if not tokenizer_json.is_file():
        raise UserError(f"tokenizer {tokenizer_json} not found; pass --tokenizer PATH")
    eos, eos_id = _eos_token(tokenizer_json)
    shutil.copy2(tokenizer_json, out / "tokenizer.json")
    src = tokenizer_json.with_name("tokenizer_config.json")
    config = json.loads(src.read_text()) if src.is_file() else {}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if eos is not None:
        for key in ("eos_token", "bos_token"):
            config.setdefault(key, eos)
    config["model_max_length"] = max_length
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return eos_id


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    """What `export_hf` wrote."""

    out: Path
    step: int
    architecture: str
    num_parameters: int
    size_bytes: int
    shards: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "out": str(self.out),
            "step": self.step,
            "architecture": self.architecture,
            "num_parameters": self.num_parameters,
            "size_bytes": self.size_bytes,
            "shards": self.shards,
        }


def _write_dir(
    ckpt: RunCheckpoint, staging: Path, max_shard_bytes: int, progress: Progress = NO_PROGRESS
) -> tuple[int, list[str]]:
    model = ckpt.model
    arch = check_exportable(model)
    convert, make_config = (
        (megatron_to_hf_llama, llama_config) if arch != GPT2 else (megatron_to_hf_gpt2, gpt2_config)
    )
    loaded = load_model_tensors(ckpt.path, progress)
    from llmctl.hf.lora_export import split_lora  # a LoRA run: its base, merged with adapters

    loaded, merge = split_lora(ckpt, loaded, progress)
    with progress.phase(f"convert to {arch}"):
        state = merge(convert(loaded, model))
    max_len = int(model.max_position_embeddings or model.seq_length)
    eos_id = write_tokenizer(ckpt.tokenizer, staging, max_len) if ckpt.tokenizer else None
    embed = "model.embed_tokens.weight" if arch != GPT2 else "transformer.wte.weight"
    config = make_config(model, _torch_dtype_name(state[embed]), eos_id)
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False}
    (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shards = write_safetensors(state, staging, max_shard_bytes, progress)
    return sum(int(t.numel()) for t in state.values()), shards


def export_hf(
    ckpt: RunCheckpoint,
    out: Path,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress = NO_PROGRESS,
) -> ExportResult:
    """Write the Hugging Face directory; it appears under `out` only once complete.

    Raises:
        UserError: Unsupported architecture, unmapped tensors, missing tokenizer.
    """
    check_exportable(ckpt.model)
    if ckpt.tokenizer is None:
        raise UserError(f"run {ckpt.run_dir}: tokenizer not found; pass --tokenizer PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    from llmctl.staging import publish, staging_dir

    staging = staging_dir(out)
    try:
        num_params, shards = _write_dir(ckpt, staging, max_shard_bytes, progress)
        publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return ExportResult(
        out=out,
        step=ckpt.step,
        architecture=check_exportable(ckpt.model),
        num_parameters=num_params,
        size_bytes=size,
        shards=shards,
    )


EXPORT_MARKER = "llmctl_export.json"  # what `llmctl export` wrote: --force may replace it


def export_run(
    run_dir: Path,
    out: Path,
    *,
    step: int | None = None,
    tokenizer: Path | None = None,
    force: bool = False,
    adapter: bool = False,
    progress: Progress = NO_PROGRESS,
) -> Any:
    """`llmctl export hf`: find, validate and export a run's checkpoint (`adapter`: a LoRA
    run's PEFT adapter directory, `llmctl.hf.lora_export`; returns its `AdapterExport`).

    Third-party warnings go to OUT/export.log (kept as .OUT.export.log if the export fails),
    not the console, unless `-v`.
    """
    check_out(out, force, EXPORT_MARKER)
    log = out.parent / f".{out.name}.export.log"
    with third_party_output_to(log):
        with progress.phase(f"validate checkpoint of {run_dir}"):
            ckpt = find_run_checkpoint(run_dir, step, tokenizer)
        check_exportable(ckpt.model)
        result: Any
        if adapter:
            from llmctl.hf.lora_export import export_adapter

            result = export_adapter(ckpt, out, progress=progress)
        else:
            result = export_hf(ckpt, out, progress=progress)
    if log.is_file():
        log.replace(out / "export.log")
    (out / EXPORT_MARKER).write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return result
