"""Choosing the 3D layout for a GPU budget: `choose_layout()` searches pipeline x tensor x data, micro-batch
and accumulation, activation recomputation and ZeRO stage, and places the best candidates on the cluster.

Candidates are every variant of the job whose sizes multiply to the budget (keeping the sizes the user fixed),
whose micro-batch x accumulation x DP is the job's train batch, with recomputation on or off and each ZeRO
stage the job's DeepSpeed config allows. A candidate must pass every validation rule (`validate_job`, the
same check as `paralleljob validate`) and fit the reported GPU memory within `MEMORY_MARGIN`.

The objective is the planner's modeled step time on the actual free nodes, placement included. Planning
costs a pass over the nodes, so the search is a branch and bound: each candidate first gets an optimistic
step time (every group that crosses nodes priced at leaf-switch bandwidth, the fastest a real placement
can give it), candidates are planned in that order, and the search stops when the next bound cannot beat
the kept results. Ties go to fewer nodes, then less inter-node traffic, then less memory.

The parts, one module each: the candidate space (`layout_space`), the screen and bound (`layout_bounds`), the
ranking (`layout_ranking`) and the explanation (`layout_explanation`); this module runs them in order.

Callers: `paralleljob plan --auto`, the operator at first admission of a job that gives a budget, and
`paralleljob run` on its local shape. docs/planning.md ("Choosing the layout") documents the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paralleljob.api.problems import Problem, error
from paralleljob.api.validation import ResolvedJob
from paralleljob.planning.inventory import Cluster
from paralleljob.planning.layout_bounds import MEMORY_MARGIN, Tally, hardware_of, screen
from paralleljob.planning.layout_explanation import explain, nothing_fits, nothing_places
from paralleljob.planning.layout_ranking import Candidate, branch_and_bound
from paralleljob.planning.layout_space import Budget, Variant, budget_of, max_tensor_size, shapes, variant_job, variants
from paralleljob.planning.levels import detect_nvlink_label, label_keys
from paralleljob.planning.planner import PlanningOptions

# The search's parts (`layout_space`, `layout_bounds`, `layout_ranking`, `layout_explanation`) stay reachable
# from here, where its callers have always found them.
__all__ = [
    "MEMORY_MARGIN",
    "Budget",
    "Candidate",
    "LayoutChoice",
    "NoLayout",
    "Variant",
    "budget_of",
    "choose_layout",
    "chosen_job",
    "record",
    "shapes",
    "variant_job",
    "variants",
]


@dataclasses.dataclass(frozen=True)
class LayoutChoice:
    """The search's outcome: the winner, the ranked best layouts (winner first) and why, in the rule's order."""

    budget: Budget
    ranked: tuple[Candidate, ...]
    explanation: tuple[str, ...]
    searched: int  # variants enumerated
    valid: int  # variants that passed validation
    fitting: int  # valid variants that fit the GPU memory
    planned: int  # variants the planner placed or tried

    @property
    def winner(self) -> Candidate:
        return self.ranked[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": {"gpus": self.budget.gpus, "fixed": dict(self.budget.fixed)},
            "winner": self.winner.to_dict(),
            "candidates": [candidate.to_dict() for candidate in self.ranked],
            "explanation": list(self.explanation),
            "search": {
                "variants": self.searched,
                "valid": self.valid,
                "fitMemory": self.fitting,
                "planned": self.planned,
            },
            "plan": self.winner.plan.to_dict(),
        }


@dataclasses.dataclass(frozen=True)
class NoLayout:
    """No layout of the budget is valid, fits, or places; `message` is one line naming what to change."""

    budget: Budget
    message: str

    def problem(self) -> Problem:
        return error("spec.parallelism", self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"budget": {"gpus": self.budget.gpus, "fixed": dict(self.budget.fixed)}, "error": self.message}


def choose_layout(
    job: ResolvedJob, cluster: Cluster, budget: Budget, options: PlanningOptions | None = None
) -> LayoutChoice | NoLayout:
    """The best layout of `job` for `budget` GPUs on `cluster`, or one line saying what to change."""
    options = options or PlanningOptions()
    hardware = hardware_of(job, cluster, options.cost_model)
    tally = Tally()
    screened = list(screen(job, cluster, budget, hardware, tally))
    if not screened:
        return NoLayout(budget, nothing_fits(job, cluster, budget, hardware, tally))
    ranked, planned, misses = branch_and_bound(job, cluster, screened, options)
    if not ranked:
        return NoLayout(budget, nothing_places(screened, misses))
    label = job.spec.topology.nvlink_domain_label or detect_nvlink_label(label_keys(cluster.nodes))
    explanation = explain(job, budget, hardware, max_tensor_size(job, cluster, label), ranked)
    return LayoutChoice(budget, tuple(ranked), tuple(explanation), tally.searched, tally.valid, tally.fitting, planned)


def record(choice: LayoutChoice) -> dict[str, Any]:
    """What the operator keeps in status.layoutChoice: enough to rebuild the chosen job without searching."""
    v = choice.winner.variant
    return {
        "pipeline": v.pipeline,
        "tensor": v.tensor,
        "data": v.data,
        "microBatch": v.micro_batch,
        "gradientAccumulationSteps": v.accumulation,
        "activationRecomputation": v.recompute,
        "zeroStage": v.zero_stage,
        "gpus": choice.budget.gpus,
        "stepSeconds": choice.winner.step_seconds,
        "explanation": " ".join(choice.explanation),
    }


def chosen_job(job: ResolvedJob, recorded: Mapping[str, Any]) -> tuple[ResolvedJob | None, list[Problem]]:
    """The job with the layout `record()` kept: what a restart runs, never searching again."""
    try:
        variant = Variant(
            int(recorded["pipeline"]),
            int(recorded["tensor"]),
            int(recorded["data"]),
            int(recorded["microBatch"]),
            int(recorded["gradientAccumulationSteps"]),
            bool(recorded["activationRecomputation"]),
            int(recorded["zeroStage"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return None, [error("status.layoutChoice", f"is malformed ({exc}); remove it to choose the layout again.")]
    return variant_job(job, variant)
