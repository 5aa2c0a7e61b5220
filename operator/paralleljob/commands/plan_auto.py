"""`paralleljob plan JOB --auto [--gpus N | --gpus A..B | --nodes N]`: choose the 3D layout for a GPU budget.

Calls `planning.layout_search.choose_layout()` for each job (and each budget of a range) on the cluster that
`paralleljob plan` reads, and prints the ranked candidates, the explanation in the rule's order and the
winner's placement; or the same as JSON/YAML. `commands.plan` parses the arguments and reads the inputs.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from paralleljob import planning
from paralleljob.api.validation import ResolvedJob
from paralleljob.planning import layout_search
from paralleljob.planning.estimates import GIB
from paralleljob.planning.layout_search import Budget, LayoutChoice, NoLayout


class BudgetError(ValueError):
    """A --gpus or --nodes value that is not a budget (exit 2)."""


@dataclasses.dataclass(frozen=True)
class BudgetRequest:
    """What the command line asked for: a GPU count or range, or a node count; none means the job's size."""

    gpus: tuple[int, int] | None = None  # (low, high); low == high for one budget
    nodes: int | None = None

    @property
    def is_range(self) -> bool:
        return self.gpus is not None and self.gpus[0] != self.gpus[1]

    def budgets(self, job: ResolvedJob, cluster: planning.Cluster) -> list[int]:
        """GPU budgets to search: one, or a range doubling from its low end (its high end always included)."""
        if self.nodes is not None:
            per_node = job.spec.gpus_per_node or max((n.allocatable_gpus for n in cluster.nodes), default=0)
            return [self.nodes * per_node]
        if self.gpus is None:
            return [job.world_size]  # the job's own size, or the budget it gives
        low, high = self.gpus
        found = []
        while low < high:
            found.append(low)
            low *= 2
        return [*found, high]


def parse_budget(gpus: str | None, nodes: int | None) -> BudgetRequest:
    """--gpus N, --gpus A..B or --nodes N (at most one)."""
    if gpus is not None and nodes is not None:
        raise BudgetError("give --gpus or --nodes, not both")
    if nodes is not None:
        if nodes < 1:
            raise BudgetError(f"--nodes {nodes}: must be at least 1")
        return BudgetRequest(nodes=nodes)
    if gpus is None:
        return BudgetRequest()
    low_text, dots, high_text = gpus.partition("..")
    try:
        low, high = int(low_text), int(high_text if dots else low_text)
    except ValueError:
        raise BudgetError(f"--gpus {gpus}: give a GPU count (64) or a range (32..512)") from None
    if low < 1 or high < low:
        raise BudgetError(f"--gpus {gpus}: counts must be positive and the range low..high with low <= high")
    return BudgetRequest(gpus=(low, high))


def choose_all(
    jobs: Sequence[tuple[str, ResolvedJob]],
    cluster_for: Any,
    request: BudgetRequest,
    options: planning.PlanningOptions,
    reasons: TextIO,
) -> tuple[list[tuple[str, list[LayoutChoice]]], bool]:
    """Search each job's budgets; `cluster_for(job, reservations)` builds its cluster. Later jobs see the GPUs
    earlier winners hold. Failures print one line each to `reasons`."""
    chosen: list[tuple[str, list[LayoutChoice]]] = []
    held: list[planning.Reservation] = []
    ok = True
    for label, job in jobs:
        cluster = cluster_for(job, held)
        choices: list[LayoutChoice] = []
        own = layout_search.budget_of(job)
        for gpus in request.budgets(job, cluster):
            budget = Budget(gpus, own.fixed if own is not None else {})
            outcome = layout_search.choose_layout(job, cluster, budget, options)
            if isinstance(outcome, NoLayout):
                print(f"{label}: {outcome.problem().render()}", file=reasons)
                ok = False
                continue
            choices.append(outcome)
        if choices:
            chosen.append((job.name, choices))
            if not request.is_range:
                held += planning.reservations_of(choices[0].winner.plan, job.name)
    return chosen, ok


