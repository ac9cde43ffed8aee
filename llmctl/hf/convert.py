"""The heavy half of `llmctl import hf`: stream Hugging Face tensors into megatron-core and save.

Imports torch, safetensors and megatron-core; `llmctl.hf.importer` calls it only after every
check has passed.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.hf import mapping as M

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.hf.importer import ImportPlan
    from llmctl.plan import Layout

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def one_rank_layout() -> Layout:
    """TP=PP=DP=1 on one rank."""
    from llmctl.plan import Layout, Sharding

    return Layout(optimizer_sharding=Sharding.none)


@contextlib.contextmanager
def one_rank_megatron() -> Iterator[Any]:
    """megatron's parallel state for one CPU rank (a process group is created if none runs)."""
    import torch.distributed as dist

    from llmctl.train import cpu_compat, parallel

    created, had_compat = not dist.is_initialized(), cpu_compat.is_installed()
    if not created and dist.get_world_size() != 1:
        raise RuntimeError("import hf runs in a process of its own (one rank)")
    parallel.init_distributed()
    layout = one_rank_layout()
    parallel.init_model_parallel(layout, 1, False)
    try:
        yield layout
    finally:
        parallel.teardown(destroy_process_group=created)
        if not had_compat:
            cpu_compat.uninstall()


def empty_model(cfg: RootConfig, layout: Layout, dtype: str) -> Any:
    """GPTModel at TP=1 with uninitialised weights in `dtype` (they are all overwritten)."""
    import torch

    from llmctl.run.precision import recipe_for
    from llmctl.train import model as model_mod

    tc = model_mod.transformer_config(
        cfg.model, layout, cfg.precision, recipe_for(cfg.precision), on_gpu=False
    )
    tc.perform_initialization = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        [model] = model_mod.build_model_chunks(cfg.model, tc, layout, use_te=False, seed=1)
    return model.to(getattr(torch, _TORCH_DTYPES[dtype]))


_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


