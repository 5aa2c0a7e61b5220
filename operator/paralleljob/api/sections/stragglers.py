"""spec.failurePolicy.stragglers: when a node slower than its peers is named, and what is done about it; and
the named nodes' shape in status.progress.stragglers. The comparison itself is the contract's
(`paralleljob_contract.stragglers.name_stragglers`), shared by the trainer, the operator and `paralleljob run`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from paralleljob.api.fields import api_field
from paralleljob_contract import stragglers as contract

StragglerAction = Literal["Report", "Replace"]


@dataclasses.dataclass(frozen=True)
class Stragglers:
    """Naming a node whose ranks compute slower than their peers doing identical work (same pipeline stage and
    tensor position in other data-parallel replicas)."""

    threshold: float = api_field(
        "A node is named when one of its ranks computed slower than the median of its peers by more than this "
        "factor over a window (its compute time, without the time blocked in collectives or pipeline sends).",
        default=contract.DEFAULT_THRESHOLD,
        minimum=1.05,
        maximum=100.0,
    )
    window_steps: int = api_field(
        "Steps per comparison window. 0 turns the per-rank timing and the comparison off.",
        default=contract.DEFAULT_WINDOW_STEPS,
        minimum=0,
        json_name="windowSteps",
    )
    windows: int = api_field(
        "Consecutive windows a node must be slower in before it is named: one window of a node busy with something "
        "else (a checkpoint write, a data refill) names nobody. 1 names a node on its first slow window.",
        default=contract.DEFAULT_WINDOWS,
        minimum=1,
        maximum=100,
    )
    action: StragglerAction = api_field(
        "Report: name the node (condition Straggler, Event SlowNode, status.progress.stragglers). Replace: also "
        "take it out of the job: a hot spare takes its node rank, or without a spare the gang restarts "
        "re-planned without it. Either way it is added to status.excludedNodes; it is never cordoned.",
        default="Report",
    )


@dataclasses.dataclass(frozen=True)
class SlowNode:
    """A node the last comparison window named."""

    node_rank: int = api_field("The node rank (pod) named.", minimum=0, json_name="nodeRank")
    node: str | None = api_field("The Kubernetes node it ran on.", default=None)
    factor: float = api_field("Its slowest rank's compute time over that rank's peers' median.", default=0.0)
    stage: int = api_field("The pipeline stage of that rank.", default=0, minimum=0)
    steps: list[int] = api_field("The window: first and last step.", default_factory=list)
