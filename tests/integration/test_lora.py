"""LoRA (`train.peft=lora`) on megatron-core against PEFT, on one CPU rank (fp32).

One LoRA run (a Mistral-shaped model made here with transformers, imported with
`checkpoint.init_from=hf:DIR`, rank 4 on all seven targets, 4 steps at lr 1e-2, checkpoints at
steps 2 and 4) feeds every test:

- only adapters train: every base tensor after 4 steps is bit-identical to step 0's; every
  adapter B moved; the optimizer holds exactly the adapter parameters;
- oracle PEFT: transformers + PEFT with `llmctl export hf RUN --adapter` give megatron-core's
  logits of the adapted model within 1e-4; `llmctl export hf RUN` (merged) equals PEFT's
  `merge_and_unload` of that adapter within 1e-6 (weights and logits);
- resume: the run resumed from step 2 gives steps 3-4 losses and adapters bit for bit;
- the adapter checkpoint's size as a fraction of a full-parameter run's checkpoint;
- an adapter for another base: refused in one line (resume and export, rc 2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hf_support import hf_logits, imported_with_data, load_safetensors_dir, make_model
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.slow]
pytest.importorskip("peft")
STEPS = 4
TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


class _Watch:
    """The run's checkpointer, plus a snapshot of every parameter at load and at close."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}
        self.optimizer_numel = 0

    @staticmethod
    def _params(state: Any) -> dict[str, Any]:
        return {
            n: (p.detach().clone(), p.requires_grad)
            for c in state.model
            for n, p in c.named_parameters()
        }

    def load(self, state: Any) -> None:
        self.inner.load(state)
        self.before = self._params(state)

    def after_step(self, state: Any) -> None:
        self.inner.after_step(state)

    def close(self, state: Any) -> None:
        self.inner.close(state)
        self.after = self._params(state)
        groups = state.optimizer.optimizer.param_groups
        self.optimizer_numel = sum(p.numel() for g in groups for p in g["params"])


def _overrides(prefix: Path, run_dir: Path, src: Path, *extra: str) -> list[str]:
    return [
        f"data.prefixes=[{prefix}]", f"train.run_dir={run_dir}", f"train.train_iters={STEPS}",
        "train.global_batch_size=2", "parallel.micro_batch_size=1", "train.eval_interval=0",
        "train.lr=1e-2", "train.min_lr=1e-2", "train.warmup_iters=0", "checkpoint.interval=2",
        f"checkpoint.init_from=hf:{src}", *extra,
    ]  # fmt: skip


def _train(recipe: Path, overrides: list[str], watch: bool = False) -> tuple[Any, Any]:
    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir
    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import make_checkpointer

    cfg = compose(str(recipe), overrides)
    run_dir = create_run_dir(cfg, None)
    ckpt = _Watch(make_checkpointer(cfg, run_dir, None)) if watch else None
    return run_in_process(cfg, run_dir, checkpointer=ckpt), ckpt


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lora")
    src, prefix = imported_with_data(tmp, "mistral")
    recipe = tmp / "mc" / "recipe.yaml"
    run_dir = tmp / "run"
    lora = ["train.peft=lora", "train.lora.rank=4", "train.lora.alpha=8",
            f"train.lora.target_modules={TARGETS}"]  # fmt: skip
    result, watch = _train(recipe, _overrides(prefix, run_dir, src, *lora), watch=True)
    return {"tmp": tmp, "src": src, "prefix": prefix, "recipe": recipe, "run": run_dir,
            "result": result, "watch": watch, "lora": lora}  # fmt: skip


def test_only_adapters_change(lora_run: dict[str, Any]) -> None:
    import torch

    watch = lora_run["watch"]
    base = {n: v for n, v in watch.before.items() if "_lora." not in n}
    adapters = {n: v for n, v in watch.before.items() if "_lora." in n}
    assert base and len(adapters) == 2 * 7 * 4  # A and B, 7 targets, 4 layers
    for name, (tensor, grad) in base.items():
        assert not grad, f"{name} requires grad"
        assert torch.equal(tensor, watch.after[name][0]), f"base tensor {name} changed"
    moved = [n for n in adapters if not torch.equal(adapters[n][0], watch.after[n][0])]
    assert all(adapters[n][1] for n in adapters)
    assert sorted(n for n in adapters if n.endswith("lora_B")) == sorted(
        n for n in moved if n.endswith("lora_B")
    )
    assert watch.optimizer_numel == sum(v[0].numel() for v in adapters.values())
    print(f"measured: {len(base)} base tensors bit-identical after {STEPS} steps; "
          f"{len(moved)}/{len(adapters)} adapter tensors moved; optimizer holds "
          f"{watch.optimizer_numel} params (adapters only)")  # fmt: skip


def _export(run: Path, out: Path, *flags: str) -> None:
    res = CliRunner().invoke(app, ["export", "hf", str(run), "--out", str(out), *flags])
    assert res.exit_code == 0, res.output


