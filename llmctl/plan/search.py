"""Enumerate every valid layout, evaluate memory and step time, rank what fits.

Why exhaustive: the space is small once divisibility prunes it (thousands of layouts for a
405B model on 1024 GPUs), each evaluation is a few dozen float operations, and an exhaustive
search is the only way to be sure the ranking is not an artefact of a heuristic. Work is
linear in the number of candidates: structural checks are done once per (TP, CP, PP, VPP)
family and the inner loop over micro-batch, recompute and sharding only evaluates formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from llmctl.plan.layout import Layout, StageSplit, check_world, split_layers
from llmctl.plan.memory import MemoryBreakdown, peak_gib_options, peak_memory
from llmctl.plan.moe import layout_refusal
from llmctl.plan.perf import StepTime, Throughput, step_s_options, step_time, throughput
from llmctl.plan.specs import Constraints, ModelSpec, PlanInput, Recompute, Sharding


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """One layout with its worst-rank memory, step time and rates."""

    layout: Layout
    split: StageSplit
    memory: MemoryBreakdown
    time: StepTime
    rates: Throughput
    fits: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A family of layouts dropped for one reason."""

    reason: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """Ranked fitting layouts, every candidate's (step s, peak GiB, fits), rejections."""

    input: PlanInput
    ranked: tuple[Evaluation, ...]
    points: tuple[tuple[float, float, bool, int, int], ...]
    rejections: tuple[Rejection, ...]
    num_candidates: int
    usable_gib: float
    closest: Evaluation | None
    suggestions: tuple[str, ...]
    reference: Evaluation | None = None

    @property
    def reference_rank(self) -> int | None:
        """Rank of `reference` among the fitting layouts (None if absent or not fitting)."""
        ref = self.reference
        if ref is None or not ref.fits:
            return None
        return 1 + sum(1 for p in self.points if p[2] and p[0] < ref.rates.step_s * (1 - 1e-9))

    @property
    def best(self) -> Evaluation | None:
        """The fastest fitting layout, if any."""
        return self.ranked[0] if self.ranked else None


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def usable_gib(inp: PlanInput) -> float:
    """HBM a layout may use: capacity minus the headroom fraction."""
    return inp.cluster.hbm_gib * (1.0 - inp.search.headroom_fraction)


def evaluate(inp: PlanInput, layout: Layout) -> Evaluation:
    """Memory, step time and rates of one structurally valid layout."""
    model, cluster, run = inp.model, inp.cluster, inp.run
    split = split_layers(model.num_layers, layout.pp, layout.vpp, inp.search.allow_uneven_pp)
    if split is None:
        raise ValueError(_pp_reason(model, layout.pp, layout.vpp))
    m = layout.num_microbatches(run.global_batch_size)
    mem = peak_memory(model, cluster, run, layout, split=split, num_microbatches=m)
    time = step_time(model, cluster, run, layout, split)
    rates = throughput(model, cluster, run, layout.world_size, time.total_s)
    return Evaluation(
        layout=layout,
        split=split,
        memory=mem,
        time=time,
        rates=rates,
        fits=mem.total_gib <= usable_gib(inp),
    )


def _pp_reason(model: ModelSpec, pp: int, vpp: int) -> str:
    chunks = f"PP*VPP = {pp}*{vpp}" if vpp > 1 else f"PP={pp}"
    return f"{chunks} does not divide {model.num_layers} layers (nor {model.num_layers}+2)"


def _tp_reason(inp: PlanInput, tp: int) -> str | None:
    m, c = inp.model, inp.cluster
    if m.num_attention_heads % tp:
        return f"TP={tp} does not divide {m.num_attention_heads} attention heads"
    if m.num_query_groups % tp:
        return f"TP={tp} does not divide {m.num_query_groups} query groups"
    if tp > c.nvlink_domain_size and not inp.constraints.allow_tp_outside_nvlink:
        return f"TP={tp} crosses the {c.nvlink_domain_size}-GPU NVLink domain"
    return None


def _cp_reason(inp: PlanInput, cp: int) -> str | None:
    s = inp.model.seq_length
    if cp > 1 and s % (2 * cp):
        return f"CP={cp}: sequence {s} not divisible by 2*CP = {2 * cp}"
    return None


