"""DPO terms of a plan (`train.objective=dpo`, docs/finetune.md): pure arithmetic.

How llmctl runs DPO decides the terms. The two sequences of a pair (prompt + chosen, prompt +
rejected) are packed whole into one pack of `seq_length` tokens (`llmctl data prefs`), so a
micro-batch holds `micro_batch_size * seq_length` tokens as in SFT: weights, gradients,
optimizer state, activations and the step time are those of the same model trained on the
same packs, and the layout search is unchanged. What DPO adds:

- the reference model: no second copy of the weights (0 bytes); its sequence log-probs are
  computed once, before step 1, and kept as a float32 table of (packs x sequences per pack),
  on every rank (`reference_table_bytes`). Keeping a frozen copy instead would add the
  stage's weights once more (`frozen_copy_bytes`, the figure this choice saves);
- the reference pass: one forward-only pass over the packs the run reads, about a third of
  the compute of a training step per `global_batch_size` packs (forward = 1 of the 3 GEMM
  passes), plus the step's fixed overhead (`reference_pass_s`);
- pairs per step: `global_batch_size * pairs per pack` (the loss is the mean over them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class DpoSpec:
    """The preference data of a DPO run, from its packs' manifests."""

    num_pairs: int
    num_packs: int
    sequences_per_pack: int
    """At most 2 x the most pairs one pack holds: the width of the reference table."""
    global_batch_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DpoTerms:
    """What DPO adds to a plan's layout (see the module docstring)."""

    pairs_per_step: float
    sequences_per_step: float
    reference_table_bytes: int
    frozen_copy_bytes: float
    reference_pass_s: float


def dpo_terms(
    spec: DpoSpec, *, compute_s: float, overhead_s: float, weights_bytes: float
) -> DpoTerms:
    """DPO terms of one layout.

    Args:
        spec: The preference data.
        compute_s: The layout's training-step compute (GEMM + attention + element-wise), s.
        overhead_s: The layout's fixed per-step overhead, s.
        weights_bytes: The worst stage's weight bytes per GPU (what a frozen copy would add).
    """
    pairs_per_pack = spec.num_pairs / max(spec.num_packs, 1)
    batches = spec.num_packs / max(spec.global_batch_size, 1)
    return DpoTerms(
        pairs_per_step=spec.global_batch_size * pairs_per_pack,
        sequences_per_step=2 * spec.global_batch_size * pairs_per_pack,
        reference_table_bytes=4 * spec.num_packs * spec.sequences_per_pack,
        frozen_copy_bytes=weights_bytes,
        reference_pass_s=batches * (compute_s / 3.0 + overhead_s),
    )
