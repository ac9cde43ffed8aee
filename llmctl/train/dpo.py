"""DPO on megatron-core (`train.objective=dpo`): pairs, reference log-probs, loss, metrics.

Data: packs from `llmctl data prefs`; in a pack, example 2k-1 is the chosen and 2k the
rejected sequence of pair k (`llmctl.data.prefs`). A sample is the SFT sample of the pack
(`llmctl.train.data.sft_sample`: block-diagonal causal attention, positions restarting per
example, loss mask on reply tokens only) plus `doc_ids` (the example each trained label
belongs to, 0 elsewhere) and `ref_logps` (the reference's sequence log-probability of each
example). The model runs as for SFT, `labels` given, so megatron-core returns the per-token
cross entropy (vocabulary-parallel at TP > 1); a sequence's log-probability is minus the sum
of its trained labels' cross entropy, so prompt tokens contribute nothing.

Loss, per pair, with the log-ratio margin `m = (pi_c - ref_c) - (pi_r - ref_r)` (sequence
log-probs of the chosen/rejected reply under the policy and the reference):

- sigmoid: `-(1 - eps) log sigmoid(beta m) - eps log sigmoid(-beta m)` (eps =
  `train.dpo.label_smoothing`, conservative DPO; eps = 0 is DPO);
- ipo: `(m_c / n_c - m_r / n_r - 1 / (2 beta))^2` with the log-ratios divided by the reply
  lengths in tokens, as TRL's `loss_type="ipo"`.

The step's loss is the mean over all pairs of the step, whatever the micro-batching: the loss
function returns (sum over the micro-batch's pairs, number of pairs) to megatron-core's
`calculate_per_token_loss`, as SFT does with tokens (`llmctl.train.token_loss`). Rewards are
`beta * (pi - ref)`; metrics.jsonl gets `rewards_chosen`, `rewards_rejected`, `reward_margin`,
`reward_accuracy` (share of pairs with chosen reward > rejected reward) and `pairs` (in the
step), and the same with `val_` after a validation pass.

Reference (`train.dpo.reference=precomputed`): before step 1 the trainer's own model, which at
step 0 is the starting model (`checkpoint.init_from`), runs forward-only through the same
pipeline schedule over every pack of the train and validation splits, under
`DpoObjective.reference` (a context manager; `contextlib.nullcontext` here). The sequence
log-probs go to RUN_DIR/dpo_reference.npz, which a resumed run reads back (its model is no
longer the starting one). Memory: 4 bytes per sequence (8 per pair) on every rank, and no second
copy of the weights; compute: one forward pass over the packs, about a third of one training
pass over them. A run whose reference is its base model with adapters disabled (LoRA) sets
`DpoObjective.reference` to that context and `reference_is_start = False`, and can then
recompute the reference at any step.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llmctl.errors import UserError
from llmctl.run.dpo import REFERENCE_FILE
from llmctl.train.data import SftSamples, sft_sample

if TYPE_CHECKING:
    from llmctl.config.schema import DpoConfig, RootConfig

log = logging.getLogger("llmctl.train")

REPORT = ("loss_sum", "pairs", "chosen_reward_sum", "rejected_reward_sum", "correct")


class ReferenceTable:
    """Reference sequence log-probs, one row of `width` per pack, keyed by (prefix, pack)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: dict[tuple[str, int], np.ndarray] = {}

    def row(self, key: tuple[str, int]) -> np.ndarray:
        """The pack's row (zeros before the precomputed pass)."""
        found = self.rows.get(key)
        return found if found is not None else np.zeros(self.width, np.float32)

    def fingerprint(self, keys: list[tuple[str, int]]) -> str:
        """Digest of the data files a table covers (their .idx files)."""
        h = hashlib.sha256()
        for prefix in sorted({p for p, _ in keys}):
            h.update(prefix.encode())
            with open(prefix + ".idx", "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        return h.hexdigest()[:16]

    def save(self, path: Path, keys: list[tuple[str, int]]) -> None:
        """Write the rows of `keys` (temporary name, then renamed)."""
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                prefixes=np.asarray([p for p, _ in keys]),
                packs=np.asarray([j for _, j in keys], dtype=np.int64),
                logps=np.stack([self.rows[k] for k in keys]),
                fingerprint=np.asarray(self.fingerprint(keys)),
            )
        tmp.replace(path)

    def load(self, path: Path, keys: list[tuple[str, int]]) -> bool:
        """Read `path` if it covers `keys` of the same data files; False if not."""
        with np.load(path) as z:
            found = list(zip(z["prefixes"].tolist(), z["packs"].tolist(), strict=True))
            if str(z["fingerprint"]) != self.fingerprint(keys) or not set(keys) <= set(found):
                return False
            for key, row in zip(found, z["logps"], strict=True):
                self.rows[(str(key[0]), int(key[1]))] = row.astype(np.float32)
        return True


