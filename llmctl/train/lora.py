"""LoRA on megatron-core (`train.peft=lora`): frozen base, small adapters, any TP/PP.

Each adapted Hugging Face linear `t` gets `W x + (alpha / r) B_t A_t dropout(x)`, exactly as
PEFT computes it, on megatron-core's fused linears:

- q_proj, k_proj, v_proj: `self_attention.linear_qkv` (fused per query group), column-parallel:
  A (r x in) replicated, B (out x r) rows sharded like the base's;
- gate_proj, up_proj: `mlp.linear_fc1` ([gate; up] on each rank when gated), column-parallel;
- o_proj: `self_attention.linear_proj`, row-parallel: A's input columns sharded, B replicated;
- down_proj: `mlp.linear_fc2`, row-parallel.

A column-parallel target's `h = A x` is replicated and enters the sharded `B` through megatron's
`copy_to_tensor_model_parallel_region` (identity forward, all-reduce of the gradient), so every
TP rank holds A's full gradient; the local rows `B_t h` are placed where the base linear's local
output holds that projection (q, k, v of each local query group; the gate and up halves). A
row-parallel target's partial `A_local x_local` is summed over TP by
`reduce_from_tensor_model_parallel_region` (or reduce-scattered over the sequence with sequence
parallelism), then the replicated B applies. With sequence parallelism the replicated factor
sees a sequence shard, so it carries megatron's `sequence_parallel` flag and
`finalize_model_grads` all-reduces its gradient over TP, as for LayerNorm weights.

The adapters of a linear live in a sibling module `<linear>_lora` (e.g.
`self_attention.linear_qkv_lora.q_proj.lora_A`), so the base's keys are unchanged; a forward
hook on the base linear adds them. Every base parameter has `requires_grad=False`: megatron's
DDP gives it no gradient buffer and its optimizer no state. Checkpoints hold only the adapter
tensors (and their optimizer state) and record the base they belong to (`base_record`); the
base is loaded from `checkpoint.init_from` on every start, including resumes (`load_base`).

`adapters_disabled(model)` makes the forward skip every adapter (the base model, e.g. a DPO
reference without a second copy of the weights).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value as _v
from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train")

#: Suffix of the sibling module that holds a linear's adapters.
SUFFIX = "_lora"
#: train_state.json key of the base record of an adapter checkpoint.
RECORD_KEY = "lora"
_BASE_ATTR = "_llmctl_lora_base"
_COLUMN = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where a Hugging Face target lives in a megatron-core layer."""

    hf: str
    parent: str  # "self_attention" or "mlp"
    linear: str  # "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"

    @property
    def column(self) -> bool:
        """Column-parallel base (A replicated, B sharded on its output rows)."""
        return self.hf in _COLUMN

    @property
    def hf_parent(self) -> str:
        """The Hugging Face layer submodule (`self_attn` or `mlp`)."""
        return "self_attn" if self.parent == "self_attention" else "mlp"


TARGETS = {
    "q_proj": Target("q_proj", "self_attention", "linear_qkv"),
    "k_proj": Target("k_proj", "self_attention", "linear_qkv"),
    "v_proj": Target("v_proj", "self_attention", "linear_qkv"),
    "o_proj": Target("o_proj", "self_attention", "linear_proj"),
    "gate_proj": Target("gate_proj", "mlp", "linear_fc1"),
    "up_proj": Target("up_proj", "mlp", "linear_fc1"),
    "down_proj": Target("down_proj", "mlp", "linear_fc2"),
}


def enabled(cfg: RootConfig) -> bool:
    """Whether the run trains LoRA adapters."""
    return _v(cfg.train.peft) == "lora"


def dims(model: Any, hf: str) -> tuple[int, int]:
    """(in, out) features of target `hf` in the full (unsharded) model."""
    from llmctl.plan.lora import target_dims

    d = model.kv_channels or model.hidden_size // model.num_attention_heads
    return target_dims(
        model.hidden_size, model.ffn_hidden_size, d, model.num_attention_heads,
        model.num_query_groups, hf,
    )  # fmt: skip