class _Reader:
    """Reads tensors by name from a directory's safetensors files with plain `readinto`.

    Why not safetensors' `safe_open`: it memory-maps the file, and every page of the source
    it touches stays mapped (and counted in RSS) until the handle closes, which made the peak
    of an import the checkpoint plus the whole source (measured 2.1x the model size). A read
    into a fresh tensor holds exactly that tensor, freed once it is copied into the model.
    """

    def __init__(self, src: Path, files: dict[str, str]) -> None:
        self.src, self.files = src, files
        self.headers: dict[str, tuple[int, dict[str, Any]]] = {}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.headers.clear()

    def _header(self, fname: str) -> tuple[int, dict[str, Any]]:
        if fname not in self.headers:
            import json
            import struct

            with open(self.src / fname, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                self.headers[fname] = (8 + size, json.loads(f.read(size)))
        return self.headers[fname]

    def get(self, name: str) -> Any:
        import torch

        fname = self.files[name]
        base, header = self._header(fname)
        entry = header[name]
        start, end = entry["data_offsets"]
        raw = torch.empty(end - start, dtype=torch.uint8)
        with open(self.src / fname, "rb") as f:
            f.seek(base + start)
            if f.readinto(raw.numpy().data) != end - start:
                raise UserError(f"{self.src / fname}: tensor {name} is truncated")
        dtype = getattr(torch, _ST_DTYPES[entry["dtype"]])
        return raw.view(dtype).reshape(entry["shape"])


def _copy_in(param: Any, tensor: Any, name: str, hf_names: tuple[str, ...]) -> None:
    """Copy a converted tensor into its parameter; vocab rows past the source are zeroed."""
    import torch

    rows = tensor.shape[0]
    if (
        tensor.dim() == 2
        and rows < param.shape[0]
        and name in (M.EMBEDDING.megatron, M.OUTPUT.megatron)
    ):
        with torch.no_grad():
            param[rows:].zero_()
        param = param[:rows]
    if tuple(param.shape) != tuple(tensor.shape):
        raise UserError(
            f"{', '.join(hf_names)}: shape {tuple(tensor.shape)} does not fit {name} "
            f"{tuple(param.shape)} of the model config.json describes"
        )
    with torch.no_grad():
        param.copy_(tensor)


def stream_weights(
    plan: ImportPlan, model: Any, cfg: RootConfig, on_progress: Callable[[int, int], None] | None
) -> None:
    """Fill every parameter from the source, one layer's tensors in memory at a time."""
    params = dict(model.named_parameters())
    filled: set[str] = set()
    heads = M.heads_of(cfg.model)
    num_layers = cfg.model.num_layers
    by_layer: list[list[Any]] = [[] for _ in range(num_layers + 1)]
    for name, hf_names, op in plan.mapping:
        layer = int(name.split(".")[2]) if name.startswith("decoder.layers.") else num_layers
        by_layer[layer].append((name, hf_names, op))
    with _Reader(plan.src, plan.files) as reader:
        for done, rows in enumerate([by_layer[-1], *by_layer[:-1]]):
            for name, hf_names, op in rows:
                if name not in params:
                    raise UserError(
                        f"megatron-core's GPTModel has no parameter {name} (for {hf_names[0]})"
                    )
                tensor = M.to_megatron(M.Op(op), [reader.get(h) for h in hf_names], heads)
                _copy_in(params[name], tensor, name, hf_names)
                filled.add(name)
            if on_progress is not None and done:
                on_progress(done, num_layers)
    unfilled = sorted(set(params) - filled)
    if unfilled:
        raise UserError(f"no source tensor for megatron parameter {unfilled[0]}")  # fmt: skip


def save_checkpoint(
    model: Any, cfg: RootConfig, layout: Layout, ckpt_root: Path, source: str
) -> Path:
    """Save `model` as llmctl's committed checkpoint `iter_0000000` (manifest, latest)."""
    from megatron.core import dist_checkpointing

    from llmctl.config import cfg_to_yaml
    from llmctl.run import ckpt_store as store

    # getattr: checkpoint.py may re-export these from its ckpt_* submodules (no __all__)
    from llmctl.run.ckpt_compat import ARCH_FIELDS as arch_fields
    from llmctl.run.layout import layout_record
    from llmctl.train import checkpoint as ck  # its public API (names re-exported there)

    capture_rng, versions = getattr(ck, "capture_rng"), getattr(ck, "versions")  # noqa: B009

    tmp = store.staging_dir(ckpt_root, 0)
    tmp.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist_checkpointing.save({"model": model.sharded_state_dict()}, str(tmp))
    header = {
        "step": 0, "consumed_samples": 0, "world_size": 1, "layout": layout_record(layout, 1),
        "model": {k: _value(getattr(cfg.model, k, None)) for k in arch_fields},
        "versions": versions(), "backend": "torch_dist", "created_unix": time.time(),
        "imported_from": source, "weights_only": True, "config_yaml": cfg_to_yaml(cfg),
    }  # fmt: skip
    store.write_json_durable(tmp / store.RNG_DIR / "rank_0.json", capture_rng())
    store.write_json_durable(
        tmp / store.TRAIN_STATE, header | {"scheduler": None, "data": [], "plan": {}}
    )
    store.write_rank_marker(tmp, 0, store.rank_files(tmp, 0))
    return store.commit(ckpt_root, tmp, 0, store.build_manifest(tmp, 1, header))


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def convert(
    plan: ImportPlan,
    cfg: RootConfig,
    ckpt_root: Path,
    on_progress: Callable[[int, int], None] | None,
) -> tuple[int, int]:
    """Build, fill and save; returns (RSS before the model was allocated, parameter count)."""
    from llmctl.memory import rss_bytes

    with one_rank_megatron() as layout:
        base = rss_bytes()
        model = empty_model(cfg, layout, plan.dtype)
        stream_weights(plan, model, cfg, on_progress)
        save_checkpoint(model, cfg, layout, ckpt_root, str(plan.src))
        num = sum(int(p.numel()) for p in model.parameters())
        del model
    return base, num
