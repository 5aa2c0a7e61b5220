"""The layout search's explanation: the decision rule in its own order (one GPU, one NVLink domain, pipeline),
the winner against the runner-up, and, when nothing is left, one line naming what to change (a budget with a
valid layout, ZeRO-1, free sizes, more GPUs).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from paralleljob.api.validation import ResolvedJob
from paralleljob.planning import estimates
from paralleljob.planning.estimates import GIB
from paralleljob.planning.inventory import Cluster
from paralleljob.planning.layout_bounds import (
    MEMORY_MARGIN,
    Hardware,
    Screened,
    Tally,
    screen,
    workload,
)
from paralleljob.planning.layout_ranking import Candidate
from paralleljob.planning.layout_space import (
    Budget,
    divisors,
    max_tensor_size,
    shapes,
    variant_job,
    variants,
    zero_stages,
)
from paralleljob.planning.levels import detect_nvlink_label, label_keys
from paralleljob_contract import model as model_math


def explain(
    job: ResolvedJob, budget: Budget, hardware: Sequence[Hardware], max_tensor: int, ranked: Sequence[Candidate]
) -> list[str]:
    """The decision rule in its own order (one GPU, one NVLink domain, pipeline), then winner vs runner-up."""
    winner = ranked[0]
    lines = [_regime(job, budget, _gpu_memory(hardware), max_tensor, winner)]
    lines.append(
        f"winner {winner.variant.describe()}: modeled step {winner.step_seconds:.3g} s, "
        f"{winner.tokens_per_second:,.0f} tokens/s, MFU {winner.plan.estimates.mfu:.0%}, "
        f"{winner.memory / GIB:.1f} GiB per GPU, {len(winner.plan.nodes)} nodes x {winner.plan.ranks_per_node} GPUs."
    )
    if len(ranked) > 1:
        lines.append(_versus(winner, ranked[1]))
    return lines


def _gpu_memory(hardware: Sequence[Hardware]) -> float | None:
    return max((h.gpu_memory or 0.0 for h in hardware), default=0.0) or None


def _regime(job: ResolvedJob, budget: Budget, gpu_memory: float | None, max_tensor: int, winner: Candidate) -> str:
    """Whether one replica fits one GPU, one NVLink domain (TP), or needs pipeline stages across nodes."""
    if gpu_memory is None:
        return (
            "GPU memory is unknown (no nvidia.com/gpu.memory label), so memory was not checked: the fastest "
            "modeled layout wins."
        )
    usable = gpu_memory * (1 - MEMORY_MARGIN)
    room = f"{usable / GIB:.0f} GiB usable of {gpu_memory / GIB:.0f} GiB"
    one_gpu = _least_memory(job, budget, 1, 1)
    if one_gpu is not None and one_gpu <= usable:
        return (
            f"1. the model fits one GPU ({one_gpu / GIB:.1f} GiB at best with TP 1 x PP 1; {room}), so DP alone "
            "works; TP or PP is added only where the model says it is faster."
        )
    start = f"1. one replica does not fit one GPU ({(one_gpu or math.inf) / GIB:.1f} GiB at best; {room})"
    tensors = [t for t in divisors(budget.gpus) if 1 < t <= max_tensor and _splits(job, t)]
    in_domain = [(t, m) for t in tensors if (m := _least_memory(job, budget, t, 1)) is not None and m <= usable]
    if in_domain:
        t, m = in_domain[0]
        then = (
            "so no pipeline is needed"
            if winner.variant.pipeline == 1
            else f"but PP {winner.variant.pipeline} is faster in the model (below)"
        )
        return f"{start}; 2. TP {t} inside one NVLink domain fits ({m / GIB:.1f} GiB), {then}."
    widest = max(tensors, default=1)
    return (
        f"{start}; 2. nor one NVLink domain (TP up to {widest}); 3. so it needs PP across nodes: "
        f"PP {winner.variant.pipeline} x TP {winner.variant.tensor}, TP inside the domain."
    )


def _splits(job: ResolvedJob, tensor: int) -> bool:
    model = job.spec.model
    kv = model.kv_heads or model.attention_heads
    kv_fits = kv % tensor == 0 or tensor % kv == 0  # whole key/value groups per rank, or all of them
    return (
        model_math.heads_split(model.attention_heads, tensor)
        and model_math.ffn_split(job.ffn_hidden_size, tensor)
        and kv_fits
    )


def _least_memory(job: ResolvedJob, budget: Budget, tensor: int, pipeline: int) -> float | None:
    """The least memory per GPU over micro-batch, recomputation and ZeRO for a TP x PP with the rest DP."""
    if budget.gpus % (tensor * pipeline):
        return None
    data = budget.gpus // (tensor * pipeline)
    found = [estimates.memory_per_gpu(workload(job, v)).total for v in variants(job, (pipeline, tensor, data))]
    return min(found, default=None)


def _versus(winner: Candidate, runner_up: Candidate) -> str:
    """Why the winner beats the runner-up: the two parts of the step that differ most."""
    a, b = winner.step, runner_up.step
    parts = {
        "compute": b.compute - a.compute,
        "TP all-reduces": b.tensor - a.tensor,
        "PP transfers": b.pipeline - a.pipeline,
        "pipeline bubble": b.bubble - a.bubble,
        "DP all-reduce": b.data - a.data,
    }
    biggest = sorted(parts.items(), key=lambda item: -abs(item[1]))[:2]
    reasons = " and ".join(f"{abs(d):.3g} s {'more' if d >= 0 else 'less'} in {name}" for name, d in biggest if d)
    gain = runner_up.step_seconds / winner.step_seconds - 1
    if gain < 1e-9:
        return (
            f"the runner-up {runner_up.variant.describe()} ties in modeled step time; the winner uses fewer nodes, "
            "less inter-node traffic or less memory."
        )
    return (
        f"the runner-up {runner_up.variant.describe()} is {gain:.1%} slower ({runner_up.step_seconds:.3g} s per "
        f"step): it spends {reasons}."
    )


def nothing_fits(job: ResolvedJob, cluster: Cluster, budget: Budget, hardware: Sequence[Hardware], tally: Tally) -> str:
    """One line: no valid layout (name a rule and a budget that works), or none fits (what to change)."""
    if tally.smallest is None:
        usable = _nearest_usable_budgets(job, cluster, budget)
        why = "; ".join(list(tally.invalid.values())[:2]) or "no sizes multiply to it"
        near = f"; try {' or '.join(str(n) for n in usable)} GPUs" if usable else ""
        return f"no valid layout uses exactly {budget.describe()} (e.g. {why}){near}"
    closest = tally.smallest
    gpu_memory = _gpu_memory(hardware) or 0.0
    return (
        f"no layout of {budget.describe()} fits in memory: the closest, {closest.variant.describe()}, needs "
        f"{closest.memory / GIB:.1f} GiB per GPU of {gpu_memory * (1 - MEMORY_MARGIN) / GIB:.0f} GiB usable "
        f"({gpu_memory / GIB:.0f} GiB less a {MEMORY_MARGIN:.0%} margin); "
        f"{_memory_changes(job, cluster, budget, closest, hardware)}"
    )


def _memory_changes(
    job: ResolvedJob, cluster: Cluster, budget: Budget, closest: Screened, hardware: Sequence[Hardware]
) -> str:
    """What would make it fit: ZeRO-1 when the config pins 0, free fixed sizes, more GPUs (the smallest
    power-of-two multiple of the budget that fits)."""
    advice = []
    if zero_stages(job, closest.variant.pipeline) == (0,):
        advice.append("allow ZeRO-1 (spec.deepspeed.zero_optimization.stage: 1 shards the optimizer over DP)")
    if budget.fixed:
        advice.append(f"leave {' and '.join(budget.fixed)} to the search")
    bigger = next(
        (gpus for gpus in _larger_budgets(budget, cluster) if _any_fits(job, cluster, budget, gpus, hardware)), None
    )
    if bigger is not None:
        advice.append(f"use {bigger} GPUs, the smallest larger budget tried where a layout fits")
    else:
        advice.append("shrink the model: not even 64x the GPUs fit it with micro-batch 1, recomputation and ZeRO-1")
    return "; or ".join(advice)


def _larger_budgets(budget: Budget, cluster: Cluster) -> Iterator[int]:
    """The next 16 multiples of a node's GPUs above the budget, then doublings up to 64x."""
    per_node = max((node.allocatable_gpus for node in cluster.nodes), default=1) or 1
    start = budget.gpus // per_node + 1
    yield from (per_node * count for count in range(start, start + 16))
    yield from (budget.gpus * factor for factor in (4, 8, 16, 32, 64) if budget.gpus * factor > per_node * (start + 15))


