"""`checkpoint.init_from`, checked before any rank starts: the source holds this run's model.

The ranks load it (`llmctl.train.init_from`); the sources are described in `llmctl.run.init_from`.
"""

from __future__ import annotations

from pathlib import Path

from llmctl.config.schema import RootConfig
from llmctl.run.ckpt_compat import ARCH_FIELDS
from llmctl.run.init_from import HF_PREFIX, check_checkpoint_source, check_same_model


def check_init_from(cfg: RootConfig, tp: int = 1) -> str | None:
    """Before any rank starts (and under `--dry-run`): the source exists and holds this run's
    model, compared field by field as the ranks compare it after loading.

    A checkpoint source is read from its `train_state.json`; an `hf:DIR` source from what its
    import would record (config.json and safetensors headers through `plan_import`, with the
    vocabulary padded for this run's TP as the ranks' import pads it). Nothing is written.

    Returns:
        The checkpoint directory or Hugging Face directory checked; None without `init_from`.

    Raises:
        UserError: A source that is missing or unreadable, or the first model field that
            differs (`model.<field>`, the source's value and this run's).
    """
    spec = cfg.checkpoint.init_from
    if not spec:
        return None
    if not spec.startswith(HF_PREFIX):
        return check_checkpoint_source(spec, cfg.model)
    from llmctl.hf.importer import plan_import

    src = Path(spec[len(HF_PREFIX) :]).expanduser()
    plan = plan_import(src, tp=tp)
    check_same_model({"model": {k: plan.model.get(k) for k in ARCH_FIELDS}}, cfg.model, src)
    return str(src)
