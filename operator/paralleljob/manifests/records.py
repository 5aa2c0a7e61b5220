"""The attempt record: what the operator decided for one gang attempt, kept in the job's `<job>-config` ConfigMap.

Pure. `attempt.json` is written only by the operator (no pod's account may write the `-config` ConfigMap) and
holds: the attempt number (the gang restart count against backoffLimit), the spec the attempt was admitted
with as YAML (the chosen layout applied; so every pod of the attempt is built from it: image, command, env,
volumes, resources, never from a later edit), the trainer image the operator resolved, the node of each node
rank, the nodes excluded so far, and what became of the attempt: all its pods created (`placed`), a gang
restart into the next attempt (`restartedAs`, with why), or the job's end (`outcome`).

The operator's decisions come from this record: which attempt is live, its placement, the restart count, the
excluded nodes, whether the job has finished. The job's status is written from it for people and for the
admission queue's order, and is believed only when the record is missing (a ConfigMap someone deleted, or a
job between two attempts' ConfigMaps).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.api import types as api_types

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
    placed: bool = False
    restarted_as: int | None = None
    restart_reason: str = ""
    outcome: str | None = None

    @property
    def live(self) -> bool:
        """Its pods are (or are to be) the job's current gang."""
        return self.restarted_as is None and self.outcome is None

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
            "placed": self.placed,
            "restartedAs": self.restarted_as,
            "restartReason": self.restart_reason,
            "outcome": self.outcome,
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    def with_placed(self) -> AttemptRecord:
        return dataclasses.replace(self, placed=True)

    def with_restart(self, reason: str, excluded: Sequence[str], *, into: int) -> AttemptRecord:
        return dataclasses.replace(self, restarted_as=into, restart_reason=reason, excluded_nodes=tuple(excluded))

    def with_outcome(self, phase: str) -> AttemptRecord:
        return dataclasses.replace(self, outcome=phase)


def parse_record(text: str) -> AttemptRecord:
    """The record in `attempt.json`; ValueError when it is not one this operator wrote."""
    body = json.loads(text)
    if not isinstance(body, dict) or body.get("version") != RECORD_VERSION:
        raise ValueError(f"{RECORD_FILE} is not a version {RECORD_VERSION} attempt record")
    restarted = body.get("restartedAs")
    outcome = body.get("outcome")
    return AttemptRecord(
        attempt=int(body["attempt"]),
        spec=dict(body["spec"]),
        image=str(body["image"]),
        nodes=tuple(str(node) for node in body["nodes"]),
        excluded_nodes=tuple(str(node) for node in body.get("excludedNodes") or ()),
        placed=bool(body.get("placed")),
        restarted_as=int(restarted) if restarted is not None else None,
        restart_reason=str(body.get("restartReason") or ""),
        outcome=str(outcome) if outcome is not None else None,
    )


def record_of(config_map: Mapping[str, Any] | None) -> AttemptRecord | None:
    """The record of a ConfigMap of ours; None without a readable one (none, or written by an older operator)."""
    text = ((config_map or {}).get("data") or {}).get(RECORD_FILE)
    if not text:
        return None
    try:
        return parse_record(text)
    except (ValueError, KeyError, TypeError):
        return None


def same_spec(record: AttemptRecord, spec: Mapping[str, Any]) -> bool:
    """Whether `spec` (as `api.types.spec_to_dict` writes it) is the one the attempt was admitted with."""
    return json.loads(json.dumps(spec)) == record.spec


def pinned_document(record: AttemptRecord, name: str, namespace: str) -> dict[str, Any]:
    """The ParallelJob document of the attempt's pinned spec, to validate into the attempt's ResolvedJob."""
    return {
        "apiVersion": api_types.API_VERSION,
        "kind": api_types.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": json.loads(json.dumps(record.spec)),
    }
