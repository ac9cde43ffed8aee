"""RNG state of one rank, captured into and restored from a checkpoint (plain JSON).

Python's, numpy's, torch's CPU (and CUDA) generators and megatron's model-parallel RNG tracker
(its per-region states: TP-sharded dropout draws differ per TP rank). A resume on the same
layout restores every rank's states, so the next step draws exactly what an uninterrupted run
would have: that is what makes resume bit-exact.
"""

from __future__ import annotations

import base64
from typing import Any


def _b64(t: Any) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    """This rank's RNG states (python, numpy, torch CPU/CUDA, megatron's tracker) as JSON."""
    import random

    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": _b64(torch.get_rng_state()),
        "tracker": {
            k: _b64(v) for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()
        },
    }
    if torch.cuda.is_available():
        out["cuda"] = _b64(torch.cuda.get_rng_state())
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    import random

    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))
    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.set_states({k: _unb64(v) for k, v in state["tracker"].items()})
