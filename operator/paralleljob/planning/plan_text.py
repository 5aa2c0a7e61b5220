"""A Plan in words, for every command that prints one (`paralleljob plan`, `plan --auto`, `run`): one row per
node rank, then the estimates and the modeled cost (models, not measurements).
"""

from __future__ import annotations

import io

from paralleljob.planning.estimates import GIB
from paralleljob.planning.plan import Plan


def render_table(name: str, plan: Plan) -> str:
    """One row per node rank, then the estimates and the modeled cost, as rich prints them."""
    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, width=140, force_terminal=False, color_system=None)
    layout = plan.layout
    table = Table(
        title=f"{name}: {layout.pipeline}x{layout.tensor}x{layout.data} (PP x TP x DP), {plan.world_size} GPUs on "
        f"{len(plan.nodes)} nodes x {plan.ranks_per_node}, axis order {','.join(plan.axis_order)}",
        title_justify="left",
    )
    for column in ("node rank", "node", "ranks", "stages", "domains"):
        table.add_column(column, justify="right" if column == "node rank" else "left")
    for entry in plan.nodes:
        stages = ",".join(str(s) for s in entry.stages)
        domains = " ".join(entry.domains.values()) or "-"
        table.add_row(str(entry.node_rank), entry.node, entry.rank_range, stages, domains)
    console.print(table)
    for line in summary_lines(plan):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return buffer.getvalue()


def summary_lines(plan: Plan) -> list[str]:
    """The estimates and cost in words (models, not measurements)."""
    e = plan.estimates
    memory = e.memory
    fits = "unknown GPU memory" if e.gpu_memory is None else f"of {e.gpu_memory / GIB:.0f} GiB"
    naive = plan.naive_cost
    cost = plan.cost
    by_group = ", ".join(f"{k} {v:.3g} s over {cost.levels[k]}" for k, v in cost.by_group.items())
    lines = [
        f"GPU product: {plan.gpu_product or 'unlabelled'}; network levels: {', '.join(plan.levels) or 'none (flat)'}",
        f"memory per GPU (model, {_stage_words(e.memory_stage)}): {memory['total'] / GIB:.1f} GiB {fits} = "
        f"weights {memory['weights'] / GIB:.1f} + "
        f"gradients {memory['gradients'] / GIB:.1f} + optimizer {memory['optimizer'] / GIB:.1f} + activations "
        f"{memory['activations'] / GIB:.1f} + reserve {memory['reserve'] / GIB:.1f}",
        f"pipeline bubble: {e.bubble_fraction:.1%} of each step (1F1B)",
        "bytes per GPU per step: "
        + ", ".join(f"{k} {_bytes(v)}" for k, v in e.bytes_per_step.items())
        + f"; FLOPs per step {e.model_flops_per_step:.3g} model, {e.flops_per_step:.3g} executed",
        f"modeled step time {e.step_seconds:.3g} s, MFU {e.mfu:.0%} of model FLOPs (at "
        f"{e.assumptions['peakTFLOPS']:.0f} TFLOP/s peak, {e.assumptions['kernelEfficiency']:.0%} kernel efficiency)",
        f"modeled communication per step: planned {cost.seconds:.3g} s ({by_group})"
        + (f"; naive (free nodes in name order) {naive.seconds:.3g} s" if naive else ""),
    ]
    if plan.spares:
        held = ", ".join(f"{spare.node} (guards node rank {spare.guards})" for spare in plan.spares)
        lines.append(f"hot spares (spec.failurePolicy.spareNodes), held free for the job: {held}")
    return lines + [f"warning: {w}" for w in plan.warnings]


def _stage_words(stage: str) -> str:
    """ "first pipeline stage", "last pipeline stage" or "one stage"."""
    return "one stage" if stage == "only" else f"{stage} pipeline stage, the fuller end"


def _bytes(value: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"
