"""Bytes a megatron-core training step actually holds, measured term by term (the memory
oracle of the planner; tests/unit/plan/test_plan_memory_oracle.py).

What is measured, on one rank, with the real objects:
- weights: the model chunks' parameters (unique storages; megatron-core DDP's contiguous
  parameter buffer when the distributed optimizer lays parameters out in one);
- grads: megatron-core DDP's gradient buffers (`buffers[*].grad_data`, all chunks);
- optimizer: every tensor the megatron optimizer owns after one step: the Adam moments in
  `optimizer.state` and the fp32 master copies (`fp32_from_float16_groups` for the plain
  mixed-precision optimizer, `shard_fp32_from_float16_groups` for the distributed one);
- activations: the tensors autograd saves for backward, seen through
  `torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage, parameters excluded.
  Each saved tensor is held by a small box whose release (when autograd frees the saved
  variable after the node's backward) lowers the live count, so the peak over a whole
  pipeline schedule is the activation bytes of all micro-batches in flight at once.
- FSDP (`ProbeLayout.fsdp`, megatron-core's torch FSDP2 wrapper as `llmctl train` runs it):
  weights, grads and optimizer state are the local shards of the DTensors; on top of them
  `FsdpMeter` reads the peak bytes of unsharded parameters gathered at once and the peak of
  unsharded gradients alive before their reduce-scatter (`gathered_weights`, `gathered_grads`).

Heavy imports (torch, megatron-core) happen inside the functions. The process must already
be in a `torch.distributed` group (gloo on CPU) with `llmctl.train.cpu_compat` installed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SavedTensorMeter:
    """Live and peak bytes of the unique storages autograd holds for backward.

    Use as a context manager around forward (and backward). `exclude` holds storage
    pointers never counted (parameters and their buffers).
    """

    exclude: set[int] = field(default_factory=set)
    excluded: Any = None
    """Optional `(storage pointer) -> bool`, asked at each save: storages not counted at that
    moment (FSDP's gathered parameters, which live only while their unit is gathered)."""
    live: int = 0
    peak: int = 0
    saved: int = 0
    """Bytes of unique storages saved outside the backward pass since the last `reset`
    (freed or not): the forward's saves, not those of a recomputation during backward."""
    _refs: dict[int, list[int]] = field(default_factory=dict)
    _ctx: Any = None

    def reset(self) -> None:
        """Forget the peak and the cumulative count (live storages stay counted)."""
        self.peak, self.saved = self.live, 0

    def _pack(self, tensor: Any) -> Any:
        import torch

        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.exclude or storage.nbytes() == 0:
            return tensor
        if self.excluded is not None and self.excluded(ptr):
            return tensor
        entry = self._refs.get(ptr)
        if entry is None:
            entry = self._refs[ptr] = [0, storage.nbytes()]
            self.live += entry[1]
            if torch._C._current_graph_task_id() == -1:  # not inside backward
                self.saved += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Box(self, ptr, tensor)

    def _release(self, ptr: int) -> None:
        entry = self._refs[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[ptr]

    def __enter__(self) -> SavedTensorMeter:
        import torch

        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


class _Box:
    """Holds one saved tensor; its deletion tells the meter the storage may be free."""

    __slots__ = ("meter", "ptr", "tensor")

    def __init__(self, meter: SavedTensorMeter, ptr: int, tensor: Any) -> None:
        self.meter, self.ptr, self.tensor = meter, ptr, tensor

    def __del__(self) -> None:
        self.meter._release(self.ptr)


def _unpack(packed: Any) -> Any:
    return packed.tensor if isinstance(packed, _Box) else packed


def _local(t: Any) -> Any:
    """The local shard of a DTensor (FSDP), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = _local(t).untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _ddp_buffers(chunk: Any) -> list[Any]:
    """megatron-core DDP's parameter/gradient buffers (dense and expert) of one chunk."""
    out: list[Any] = []
    for name in ("buffers", "expert_parallel_buffers"):
        value = getattr(chunk, name, None)
        if isinstance(value, list):
            out += value
    return out


def param_storages(chunks: list[Any]) -> set[int]:
    """Storage pointers of every parameter (and DDP buffer) of the chunks."""
    ptrs = {_local(p).untyped_storage().data_ptr() for c in chunks for p in c.parameters()}
    for c in chunks:
        for buf in _ddp_buffers(c):
            if buf.param_data is not None:
                ptrs.add(buf.param_data.untyped_storage().data_ptr())
    return ptrs


def weight_bytes(chunks: list[Any]) -> int:
    """Bytes of the parameters (numel x element size; shared storages counted once)."""
    seen: set[int] = set()
    total = 0
    for c in chunks:
        for p in c.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += _local(p).numel() * p.element_size()
    return total


def grad_buffer_bytes(chunks: list[Any]) -> int:
    """Bytes of megatron-core DDP's gradient buffers (dense and expert) over all chunks."""
    total = 0
    for c in chunks:
        for buf in _ddp_buffers(c):
            total += buf.grad_data.numel() * buf.grad_data.element_size()
    return total


def local_grad_bytes(chunks: list[Any]) -> int:
    """Bytes of the parameters' own `.grad` (their local shards under FSDP)."""
    return _storage_bytes(p.grad for c in chunks for p in c.parameters() if p.grad is not None)


class FsdpMeter:
    """Peak unsharded bytes torch FSDP2 holds on top of the shards, over one step.

    Reads FSDP2's parameter groups (`torch.distributed.fsdp` internals, torch 2.4+): after
    each all-gather is issued (`unshard`, prefetches included) or waited on, and at each
    `post_backward` (before its reduce-scatter frees anything) it sums the unsharded
    parameters of every group gathered or being gathered at that moment, and the unsharded
    gradients every group still holds.
    """

    def __init__(self, chunks: list[Any], saved: SavedTensorMeter | None = None) -> None:
        """`saved`: a meter told not to count the storages of the parameters gathered at the
        moment of each save (the unsharded weights autograd saves are not activations)."""
        from torch.distributed.fsdp import FSDPModule

        if saved is not None:
            saved.excluded = self.is_gathered_storage

        self.groups = []
        for c in chunks:
            for m in c.modules():
                if isinstance(m, FSDPModule):
                    self.groups += m._get_fsdp_state()._fsdp_param_groups
        self.weights_peak = 0
        self.grads_peak = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def is_gathered_storage(self, ptr: int) -> bool:
        """Whether `ptr` is the storage of a parameter gathered now."""
        for g in self.groups:
            if g.is_unsharded:
                for fp in g.fsdp_params:
                    up = getattr(fp, "_unsharded_param", None)
                    if up is not None and up.untyped_storage().data_ptr() == ptr:
                        return True
        return False

    def _gathered(self) -> tuple[int, int]:
        weights = grads = 0
        for g in self.groups:
            # gathered: unsharded, or its all-gather issued (a prefetch) and not yet waited on
            gathered = g.is_unsharded or g._all_gather_result is not None
            for fp in g.fsdp_params:
                if gathered:
                    weights += fp._orig_size.numel() * fp.sharded_param.element_size()
                if not hasattr(fp, "_unsharded_param"):
                    continue
                up = fp._unsharded_param
                grad = (
                    up.grad
                    if fp.unsharded_accumulated_grad is None
                    else (fp.unsharded_accumulated_grad)
                )
                if grad is not None:
                    grads += grad.numel() * grad.element_size()
        return weights, grads

    def _sample(self) -> None:
        w, g = self._gathered()
        self.weights_peak = max(self.weights_peak, w)
        self.grads_peak = max(self.grads_peak, g)

    def __enter__(self) -> FsdpMeter:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        meter = self
        for name, before in (
            ("unshard", False),
            ("wait_for_unshard", False),
            ("post_backward", True),
        ):
            original = getattr(FSDPParamGroup, name)

            def wrapped(group: Any, *a: Any, _orig: Any = original, _pre: bool = before,
                        **k: Any) -> Any:  # fmt: skip
                if _pre:
                    meter._sample()
                out = _orig(group, *a, **k)
                if not _pre:
                    meter._sample()
                return out

            self._saved.append((FSDPParamGroup, name, original))
            setattr(FSDPParamGroup, name, wrapped)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        self._saved.clear()


def optimizer_bytes(optimizer: Any) -> int:
    """Bytes of the tensors a megatron optimizer owns: Adam moments and fp32 master copies
    (unique storages; views of model parameters or grad buffers are not counted)."""
    import torch

    opts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    tensors: list[Any] = []
    for opt in opts:
        inner = opt.optimizer
        for state in inner.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        for name in ("fp32_from_float16_groups", "shard_fp32_from_float16_groups"):
            for group in getattr(opt, name, None) or []:
                tensors += [t for t in group if t is not None]
    return _storage_bytes(tensors)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeShape:
    """A small GPT shape for the probe (Llama-style by default)."""

    num_layers: int = 4
    hidden_size: int = 64
    ffn_hidden_size: int = 160
    num_attention_heads: int = 8
    num_query_groups: int = 2
    vocab_size: int = 256
    seq_length: int = 64
    swiglu: bool = True
    normalization: str = "LayerNorm"
    """LayerNorm by default: torch's CPU RMSNorm is a composite that saves fp32 copies of its
    input (8 bytes per element, measured) where Transformer Engine's saves the 16-bit input."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeLayout:
    """What the probe runs: parallel degrees, recompute, optimizer sharding, micro-batches."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    sp: bool = False
    recompute: str = "none"
    distributed_optimizer: bool = False
    fsdp: bool = False
    """megatron-core's torch FSDP2 wrapper (`llmctl train`'s parallel.optimizer_sharding=full)."""
    micro_batch_size: int = 1
    num_microbatches: int = 1
    bf16: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """Measured bytes on this rank."""

    weights: int
    grads: int
    optimizer: int
    activations_one: int
    """Bytes the forward of one micro-batch saves on this rank (all its chunks; mean over
    the schedule's micro-batches)."""
    activations_peak: int
    """Peak live saved bytes over the whole forward-backward schedule."""
    gathered_weights: int = 0
    """FSDP: peak bytes of unsharded parameters gathered at once (0 without FSDP)."""
    gathered_grads: int = 0
    """FSDP: peak bytes of unsharded gradients alive before their reduce-scatter."""

    def as_dict(self) -> dict[str, int]:
        """Plain dict (JSON)."""
        return {
            "weights": self.weights,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations_one": self.activations_one,
            "activations_peak": self.activations_peak,
            "gathered_weights": self.gathered_weights,
            "gathered_grads": self.gathered_grads,
        }


def _config(shape: ProbeShape, lay: ProbeLayout) -> Any:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    from llmctl.train.cpu_compat import CPU_KERNEL_FLAGS

    recompute: dict[str, Any] = {}
    if lay.recompute == "full":
        recompute = dict(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    elif lay.recompute == "selective":
        recompute = dict(recompute_granularity="selective")
    dtype = torch.bfloat16 if lay.bf16 else torch.float32
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        normalization=shape.normalization,
        gated_linear_unit=shape.swiglu,
        activation_func=F.silu if shape.swiglu else F.gelu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        sequence_parallel=lay.sp,
        **CPU_KERNEL_FLAGS,
        batch_p2p_comm=False,
        deallocate_pipeline_outputs=True,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=lay.bf16,
        transformer_impl="local",
        **recompute,
    )


def _chunks(shape: ProbeShape, lay: ProbeLayout, config: Any) -> list[Any]:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization=config.normalization)
    chunks = []
    for v in range(lay.vpp):
        first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v)
        last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v)
        kw: dict[str, Any] = {"vp_stage": v} if lay.vpp > 1 else {}
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=spec,
                vocab_size=shape.vocab_size,
                max_sequence_length=shape.seq_length,
                pre_process=first,
                post_process=last,
                share_embeddings_and_output_weights=False,
                position_embedding_type="rope",
                **kw,
            )
        )
    return chunks