def test_peft_logits_and_merge_match(lora_run: dict[str, Any]) -> None:
    import torch
    from lora_logits import logits
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from llmctl.hf.convert import one_rank_megatron

    tmp, src = lora_run["tmp"], lora_run["src"]
    _export(lora_run["run"], tmp / "adapter", "--adapter")
    _export(lora_run["run"], tmp / "merged")
    cfg = json.loads((tmp / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(src.resolve()) and cfg["r"] == 4
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(5))
    base = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(base, str(tmp / "adapter")).eval()
    with torch.no_grad():
        theirs = peft(input_ids=ids).logits.float()
    with one_rank_megatron() as layout:
        ours = logits(lora_run["run"], ids, layout).float()
    moved = float((theirs - hf_logits(src, ids)).abs().max())
    diff = float((ours - theirs).abs().max())
    print(f"measured: PEFT vs megatron-core adapted logits at TP=1: {diff:.3g} (adapters move "
          f"the logits by {moved:.3g})")  # fmt: skip
    assert moved > 1e-2
    assert diff < 1e-4
    with torch.no_grad():
        merged = peft.merge_and_unload()
        want = merged(input_ids=ids).logits.float()
    ours_merged = hf_logits(tmp / "merged", ids)
    theirs_sd = {k: v for k, v in merged.state_dict().items()}
    written = load_safetensors_dir(tmp / "merged")
    wdiff = max(float((theirs_sd[k] - written[k]).abs().max()) for k in theirs_sd)
    ldiff = float((ours_merged - want).abs().max())
    print(f"measured: merged export vs PEFT merge_and_unload: weights {wdiff:.3g}, "
          f"logits {ldiff:.3g}")  # fmt: skip
    assert set(theirs_sd) == set(written)
    assert wdiff < 1e-6 and ldiff < 1e-6


def test_resume_is_bit_for_bit(lora_run: dict[str, Any]) -> None:
    import torch

    from llmctl.hf.export import load_model_tensors
    from llmctl.run import ckpt_store as store

    tmp, run = lora_run["tmp"], lora_run["run"]
    resumed = tmp / "resumed"
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns(store.iter_name(STEPS)))
    over = _overrides(lora_run["prefix"], resumed, lora_run["src"], *lora_run["lora"])
    result, _ = _train(lora_run["recipe"], over)
    assert result.steps == STEPS
    assert result.losses == lora_run["result"].losses[2:]
    a = load_model_tensors(run / "checkpoints" / store.iter_name(STEPS))
    b = load_model_tensors(resumed / "checkpoints" / store.iter_name(STEPS))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_adapter_checkpoint_is_a_fraction_of_a_full_one(lora_run: dict[str, Any]) -> None:
    from llmctl.run import ckpt_store as store

    tmp = lora_run["tmp"]
    full = tmp / "full"
    over = _overrides(lora_run["prefix"], full, lora_run["src"])
    over = [o for o in over if not o.startswith("train.train_iters")] + ["train.train_iters=2"]
    _train(lora_run["recipe"], over)

    def size(path: Path) -> int:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    s_lora = size(lora_run["run"] / "checkpoints" / store.iter_name(2))
    s_full = size(full / "checkpoints" / store.iter_name(2))
    n_full = sum(v.numel() for v in _model_tensors(full).values())
    n_lora = sum(v.numel() for v in _model_tensors(lora_run["run"]).values())
    print(f"measured: adapter checkpoint {s_lora} B = {s_lora / s_full:.3f} of the full "
          f"checkpoint's {s_full} B ({n_lora} adapter vs {n_full} model parameters, "
          f"{n_lora / n_full:.3f})")  # fmt: skip
    assert n_lora < n_full / 4 and s_lora < s_full / 2


def _model_tensors(run: Path) -> dict[str, Any]:
    from llmctl.hf.export import load_model_tensors
    from llmctl.run import ckpt_store as store

    return load_model_tensors(run / "checkpoints" / store.iter_name(2))


def test_adapter_for_another_base_is_refused(lora_run: dict[str, Any]) -> None:
    from llmctl.errors import UserError

    tmp = lora_run["tmp"]
    other = make_model("mistral", tmp / "other-hf", seed=1)
    moved = tmp / "other-run"
    shutil.copytree(lora_run["run"], moved)
    over = _overrides(lora_run["prefix"], moved, other, *lora_run["lora"])
    over = [o for o in over if not o.startswith("train.train_iters")] + ["train.train_iters=6"]
    with pytest.raises(UserError, match="its LoRA adapters belong to base") as e:
        _train(lora_run["recipe"], over)
    assert "\n" not in e.value.message
    # the base recorded by the run (its init_from/ import) replaced: export refuses, rc 2
    res = CliRunner().invoke(app, ["import", "hf", str(other), "--out", str(tmp / "other-mc")])
    assert res.exit_code == 0, res.output
    shutil.rmtree(moved / "init_from")
    shutil.copytree(tmp / "other-mc", moved / "init_from")
    import subprocess
    import sys

    argv = [sys.executable, "-m", "llmctl", "export", "hf", str(moved), "--adapter", "--out"]
    proc = subprocess.run([*argv, str(tmp / "refused")], capture_output=True, text=True)
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    print(f"measured: rc {proc.returncode}: {lines}")
    assert proc.returncode == 2 and len(lines) == 1 and "(another base)" in lines[0]
    res = CliRunner().invoke(app, ["export", "hf", str(moved), "--out", str(tmp / "refused2")])
    assert res.exit_code == 2 and "another base" in " ".join(res.output.split())
    assert not (tmp / "refused").exists() and not (tmp / "refused2").exists()
