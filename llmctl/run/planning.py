"""Build the planner's frozen inputs from a composed `RootConfig`, and run `plan` on a recipe.

This is the only bridge between `llmctl.config` (mutable, Hydra) and `llmctl.plan` (pure,
frozen). It also reads the `perf.json` records that `--calibrate RUN_DIR` points at.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from llmctl.config.schema import (
    Activation,
    ModelConfig,
    ModelFamily,
    Norm,
    PositionEmbedding,
    RootConfig,
)
from llmctl.errors import UserError
from llmctl.plan import (
    AttentionKernel,
    ClusterSpec,
    Constraints,
    Efficiency,
    Layout,
    ModelSpec,
    PerfRecord,
    PlanInput,
    PlanResult,
    Recompute,
    RunSpec,
    SearchSpec,
    Sharding,
    calibrate,
    evaluate,
    plan,
)
from llmctl.plan.calibrate import MeasuredRun, calibrate_time
from llmctl.plan.layout import LAYOUT_DICT_KEYS, StageSplit, layout_from_dict
from llmctl.plan.perf import loss_layers_moved
from llmctl.plan.stack import FsdpImpl, Stack, apply_stack
from llmctl.run.layout import (
    fixed_sequence_parallel,
    layout_from_record,
    with_cpu_ranks_for_layout,
)


def model_spec(cfg: RootConfig) -> ModelSpec:
    """Frozen model shape of `cfg.model` (`model_shape`)."""
    return model_shape(cfg.model)


def model_shape(m: ModelConfig) -> ModelSpec:
    """Frozen model shape; GPT-family models train with dropout (Korthikanti et al. 2022)."""
    learned = m.position_embedding == PositionEmbedding.learned_absolute
    return ModelSpec(
        name=m.name,
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels or m.hidden_size // m.num_attention_heads,
        vocab_size=m.vocab_size,
        seq_length=m.seq_length,
        gated_mlp=m.activation == Activation.swiglu,
        layernorm_bias=m.normalization == Norm.layernorm,
        add_bias_linear=m.add_bias_linear,
        learned_positions=(m.max_position_embeddings or m.seq_length) if learned else 0,
        tied_embeddings=m.tied_embeddings,
        dropout=m.family == ModelFamily.gpt,
        num_experts=m.num_experts,
        moe_router_topk=m.moe_router_topk if m.num_experts else 1,
        moe_ffn_hidden_size=(m.moe_ffn_hidden_size or 0) if m.num_experts else 0,
    )


def efficiency(values: dict[str, float], source: str) -> Efficiency:
    """Calibration knobs from a cluster's `efficiency` mapping (absent keys: defaults).

    Raises:
        UserError: an unknown key or an out-of-range value, naming `source`.
    """
    known = {f.name for f in fields(Efficiency)}
    for key in values:
        if key not in known:
            raise UserError(
                f"{source}: efficiency.{key} is not a known knob; expected one of "
                f"{', '.join(sorted(known))}"
            )
    try:
        return Efficiency(**{k: float(v) for k, v in values.items()})
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from None


def cluster_spec(cfg: RootConfig) -> ClusterSpec:
    """Frozen hardware description."""
    c = cfg.cluster
    return ClusterSpec(
        name=c.name,
        num_nodes=c.num_nodes,
        gpus_per_node=c.gpus_per_node,
        hbm_gib=c.hbm_gib,
        hbm_bandwidth_gb_s=c.hbm_bandwidth_gb_s,
        peak_tflops=dict(c.peak_tflops),
        achievable_fraction=dict(c.achievable_fraction),
        nvlink_domain_size=c.nvlink_domain_size,
        nvlink_bandwidth_gb_s=c.nvlink_bandwidth_gb_s,
        internode_bandwidth_gb_s=c.internode_bandwidth_gb_s,
        internode_latency_us=c.internode_latency_us,
        cuda_context_gib=c.cuda_context_gib,
        nccl_buffer_gib=c.nccl_buffer_gib,
        fragmentation_fraction=c.fragmentation_fraction,
        sm_count=c.sm_count,
        efficiency=efficiency(dict(c.efficiency), f"cluster {c.name}"),
        nodes_per_switch=c.nodes_per_switch,
    )


def attention_kernel(cfg: RootConfig) -> AttentionKernel:
    """The attention kernel megatron-core + Transformer Engine would run: `auto` is flash
    attention on CUDA with 16-bit or FP8 compute and the unfused (local) kernel otherwise."""
    asked = str(cfg.precision.attention_backend)
    if asked != "auto":
        return AttentionKernel(asked)
    flash = cfg.cluster.device == "cuda" and str(cfg.precision.dtype) != "fp32"
    return AttentionKernel.flash if flash else AttentionKernel.unfused


def run_spec(cfg: RootConfig) -> RunSpec:
    """Batch and numerics, with megatron-core's defaults for unset gradient dtypes.

    Gradients: fp32 main gradients reduced in fp32 unless set (Megatron-LM turns
    `grad_reduce_in_fp32` on for bf16; Megatron-Bridge's `bf16_mixed` and FP8 mixed recipes
    too). FP8 recipes keep FP8 weights and gather them in FP8 unless `fp8_param_gather` is
    false (Bridge's `bf16_with_fp8_*_mixed` set it).
    """
    p = cfg.precision
    dtype = str(p.dtype)
    fp8 = dtype == "fp8"
    # megatron-core's grad buffer: fp32 with grad_reduce_in_fp32, else the parameter dtype.
    asked = str(p.grad_dtype) if p.grad_dtype is not None else "fp32"
    grad = "fp32" if asked == "fp32" else str(p.params_dtype)
    return RunSpec(
        global_batch_size=cfg.train.global_batch_size,
        compute_dtype=dtype,
        params_dtype=str(p.params_dtype),
        grad_dtype=grad,
        grad_reduce_dtype=str(p.grad_reduce_dtype) if p.grad_reduce_dtype is not None else grad,
        fp8=fp8,
        fp8_param_gather=fp8 and _fp8_param_gather(cfg),
        attention=attention_kernel(cfg),
        fused_kernels=cfg.cluster.device == "cuda",  # CPU runs megatron-core's local spec
        train_tokens=cfg.train.train_tokens,
        freeze_embeddings=cfg.train.freeze_embeddings,
        **_lora_fields(cfg),
        moe_a2a_overlap=cfg.parallel.moe_a2a_overlap and cfg.model.num_experts > 0,
        fsdp_wrapper=cfg.plan.fsdp == FsdpImpl.torch_fsdp2,
    )


def _fp8_param_gather(cfg: RootConfig) -> bool:
    """`precision.fp8_param_gather`, or when unset the stack's default (on with Transformer
    Engine's FP8 weights, off on the PyTorch-native stack: torchao's FP8 all-gather is opt-in)."""
    asked = cfg.precision.fp8_param_gather
    return bool(asked) if asked is not None else cfg.plan.stack == Stack.megatron_te


def plan_input(cfg: RootConfig) -> PlanInput:
    """Everything the planner needs, frozen, priced for `plan.stack` (`plan.stack`)."""
    p, s = cfg.parallel, cfg.plan
    constraints = Constraints(
        tp=p.tp,
        pp=p.pp,
        vpp=p.vpp,
        cp=p.cp,
        ep=p.ep,
        etp=p.etp,
        dp=p.dp,
        micro_batch_size=p.micro_batch_size,
        sequence_parallel=fixed_sequence_parallel(cfg, p.tp),
        recompute=Recompute(p.recompute) if p.recompute is not None else None,
        optimizer_sharding=(
            Sharding(p.optimizer_sharding) if p.optimizer_sharding is not None else None
        ),
        allow_tp_outside_nvlink=p.allow_tp_outside_nvlink,
    )
    search = SearchSpec(
        top_k=s.top_k,
        headroom_fraction=s.headroom_fraction,
        micro_batch_sizes=tuple(s.micro_batch_sizes),
        allow_uneven_pp=s.allow_uneven_pp,
        balance_loss=s.balance_loss,
    )
    inp = PlanInput(
        model=model_spec(cfg),
        cluster=cluster_spec(cfg),
        run=run_spec(cfg),
        constraints=constraints,
        search=search,
    )
    return apply_stack(inp, Stack(cfg.plan.stack))


def loss_balanced_stage_layers(cfg: RootConfig, layout: Layout) -> list[int] | None:
    """Transformer layers per virtual pipeline stage under `plan.balance_loss`, in model order
    (megatron's `pipeline_model_parallel_layout`: entry `v * pp + r` is rank r's chunk v);
    None when off or PP=1.

    Why: the planner's loss-balanced step time (`perf.loss_layers_moved`) moves k layers, the
    output layer and loss's time in layers, off the last pipeline rank to the others, one each
    from the first rank on; `llmctl train` builds exactly these per-rank totals, so the run is
    the layout the plan timed. With VPP the k layers leave the last rank's chunks from its last
    one (the loss's) backwards, keeping a layer in each, and land on the other ranks' chunks in
    turn (Megatron-Bridge's Llama-3 70B layout: the last virtual stage holds one layer).

    Args:
        cfg: The resolved config.
        layout: The run's layout (`run.layout.resolve_layout`).

    Raises:
        UserError: a layer count that PP x VPP does not divide.
    """
    pp, vpp = layout.pp, layout.vpp
    if not cfg.plan.balance_loss or pp == 1:
        return None
    n, stages = cfg.model.num_layers, pp * vpp
    if n % stages:
        what = f"parallel.pp={pp}" + (f" x parallel.vpp={vpp}" if vpp > 1 else "")
        raise UserError(f"plan.balance_loss=true needs model.num_layers={n} divisible by {what}")
    inp = plan_input(cfg)
    lay = Layout(  # what the planner timed: its ETP and sharding do not move layers
        tp=layout.tp,
        pp=pp,
        vpp=vpp,
        cp=layout.cp,
        ep=layout.ep,
        dp=layout.dp,
        micro_batch_size=layout.micro_batch_size,
        sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute,
        loss_balanced=True,
    )
    split = StageSplit(first=n // pp, middle=n // pp, last=n // pp, method="even")
    k = loss_layers_moved(inp.model, inp.cluster, inp.run, lay, split)
    return _move_layers(n // stages, pp, vpp, k)


def _move_layers(per_chunk: int, pp: int, vpp: int, k: int) -> list[int]:
    """Chunk sizes (model order) after moving k layers off the last rank, see the caller."""
    layers = [per_chunk] * (pp * vpp)
    k = min(k, vpp * (per_chunk - 1))
    for i in range(k):
        chunk = vpp - 1 - i // (per_chunk - 1)
        layers[chunk * pp + pp - 1] -= 1
        rank, v = i % (pp - 1), (i // (pp - 1)) % vpp
        layers[v * pp + rank] += 1
    return layers


def _perf_json(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "perf.json"
    if not path.is_file():
        raise UserError(f"no perf.json in {run_dir} (written by `llmctl train` at the end)")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(
            f"{path}: line 1: expected JSON written by `llmctl train` ({exc})"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: line 1: expected a JSON object written by `llmctl train`")
    return data


def _run_layout(data: dict[str, Any], path: Path) -> Layout:
    try:
        return layout_from_record(data["layout"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: malformed layout ({exc})") from None


def _quiet_step_s(run_dir: Path) -> float | None:
    """The 20th percentile of the steady-state, load-corrected step times in
    RUN_DIR/metrics.jsonl (`step_time_s * cpu_share` where recorded: the waits for a CPU
    taken out): a step time robust to other processes sharing the machine (perf.json keeps
    the median wall time)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    times = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            value = record.get("step_time_s")
        except (ValueError, AttributeError):
            continue
        share = record.get("cpu_share")
        if isinstance(share, int | float) and 0 < share <= 1 and isinstance(value, int | float):
            value *= share
        if isinstance(value, int | float) and value > 0:
            times.append(float(value))
    from llmctl.run.metrics import quiet_step_s

    return quiet_step_s(times)


def load_measured_run(run_dir: str | Path) -> MeasuredRun:
    """A finished run as calibration data: RUN_DIR/config.yaml (the planner input) and
    RUN_DIR/perf.json (the layout that ran and the measured steady-state step time)."""
    from llmctl.config.compose import load_resolved

    root = Path(run_dir)
    data = _perf_json(root)
    path = root / "perf.json"
    if not (root / "config.yaml").is_file():
        raise UserError(f"no config.yaml in {run_dir} (not a run directory)")
    cfg = load_resolved(root / "config.yaml")
    try:
        step = _quiet_step_s(root) or float(data["measured_step_s"])
        return MeasuredRun(input=plan_input(cfg), layout=_run_layout(data, path), step_s=step)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: malformed perf record ({exc})") from None


def load_perf_record(run_dir: str | Path) -> PerfRecord | None:
    """Predicted and measured memory of RUN_DIR/perf.json (None when not both recorded)."""
    path = Path(run_dir) / "perf.json"
    data = _perf_json(Path(run_dir))
    if data.get("predicted_step_s") is None or data.get("predicted_peak_mem_gib") is None:
        return None
    try:
        return PerfRecord(
            cluster=str(data["cluster"]),
            dtype=str(data["dtype"]),
            predicted_step_s=float(data["predicted_step_s"]),
            measured_step_s=float(data["measured_step_s"]),
            predicted_peak_mem_gib=float(data["predicted_peak_mem_gib"]),
            measured_peak_mem_gib=(
                float(data["measured_peak_mem_gib"])
                if data.get("measured_peak_mem_gib") is not None
                else None
            ),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: malformed perf record ({exc})") from None


def calibrated_cluster(cluster: ClusterSpec, run_dirs: list[str]) -> ClusterSpec:
    """`cluster` with its step-time knobs fitted to the measured runs in `run_dirs` and its
    fragmentation fraction to their measured memory.

    Raises:
        UserError: a run directory without perf.json/config.yaml, or a run on another
            cluster (its name is in the message).
    """
    runs = [load_measured_run(d) for d in run_dirs]
    for d, run in zip(run_dirs, runs, strict=True):
        if run.input.cluster.name != cluster.name:
            raise UserError(
                f"{d}: ran on cluster {run.input.cluster.name}, not {cluster.name}; calibrate "
                "with runs of the cluster being planned"
            )
    records = [r for r in (load_perf_record(d) for d in run_dirs) if r is not None]
    return calibrate(calibrate_time(cluster, runs), records)


CALIBRATED_HEADER = "# Written by `llmctl plan --calibrate`"


def cluster_yaml(cfg: RootConfig, cluster: ClusterSpec, run_dirs: list[str]) -> str:
    """The cluster description of `cfg` with the calibrated knobs, as YAML."""
    import yaml
    from omegaconf import OmegaConf

    body = dict(OmegaConf.to_container(OmegaConf.structured(cfg.cluster), enum_to_str=True))  # type: ignore[arg-type]
    body["achievable_fraction"] = {k: round(v, 6) for k, v in cluster.achievable_fraction.items()}
    eff = cluster.efficiency
    body["efficiency"] = {f.name: round(getattr(eff, f.name), 6) for f in fields(Efficiency)}
    body["fragmentation_fraction"] = round(cluster.fragmentation_fraction, 6)
    head = [f"{CALIBRATED_HEADER} from {len(run_dirs)} run(s):"]
    head += [f"#   {Path(d).resolve()}" for d in run_dirs]
    head += ["# Plan or train with it: --cluster-file THIS_FILE"]
    return "\n".join(head) + "\n" + str(yaml.safe_dump(body, sort_keys=False))


def check_calibrated_out(path: str | Path, force: bool = False) -> None:
    """`plan --calibrate --out PATH` may write only where nothing is, or (`force`) over its own
    earlier file.

    Raises:
        UserError: PATH is a folder, lies under a file or a read-only folder, exists without
            `force`, or was not written by `llmctl plan --calibrate`.
    """
    from llmctl.staging import check_file_out

    what = "plan --calibrate --out writes a cluster YAML file"
    check_file_out(Path(path), force, CALIBRATED_HEADER, what)


def save_calibrated(path: str | Path, text: str, force: bool = False) -> Path:
    """Write a calibrated cluster file whole or not at all (a hidden temporary file renamed
    into place); refuse to overwrite a file llmctl did not write.

    Raises:
        UserError: see `check_calibrated_out`; or the file cannot be written.
    """
    from llmctl.staging import write_text_whole

    check_calibrated_out(path, force)
    write_text_whole(Path(path), text)
    return Path(path)


def plan_config(
    cfg: RootConfig,
    calibrate_dirs: list[str] | None = None,
    save_to: str | None = None,
    force: bool = False,
) -> PlanResult:
    """Plan a composed configuration, after calibrating the cluster on measured runs (and
    writing the calibrated cluster description to `save_to`; `force` replaces llmctl's own
    earlier file there).

    Raises:
        UserError: an impossible explicit layout (the message names the failing product),
            an unreadable run directory, a cluster without a peak for the compute dtype, or a
            `save_to` that cannot be written (checked before any work).
    """
    if calibrate_dirs and save_to:
        check_calibrated_out(save_to, force)
    cfg = with_cpu_ranks_for_layout(cfg)  # on CPU, ranks follow the layout, as `llmctl train`
    inp = plan_input(cfg)
    if calibrate_dirs:
        inp = replace(inp, cluster=calibrated_cluster(inp.cluster, calibrate_dirs))
        if save_to:
            save_calibrated(save_to, cluster_yaml(cfg, inp.cluster, calibrate_dirs), force)
    try:
        result = plan(inp)
        published = cfg.plan.published_layout
        if published:
            layout = _user_layout(dict(published), "plan.published_layout")
            if in_search(inp, layout):
                result = replace(result, reference=evaluate(inp, layout))
        return result
    except ValueError as exc:
        raise UserError(str(exc)) from None


def in_search(inp: PlanInput, layout: Layout) -> bool:
    """Whether the search of `inp` could have listed `layout`: the same world size and every
    fixed dimension equal (the published layout of a recipe is compared only then; ranked
    against another world or fixed dimensions it was a meaningless '#1' or '#1672')."""
    if layout.tp * layout.pp * layout.cp * layout.dp != inp.cluster.world_size:
        return False
    c = inp.constraints
    fixed = {
        "tp": c.tp, "pp": c.pp, "vpp": c.vpp, "cp": c.cp, "ep": c.ep, "dp": c.dp,
        "micro_batch_size": c.micro_batch_size, "sequence_parallel": c.sequence_parallel,
        "recompute": c.recompute, "optimizer_sharding": c.optimizer_sharding,
    }  # fmt: skip
    return all(want is None or getattr(layout, name) == want for name, want in fixed.items())


def _user_layout(data: dict[str, Any], source: str) -> Layout:
    """A Layout from a mapping a user wrote with Layout.as_dict keys (missing keys: defaults).

    Raises:
        UserError: an unknown key or a bad value, naming `source`.
    """
    try:
        return layout_from_dict(data)
    except KeyError as exc:
        raise UserError(
            f"{source}.{exc.args[0]}: not a layout field; expected one of "
            f"{sorted(LAYOUT_DICT_KEYS)}"
        ) from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{source}: {exc}") from None


def _lora_fields(cfg: RootConfig) -> dict[str, Any]:
    """`RunSpec` fields of `train.peft=lora` (llmctl.plan.lora); none without LoRA."""
    if str(getattr(cfg.train.peft, "value", cfg.train.peft)) != "lora":
        return {}
    lora = cfg.train.lora
    return {"lora_rank": lora.rank, "lora_targets": tuple(lora.target_modules)}


def dpo_plan(cfg: RootConfig, result: PlanResult) -> dict[str, Any] | None:
    """The DPO terms (`llmctl.plan.dpo`) of the chosen layout, from the packs' manifests;
    None unless `train.objective=dpo` with `llmctl data prefs` packs and a layout."""
    from llmctl.data.sft import sft_manifest
    from llmctl.plan.dpo import DpoSpec, dpo_terms

    manifests = [sft_manifest(p) for p in cfg.data.prefixes]
    chosen = result.best or result.closest
    if str(cfg.train.objective) != "dpo" or not manifests or chosen is None:
        return None
    if any(m is None or m.get("kind") != "prefs-packed" for m in manifests):
        return None
    counts = [m["counts"] for m in manifests if m is not None]
    spec = DpoSpec(
        num_pairs=sum(int(c["num_pairs"]) - int(c["num_dropped"]) for c in counts),
        num_packs=sum(int(c["num_packs"]) for c in counts),
        sequences_per_pack=max(int(c["max_examples_per_pack"]) for c in counts),
        global_batch_size=cfg.train.global_batch_size,
    )
    terms = dpo_terms(
        spec,
        compute_s=chosen.time.compute_s,
        overhead_s=chosen.time.overhead_s,
        weights_bytes=chosen.memory.weights_gib * 2**30,
    )
    return {"reference": str(cfg.train.dpo.reference), **asdict(terms)}