def _any_fits(job: ResolvedJob, cluster: Cluster, budget: Budget, gpus: int, hardware: Sequence[Hardware]) -> bool:
    return next(screen(job, cluster, Budget(gpus, budget.fixed), hardware, Tally()), None) is not None


def _nearest_usable_budgets(job: ResolvedJob, cluster: Cluster, budget: Budget) -> list[int]:
    """The nearest GPU counts below and above the budget that have a valid layout (memory not considered)."""
    label = job.spec.topology.nvlink_domain_label or detect_nvlink_label(label_keys(cluster.nodes))
    max_tensor = max_tensor_size(job, cluster, label)

    def usable(gpus: int) -> bool:
        if job.spec.gpus_per_node and gpus % job.spec.gpus_per_node:
            return False
        return any(
            variant_job(job, variant)[0] is not None
            for shape in shapes(Budget(gpus, budget.fixed))
            if shape[1] <= max_tensor
            for variant in itertools.islice(variants(job, shape), 1)
        )

    below = next((n for n in range(budget.gpus - 1, 0, -1) if usable(n)), None)
    above = next((n for n in range(budget.gpus + 1, 2 * budget.gpus + 9) if usable(n)), None)
    return [n for n in (below, above) if n is not None]


def nothing_places(screened: Sequence[Screened], misses: Sequence[tuple[Screened, str]]) -> str:
    item, reason = min(misses, key=lambda miss: (miss[0].bound, miss[0].memory)) if misses else (screened[0], "")
    return f"no candidate layout places on the cluster now: the best modeled one, {item.variant.describe()}, {reason}"