def is_adapter_key(key: str) -> bool:
    """A state-dict key of an adapter tensor (`...<linear>_lora.<target>.lora_A|lora_B`)."""
    return (key.endswith(".lora_A") or key.endswith(".lora_B")) and f"{SUFFIX}." in key


# ---------------------------------------------------------------- modules (torch imported late)


def _modules() -> tuple[type, type]:
    """The adapter module classes, defined on first use (torch and megatron imported here)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel as tpm
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    class LoraPair(torch.nn.Module):
        """A and B of one Hugging Face target, sharded for this rank."""

        def __init__(self, a: Any, b: Any, column: bool) -> None:
            super().__init__()
            self.lora_A = torch.nn.Parameter(a)
            self.lora_B = torch.nn.Parameter(b)
            self.column = column
            sharded = self.lora_B if column else self.lora_A
            tpm.set_tensor_model_parallel_attributes(sharded, True, 0 if column else 1, 1)

        def sharded_state_dict(
            self, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None
        ) -> dict[str, Any]:
            state = self.state_dict(prefix="", keep_vars=True)
            axis = {"lora_B": 0} if self.column else {"lora_A": 1}
            return dict(make_sharded_tensors_for_checkpoint(state, prefix, axis, sharded_offsets))

    class LoraLinear(torch.nn.Module):
        """The adapters of one megatron linear; `delta(x)` is what they add to its output."""

        def __init__(self, kind: str, pairs: dict[str, Any], layout: dict[str, Any]) -> None:
            super().__init__()
            self.kind = kind  # linear_qkv / linear_fc1 / linear_proj / linear_fc2
            self.names = list(pairs)
            for name, pair in pairs.items():
                self.add_module(name, pair)
            self.scale = float(layout["scale"])
            self.dropout = torch.nn.Dropout(float(layout["dropout"]))
            self.sp = bool(layout["sequence_parallel"])
            self.shape = layout  # local output sizes per slot
            self.disabled = False

        def sharded_state_dict(
            self, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None
        ) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name in self.names:
                out.update(
                    getattr(self, name).sharded_state_dict(f"{prefix}{name}.", sharded_offsets)
                )
            return out

        def _column(self, x: Any, pair: Any) -> Any:
            h = torch.nn.functional.linear(x, pair.lora_A)
            if self.sp:
                h = tpm.gather_from_sequence_parallel_region(h)
            else:
                h = tpm.copy_to_tensor_model_parallel_region(h)
            return torch.nn.functional.linear(h, pair.lora_B)

        def _row(self, x: Any, pair: Any) -> Any:
            h = torch.nn.functional.linear(x, pair.lora_A)
            if self.sp:
                h = tpm.reduce_scatter_to_sequence_parallel_region(h)
            else:
                h = tpm.reduce_from_tensor_model_parallel_region(h)
            return torch.nn.functional.linear(h, pair.lora_B)

        def delta(self, x: Any) -> Any:
            x = self.dropout(x)
            if self.kind in ("linear_proj", "linear_fc2"):
                return self._row(x, getattr(self, self.names[0])) * self.scale
            ys = {n: self._column(x, getattr(self, n)) for n in self.names}
            lead = next(iter(ys.values())).shape[:-1]
            if self.kind == "linear_qkv":
                g = self.shape["local_groups"]
                per = {"q_proj": self.shape["q_per_group"], "k_proj": self.shape["head_dim"]}
                per["v_proj"] = self.shape["head_dim"]
                parts = [
                    ys[n].reshape(*lead, g, per[n]) if n in ys else x.new_zeros((*lead, g, per[n]))
                    for n in ("q_proj", "k_proj", "v_proj")
                ]
                return torch.cat(parts, dim=-1).reshape(*lead, -1) * self.scale
            if not self.shape["gated"]:
                return ys["up_proj"] * self.scale
            f = self.shape["local_ffn"]
            parts = [
                ys[n] if n in ys else x.new_zeros((*lead, f)) for n in ("gate_proj", "up_proj")
            ]
            return torch.cat(parts, dim=-1) * self.scale

    del ps
    _CLASSES = (LoraPair, LoraLinear)
    return _CLASSES


_CLASSES: tuple[type, type] | None = None


def _hook(adapters: Any) -> Any:
    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        del module
        if adapters.disabled:
            return output
        out, bias = output
        return out + adapters.delta(args[0]).to(out.dtype), bias

    return hook


def _init_pair(model: Any, hf: str, rank: int, seed: int, layer: int, tp: int, tp_rank: int) -> Any:
    """(A, B) local to this TP rank: A ~ PEFT's kaiming_uniform(a=sqrt(5)) over the full
    matrix (the same on every layout: one generator per layer and target), B = 0."""
    import torch

    inp, out = dims(model, hf)
    gen = torch.Generator().manual_seed(seed * 7919 + layer * 31 + list(TARGETS).index(hf))
    bound = 1.0 / math.sqrt(inp)  # kaiming_uniform_(a=sqrt(5)): sqrt(6 / (6 * fan_in))
    a = (torch.rand((rank, inp), generator=gen) * 2.0 - 1.0) * bound
    b = torch.zeros((out, rank))
    if TARGETS[hf].column:
        b = b.chunk(tp, dim=0)[tp_rank].clone()
    else:
        a = a.chunk(tp, dim=1)[tp_rank].clone()
    return a, b


def apply_lora(chunks: list[Any], cfg: RootConfig, layout: Any) -> int:
    """Freeze every base parameter and add the adapters `train.lora` names; no-op without
    `train.peft=lora`. Returns the number of adapter parameters on this rank.

    Raises:
        UserError: A target on a linear that fuses its input norm (Transformer Engine spec).
    """
    if not enabled(cfg):
        return 0
    import torch
    from megatron.core import parallel_state as ps

    pair_cls, linear_cls = _modules()
    lora, model = cfg.train.lora, cfg.model
    tp, tp_rank = layout.tp, ps.get_tensor_model_parallel_rank()
    d = model.kv_channels or model.hidden_size // model.num_attention_heads
    gated = _v(model.activation) == "swiglu"
    shape = {
        "scale": lora.alpha / lora.rank,
        "dropout": lora.dropout,
        "sequence_parallel": bool(layout.sequence_parallel and tp > 1),
        "local_groups": model.num_query_groups // tp,
        "q_per_group": model.num_attention_heads // model.num_query_groups * d,
        "head_dim": d,
        "gated": gated,
        "local_ffn": model.ffn_hidden_size // tp,
    }
    by_linear: dict[tuple[str, str], list[str]] = {}
    for name in lora.target_modules:
        t = TARGETS[name]
        by_linear.setdefault((t.parent, t.linear), []).append(name)
    count = 0
    for chunk in chunks:
        for p in chunk.parameters():
            p.requires_grad_(False)
        inner = getattr(chunk, "module", chunk)
        for layer in inner.decoder.layers:
            number = int(layer.layer_number)  # global, 1-based (PP/VPP offset included)
            for (parent, linear), names in by_linear.items():
                owner = getattr(layer, parent)
                base = getattr(owner, linear)
                if hasattr(base, "layer_norm_weight"):
                    raise UserError(
                        f"train.peft=lora: {parent}.{linear} fuses its input norm (Transformer "
                        "Engine layer spec); LoRA runs on megatron-core's local spec only"
                    )
                pairs = {}
                for n in sorted(names, key=list(TARGETS).index):
                    a, b = _init_pair(model, n, lora.rank, cfg.train.seed, number, tp, tp_rank)
                    pair = pair_cls(
                        a.to(base.weight.dtype), b.to(base.weight.dtype), TARGETS[n].column
                    )
                    pair.to(base.weight.device)
                    if shape["sequence_parallel"]:  # the replicated factor sees a sequence shard
                        (pair.lora_A if TARGETS[n].column else pair.lora_B).sequence_parallel = True
                    pairs[n] = pair
                    count += a.numel() + b.numel()
                adapters = linear_cls(linear, pairs, shape)
                owner.add_module(linear + SUFFIX, adapters)
                base.register_forward_hook(_hook(adapters))
    del torch
    return count


def adapter_modules(model: Any) -> Iterator[Any]:
    """Every adapter container of a model, a list of chunks, or DDP/Float16 wrappers."""
    _, linear_cls = _modules()
    for chunk in model if isinstance(model, list | tuple) else [model]:
        for m in chunk.modules():
            if isinstance(m, linear_cls):
                yield m


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """Within the block, forward passes of `model` skip every adapter (the base model).

    For a DPO reference with LoRA: the frozen base is the starting model, so no second copy
    of the weights is needed. Nests; restores each adapter's previous state on exit.
    """
    mods = list(adapter_modules(model))
    before = [m.disabled for m in mods]
    for m in mods:
        m.disabled = True
    try:
        yield
    finally:
        for m, b in zip(mods, before, strict=True):
            m.disabled = b


def trainable_counts(chunks: list[Any]) -> tuple[int, int]:
    """(parameters with gradients, frozen parameters) on this rank."""
    train = sum(p.numel() for c in chunks for p in c.parameters() if p.requires_grad)
    frozen = sum(p.numel() for c in chunks for p in c.parameters() if not p.requires_grad)
    return int(train), int(frozen)


# ---------------------------------------------------------------- checkpoints


def is_lora_chunk(chunk: Any) -> bool:
    """Whether a (unwrapped) chunk carries adapters."""
    return any(name.endswith(SUFFIX) for name, _ in chunk.named_modules())


def checkpoint_view(chunk: Any, sd: dict[str, Any]) -> dict[str, Any]:
    """The part of a chunk's sharded state dict a checkpoint holds: all of it, or with LoRA
    only the adapters (the base is `checkpoint.init_from`'s, recorded by `base_record`)."""
    if not is_lora_chunk(chunk):
        return sd
    return {k: v for k, v in sd.items() if is_adapter_key(k)}


def load_view(chunk: Any, state: dict[str, Any]) -> None:
    """`chunk.load_state_dict` of what `checkpoint_view` saved (adapters only with LoRA)."""
    if not is_lora_chunk(chunk):
        chunk.load_state_dict(state)
        return
    missing, unexpected = chunk.load_state_dict(state, strict=False)
    lost = [k for k in missing if is_adapter_key(k)]
    if lost or unexpected:
        raise UserError(
            f"adapter checkpoint does not fit this run's adapters: {(lost or unexpected)[0]}"
        )


def base_record(model: list[Any]) -> dict[str, Any]:
    """{"lora": base record} for a checkpoint's train_state.json; {} without LoRA."""
    for m in model:
        rec = getattr(_unwrap(m), _BASE_ATTR, None)
        if rec is not None:
            return {RECORD_KEY: rec}
    return {}


def _unwrap(module: Any) -> Any:
    while hasattr(module, "module"):
        module = module.module
    return module


def fingerprint(ckpt_dir: Path) -> str:
    """sha256 of a committed checkpoint's manifest (every file's size and CRC32)."""
    from llmctl.run import ckpt_store as store

    return hashlib.sha256((ckpt_dir / store.MANIFEST).read_bytes()).hexdigest()


def _recorded(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The base record of this run's newest committed checkpoint, if it has one."""
    from llmctl.run import ckpt_store as store

    root = run_dir / "checkpoints"
    steps = store.committed_steps(root) if root.is_dir() else []
    if not steps:
        return None
    ckpt = root / store.iter_name(steps[-1])
    try:
        saved = json.loads((ckpt / store.TRAIN_STATE).read_text())
    except (OSError, ValueError):
        return None
    rec = saved.get(RECORD_KEY)
    return (ckpt, rec) if isinstance(rec, dict) else None


def check_base(cfg: RootConfig, run_dir: Path, base: Path, fp: str) -> None:
    """Refuse an adapter checkpoint of this run that belongs to another base.

    Raises:
        UserError: The newest checkpoint's record names another base fingerprint or source.
    """
    found = _recorded(run_dir)
    if found is None:
        return
    ckpt, rec = found
    spec = str(cfg.checkpoint.init_from)
    if rec.get("fingerprint") != fp or rec.get("source") != spec:
        raise UserError(
            f"{ckpt}: its LoRA adapters belong to base {rec.get('source')} "
            f"(fingerprint {str(rec.get('fingerprint'))[:12]}), not to checkpoint.init_from="
            f"{spec} ({base}, fingerprint {fp[:12]})"
        )


def resolve_base(cfg: RootConfig, run_dir: Path, tp: int) -> tuple[Path, dict[str, Any]]:
    """(base checkpoint dir, base record) of `checkpoint.init_from` (rank 0: may import hf:).

    Raises:
        UserError: An unusable source, another model, or a LoRA adapter checkpoint as base.
    """
    from llmctl.run import ckpt_store as store
    from llmctl.run.init_from import check_same_model
    from llmctl.train.init_from import resolve_source

    spec = str(cfg.checkpoint.init_from)
    ckpt = resolve_source(spec, run_dir, tp)
    check = store.validate(ckpt, full=True)
    if not check.ok:
        raise UserError(f"checkpoint.init_from: {ckpt} is not usable: {check.reason}")
    saved = json.loads((ckpt / store.TRAIN_STATE).read_text())
    if RECORD_KEY in saved:
        raise UserError(
            f"checkpoint.init_from={spec}: {ckpt} holds LoRA adapters, not a base model; "
            f"export it merged (llmctl export hf RUN --out DIR) and use hf:DIR"
        )
    check_same_model(saved, cfg.model, ckpt)
    fp = fingerprint(ckpt)
    check_base(cfg, run_dir, ckpt, fp)
    lora = cfg.train.lora
    inside = ckpt.resolve().is_relative_to(run_dir.resolve())
    record = {
        "source": spec,  # the base checkpoint, relative to the run directory when inside it
        "checkpoint": str(ckpt.resolve().relative_to(run_dir.resolve()) if inside else ckpt),
        "fingerprint": fp,
        "rank": lora.rank,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
    }
    return ckpt, record


def load_base(state: Any, cfg: RootConfig, run_dir: Path) -> bool:
    """With LoRA, load the base weights of `checkpoint.init_from` into the model (every start,
    resumes included: the checkpoints hold only adapters). Returns whether it did.

    Raises:
        UserError: See `resolve_base`; a base that does not load into this model.
    """
    if not enabled(cfg):
        return False
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from llmctl.run.ckpt_safe import load_metadata, weights_only_loads
    from llmctl.train.init_from import _agree

    rank = dist.get_rank() if dist.is_initialized() else 0
    value = error = None
    record: dict[str, Any] = {}
    if rank == 0:
        try:
            ckpt, record = resolve_base(cfg, Path(run_dir), state.layout.tp)
            value = json.dumps({"ckpt": str(ckpt), "record": record})
        except UserError as e:
            error = e.message
    box = json.loads(_agree(rank, value, error))
    ckpt, record = Path(box["ckpt"]), box["record"]
    chunks = [_unwrap(m) for m in state.model]
    load_metadata(ckpt / ".metadata")
    keys = ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]
    sd = {
        k: {n: t for n, t in c.sharded_state_dict().items() if not is_adapter_key(n)}
        for k, c in zip(keys, chunks, strict=True)
    }
    try:
        with weights_only_loads(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            loaded = dist_checkpointing.load(sd, str(ckpt))
        for key, chunk in zip(keys, chunks, strict=True):
            missing, unexpected = chunk.load_state_dict(loaded[key], strict=False)
            lost = [k for k in missing if not is_adapter_key(k) and not k.endswith("_extra_state")]
            if lost or unexpected:
                raise RuntimeError(f"{(lost or unexpected)[0]} not in the base checkpoint")
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"checkpoint.init_from: cannot load {ckpt} into this model: {first}") from e
    for chunk in chunks:
        setattr(chunk, _BASE_ATTR, record)
    if rank == 0:
        train, frozen = trainable_counts(chunks)
        log.info(
            "LoRA: base %s (frozen, %d params on rank 0), adapters %d params (r=%d, %s)",
            ckpt, frozen, train, cfg.train.lora.rank, ",".join(cfg.train.lora.target_modules),
        )  # fmt: skip
    return True
