"""What one reconcile pass works with (`Pass`: the job, its attempt record, the watches' view, the operator's
`Settings`) and what it returns (`Outcome`), with the one look at nodes the watch does not know (`lost_nodes`).
Nothing here writes: the steps (`handlers.steps`, which decide from `handlers.observed` and do not import this)
decide, `k8s.apply` writes, and `handlers.reconcile` runs them in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from paralleljob import planning
from paralleljob.handlers import observed
from paralleljob.handlers.nodes import NodeSnapshot
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps.admission import AdmissionRequest
from paralleljob.k8s import reads
from paralleljob.k8s.session import Session
from paralleljob.manifests import records
from paralleljob.planning.inventory import TERMINAL_POD_PHASES, ClusterBuilder
from paralleljob.planning.usage import UsageSnapshot

# A job's terminal phases are named like a pod's.
TERMINAL = TERMINAL_POD_PHASES


@dataclasses.dataclass(frozen=True)
class NodeView:
    """What the watches know: the nodes that exist and those that are NotReady; for admission passes also the
    planner's node records, the usage index's totals and bound pods of the same moment, and the cluster
    builder that reuses unchanged records."""

    known: frozenset[str] = frozenset()
    not_ready: frozenset[str] = frozenset()
    snapshot: NodeSnapshot = dataclasses.field(default_factory=NodeSnapshot)
    usage: UsageSnapshot = dataclasses.field(default_factory=UsageSnapshot)
    builder: ClusterBuilder = dataclasses.field(default_factory=ClusterBuilder)
    # Every ParallelJob's reservations when the admission round began (None: not read). A pass plans against
    # these and the ones it reads itself, so GPUs released during a round go to the next round, in order.
    round_held: frozenset[planning.Reservation] | None = None
    # Failed image pulls per pod uid, counted from the job-pods watch (`start_failures.PullFailures`).
    pull_failures: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The step a pass took, whether GPUs may have been freed, and when to look at the job again."""

    step: str
    wake_others: bool = False
    requeue_after: float | None = None
    admission: AdmissionRequest | None = None  # set when the job waits for the admission queue
    # An admission that did not fit: the reservations it was planned against.
    held: tuple[planning.Reservation, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Pass(observed.JobFields):
    """What one pass works with."""

    session: Session
    settings: Settings
    job: Mapping[str, Any]
    nodes: NodeView
    admit: bool = False
    # The latest attempt's record (`manifests.records`), from the job's ConfigMap: what every decision comes
    # from. None before the first admission (or when someone deleted the ConfigMap: the job has no attempt).
    record: records.AttemptRecord | None = None
    # The job's `-config` ConfigMap when another owner holds the name (a name conflict before any attempt).
    foreign_config: Mapping[str, Any] | None = None
    # The job's own `-config` ConfigMap as the pass read it first (its plan and network, beside the record).
    config_map: Mapping[str, Any] | None = None
    # Why the current spec is invalid while its running attempt is still supervised from its record.
    spec_problem: str = ""
    # Called right before an admission writes its attempt and placement: raises when the cluster-wide
    # admission lock (`k8s.admission_lock`) is no longer safely held; None without the lock.
    fence: Callable[[], None] | None = None
    # The gang's lost-peer evidence (`handlers.lost_peers`: node -> why, and when the next falls due), weighed
    # once for the pass: its steps must not judge the same nodes on two reads of a report or Lease that can
    # change between them. None until weighed.
    gang_lost: tuple[Mapping[str, str], float | None] | None = None

    @property
    def live(self) -> records.AttemptRecord | None:
        """The record of the attempt whose pods are the job's current gang, when that attempt was admitted."""
        return self.record if self.record is not None and self.record.live else None

    @property
    def finished(self) -> bool:
        """Succeeded or Failed, as the record says."""
        return self.record is not None and self.record.outcome in TERMINAL

    @property
    def placed_nodes(self) -> list[str]:
        """The node of each node rank of the live attempt, from its record; empty when none is admitted."""
        return list(self.live.nodes) if self.live is not None else []

    @property
    def idle_phase(self) -> str:
        """The phase of a job between attempts: Restarting once it has restarted, else Pending."""
        return "Restarting" if self.attempt else "Pending"


def lost_nodes(p: Pass, names: Collection[str | None]) -> dict[str, str]:
    """Of these nodes, those NotReady or deleted, with why. The Node watch answers; a node it has not seen
    (it may not have listed yet) is looked up with one list before being called deleted."""
    wanted = {name for name in names if name}
    lost = {name: "is NotReady" for name in wanted if name in p.nodes.not_ready}
    unknown = wanted - p.nodes.known
    if unknown:
        existing = {name for name in unknown if reads.node_exists(p.session, name)}
        lost.update({name: "no longer exists" for name in unknown - existing})
    return lost