def _batches(shape: ProbeShape, lay: ProbeLayout, n: int) -> list[dict[str, Any]]:
    import torch

    gen = torch.Generator().manual_seed(7)
    b, s = lay.micro_batch_size, shape.seq_length
    out = []
    for _ in range(n):
        tokens = torch.randint(0, shape.vocab_size, (b, s + 1), generator=gen)
        out.append(
            {
                "tokens": tokens[:, :-1].contiguous(),
                "labels": tokens[:, 1:].contiguous(),
                "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous(),
            }
        )
    return out


def _forward_step(data_iterator: Any, model: Any) -> tuple[Any, Any]:
    batch = next(data_iterator)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])

    def loss_func(output: Any) -> tuple[Any, dict[str, Any]]:
        loss = output.float().mean()
        return loss, {"loss": loss.detach().clone()}

    return out, loss_func


def probe(shape: ProbeShape, lay: ProbeLayout) -> ProbeResult:
    """Build, wrap, step once and measure; the caller's process group must span
    TP*PP*DP ranks (DP = world / (TP*PP))."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    from llmctl.train import cpu_compat

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
    )
    cpu_compat.seed_model_parallel_rng(1234, ps.get_tensor_model_parallel_rank())
    config = _config(shape, lay)
    # megatron's training wraps each chunk in Float16Module (every parameter, norms too, in
    # the 16-bit dtype), as GPU runs do; without it the local spec's norms stay fp32.
    chunks = [Float16Module(config, c) if lay.bf16 else c for c in _chunks(shape, lay, config)]
    if lay.fsdp:
        from megatron.core.distributed.torch_fully_sharded_data_parallel_config import (
            TorchFullyShardedDataParallelConfig,
        )

        from llmctl.train.optim import fsdp_class

        cls, fsdp_config = fsdp_class(), TorchFullyShardedDataParallelConfig()
        model = [cls(config=config, ddp_config=fsdp_config, module=c) for c in chunks]
        config.no_sync_func = None
    else:
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=lay.distributed_optimizer
        )
        model = [
            DistributedDataParallel(
                config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0
            )
            for i, c in enumerate(chunks)
        ]
        config.no_sync_func = [m.no_sync for m in model] if len(model) > 1 else model[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-4,
            bf16=lay.bf16,
            params_dtype=config.params_dtype,
            use_distributed_optimizer=lay.distributed_optimizer,
        ),
        model,
    )
    meter = SavedTensorMeter(exclude=param_storages(model))
    fsdp_meter = FsdpMeter(model, meter) if lay.fsdp else contextlib.nullcontext()
    fb = get_forward_backward_func()
    m = lay.num_microbatches
    iters = [iter(_batches(shape, lay, m)) for _ in model]
    with meter, fsdp_meter:
        fb(
            forward_step_func=_forward_step,
            data_iterator=iters if len(iters) > 1 else iters[0],
            model=model if len(model) > 1 else model[0],
            num_microbatches=m,
            seq_length=shape.seq_length,
            micro_batch_size=lay.micro_batch_size,
            forward_only=False,
        )
    peak = meter.peak
    grads = local_grad_bytes(model) if lay.fsdp else grad_buffer_bytes(model)
    optimizer.step()
    torch.distributed.barrier()
    return ProbeResult(
        weights=weight_bytes(model),
        grads=grads,
        optimizer=optimizer_bytes(optimizer),
        activations_one=meter.saved // m,
        activations_peak=peak,
        gathered_weights=fsdp_meter.weights_peak if isinstance(fsdp_meter, FsdpMeter) else 0,
        gathered_grads=fsdp_meter.grads_peak if isinstance(fsdp_meter, FsdpMeter) else 0,
    )