class DpoSamples(SftSamples):
    """`SftSamples` of pair packs; each sample also carries `doc_ids` and `ref_logps`."""

    def __init__(
        self, packs: list[tuple[Any, range]], num_samples: int, seed: int, table: ReferenceTable
    ) -> None:
        super().__init__(packs, num_samples, seed)
        self.table = table

    def item_sample(self, k: int) -> dict[str, Any]:
        """The sample of pack `self.items[k]`."""
        import torch

        ds, j = self.items[k]
        tokens, mask, docs = ds[j]
        out = sft_sample(tokens, mask, docs)
        label_docs = torch.from_numpy(np.asarray(docs[1:], dtype=np.int64))
        out["doc_ids"] = torch.where(out["loss_mask"] > 0, label_docs, 0)
        out["ref_logps"] = torch.from_numpy(self.table.row((ds.prefix, j)))
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self.items)
        return self.item_sample(int(self._order(i // n)[i % n]))

    def used_items(self) -> list[int]:
        """Indices into `items` of the packs the reference pass covers: all of the split's
        (not only those `num_samples` reaches, so a resumed run with more steps finds them)."""
        return list(range(len(self.items))) if self.num_samples else []


class _Listed:
    """Samples of chosen items of a `DpoSamples`, as a dataset for `MicroBatches`."""

    def __init__(self, samples: DpoSamples, items: list[int]) -> None:
        self.samples, self.items = samples, items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.samples.item_sample(self.items[i])


def build_pair_datasets(
    cfg: RootConfig, spec: Any, num_train_samples: int, num_valid_samples: int
) -> tuple[DpoSamples, DpoSamples]:
    """Train and validation `DpoSamples` (one shared reference table), split by data.split."""
    from llmctl.data.sft import PackedSft, sft_manifest
    from llmctl.train.data import _refuse_te_packing, split_range

    datasets = [PackedSft(p) for p in spec.prefixes]
    _refuse_te_packing(datasets)
    width = max(
        int((sft_manifest(p) or {})["counts"]["max_examples_per_pack"]) for p in spec.prefixes
    )
    table = ReferenceTable(max(width, 2))
    splits = [
        [(ds, range(*split_range(len(ds), cfg.data.split, part))) for ds in datasets]
        for part in (0, 1)
    ]
    seed = cfg.train.seed
    return (
        DpoSamples(splits[0], num_train_samples, seed, table),
        DpoSamples(splits[1], num_valid_samples, seed + 1, table),
    )


# ---------------------------------------------------------------- loss


def sequence_logps(doc_ids: Any, output_tensor: Any, width: int) -> tuple[Any, Any]:
    """(log-prob sum, trained-token count) per example of each pack, [batch, width]: minus the
    cross entropy of the trained labels, summed per example (label doc id 0 = not trained)."""
    import torch

    logp = -output_tensor.float().view(doc_ids.shape)
    ids = doc_ids.long()
    trained = (ids > 0).to(logp.dtype)
    sums = torch.zeros(ids.shape[0], width + 1, dtype=logp.dtype, device=logp.device)
    counts = torch.zeros_like(sums)
    sums = sums.scatter_add(1, ids, logp * trained)
    counts = counts.scatter_add(1, ids, trained)
    return sums[:, 1:], counts[:, 1:]


def pair_losses(d: DpoConfig, policy: Any, ref: Any, counts: Any) -> tuple[Any, Any, Any, Any]:
    """(loss, chosen reward, rejected reward, valid) per pair slot, [batch, width // 2].

    `policy`, `ref`, `counts` are per-example [batch, width]; columns 2k, 2k+1 are pair k.
    """
    import torch
    import torch.nn.functional as F

    pc, pr = policy[:, 0::2], policy[:, 1::2]
    rc, rr = ref[:, 0::2].to(policy.dtype), ref[:, 1::2].to(policy.dtype)
    nc, nr = counts[:, 0::2], counts[:, 1::2]
    valid = (nc > 0) & (nr > 0)
    chosen_ratio, rejected_ratio = pc - rc, pr - rr
    margin = chosen_ratio - rejected_ratio
    if str(d.loss) == "ipo":
        delta = chosen_ratio / nc.clamp(min=1.0) - rejected_ratio / nr.clamp(min=1.0)
        loss = (delta - 1.0 / (2.0 * d.beta)) ** 2
    else:
        eps = float(d.label_smoothing)
        loss = -(1.0 - eps) * F.logsigmoid(d.beta * margin) - eps * F.logsigmoid(-d.beta * margin)
    zero = torch.zeros_like(loss)
    return (
        torch.where(valid, loss, zero),
        torch.where(valid, d.beta * chosen_ratio.detach(), zero),
        torch.where(valid, d.beta * rejected_ratio.detach(), zero),
        valid,
    )


def pair_loss_func(
    d: DpoConfig, doc_ids: Any, ref_logps: Any, output_tensor: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """(sum of the micro-batch's pair losses, its number of pairs, report) for megatron-core's
    per-token-loss schedule; the report is [loss sum, pairs, chosen reward sum, rejected
    reward sum, pairs with chosen reward > rejected reward]."""
    import torch

    policy, counts = sequence_logps(doc_ids, output_tensor, ref_logps.shape[1])
    loss, chosen, rejected, valid = pair_losses(d, policy, ref_logps, counts)
    total = loss.sum()
    pairs = valid.sum()
    correct = ((chosen > rejected) & valid).sum()
    report = torch.stack(
        [total.detach().clone(), pairs.to(total.dtype), chosen.sum(), rejected.sum(),
         correct.to(total.dtype)]
    )  # fmt: skip
    return total, pairs.to(torch.int), {"lm loss": report}


def _logps_func(doc_ids: Any, width: int, output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Forward-only loss function of the reference pass: reports the sequence log-probs."""
    import torch

    sums, _ = sequence_logps(doc_ids, output_tensor, width)
    zero = torch.zeros((), dtype=sums.dtype, device=sums.device)
    return zero, torch.ones((), dtype=torch.int, device=sums.device), {"logps": sums.detach()}


# ---------------------------------------------------------------- the objective


class DpoObjective:
    """The DPO parts of the trainer: forward step, reference pass, metrics.

    `reference` is the context under which the trainer's model computes the reference
    log-probs; `reference_is_start` says that this is only true of the starting weights (full
    fine-tuning: the pass must run before step 1, and a resumed run needs the saved table).
    """

    reference: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    reference_is_start: bool = True

    def __init__(self, cfg: RootConfig) -> None:
        self.cfg, self.d = cfg, cfg.train.dpo
        self.precomputing = False
        self.sums: dict[str, Any] = {}

    def forward_step(self, data_iterator: Any, model: Any, device: Any) -> tuple[Any, Any]:
        """megatron-core forward step of a pair micro-batch."""
        batch = next(data_iterator)
        b = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        output = model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"])
        width = int(b["ref_logps"].shape[1])
        if self.precomputing:
            return output, partial(_logps_func, b["doc_ids"], width)
        return output, partial(pair_loss_func, self.d, b["doc_ids"], b["ref_logps"])

    # -------------------------------------------------------- metrics

    def observe(self, losses_reduced: list[dict[str, Any]], device: Any, val: bool = False) -> None:
        """Add a forward-backward's reports to the train (reset each call) or val sums."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if losses_reduced:
            sums = torch.stack([x["lm loss"].float() for x in losses_reduced]).sum(dim=0)
            dist.all_reduce(sums, group=ps.get_data_parallel_group())
        else:
            sums = torch.zeros(len(REPORT), device=device)
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.all_reduce(sums, group=ps.get_pipeline_model_parallel_group())
        key = "val" if val else "train"
        if val and key in self.sums:
            self.sums[key] = self.sums[key] + sums.cpu()
        else:
            self.sums[key] = sums.cpu()

    def metrics(self) -> dict[str, float]:
        """The last step's reward metrics, and those of the validation pass since the last
        call (`val_` prefix)."""
        out: dict[str, float] = {}
        for key, prefix in (("train", ""), ("val", "val_")):
            s = self.sums.get(key)
            if s is None:
                continue
            n = max(float(s[1]), 1.0)
            out |= {
                f"{prefix}rewards_chosen": float(s[2]) / n,
                f"{prefix}rewards_rejected": float(s[3]) / n,
                f"{prefix}reward_margin": float(s[2] - s[3]) / n,
                f"{prefix}reward_accuracy": float(s[4]) / n,
            }
            out[f"{prefix}pairs"] = float(s[1])
        self.sums.pop("val", None)
        return out

    # -------------------------------------------------------- reference

    def prepare(self, trainer: Any, run_dir: Path) -> None:
        """Fill the reference table: from RUN_DIR/dpo_reference.npz when it matches the
        data, else by the forward-only pass (refused past step 0 when the reference is the
        starting model).

        Raises:
            UserError: a resumed run whose saved reference is missing or for other data.
        """
        train_ds = trainer.state.train_iters[0].dataset
        valid_ds = trainer.valid_ds
        table: ReferenceTable = train_ds.table
        used = [(train_ds, k) for k in train_ds.used_items()]
        if valid_ds is not None:
            used += [(valid_ds, k) for k in valid_ds.used_items()]
        keys = sorted({(s.items[k][0].prefix, s.items[k][1]) for s, k in used})
        path = Path(run_dir) / REFERENCE_FILE
        if path.is_file() and table.load(path, keys):
            log.info("DPO reference log-probs read from %s (%d packs)", path, len(keys))
            return
        if trainer.state.step > 0 and self.reference_is_start:
            raise UserError(
                f"train.objective=dpo: {path} is missing or was computed for other data; the "
                "reference is the starting model, which a resumed run no longer holds: start "
                "a new run"
            )
        first: dict[tuple[str, int], tuple[Any, int]] = {}
        for s, k in used:
            first.setdefault((s.items[k][0].prefix, s.items[k][1]), (s, k))
        rows = self._reference_pass(trainer, [first[key] for key in keys], table.width)
        for key, row in zip(keys, rows, strict=True):
            table.rows[key] = row
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_rank() == 0:
            table.save(path, keys)
        log.info("DPO reference log-probs of %d packs computed, saved to %s", len(keys), path)

    def _reference_pass(self, trainer: Any, todo: list[tuple[Any, int]], width: int) -> np.ndarray:
        """Sequence log-probs [len(todo), width] under `self.reference`, on every rank.

        Each DP rank runs its share of the packs through the pipeline schedule
        (forward-only); the last stage's TP rank 0 of each holds them, and one all-reduce over
        all ranks gives every rank the whole table.
        """
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from llmctl.train.data import MicroBatches

        dp, dp_rank = trainer.dp, trainer.dp_rank
        mine = list(range(dp_rank, len(todo), dp))
        mbs = trainer.layout.micro_batch_size
        full = torch.zeros(len(todo), width, dtype=torch.float64, device=trainer.device)
        by_samples: dict[int, tuple[Any, list[int], list[int]]] = {}
        for i in mine:
            s, k = todo[i]
            entry = by_samples.setdefault(id(s), (s, [], []))
            entry[1].append(k)
            entry[2].append(i)
        self.precomputing = True
        for m in trainer.model:
            m.eval()
        try:
            with self.reference(), torch.no_grad():
                for samples, items, rows in by_samples.values():
                    data = _Listed(samples, items)
                    iters = [MicroBatches(data, mbs, 0, 1) for _ in trainer.model]
                    out = get_forward_backward_func()(
                        forward_step_func=partial(self.forward_step, device=trainer.device),
                        data_iterator=iters if len(iters) > 1 else iters[0],
                        model=trainer.model if len(trainer.model) > 1 else trainer.model[0],
                        num_microbatches=math.ceil(len(items) / mbs),
                        seq_length=self.cfg.model.seq_length,
                        micro_batch_size=mbs,
                        forward_only=True,
                    )
                    last = ps.is_pipeline_last_stage(ignore_virtual=True)
                    if last and ps.get_tensor_model_parallel_rank() == 0:
                        got = torch.cat([x["logps"].double() for x in out])[: len(items)]
                        full[torch.as_tensor(rows, device=full.device)] = got
        finally:
            self.precomputing = False
            for m in trainer.model:
                m.train()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(full)
        return full.float().cpu().numpy()


def objective_for(cfg: RootConfig) -> DpoObjective | None:
    """The DPO objective of a run, or None (`train.objective=lm`)."""
    return DpoObjective(cfg) if str(cfg.train.objective) == "dpo" else None
