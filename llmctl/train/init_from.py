"""`checkpoint.init_from`: start a run from another model's weights (weights only, step 0).

Continued pretraining and fine-tuning start from a model, not from a run: the optimizer state,
the LR schedule, the data position and the RNG of the source are not wanted. The source is

- an `llmctl import hf` output directory, or any run directory (its `latest` checkpoint),
- a checkpoint directory `.../checkpoints/iter_N`, or
- `hf:DIR`, a Hugging Face model directory, imported first into `RUN_DIR/init_from/` (once;
  a resumed run reuses it).

The checkpoint is validated like a resume (manifest, sizes, CRC32s), its model fields are
compared with the run's, and only the model's sharded tensors are requested from
`dist_checkpointing.load`, which reads them at this run's TP/PP/VPP layout. A resumed run (a
committed checkpoint of its own exists) ignores `init_from`: the loop calls this only at step 0.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.run.init_from import HF_PREFIX, IMPORT_SUBDIR, check_same_model, checkpoint_dir

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train")
_DIST_VARS = frozenset(
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
     "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
)  # fmt: skip


def _import_hf(src: Path, out: Path, tp: int) -> Path:
    """Import `src` in a fresh process (its own one-rank group): `python -m llmctl.hf.importer`.

    Raises:
        UserError: The importer's own one-line error.
    """
    if (out / "import.json").is_file():
        return out
    argv = [sys.executable, "-m", "llmctl.hf.importer", str(src), str(out), "--tp", str(tp)]
    # not the rank's torchrun variables: with RANK/WORLD_SIZE the child would join (and wait
    # for) a process group of WORLD_SIZE ranks instead of making its own one-rank group
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise UserError(lines[-1].removeprefix("llmctl: ") if lines else f"import of {src} failed")
    return Path(done.stdout.strip().splitlines()[-1])


def resolve_source(spec: str, run_dir: Path, tp: int = 1) -> Path:
    """The checkpoint directory `checkpoint.init_from` names (importing `hf:DIR` first).

    Call on rank 0 only: an `hf:` source is imported in a spawned child process.
    """
    if not spec.startswith(HF_PREFIX):
        return checkpoint_dir(Path(spec).expanduser())
    src = Path(spec[len(HF_PREFIX) :]).expanduser()
    return checkpoint_dir(_import_hf(src, run_dir / IMPORT_SUBDIR, tp))


def load_model_weights(chunks: list[Any], ckpt_dir: Path) -> None:
    """Load only the model tensors of a checkpoint into `chunks` (any layout; dtypes cast)."""
    from megatron.core import dist_checkpointing

    from llmctl.run.ckpt_safe import load_metadata, weights_only_loads

    load_metadata(ckpt_dir / ".metadata")  # rejects a .metadata naming unsafe globals
    keys = ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]
    sd = {k: c.sharded_state_dict() for k, c in zip(keys, chunks, strict=True)}
    with weights_only_loads(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        loaded = dist_checkpointing.load(sd, str(ckpt_dir))
    for key, chunk in zip(keys, chunks, strict=True):
        chunk.load_state_dict(loaded[key])


def _unwrap(module: Any) -> Any:
    while hasattr(module, "module"):
        module = module.module
    return module


def _agree(rank: int, value: str | None, error: str | None) -> str:
    """Rank 0's (path or error) on every rank; an error becomes a UserError everywhere."""
    import torch.distributed as dist

    box = [(value, error)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    value, error = box[0]
    if error is not None:
        raise UserError(error)
    assert value is not None
    return value


def init_weights(state: Any, cfg: RootConfig, run_dir: Path) -> Path:
    """Load `cfg.checkpoint.init_from` into a fresh run's model (weights only).

    The optimizer's fp32 main copies (bf16 params) are refreshed from the loaded weights.

    Returns:
        The checkpoint directory that was loaded.
    """
    import torch.distributed as dist

    from llmctl.run import ckpt_store as store

    rank = dist.get_rank() if dist.is_initialized() else 0
    value = error = None
    if rank == 0:
        try:
            ckpt = resolve_source(str(cfg.checkpoint.init_from), Path(run_dir), state.layout.tp)
            check = store.validate(ckpt, full=True)
            if not check.ok:
                raise UserError(f"checkpoint.init_from: {ckpt} is not usable: {check.reason}")
            saved = json.loads((ckpt / store.TRAIN_STATE).read_text())
            check_same_model(saved, cfg.model, ckpt)
            value = str(ckpt)
        except UserError as e:
            error = e.message
    ckpt = Path(_agree(rank, value, error))
    try:
        load_model_weights([_unwrap(m) for m in state.model], ckpt)
    except Exception as e:  # e.g. a bias or expert tensor this run's model does not have
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"checkpoint.init_from: cannot load {ckpt} into this model: {first}") from e
    if hasattr(state.optimizer, "reload_model_params"):
        state.optimizer.reload_model_params()
    if rank == 0:
        log.info("initialised weights from %s (step 0, fresh optimizer)", ckpt)
    return ckpt
