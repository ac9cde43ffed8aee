"""`llmctl plan --nodes N --from-checkpoint CKPT`: the best layout on N nodes that a
checkpoint can be resharded to (`llmctl.plan.reshard`), from the checkpoint alone.

Why from the checkpoint: its train_state.json carries the resolved config of the run that
saved it (`config_yaml`: model, cluster kind, batch, numerics) and the layout it was saved
at (the optimizer sharding its state is in). The layout dimensions the run set are freed,
since megatron-core's distributed checkpoint reshards across them on load; flags and
`key=value` overrides given now constrain them again. Torch-free; reads nothing but the
checkpoint's train_state.json (and, for a run directory, its checkpoints' commit markers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError
from llmctl.plan import PlanResult, Sharding

#: Layout fields of `parallel` a checkpoint does not fix (megatron-core reshards them).
FREED = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size", "sequence_parallel",
         "recompute")  # fmt: skip


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """What a checkpoint fixes: where it is, its step, its saved layout and config."""

    path: Path
    step: int | None
    layout: dict[str, Any]
    config: dict[str, Any]

    @property
    def sharding(self) -> Sharding:
        """The optimizer sharding its state is in."""
        return Sharding(str(self.layout.get("optimizer_sharding", "none")))


def checkpoint_facts(location: str | Path) -> CheckpointFacts:
    """Read a checkpoint directory (with train_state.json) or a run directory (its newest
    committed checkpoint).

    Raises:
        UserError: no checkpoint there, or a train_state.json without the saved config.
    """
    import yaml

    from llmctl.run.ckpt_store import TRAIN_STATE, committed_steps, iter_name

    path = Path(location)
    if not (path / TRAIN_STATE).is_file() and (path / "checkpoints").is_dir():
        steps = committed_steps(path / "checkpoints")
        if not steps:
            raise UserError(f"{location}: run directory without a committed checkpoint")
        path = path / "checkpoints" / iter_name(steps[-1])
    state_file = path / TRAIN_STATE
    if not state_file.is_file():
        raise UserError(
            f"{location}: not a checkpoint (no {TRAIN_STATE}) nor a run directory with one"
        )
    try:
        state = json.loads(state_file.read_text())
        config = yaml.safe_load(state["config_yaml"])
        layout = dict(state["layout"])
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise UserError(
            f"{state_file}: expected train_state written by llmctl train ({exc})"
        ) from None
    if not isinstance(config, dict):
        raise UserError(f"{state_file}: config_yaml is not a mapping")
    step = state.get("step")
    return CheckpointFacts(
        path=path, step=int(step) if step is not None else None, layout=layout, config=config
    )


def plan_from_checkpoint(
    location: str | Path, num_nodes: int, overrides: list[str] | None = None
) -> tuple[PlanResult, CheckpointFacts]:
    """The ranked layouts on `num_nodes` nodes that the checkpoint at `location` loads into.

    `overrides` are `key=value` settings (layout flags included, e.g. `parallel.tp=8`) applied
    to the checkpoint's config after its layout fields are freed.

    Raises:
        UserError: an unreadable checkpoint, a bad override, or impossible fixed dimensions.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from llmctl.config import from_dict
    from llmctl.config.validate import validate
    from llmctl.plan.reshard import reshard_plan
    from llmctl.run.ckpt_compat import fsdp_fixed_dims
    from llmctl.run.planning import plan_input

    facts = checkpoint_facts(location)
    body = dict(facts.config)
    body["parallel"] = {**dict(body.get("parallel") or {}), **dict.fromkeys(FREED)}
    pinned: dict[str, Any] = {}
    if facts.sharding == Sharding.full:  # FSDP checkpoints reshard only as measured
        pinned = {d: facts.layout[d] for d in fsdp_fixed_dims() if d in facts.layout}
        body["parallel"].update(pinned)
    body["cluster"] = {**dict(body.get("cluster") or {}), "num_nodes": num_nodes}
    try:
        merged = OmegaConf.merge(OmegaConf.create(body), OmegaConf.from_dotlist(overrides or []))
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise UserError(f"--from-checkpoint override: {exc}") from None
    cfg = from_dict(data, source=str(facts.path))  # type: ignore[arg-type]
    for dim, saved in pinned.items():
        if getattr(cfg.parallel, dim) != saved:
            raise UserError(
                f"--from-checkpoint: parallel.{dim}={getattr(cfg.parallel, dim)}, but this FSDP "
                f"checkpoint resumes only with {dim}={saved} (docs/train.md)"
            )
    validate(cfg)
    inp = plan_input(cfg)
    try:
        return reshard_plan(inp, num_nodes, facts.sharding, inp.constraints), facts
    except ValueError as exc:
        raise UserError(str(exc)) from None
