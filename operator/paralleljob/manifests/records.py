"""The attempt record: what the operator decided for one gang attempt, kept in the job's `<job>-config` ConfigMap.

Pure. `attempt.json` is written only by the operator (no pod's account may write the `-config` ConfigMap) and
holds: the attempt number (the gang restart count against backoffLimit), the spec the attempt was admitted
with as YAML (the chosen layout applied; so every pod of the attempt is built from it: image, command, env,
volumes, resources, never from a later edit), the layout search's choice for a job that gave a GPU budget, the
trainer image the operator resolved, the node of each node rank and the GPUs each holds, the nodes excluded so
far (and which of them for a verdict on the node itself, `suspectNodes`), when the gang first ran (`startedAt`) and rank 0's network verdict once it came, the hot spares it holds
(`spareNodes`) and the node ranks being moved onto one (`replacing`), and what became of the attempt: all its pods created (`placed`), a
gang restart into the next attempt (`restartedAs`, with why, and the old nodes it holds until `heldUntil`), a
name held by someone else that released its nodes (`conflict`), or the job's end (`outcome`). For a job queued
through Kueue (`handlers.queueing`): Kueue's eviction of the attempt while it ran (`eviction`: reason, message,
since when, and the checkpoint asked of rank 0 before the gang stops), and the gang stopped for it (`evicted`:
the attempt holds nothing, and the next admission re-places the same attempt number, so an eviction is not a
restart against backoffLimit).

Every decision of the operator comes from this record: which attempt is live, its placement, the restart count,
the excluded nodes, the restart hold, whether and since when the gang runs, whether the job has finished, and
the reservations every admission plans around (`reservations_of`, over every job's record in the cluster). The
job's status is written from it for people, and never read back: a job without a record has no attempt. The
ConfigMap carries RESERVING_LABEL while the record reserves nodes, so the admissions list only those records.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from paralleljob.api import types as api_types
from paralleljob.manifests import configmap, labels
from paralleljob.planning.inventory import Reservation

RECORD_FILE = "attempt.json"
RECORD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One attempt's record, as stored in `attempt.json`."""

    attempt: int
    spec: Mapping[str, Any]
    image: str
    nodes: tuple[str, ...]
    excluded_nodes: tuple[str, ...] = ()
    # Of the excluded nodes, those excluded for a verdict on the node itself (a slow link the link check named, a
    # straggler, a node its stalled pods waited on), not merely where a pod failed: when the job does not fit
    # without every excluded node, it is planned without these before it is planned on them
    # (`handlers.placement.plan`).
    suspect_nodes: tuple[str, ...] = ()
    placed: bool = False
    restarted_as: int | None = None
    restart_reason: str = ""
    outcome: str | None = None
    # GPUs each node rank's pod requests (0 in a record of an older operator: plan.json's ranksPerNode says).
    gpus_per_node: int = 0
    layout_choice: Mapping[str, Any] | None = None
    started_at: str | None = None  # RFC 3339: when the gang was first seen running
    held_nodes: tuple[str, ...] = ()  # a restart's old nodes, kept from other jobs until held_until
    held_until: str | None = None
    conflict: str = ""  # the name conflict that released the attempt's nodes
    # Rank 0's network verdict (verified, reason, message), once it arrived, as `manifests.progress` reads it.
    network_report: Mapping[str, str] | None = None
    # Kueue evicted the attempt: reason, message, since (RFC 3339), checkpointRequest (an id, or absent) and
    # checkpointStep (rank 0's last checkpoint step when it was asked); `evicted`: its gang was stopped for it.
    eviction: Mapping[str, str] | None = None
    evicted: bool = False
    # Hot spares (spec.failurePolicy.spareNodes) the attempt holds, and the node ranks whose pods are being
    # recreated on a spare (their node in `nodes` is the spare already).
    spare_nodes: tuple[str, ...] = ()
    replacing: tuple[int, ...] = ()
    # The DP shrink: once a shrunk attempt fits at full size again, the checkpoint step rank 0 had reported then
    # (-1 for none): the gang grows back after a newer one. Gang restarts that were grow-backs, carried from
    # attempt to attempt, do not count against backoffLimit.
    grow_after: int | None = None
    grow_restarts: int = 0
    # In-place restarts of this attempt's pods (their supervisors restarted every rank without a new pod), as
    # rank 0 reported them; each counts against backoffLimit like a gang restart (`restarts`).
    in_place_restarts: int = 0

    @property
    def live(self) -> bool:
        """Its pods are (or are to be) the job's current gang."""
        return self.restarted_as is None and self.outcome is None and not self.conflict and not self.evicted

    @property
    def reserving(self) -> bool:
        """Whether it keeps nodes from other jobs: its live attempt's, or a restart's hold on the old ones."""
        return self.live or (self.restarted_as is not None and bool(self.held_nodes))

    @property
    def restarts(self) -> int:
        """The job's restarts against backoffLimit so far: the attempt number (every restart before this
        attempt's pods), and the in-place restarts those pods made."""
        return self.attempt + self.in_place_restarts

    @property
    def next_attempt(self) -> int:
        """The attempt the job is on: this one, or the one it restarted into."""
        return self.restarted_as if self.restarted_as is not None else self.attempt

    def to_json(self) -> str:
        body = {
            "version": RECORD_VERSION,
            "attempt": self.attempt,
            "image": self.image,
            "spec": self.spec,
            "nodes": list(self.nodes),
            "excludedNodes": list(self.excluded_nodes),
            "suspectNodes": list(self.suspect_nodes),
            "placed": self.placed,
            "restartedAs": self.restarted_as,
            "restartReason": self.restart_reason,
            "outcome": self.outcome,
            "gpusPerNode": self.gpus_per_node,
            "layoutChoice": self.layout_choice,
            "startedAt": self.started_at,
            "heldNodes": list(self.held_nodes),
            "heldUntil": self.held_until,
            "conflict": self.conflict,
            "networkReport": self.network_report,
            "eviction": self.eviction,
            "evicted": self.evicted,
            "spareNodes": list(self.spare_nodes),
            "replacing": list(self.replacing),
            "growAfter": self.grow_after,
            "growRestarts": self.grow_restarts,
            "inPlaceRestarts": self.in_place_restarts,
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    def with_in_place_restarts(self, count: int) -> AttemptRecord:
        return dataclasses.replace(self, in_place_restarts=count)

    def with_placed(self) -> AttemptRecord:
        return dataclasses.replace(self, placed=True)

    def with_started(self, at: str, network_report: Mapping[str, str] | None) -> AttemptRecord:
        return dataclasses.replace(self, started_at=at, network_report=network_report)

    def with_restart(
        self,
        reason: str,
        excluded: Sequence[str],
        *,
        into: int,
        held: Sequence[str] = (),
        until: str | None = None,
        suspect: Sequence[str] = (),
    ) -> AttemptRecord:
        return dataclasses.replace(
            self,
            restarted_as=into,
            restart_reason=reason,
            excluded_nodes=tuple(excluded),
            suspect_nodes=tuple(suspect),
            held_nodes=tuple(held),
            held_until=until if held else None,
        )

    def without_hold(self) -> AttemptRecord:
        return dataclasses.replace(self, held_nodes=(), held_until=None)

    def with_conflict(self, message: str) -> AttemptRecord:
        return dataclasses.replace(self, conflict=message)

    def with_outcome(self, phase: str) -> AttemptRecord:
        return dataclasses.replace(self, outcome=phase)

    def with_eviction(self, eviction: Mapping[str, str]) -> AttemptRecord:
        return dataclasses.replace(self, eviction=dict(eviction))

    def with_evicted(self) -> AttemptRecord:
        return dataclasses.replace(self, evicted=True)

    def with_spares_taken(self, taken: Mapping[int, str], lost_spares: Collection[str] = ()) -> AttemptRecord:
        """Node rank R moves to spare `taken[R]`, whose pod is to be recreated there; lost spares are dropped."""
        nodes = tuple(taken.get(rank, node) for rank, node in enumerate(self.nodes))
        left = tuple(node for node in self.spare_nodes if node not in taken.values() and node not in lost_spares)
        replacing = tuple(sorted({*self.replacing, *taken}))
        return dataclasses.replace(self, nodes=nodes, spare_nodes=left, replacing=replacing)

    def with_spares_added(self, added: Sequence[str]) -> AttemptRecord:
        return dataclasses.replace(self, spare_nodes=(*self.spare_nodes, *added))

    def with_grow_after(self, step: int) -> AttemptRecord:
        return dataclasses.replace(self, grow_after=step)

    def with_grow_restart(self) -> AttemptRecord:
        return dataclasses.replace(self, grow_restarts=self.grow_restarts + 1)

    @property
    def counted_restarts(self) -> int:
        """Restarts so far that count against backoffLimit: gang restarts but the grow-backs, and in-place ones."""
        # A restart's new attempt number counts the in-place restarts before it already (`restarts` + 1).
        return (self.restarted_as if self.restarted_as is not None else self.restarts) - self.grow_restarts

    def with_replaced(self) -> AttemptRecord:
        """The pods of the replaced node ranks were created on their spares."""
        return dataclasses.replace(self, replacing=())

    def hold_ends(self) -> datetime.datetime | None:
        """When a restart's hold on the old nodes ends; None without one (or with an unreadable time)."""
        if not self.held_nodes or not self.held_until:
            return None
        try:
            return datetime.datetime.fromisoformat(self.held_until.replace("Z", "+00:00"))
        except ValueError:
            return None


def parse_record(text: str) -> AttemptRecord:
    """The record in `attempt.json`; ValueError when it is not one this operator wrote."""
    body = json.loads(text)
    if not isinstance(body, dict) or body.get("version") != RECORD_VERSION:
        raise ValueError(f"{RECORD_FILE} is not a version {RECORD_VERSION} attempt record")
    restarted = body.get("restartedAs")
    outcome = body.get("outcome")
    choice = body.get("layoutChoice")
    return AttemptRecord(
        attempt=int(body["attempt"]),
        spec=dict(body["spec"]),
        image=str(body["image"]),
        nodes=tuple(str(node) for node in body["nodes"]),
        excluded_nodes=tuple(str(node) for node in body.get("excludedNodes") or ()),
        suspect_nodes=tuple(str(node) for node in body.get("suspectNodes") or ()),
        placed=bool(body.get("placed")),
        restarted_as=int(restarted) if restarted is not None else None,
        restart_reason=str(body.get("restartReason") or ""),
        outcome=str(outcome) if outcome is not None else None,
        gpus_per_node=int(body.get("gpusPerNode") or 0),
        layout_choice=dict(choice) if isinstance(choice, dict) else None,
        started_at=_text_or_none(body.get("startedAt")),
        held_nodes=tuple(str(node) for node in body.get("heldNodes") or ()),
        held_until=_text_or_none(body.get("heldUntil")),
        conflict=str(body.get("conflict") or ""),
        network_report=_texts_or_none(body.get("networkReport")),
        eviction=_texts_or_none(body.get("eviction")),
        evicted=bool(body.get("evicted")),
        spare_nodes=tuple(str(node) for node in body.get("spareNodes") or ()),
        replacing=tuple(int(rank) for rank in body.get("replacing") or ()),
        grow_after=int(body["growAfter"]) if body.get("growAfter") is not None else None,
        grow_restarts=int(body.get("growRestarts") or 0),
        in_place_restarts=int(body.get("inPlaceRestarts") or 0),
    )


def _text_or_none(value: Any) -> str | None:
    return str(value) if value else None


def _texts_or_none(value: Any) -> dict[str, str] | None:
    return {str(key): str(text) for key, text in value.items()} if isinstance(value, dict) else None


def record_of(config_map: Mapping[str, Any] | None) -> AttemptRecord | None:
    """The record of a ConfigMap of ours; None without a readable one (none, or written by an older operator)."""
    text = ((config_map or {}).get("data") or {}).get(RECORD_FILE)
    if not text:
        return None
    try:
        return parse_record(text)
    except (ValueError, KeyError, TypeError):
        return None


def labels_of(record: AttemptRecord) -> dict[str, str | None]:
    """The ConfigMap labels that go with the record (None: removed, in a merge patch)."""
    return {labels.RESERVING_LABEL: "true" if record.reserving else None}


def stamp(config_map: dict[str, Any], record: AttemptRecord) -> dict[str, Any]:
    """Put the record, and the labels that go with it, into a ConfigMap being built; returns it."""
    config_map.setdefault("data", {})[RECORD_FILE] = record.to_json()
    found = config_map["metadata"].setdefault("labels", {})
    for key, value in labels_of(record).items():
        if value is None:
            found.pop(key, None)
        else:
            found[key] = value
    return config_map


def reservations_of(
    config_maps: Iterable[Mapping[str, Any]],
    exclude: tuple[str, str] | None = None,
    *,
    bound: Collection[tuple[str, str]] = (),
    now: datetime.datetime | None = None,
) -> list[Reservation]:
    """The GPUs jobs' records keep from other jobs, from their `-config` ConfigMaps: each node of a live attempt
    whose pod is not bound yet (a bound pod counts through its own requests: `bound` names the (namespace, pod)
    the usage index holds), and a restarting gang's old nodes until its hold ends. `exclude` is the
    (namespace, job) being planned. A ConfigMap that no ParallelJob controls, or without a readable record, holds
    nothing."""
    now = now or datetime.datetime.now(datetime.UTC)
    found: list[Reservation] = []
    for config_map in config_maps:
        metadata = config_map.get("metadata") or {}
        namespace, job = str(metadata.get("namespace")), str((metadata.get("labels") or {}).get(labels.JOB_LABEL))
        record = record_of(config_map)
        if record is None or labels.owner_uid(config_map) is None or (namespace, job) == exclude:
            continue
        gpus = record.gpus_per_node or _planned_gpus_per_node(config_map)
        holder = f"{namespace}/{job}"
        if record.live:
            for rank, node in enumerate(record.nodes):
                if (namespace, labels.pod_name(job, rank)) not in bound:
                    found.append(Reservation(node, gpus, holder))
            # Hot spares run no pod of the job: they hold their GPUs for as long as the attempt lives.
            found += [Reservation(node, gpus, holder) for node in record.spare_nodes]
        elif record.restarted_as is not None and (ends := record.hold_ends()) is not None and ends > now:
            found += [Reservation(node, gpus, holder) for node in record.held_nodes]
    return found


def _planned_gpus_per_node(config_map: Mapping[str, Any]) -> int:
    """plan.json's ranksPerNode (one GPU per rank), for a record written before it carried gpusPerNode."""
    try:
        return int(
            json.loads(((config_map.get("data") or {}).get(configmap.PLAN_FILE)) or "{}").get("ranksPerNode") or 0
        )
    except (ValueError, TypeError, AttributeError):
        return 0


def same_spec(record: AttemptRecord, spec: Mapping[str, Any]) -> bool:
    """Whether `spec` (as `api.types.spec_to_dict` writes it) is the one the attempt was admitted with."""
    return bool(json.loads(json.dumps(spec)) == record.spec)


def pinned_document(record: AttemptRecord, name: str, namespace: str) -> dict[str, Any]:
    """The ParallelJob document of the attempt's pinned spec, to validate into the attempt's ResolvedJob."""
    return {
        "apiVersion": api_types.API_VERSION,
        "kind": api_types.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": json.loads(json.dumps(record.spec)),
    }
