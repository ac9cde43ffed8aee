"""CPU compatibility layer: lets unmodified megatron-core train on a machine without CUDA.

Why this exists: megatron-core is written for GPUs and hard-codes CUDA in places no config flag
reaches (measured on megatron-core 0.16.1 with a CPU build of torch 2.13):

1. `model_parallel_cuda_manual_seed` asserts CUDA, and megatron's RNG tracker sets CUDA generator
   states through `torch.cuda._lazy_call`, which on a CPU torch queues silently and never runs.
   We install a tracker (a subclass of megatron's, so `isinstance` checks and
   `get_all_rng_states` keep working) whose states are CPU generator states.
2. The forward pass (RoPE `inv_freq`, attention's global memory buffer) and DDP grad buffers
   allocate on `torch.cuda.current_device()`: it returns the CPU device here.
3. Streams, events, `synchronize`, `empty_cache` and `Tensor.cuda()` (DDP overlap, timers,
   pipeline p2p, async checkpointing) become null objects / no-ops.
4. The optimizer and grad clipping create tensors with a literal `device='cuda'` and compare
   `Tensor.type()` with `'torch.cuda.FloatTensor'`. A `TorchFunctionMode` maps a CUDA `device=`
   argument (and `.to('cuda')`) to CPU and reports CPU floating tensors' `type()` as
   `torch.cuda.*`.
5. megatron-core's torch FSDP2 wrapper asks for a "cuda" device mesh: it gets a "cpu" one.

The layer is installed only when `torch.cuda.is_available()` is False (`install()` refuses
otherwise), it touches only torch-level objects, and megatron's source stays untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_INSTALLED = False

#: `TransformerConfig` flags that keep megatron-core on its local (unfused) CPU kernels.
CPU_KERNEL_FLAGS: dict[str, bool] = {
    "use_cpu_initialization": True,
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "masked_softmax_fusion": False,
    "bias_dropout_fusion": False,
    "apply_rope_fusion": False,
    "persist_layer_norm": False,
}
_MODE: Any = None
_SAVED: dict[tuple[Any, str], Any] = {}
_CUDA_PATCHES = [
    "current_device",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "stream",
    "synchronize",
    "empty_cache",
    "set_device",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "reset_peak_memory_stats",
]


class _NullStream:
    """Stands in for `torch.cuda.Stream`: every operation is immediate on CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def wait_event(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _NullEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self) -> _NullStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _NullEvent:
    """Stands in for `torch.cuda.Event`; `elapsed_time` uses the wall clock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        self._t = 0.0

    def record(self, stream: Any = None) -> None:
        import time

        del stream
        self._t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        del stream

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _NullEvent) -> float:
        return (end._t - self._t) * 1000.0


def _is_cuda_device(device: Any) -> bool:
    import torch

    if device is None:
        return False
    if isinstance(device, int):
        return True  # a bare ordinal means a CUDA device
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


def _to_cpu_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Rewrite `.to('cuda')` / `.to(0)` positional device arguments to CPU."""
    import torch

    if func is torch.Tensor.to and len(args) >= 2 and _is_cuda_device(args[1]):
        return (args[0], "cpu", *args[2:])
    del kwargs
    return args


def _make_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    tensor_type = torch.Tensor.type
    tensor_cuda = torch.Tensor.cuda

    class CudaToCpuMode(TorchFunctionMode):
        """Maps CUDA device requests to CPU and reports CPU float tensors as CUDA types."""

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if "device" in kwargs and _is_cuda_device(kwargs["device"]):
                kwargs = {**kwargs, "device": "cpu"}
            if func is tensor_cuda:
                return args[0]
            if func is tensor_type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name.replace("torch.", "torch.cuda.", 1) if "cuda" not in name else name
            args = _to_cpu_args(func, args, kwargs)
            return func(*args, **kwargs)

    return CudaToCpuMode()


