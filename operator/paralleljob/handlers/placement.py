"""The planner's port: the watches' node records and usage totals, and other jobs' reservations, in; the typed
`Plan` (or the reason it cannot fit) out; and, for a job that gives a GPU budget, the layout chosen at
its first admission (or why none fits).

Builds the planner's `Cluster` from the Node watch's snapshot and the usage index's totals (no API call),
leaving out nodes that broke an earlier attempt when the job still fits without them ("where possible"; the
nodes a verdict named are the last to come back, `Avoid`), and times the planning.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob
from paralleljob.api.problems import Problem
from paralleljob.handlers.nodes import NodeSnapshot
from paralleljob.manifests import records
from paralleljob.planning import layout_search
from paralleljob.planning.inventory import ClusterBuilder, NodeInfo, Reservation
from paralleljob.planning.usage import NodeUsage

log = logging.getLogger(__name__)


class PlanningFailed(Exception):
    """The planner raised on a job that validation accepted: a planner bug, reported on the job
    (`handlers.failures`: Reconciled=False, reason PlanningFailed)."""


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """What an admission plans against, from the watches: node records, the usage totals of bound pods (less
    this job's own departed pods), other jobs' reservations, and the builder that reuses the node records."""

    nodes: NodeSnapshot
    usage: Mapping[str, NodeUsage]
    held: list[planning.Reservation]
    builder: ClusterBuilder


@dataclasses.dataclass(frozen=True)
class Avoid:
    """The nodes a job's attempts were restarted away from (`excluded`), and of them those a verdict on the node
    itself named (`suspect`: a slow link, a straggler, the node its stalled pods waited on), as the attempt
    record keeps them."""

    excluded: Collection[str] = ()
    suspect: Collection[str] = ()

    @classmethod
    def of(cls, record: records.AttemptRecord | None) -> Avoid:
        """What an attempt record says to avoid (nothing without one)."""
        return cls(record.excluded_nodes, record.suspect_nodes) if record is not None else cls()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A plan and the slim Node dicts it uses, or the planner's reason why the job does not fit."""

    plan: planning.Plan | None
    nodes: list[Mapping[str, Any]]
    reason: str
    seconds: float


def _plan_once(
    resolved: ResolvedJob,
    builder: ClusterBuilder,
    infos: Sequence[NodeInfo],
    usage: Mapping[str, NodeUsage],
    reservations: Sequence[Reservation],
) -> tuple[planning.Plan | None, str]:
    result = planning.plan_job(resolved, builder.build(infos, usage, reservations))
    if isinstance(result, planning.Unschedulable):
        return None, result.message
    return result, ""


def plan(
    resolved: ResolvedJob,
    nodes: NodeSnapshot,
    usage: Mapping[str, NodeUsage],
    reservations: Sequence[Reservation],
    avoid: Avoid = Avoid(),
    builder: ClusterBuilder | None = None,
) -> Outcome:
    """Plan without the excluded nodes; else without the suspect ones only (a node where a pod merely failed may
    be sound, one a verdict named is not: a slow link fails the next preflight alike); else with them all. The
    reason is from the attempt without any of them."""
    started = time.perf_counter()
    builder = builder or ClusterBuilder()
    preferred = [info for info in nodes.infos if info.name not in avoid.excluded] if avoid.excluded else nodes.infos
    found, reason = _plan_once(resolved, builder, preferred, usage, reservations)
    if found is None and len(preferred) < len(nodes.infos):
        suspect = set(avoid.suspect) & set(avoid.excluded)
        # Without the suspect nodes only, when some excluded nodes are not suspect; then with them all.
        for kept_out in ([suspect] if suspect and suspect != set(avoid.excluded) else []) + [set()]:
            back = sorted(set(avoid.excluded) - kept_out)
            log.info(
                "%s does not fit without nodes %s (%s); planning with %s",
                resolved.name,
                sorted(avoid.excluded),
                reason,
                back,
            )
            found, _ = _plan_once(
                resolved, builder, [i for i in nodes.infos if i.name not in kept_out], usage, reservations
            )
            if found is not None:
                break
    planned = [nodes.dicts[entry.node] for entry in found.nodes] if found is not None else []
    return Outcome(found, planned, reason, time.perf_counter() - started)


@dataclasses.dataclass(frozen=True)
class LayoutFound:
    """The chosen job and what status.layoutChoice keeps, with the explanation; or no job and why."""

    job: ResolvedJob | None
    record: dict[str, Any]
    message: str


def choose_layout(
    template: ResolvedJob,
    nodes: NodeSnapshot,
    usage: Mapping[str, NodeUsage],
    reservations: Sequence[Reservation],
    builder: ClusterBuilder | None = None,
    budget: layout_search.Budget | None = None,
) -> LayoutFound:
    """The layout search (`planning.layout_search`) on the watched cluster, for the budget the job gives (or
    `budget`: the re-plan's smaller one)."""
    budget = budget or layout_search.budget_of(template)
    assert budget is not None  # only jobs that give a budget come here
    cluster = (builder or ClusterBuilder()).build(nodes.infos, usage, reservations)
    outcome = layout_search.choose_layout(template, cluster, budget)
    if isinstance(outcome, layout_search.NoLayout):
        return LayoutFound(None, {}, outcome.message)
    record = layout_search.record(outcome)
    return LayoutFound(outcome.winner.job, record, str(record["explanation"]))


def chosen_job(template: ResolvedJob, recorded: Mapping[str, Any]) -> tuple[ResolvedJob | None, list[Problem]]:
    """The job with the layout recorded at first admission."""
    return layout_search.chosen_job(template, recorded)
