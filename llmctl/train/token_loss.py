"""Per-token loss for supervised fine-tuning: every trained token of a step weighs the same.

Pretraining micro-batches all hold `micro_batch_size * seq_length` trained tokens, so the mean
of per-micro-batch token means (megatron's default) is the token mean of the step. SFT
micro-batches hold as many trained tokens as their responses have, so that mean would weight a
token by 1 / (trained tokens of its micro-batch): the objective would change with the
micro-batch size. With megatron-core's `calculate_per_token_loss`, the loss function returns
(sum, count); the schedule leaves the sum unscaled and `finalize_model_grads` divides the
gradients by the count summed over micro-batches and data-parallel ranks (megatron DDP then
sums gradients instead of averaging them), so the gradient is that of the step's token mean.
"""

from __future__ import annotations

from typing import Any


def token_loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(sum of trained-token losses, their count, report [sum, count]) of one micro-batch."""
    import torch

    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    total = (losses * mask).sum()
    count = mask.sum()
    report = torch.stack([total.detach().clone(), count.detach()])
    return total, count.to(torch.int), {"lm loss": report}


def reduce_token_loss(losses_reduced: list[dict[str, Any]], device: Any) -> float:
    """Token mean over micro-batches and DP ranks, made visible on every pipeline stage."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if losses_reduced:
        sums = torch.stack([x["lm loss"].float() for x in losses_reduced]).sum(dim=0)
        dist.all_reduce(sums, group=ps.get_data_parallel_group())
        local = sums[0] / sums[1].clamp(min=1.0)
    else:
        local = torch.zeros((), device=device)
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(local, group=ps.get_pipeline_model_parallel_group())
    return float(local.item())