def _ep_values(inp: PlanInput, tp: int, dp: int, cp: int) -> tuple[list[int], str | None]:
    """EP sizes megatron-core builds: EP divides the experts and EP*ETP the stage's TP*CP*DP
    ranks (with the default ETP = TP: EP divides DP*CP)."""
    m, fixed = inp.model, inp.constraints.ep
    if not m.is_moe:
        return [1], None
    etp = inp.constraints.etp or tp
    values = [fixed] if fixed else divisors(m.num_experts)
    ok = [e for e in values if m.num_experts % e == 0 and (tp * dp * cp) % (e * etp) == 0]
    if not ok:
        e, n = values[0], tp * dp * cp
        return [], f"EP={e} must divide {m.num_experts} experts, EP*ETP = {e}*{etp} TP*DP*CP = {n}"
    return ok, None


def check_constraints(inp: PlanInput) -> None:
    """Raise ValueError naming the failing product when fixed dimensions are impossible."""
    c, world = inp.constraints, inp.cluster.world_size
    tp, pp, cp = c.tp or 1, c.pp or 1, c.cp or 1
    try:
        check_world(world, tp, pp, cp)
        if c.dp and world % (tp * pp * cp * c.dp):
            raise ValueError(f"{world} GPUs not divisible by TP*PP*CP*DP = {tp}*{pp}*{cp}*{c.dp}")
    except ValueError as exc:
        raise ValueError(f"{exc}{_world_hint(inp, tp * pp * cp * (c.dp or 1))}") from None
    if c.tp and (reason := _tp_reason(inp, c.tp)):
        raise ValueError(reason)
    if c.cp and (reason := _cp_reason(inp, c.cp)):
        raise ValueError(reason)
    if c.vpp and c.vpp > 1 and c.pp == 1:
        raise ValueError(f"VPP={c.vpp} needs PP > 1")
    if (
        c.pp
        and split_layers(inp.model.num_layers, c.pp, c.vpp or 1, inp.search.allow_uneven_pp) is None
    ):
        raise ValueError(_pp_reason(inp.model, c.pp, c.vpp or 1))
    if c.ep and c.ep > 1 and not inp.model.is_moe:
        raise ValueError(f"EP={c.ep} needs an MoE model ({inp.model.name} is dense)")
    _check_moe(inp)
    if c.sequence_parallel and c.tp == 1:
        raise ValueError("sequence parallelism needs TP > 1 (TP=1 is fixed)")
    if c.dp and c.tp and c.pp and c.cp is not None and c.dp * c.tp * c.pp * c.cp != world:
        raise ValueError(
            f"DP={c.dp} but {world} GPUs / (TP*PP*CP = {c.tp}*{c.pp}*{c.cp}) = "
            f"{world // (c.tp * c.pp * c.cp)}"
        )
    _check_batch(inp)


def _world_hint(inp: PlanInput, fixed: int) -> str:
    """Where the world size comes from, when the fixed dimensions need more GPUs than it."""
    cl = inp.cluster
    if fixed <= cl.world_size:
        return ""
    return (
        f" (cluster.num_nodes {cl.num_nodes} x cluster.gpus_per_node {cl.gpus_per_node}; "
        "--nodes/--gpus-per-node set them)"
    )


def _check_moe(inp: PlanInput) -> None:
    """Fixed expert dimensions megatron-core cannot build, and fixed dimensions that rule out
    the all-to-all overlap asked for (the search's own rejections, named up front)."""
    c, m, world = inp.constraints, inp.model, inp.cluster.world_size
    if not m.is_moe:
        return
    if c.ep and m.num_experts % c.ep:
        raise ValueError(f"EP={c.ep} does not divide {m.num_experts} experts")
    pp, ep, etp = c.pp or 1, c.ep or 1, c.etp
    if etp and world % (etp * ep * pp):
        raise ValueError(f"{world} GPUs not divisible by ETP*EP*PP = {etp}*{ep}*{pp}")
    if not inp.run.moe_a2a_overlap:
        return
    if c.ep == 1:
        raise ValueError("parallel.moe_a2a_overlap=true needs EP > 1, EP=1 is fixed")
    if c.recompute == Recompute.full:
        raise ValueError(
            "parallel.moe_a2a_overlap=true needs recompute other than full, "
            "parallel.recompute=full is fixed"
        )
    if c.pp and c.pp > 1 and c.vpp == 1:
        raise ValueError(
            f"parallel.moe_a2a_overlap=true needs VPP > 1 when PP > 1, PP={c.pp} VPP=1 is fixed"
        )


