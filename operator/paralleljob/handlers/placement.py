"""The planner's port: live cluster objects in, a plan in its JSON form (or the reason it cannot fit) out;
and, for a job that gives a GPU budget, the layout chosen at its first admission (or why none fits).

Builds the planner's `Cluster` from Nodes, pods and other jobs' reservations, leaving out nodes that broke an
earlier attempt when the job still fits without them ("where possible"), and times the planning.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from paralleljob import planning
from paralleljob.api import ResolvedJob
from paralleljob.api.problems import Problem
from paralleljob.planning import layout_search
from paralleljob.planning.inventory import Reservation, build_cluster


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A plan (JSON form) and the Node dicts it uses, or the planner's reason why the job does not fit."""

    plan: dict[str, Any] | None
    nodes: list[Mapping[str, Any]]
    reason: str
    seconds: float


def _plan_once(
    resolved: ResolvedJob,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    reservations: Sequence[Reservation],
) -> tuple[dict[str, Any] | None, str]:
    result = planning.plan_job(resolved, build_cluster(nodes, pods, reservations))
    if isinstance(result, planning.Unschedulable):
        return None, result.message
    return result.to_dict(), ""


def plan(
    resolved: ResolvedJob,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    reservations: Sequence[Reservation],
    excluded: Collection[str] = (),
) -> Outcome:
    """Plan without the excluded nodes, else with them; the reason is from the attempt without them."""
    started = time.perf_counter()
    preferred = [n for n in nodes if n["metadata"]["name"] not in excluded]
    found, reason = _plan_once(resolved, preferred, pods, reservations)
    if found is None and len(preferred) < len(nodes):
        found, _ = _plan_once(resolved, nodes, pods, reservations)
    used = {entry["node"] for entry in (found or {}).get("nodes", [])}
    planned = [n for n in nodes if n["metadata"]["name"] in used]
    return Outcome(found, planned, reason, time.perf_counter() - started)


@dataclasses.dataclass(frozen=True)
class LayoutFound:
    """The chosen job and what status.layoutChoice keeps, with the explanation; or no job and why."""

    job: ResolvedJob | None
    record: dict[str, Any]
    message: str


def choose_layout(
    template: ResolvedJob,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    reservations: Sequence[Reservation],
) -> LayoutFound:
    """The layout search (`planning.layout_search`) on the live cluster, for the budget the job gives."""
    budget = layout_search.budget_of(template)
    assert budget is not None  # only jobs that give a budget come here
    outcome = layout_search.choose_layout(template, build_cluster(nodes, pods, reservations), budget)
    if isinstance(outcome, layout_search.NoLayout):
        return LayoutFound(None, {}, outcome.message)
    record = layout_search.record(outcome)
    return LayoutFound(outcome.winner.job, record, str(record["explanation"]))


def chosen_job(template: ResolvedJob, recorded: Mapping[str, Any]) -> tuple[ResolvedJob | None, list[Problem]]:
    """The job with the layout recorded at first admission."""
    return layout_search.chosen_job(template, recorded)
