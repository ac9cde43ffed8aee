"""DPO before launch (torch-free): the data must be preference pairs, and only DPO trains on
them (`llmctl data prefs` packs hold rejected replies, which next-token training would learn)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

PAIRS_KIND = "prefs-packed"
REFERENCE_FILE = "dpo_reference.npz"
"""RUN_DIR file of the precomputed reference log-probabilities (llmctl.train.dpo)."""


def check_pairs(cfg: RootConfig, prefixes: list[str]) -> bool:
    """Whether the prefixes are DPO pairs; refuses a mix, pairs without DPO, DPO without pairs.

    Raises:
        UserError: naming the prefix and what was expected.
    """
    from llmctl.data.manifest import manifest_path, read_json

    kinds = {p: (read_json(manifest_path(p)) or {}).get("kind") for p in prefixes}
    pairs = [p for p, k in kinds.items() if k == PAIRS_KIND]
    dpo = cfg.train.objective == "dpo"
    if dpo and len(pairs) != len(prefixes):
        other = next(p for p in prefixes if p not in pairs)
        raise UserError(
            f"train.objective=dpo but data prefix {other} is not preference pairs (no "
            f"{PAIRS_KIND} manifest); make them with `llmctl data prefs`"
        )
    if pairs and not dpo:
        raise UserError(
            f"data prefix {pairs[0]} holds preference pairs (`llmctl data prefs`): train them "
            "with train.objective=dpo (next-token training would learn the rejected replies)"
        )
    return bool(pairs)