def _check_batch(inp: PlanInput) -> None:
    c, gbs = inp.constraints, inp.run.global_batch_size
    if c.micro_batch_size and gbs % c.micro_batch_size:
        raise ValueError(f"GBS {gbs} not divisible by MBS {c.micro_batch_size}")
    if c.dp and c.micro_batch_size and gbs % (c.micro_batch_size * c.dp):
        raise ValueError(f"GBS {gbs} not divisible by MBS*DP = {c.micro_batch_size}*{c.dp}")


Family = tuple[int, int, int, int, int]  # (tp, cp, pp, vpp, dp)


class _Rejected:
    """Rejection families: a reason template, the values it was seen with, and a count."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[set[int], int]] = {}

    def add(self, reason: str, value: int | None = None, count: int = 1) -> None:
        values, n = self.families.get(reason, (set(), 0))
        if value is not None:
            values.add(value)
        self.families[reason] = (values, n + count)

    @property
    def counts(self) -> dict[str, int]:
        """Final one-line reasons with counts; `{}` in a template lists the values seen."""
        return {
            (r.format(", ".join(map(str, sorted(v)))) if "{}" in r else r): n
            for r, (v, n) in self.families.items()
        }


def _structures(inp: PlanInput, rej: _Rejected) -> list[Family]:
    """Valid (tp, cp, pp, vpp, dp) families."""
    c, world = inp.constraints, inp.cluster.world_size
    pp_fixed = c.pp or 1  # a fixed PP (or CP) leaves only the divisors of the rest
    out = []
    for tp in [c.tp] if c.tp else divisors(world // (pp_fixed * (c.cp or 1))):
        if reason := _tp_reason(inp, tp):
            rej.add(reason)
            continue
        for cp in [c.cp] if c.cp else divisors(world // (tp * pp_fixed)):
            if world % (tp * cp) or (reason := _cp_reason(inp, cp)):
                rej.add(reason or f"{world} GPUs not divisible by TP*CP = {tp}*{cp}")
                continue
            out += _pp_families(inp, rej, tp, cp)
    return out


def _pp_families(inp: PlanInput, rej: _Rejected, tp: int, cp: int) -> list[Family]:
    c, world, layers = inp.constraints, inp.cluster.world_size, inp.model.num_layers
    out: list[Family] = []
    for pp in [c.pp] if c.pp else divisors(world // (tp * cp)):
        if world % (tp * cp * pp):
            rej.add(f"{world} GPUs not divisible by TP*PP*CP = {tp}*{pp}*{cp}")
            continue
        dp = world // (tp * cp * pp)
        if c.dp and c.dp != dp:
            rej.add(f"DP={c.dp} fixed but world/(TP*PP*CP) = {dp}")
            continue
        vpps = (
            [c.vpp] if c.vpp else ([1] + [v for v in range(2, layers // pp + 1)] if pp > 1 else [1])
        )
        found = False
        for vpp in vpps:
            if split_layers(layers, pp, vpp, inp.search.allow_uneven_pp) is not None:
                out.append((tp, cp, pp, vpp, dp))
                found = True
        if not found:
            rej.add(
                _pp_reason(inp.model, pp, c.vpp or 1)
                + ("" if inp.search.allow_uneven_pp else " (plan.allow_uneven_pp=false)")
            )
    return out


def _options(inp: PlanInput, tp: int, pp: int) -> list[tuple[bool, Recompute, list[Sharding]]]:
    """(sequence parallel, recompute, sharding choices) allowed for a TP/PP family."""
    c = inp.constraints
    sps = [c.sequence_parallel] if c.sequence_parallel is not None else [tp > 1]
    rcs = [c.recompute] if c.recompute else list(Recompute)
    shs = [c.optimizer_sharding] if c.optimizer_sharding else list(Sharding)
    if pp > 1 and not inp.run.torch_native and not c.optimizer_sharding:
        # FSDP with PP > 1 is planned when fixed; the search proposes it for the PyTorch-native
        # stack (torchtitan runs it by default), not for Megatron, whose recipes do not (and
        # whose 405B search would grow by half: test_plan_speed).
        shs = [sh for sh in shs if sh != Sharding.full]
    return [(sp, rc, shs) for sp in sps if not (sp and tp == 1) for rc in rcs if shs]


def candidates(inp: PlanInput) -> tuple[list[Layout], dict[str, int]]:
    """Every structurally valid layout, and rejection counts by reason."""
    groups, rejected = _groups(inp)
    return [lay for group in groups for lay in group], rejected


def _groups(inp: PlanInput) -> tuple[list[list[Layout]], dict[str, int]]:
    """Valid layouts grouped so that layouts in a group differ only in sharding."""
    rej = _Rejected()
    out: list[list[Layout]] = []
    c, gbs = inp.constraints, inp.run.global_batch_size
    mbss = [c.micro_batch_size] if c.micro_batch_size else list(inp.search.micro_batch_sizes)
    moe, overlap = inp.model.is_moe, inp.run.moe_a2a_overlap
    for tp, cp, pp, vpp, dp in _structures(inp, rej):
        eps, reason = _ep_values(inp, tp, dp, cp)
        if reason:
            rej.add(reason)
        opts = _options(inp, tp, pp)
        if dp * cp == 1 and c.optimizer_sharding is None:
            # One rank per optimizer-sharding group: megatron-core's distributed optimizer and
            # FSDP shard over nothing, so they are the same run as no sharding (FSDP only adds
            # gathered-layer memory); counting them would triple such layouts in the ranks.
            opts = [(sp, rc, [Sharding.none]) for sp, rc, _ in opts]
        for mbs in mbss:
            if gbs % (mbs * dp):
                rej.add(f"MBS={mbs}: GBS {gbs} not divisible by MBS*DP for DP in {{}}", dp)
                continue
            m = gbs // (mbs * dp)
            if vpp > 1 and m % pp:
                rej.add(
                    f"PP={pp} with VPP: micro-batches per step not divisible by PP "
                    "for MBS*DP in {}",
                    mbs * dp,
                )
                continue
            for ep in eps:
                for sp, rc, shs in opts:
                    base = Layout(
                        tp=tp,
                        pp=pp,
                        vpp=vpp,
                        cp=cp,
                        ep=ep,
                        dp=dp,
                        micro_batch_size=mbs,
                        sequence_parallel=sp,
                        recompute=rc,
                        loss_balanced=inp.search.balance_loss and pp > 1,
                        etp=c.etp,
                    )
                    if moe and (why := layout_refusal(base, overlap)):
                        rej.add(why)  # megatron-core refuses it (moe.layout_refusal)
                        continue
                    out.append([replace(base, optimizer_sharding=sh) for sh in shs])
    return out, rej.counts


def plan(inp: PlanInput, *, suggest: bool = True) -> PlanResult:
    """Search all valid layouts, drop those that do not fit, rank the rest by step time.

    Raises:
        ValueError: the fixed dimensions in `inp.constraints` are impossible; the message
            names the failing product or divisibility.
    """
    check_constraints(inp)
    groups, rejected = _groups(inp)
    limit = usable_gib(inp)
    scored = [item for group in groups for item in _score(inp, group)]
    fitting = sorted((s for s in scored if s[1] <= limit), key=lambda s: (s[0], s[1]))
    misfits = len(scored) - len(fitting)
    if misfits:
        rejected[f"needs more than {limit:.1f} GiB usable per GPU"] = misfits
    closest = None
    if scored and not fitting:
        closest = evaluate(inp, min(scored, key=lambda s: s[1])[2])
    tips = tuple(suggestions(inp, valid=bool(scored))) if suggest and not fitting else ()
    return PlanResult(
        input=inp,
        ranked=tuple(evaluate(inp, s[2]) for s in fitting[: max(inp.search.top_k, 1)]),
        points=tuple((step, gib, gib <= limit, lay.tp, lay.pp) for step, gib, lay in scored),
        rejections=tuple(Rejection(reason=r, count=n) for r, n in rejected.items()),
        num_candidates=len(scored),
        usable_gib=limit,
        closest=closest,
        suggestions=tips,
    )


def _score(inp: PlanInput, group: list[Layout]) -> list[tuple[float, float, Layout]]:
    """(step seconds, peak GiB, layout) of layouts differing only in sharding: the fast path
    of `evaluate` (same formulas, shared work, no breakdown objects)."""
    model, cluster, run = inp.model, inp.cluster, inp.run
    first = group[0]
    split = _split(model.num_layers, first.pp, first.vpp, inp.search.allow_uneven_pp)
    m = first.num_microbatches(run.global_batch_size)
    shardings = [lay.optimizer_sharding for lay in group]
    gibs = peak_gib_options(model, cluster, run, first, shardings, split=split, num_microbatches=m)
    steps = step_s_options(model, cluster, run, group, split)
    return list(zip(steps, gibs, group, strict=True))


@lru_cache(maxsize=1024)
def _split(num_layers: int, pp: int, vpp: int, allow_uneven: bool) -> StageSplit:
    split = split_layers(num_layers, pp, vpp, allow_uneven)
    assert split is not None  # candidates() only yields splittable layouts
    return split


def suggestions(inp: PlanInput, *, valid: bool = True) -> list[str]:
    """What would make something fit: relax fixed choices one by one, then together, then
    add GPUs, then (when no layout of this world and batch is valid: `valid` False, or
    nothing else worked) the nearest global batch sizes and node counts."""
    c = inp.constraints
    steps = [
        ("full activation recompute", dict(recompute=Recompute.full)),
        ("micro-batch size 1", dict(micro_batch_size=1)),
        ("more pipeline stages (PP searched)", dict(pp=None, vpp=None, dp=None)),
        ("TP searched", dict(tp=None, dp=None)),
        ("CP searched", dict(cp=None, dp=None)),
        ("optimizer sharding searched", dict(optimizer_sharding=None)),
    ]
    out = []
    for text, change in steps:
        best = _try(replace(inp, constraints=replace(c, **change)))  # type: ignore[arg-type]
        if best:
            out.append(f"{text}: {best.layout.short()} fits ({best.memory.total_gib:.1f} GiB)")
    if not out:
        relaxed, names = c, []
        for text, change in steps:
            relaxed = replace(relaxed, **change)  # type: ignore[arg-type]
            names.append(text)
            best = _try(replace(inp, constraints=relaxed))
            if best:
                out.append(
                    f"{' + '.join(names)}: {best.layout.short()} fits "
                    f"({best.memory.total_gib:.1f} GiB)"
                )
                break
    out += _more_gpus(inp)
    if not valid or not out:
        out += _batch_or_nodes(inp)
    if out:
        return out
    if not valid:
        return ["no layout is valid (every candidate is rejected above) and no nearby batch "
                "size or node count helps"]  # fmt: skip
    return ["nothing tried fits: a larger-memory GPU or a smaller model is needed"]


def _batch_or_nodes(inp: PlanInput) -> list[str]:
    """The nearest global batch sizes that are multiples of the world size, and one node
    fewer or more, each with every dimension but the fixed MBS searched."""
    cl, gbs = inp.cluster, inp.run.global_batch_size
    free = Constraints(micro_batch_size=inp.constraints.micro_batch_size)
    out = []
    lower, upper = gbs // cl.world_size * cl.world_size, -(-gbs // cl.world_size) * cl.world_size
    for size in sorted({lower, upper} - {0, gbs}):
        best = _try(replace(inp, run=replace(inp.run, global_batch_size=size), constraints=free))
        if best:
            out.append(
                f"global batch size {size} (--gbs {size}): {best.layout.short()} fits "
                f"({best.memory.total_gib:.1f} GiB)"
            )
    for nodes in (n for n in (cl.num_nodes - 1, cl.num_nodes + 1) if n >= 1):
        other = replace(cl, num_nodes=nodes)
        best = _try(replace(inp, cluster=other, constraints=free))
        if best:
            out.append(
                f"{nodes} nodes ({other.world_size} GPUs, --nodes {nodes}): "
                f"{best.layout.short()} fits ({best.memory.total_gib:.1f} GiB)"
            )
    return out


def _more_gpus(inp: PlanInput) -> list[str]:
    for cons in (replace(inp.constraints, dp=None), Constraints()):
        for factor in (2, 4, 8, 16):
            cl = replace(inp.cluster, num_nodes=inp.cluster.num_nodes * factor)
            best = _try(replace(inp, cluster=cl, constraints=cons))
            if best:
                how = " with every dimension searched" if cons == Constraints() else ""
                return [
                    f"{cl.num_nodes} nodes ({cl.world_size} GPUs){how}: "
                    f"{best.layout.short()} fits ({best.memory.total_gib:.1f} GiB)"
                ]
    return []


def _try(inp: PlanInput) -> Evaluation | None:
    try:
        return plan(inp, suggest=False).best
    except ValueError:
        return None
