"""The divergence policy of the training loop: checked between backward and the optimizer step.

`DivergenceGuard.step` replaces `optimizer.step()` in `Trainer.train_step`. It runs megatron's
own pieces of a step in megatron's order (`prepare_grads`, which also finds fp16 overflows and
skips those as megatron does; `get_grad_norm`; clipping by that norm; `step_with_ready_grads`)
with the verdict of `llmctl.run.divergence.DivergenceRule` in between, so a divergent step is
refused before any parameter or optimizer state changes. The norm is the one megatron's step
computes when clipping, so a clipped run does no extra work; with `clip_grad=0` it is computed
for the check (one pass over the gradients and one all-reduce of a scalar).

Policies (`train.health.on_divergence`):

- `stop`: waits for a checkpoint save in flight (of an earlier, applied step), records the
  event, logs one line and ends with `EXIT_DIVERGED` (4). The divergent step is never saved.
- `skip`: the step is not applied; the step counter, the data position and the LR schedule
  move on as if it had been (the batch is dropped).
- `rollback`: waits for a save in flight, reloads the newest valid committed checkpoint at a
  step K <= N-2 (the weights saved at N-1 are the very ones that diverged at N; those of K
  gave an accepted loss at K+1), then puts the run at the divergent step N with the data
  position after it: the batches of steps K+1..N (the offending window) are skipped and the
  LR schedule is at step N, so the run still ends at `train.train_iters` within the data it
  was built for. Without such a checkpoint it stops instead.

After `train.health.max_divergences` skips or rollbacks in one process, the next divergent
step stops the run (a run that keeps diverging is not worth the hardware). Each event is a
record in RUN_DIR/health.jsonl, an `events` entry on that step's metrics.jsonl record, and one
log line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value as _v
from llmctl.run.divergence import DivergenceRule
from llmctl.run.health import EXIT_DIVERGED

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train.health")
OnEvent = Callable[[dict[str, Any], bool], None]


class DivergenceGuard:
    """The guarded optimizer step of one rank (see the module docstring).

    Args:
        cfg: The resolved config (`train.health`, `train.global_batch_size`).
        run_dir: The run directory.
        checkpointer: The loop's checkpointer (rollback loads from it; stop waits for it).
        on_event: Called with each event and whether the run stops after it.
    """

    def __init__(
        self,
        cfg: RootConfig,
        run_dir: Path,
        checkpointer: Any,
        on_event: OnEvent,
        watchdog: Any = None,
    ) -> None:
        h = cfg.train.health
        self.policy = str(_v(h.on_divergence))
        self.max_events = h.max_divergences
        self.rule = DivergenceRule(h.spike_factor, h.spike_window)
        self.gbs = cfg.train.global_batch_size
        self.run_dir, self.ckpt, self.on_event = run_dir, checkpointer, on_event
        self.watchdog = watchdog  # its `untimed()` covers the reload of a rollback
        self.handled = 0

    def step(self, optimizer: Any, loss: float, state: Any) -> tuple[bool, float | None]:
        """Check, then step. Returns (advance the LR schedule, grad norm).

        Raises:
            TrainingStopped: `EXIT_DIVERGED` when the policy (or its limit) stops the run.
        """
        if optimizer.prepare_grads():  # fp16 overflow: megatron's own skip (loss scale drops)
            return False, None
        grad_norm = _grad_norm(optimizer)
        reason = self.rule.verdict(loss, grad_norm)
        if reason is None:
            _clip(optimizer, grad_norm)
            ok = bool(optimizer.step_with_ready_grads())
            self.rule.accept(loss)
            return ok, grad_norm
        self._diverged(reason, loss, grad_norm, state)
        return True, grad_norm

    def _diverged(self, reason: str, loss: float, grad_norm: float | None, state: Any) -> None:
        step = state.step + 1  # train_step counts it after this returns
        policy = self.policy
        if self.handled >= self.max_events:
            policy = "stop"
            reason += f"; {self.handled} divergent steps handled (train.health.max_divergences)"
        event: dict[str, Any] = {
            "event": "divergence", "step": step, "reason": reason, "policy": policy,
            "loss": _finite(loss), "grad_norm": _finite(grad_norm),
        }  # fmt: skip
        if policy == "rollback":
            policy = self._roll_back(state, event)
        if policy == "stop":
            self._stop(step, reason, event)
        self.handled += 1
        if policy == "skip":
            event["line"] = f"divergence at step {step} ({reason}): batch skipped, not applied"
        log.warning("%s", event["line"])
        self.on_event(event, False)

    def _stop(self, step: int, reason: str, event: dict[str, Any]) -> None:
        from llmctl.train.checkpoint import TrainingStopped

        wait = getattr(self.ckpt, "wait", None)
        if wait is not None:
            wait()  # a save of an earlier, applied step: let it commit
        newest = getattr(self.ckpt, "last_saved", None)
        line = (
            f"divergence at step {step} ({reason}): stopped (train.health.on_divergence="
            f"{self.policy}); newest checkpoint: "
            f"{'none' if newest is None else f'step {newest}'}, without the divergent step"
        )
        event.update(policy="stop", line=line)
        log.error("%s", line)
        self.on_event(event, True)
        raise TrainingStopped(EXIT_DIVERGED, line)

    def _roll_back(self, state: Any, event: dict[str, Any]) -> str:
        """Reload the newest trusted checkpoint, then skip past the divergent step's data.

        Trusted: committed at step <= N-2. The weights saved at step N-1 are the ones whose
        loss (or gradient) at step N diverged, so they are not rolled back to.

        Returns the policy applied: "rollback", or "stop" without such a checkpoint.
        """
        step, consumed = state.step + 1, state.consumed_samples + self.gbs
        back = self._load_trusted(state, step - 2)
        if back is None:
            event["reason"] += f"; no committed checkpoint at step <= {step - 2} to roll back to"
            return "stop"
        state.scheduler.step(increment=step - 1 - back)  # train_step steps it once more
        start = state.consumed_samples
        state.set_position(step, consumed)  # data iterators past the window
        state.step, state.consumed_samples = step - 1, consumed - self.gbs  # train_step adds 1
        event.update(rolled_back_to=back, skipped_samples=[start, consumed])
        event["line"] = (
            f"divergence at step {step} ({event['reason']}): rolled back to the checkpoint of "
            f"step {back}; samples {start}..{consumed} (steps {back + 1}..{step}) skipped; "
            f"continuing at step {step + 1}"
        )
        return "rollback"

    def _load_trusted(self, state: Any, newest: int) -> int | None:
        """Load the newest valid committed checkpoint at step <= `newest`; its step, or None."""
        from llmctl.run import ckpt_store as store

        ckpt = self.ckpt
        if not hasattr(ckpt, "load_from"):  # checkpointing off
            return None
        untimed = self.watchdog.untimed() if self.watchdog is not None else nullcontext()
        with untimed:  # waiting for a save, validating and loading: not a hang
            ckpt.wait()  # a save in flight commits (or fails) first
            steps = ckpt._bcast(store.committed_steps(ckpt.root) if ckpt.rank == 0 else None)
            found = ckpt._newest_valid([s for s in steps if s <= newest])
            if found is None:
                return None
            # megatron's scheduler load_state_dict *adds* the saved step count to its own
            # (right for the fresh scheduler of a resume): start from 0 as a fresh one would.
            state.scheduler.num_steps = 0
            ckpt.load_from(state, ckpt.root / store.iter_name(found))
        return int(state.step)


def _finite(x: float | None) -> float | None:
    """JSON has no NaN/inf: those become null (the reason says which it was)."""
    return x if x is not None and math.isfinite(x) else None


def _grad_norm(optimizer: Any) -> float | None:
    norm = optimizer.get_grad_norm()
    return None if norm is None else float(norm)


def _clip(optimizer: Any, grad_norm: float | None) -> None:
    """Clip each (chained) optimizer's gradients by the total norm, as megatron's step does."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    if grad_norm is None:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(opt, "is_stub_optimizer", False) or opt.config.clip_grad <= 0.0:
            continue
        params = opt.get_parameters()
        if params:
            clip_grad_by_total_norm_fp32(
                params,
                max_norm=opt.config.clip_grad,
                total_norm=grad_norm,
                use_decoupled_grad=getattr(
                    opt.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False
                ),
            )


def make_guard(
    cfg: RootConfig, run_dir: Path, checkpointer: Any, on_event: OnEvent, watchdog: Any = None
) -> DivergenceGuard | None:
    """The guard of this run; None when `train.health.on_divergence=off`."""
    if str(_v(cfg.train.health.on_divergence)) == "off":
        return None
    return DivergenceGuard(cfg, run_dir, checkpointer, on_event, watchdog)