def _patch_torch_cuda() -> None:
    import torch

    for name in _CUDA_PATCHES:
        _SAVED[(torch.cuda, name)] = getattr(torch.cuda, name)
    _SAVED[(torch.Tensor, "record_stream")] = torch.Tensor.record_stream
    cpu = torch.device("cpu")
    replacements: dict[str, Any] = {
        "current_device": lambda: cpu,
        "Stream": _NullStream,
        "Event": _NullEvent,
        "current_stream": lambda *a, **k: _NullStream(),
        "default_stream": lambda *a, **k: _NullStream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "synchronize": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "set_device": lambda *a, **k: None,
        "memory_allocated": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0,
        "memory_reserved": lambda *a, **k: 0,
        "reset_peak_memory_stats": lambda *a, **k: None,
    }
    for name, value in replacements.items():
        setattr(torch.cuda, name, value)
    setattr(torch.Tensor, "record_stream", lambda self, *a, **k: None)  # noqa: B010


def _patch_checkpoint_rng() -> None:
    """Activation recompute (megatron's `CheckpointFunction`) saves and restores the CUDA
    RNG state around each recomputed layer; on CPU that state is the CPU generator's."""
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    for name in ("_get_cuda_rng_state", "_set_cuda_rng_state"):
        _SAVED[(mrandom, name)] = getattr(mrandom, name)
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)


def _patch_device_mesh() -> None:
    """megatron-core's torch FSDP2 wrapper builds its mesh with
    `DeviceMesh.from_group(group, "cuda")`; on CPU the mesh's device type is "cpu" (gloo)."""
    import inspect

    from torch.distributed.device_mesh import DeviceMesh

    original = inspect.getattr_static(DeviceMesh, "from_group")
    _SAVED[(DeviceMesh, "from_group")] = original
    from_group = original.__func__

    def cpu_from_group(group: Any, device_type: str, *args: Any, **kwargs: Any) -> Any:
        if device_type.startswith("cuda"):
            device_type = "cpu"
        return from_group(group, device_type, *args, **kwargs)

    DeviceMesh.from_group = staticmethod(cpu_from_group)  # type: ignore[method-assign]


def _cpu_rng_tracker_class() -> type:
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):  # type: ignore[misc]
        """Megatron's RNG tracker with CPU generator states in place of CUDA ones."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def seed_model_parallel_rng(seed: int, tp_rank: int, ep_rank: int = 0, etp_rank: int = 0) -> None:
    """CPU replacement for megatron's `model_parallel_cuda_manual_seed` (same seed offsets).

    Args:
        seed: Base seed of the run.
        tp_rank: Tensor-parallel rank of this process.
        ep_rank: Expert-parallel rank.
        etp_rank: Expert-tensor-parallel rank.
    """
    from megatron.core.tensor_parallel import random as mrandom

    tracker = _cpu_rng_tracker_class()()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def install() -> None:
    """Install the layer in this process (idempotent). Refuses when CUDA is available.

    Raises:
        RuntimeError: If a CUDA device is present: GPU runs must use real CUDA paths.
    """
    global _INSTALLED, _MODE
    import torch

    if _INSTALLED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("cpu_compat.install() called on a machine with CUDA; refusing")
    import warnings

    # megatron-core announces at import that it falls back from TE/Apex: expected on CPU.
    warnings.filterwarnings(
        "ignore", message=r".*(Apex|Transformer Engine).*", category=UserWarning
    )
    _patch_torch_cuda()
    _patch_checkpoint_rng()
    _patch_device_mesh()
    _MODE = _make_mode()
    _MODE.__enter__()
    _INSTALLED = True


def uninstall() -> None:
    """Undo `install()` (used after in-process runs so other code sees plain torch again)."""
    global _INSTALLED, _MODE
    if not _INSTALLED:
        return
    _MODE.__exit__(None, None, None)
    for (owner, name), value in _SAVED.items():
        setattr(owner, name, value)
    _SAVED.clear()
    _MODE, _INSTALLED = None, False


def is_installed() -> bool:
    """Whether `install()` has run in this process."""
    return _INSTALLED
