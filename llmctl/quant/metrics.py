"""Perplexity on held-out tokens (the peak memory of a phase: `llmctl.memory.PeakRss`).

Why perplexity is computed this way: the held-out stream is cut into non-overlapping windows of
`seq_len` tokens; each window is scored on its own (no carried context), and perplexity is
exp(total negative log-likelihood / number of predicted tokens), i.e. seq_len - 1 predictions
per window. Both the source and the quantized model are scored in fp32 compute with the same
windows, so the difference between the two figures is the quantization error alone (the
quantized weights, decompressed by transformers, are exact in fp32).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


def num_batches(num_tokens: int, seq_len: int, batch_size: int = 8) -> int:
    """Forward passes `perplexity` makes (for progress)."""
    return -(-(num_tokens // seq_len) // batch_size)


def perplexity(
    model: Any,
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int = 8,
    on_batch: Callable[[], None] | None = None,
) -> float:
    """Perplexity of a causal LM (a transformers model) on a token stream.

    Args:
        model: A `PreTrainedModel` whose forward returns `.logits`.
        tokens: 1-D token ids; trailing tokens that do not fill a window are dropped.
        seq_len: Window length.
        batch_size: Windows per forward pass.
        on_batch: Called after each forward pass (progress).
    """
    import torch

    num_windows = len(tokens) // seq_len
    if num_windows < 1:
        raise ValueError(f"{len(tokens)} held-out tokens do not fill one window of {seq_len}")
    windows = torch.from_numpy(np.asarray(tokens[: num_windows * seq_len], dtype=np.int64))
    windows = windows.view(num_windows, seq_len)
    nll, count = 0.0, 0
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, num_windows, batch_size):
            batch = windows[start : start + batch_size].to(device)
            logits = model(input_ids=batch).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                batch[:, 1:].reshape(-1),
                reduction="sum",
            )
            nll += float(loss)
            count += batch[:, 1:].numel()
            if on_batch is not None:
                on_batch()
    return math.exp(nll / count)