def render(chosen: list[tuple[str, list[LayoutChoice]]], request: BudgetRequest, output: str, render_plan: Any) -> str:
    if output in ("json", "yaml"):
        documents = [_document(name, choices, request.is_range) for name, choices in chosen]
        if output == "yaml":
            return yaml.safe_dump_all(documents, sort_keys=False, width=120)
        return json.dumps(documents[0] if len(documents) == 1 else documents, indent=2) + "\n"
    parts = []
    for name, choices in chosen:
        if not request.is_range:
            parts.append(render_choice(name, choices[0]) + render_plan(name, choices[0].winner.plan))
        else:
            parts.append(render_scaling(name, choices))
    return "".join(parts)


def _document(name: str, choices: list[LayoutChoice], is_range: bool) -> dict[str, Any]:
    if not is_range:
        return {"job": name, **choices[0].to_dict()}
    return {"job": name, "scaling": [choice.to_dict() for choice in choices]}


def render_choice(name: str, choice: LayoutChoice) -> str:
    """The ranked candidates (best variant of each layout) and the explanation."""
    from rich.table import Table

    search = (
        f"{choice.searched} variants, {choice.valid} valid, {choice.fitting} fit in memory, {choice.planned} placed"
    )
    table = Table(title=f"{name}: layouts for {choice.budget.describe()} ({search})", title_justify="left")
    for column in (
        "#",
        "PPxTPxDP",
        "nodes",
        "micro",
        "GAS",
        "recompute",
        "ZeRO",
        "GiB/GPU",
        "bubble",
        "comm s",
        "step s",
        "tokens/s",
        "MFU",
    ):
        table.add_column(column, justify="left" if column in ("PPxTPxDP", "recompute") else "right")
    for index, candidate in enumerate(choice.ranked, start=1):
        v, e = candidate.variant, candidate.plan.estimates
        table.add_row(
            str(index),
            v.layout,
            f"{len(candidate.plan.nodes)}x{candidate.plan.ranks_per_node}",
            str(v.micro_batch),
            str(v.accumulation),
            "on" if v.recompute else "off",
            str(v.zero_stage),
            f"{candidate.memory / GIB:.1f}",
            f"{e.bubble_fraction:.1%}",
            f"{candidate.plan.cost.seconds:.3g}",
            f"{candidate.step_seconds:.4g}",
            f"{candidate.tokens_per_second:,.0f}",
            f"{e.mfu:.1%}",
        )
    return _print(table, [*choice.explanation, "modeled, not measured: see docs/planning.md for the formulas."])


def render_scaling(name: str, choices: list[LayoutChoice]) -> str:
    """How the best layout and its throughput change with the budget."""
    from rich.table import Table

    table = Table(title=f"{name}: best layout per GPU budget", title_justify="left")
    columns = ("GPUs", "PPxTPxDP", "nodes", "micro", "GAS", "step s", "tokens/s", "tokens/s/GPU", "MFU", "scaling")
    for column in columns:
        table.add_column(column, justify="left" if column == "PPxTPxDP" else "right")
    base = choices[0].winner.tokens_per_second / choices[0].budget.gpus
    for choice in choices:
        w = choice.winner
        per_gpu = w.tokens_per_second / choice.budget.gpus
        table.add_row(
            str(choice.budget.gpus),
            w.variant.layout,
            f"{len(w.plan.nodes)}x{w.plan.ranks_per_node}",
            str(w.variant.micro_batch),
            str(w.variant.accumulation),
            f"{w.step_seconds:.4g}",
            f"{w.tokens_per_second:,.0f}",
            f"{per_gpu:,.1f}",
            f"{w.plan.estimates.mfu:.1%}",
            f"{per_gpu / base:.0%}",
        )
    notes = ["scaling: tokens/s per GPU relative to the smallest budget (modeled, not measured)."]
    return _print(table, notes)


def _print(table: Any, lines: list[str]) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=False, color_system=None)
    console.print(table)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return buffer.getvalue()
