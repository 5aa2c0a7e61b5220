"""The cluster-wide admission lock: a coordination.k8s.io Lease that every operator of the cluster takes before
it plans an admission and releases once the placement is written.

Leader election makes one operator active per release, and its single admission worker never plans two jobs
onto the same GPUs. Operators installed per team (the chart's `watchNamespaces`) are several active
operators, each with its own worker: they read each other's reservations (every ParallelJob's placement), but
two of them admitting at the same moment both read the cluster before either has written, and both place on
the same free nodes. Sharing this Lease serialises their admissions: a holder reads the reservations, plans and
writes the placement while no other operator plans.

The Lease is taken the way client-go's leader election takes one: created when absent, or replaced (with its
resourceVersion, so that of two takers exactly one succeeds) when it is free or has expired. Expiry is judged
as client-go judges it, by no clock but the waiter's own: a Lease whose resourceVersion this operator has seen
unchanged for its `leaseDurationSeconds` is expired, whatever the times written in it say, so clock skew
between operators, or between an operator and the API server, can neither steal a held lock nor keep a dead
holder's lock forever. A holder that dies keeps the others waiting at most `hold_seconds` from the moment they
first saw its Lease; a holder whose pass outlasts `safe_seconds` (2/3 of that, as a leader's renew deadline)
must not write the placement (`Hold.check`), since another operator may take the Lease once it expires.

Called by `handlers.registry` around each admission pass; `handlers.reconcile` checks the hold just before it
writes the attempt and placement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Iterator
from typing import Any

import kubernetes

from paralleljob.k8s.session import Session

log = logging.getLogger(__name__)

DEFAULT_NAME = "paralleljob-admission"
ADMISSION_LOCK_LABEL = "paralleljob.io/admission-lock"
POLL_SECONDS = 0.2


class LockBusy(Exception):
    """The lock stayed held by another operator for as long as this one may wait."""


class HoldExpired(Exception):
    """This pass held the lock too long to write safely: another operator may hold it now."""


@dataclasses.dataclass(frozen=True)
class LockSettings:
    """Which Lease (`namespace/name`) and how long a hold may last before others may take it."""

    namespace: str
    name: str = DEFAULT_NAME
    hold_seconds: int = 30
    wait_seconds: float = 60.0

    @classmethod
    def parse(cls, text: str) -> LockSettings:
        """`NAMESPACE/NAME` or `NAMESPACE` (the default name), as the `--admission-lock` flag takes it."""
        namespace, _, name = text.strip().partition("/")
        if not namespace or "/" in name:
            raise ValueError(f"--admission-lock {text!r}: expected NAMESPACE or NAMESPACE/NAME")
        return cls(namespace, name or DEFAULT_NAME)

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def safe_seconds(self) -> float:
        return self.hold_seconds * 2 / 3


@dataclasses.dataclass
class Hold:
    """One holding of the lock, from the moment the Lease was written in our name."""

    settings: LockSettings
    taken_at: float  # time.monotonic()

    def check(self) -> None:
        """Raise HoldExpired when this hold is too old to write under."""
        held = time.monotonic() - self.taken_at
        if held > self.settings.safe_seconds:
            raise HoldExpired(
                f"the admission lock {self.settings.where} was held {held:.0f}s, past the safe "
                f"{self.settings.safe_seconds:.0f}s: the pass is retried rather than write a placement unguarded"
            )


def micro_time(moment: datetime.datetime) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Observed:
    """A version of the Lease as this operator saw it, and since when (its monotonic clock)."""

    version: str
    since: float

    @classmethod
    def of(cls, lease: dict[str, Any] | None, before: Observed | None, at: float) -> Observed:
        """What is observed now: `before` while the Lease is unchanged, else its new version from `at`."""
        version = str(((lease or {}).get("metadata") or {}).get("resourceVersion"))
        return before if before is not None and before.version == version else cls(version, at)


def holder_of(lease: dict[str, Any] | None) -> str | None:
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


def free(lease: dict[str, Any] | None, holder: str, observed: Observed, at: float) -> bool:
    """Whether `holder` may take the Lease: absent, released, its own, or seen unchanged (`observed`) for longer
    than its duration (`at` and `observed.since` on this process's monotonic clock)."""
    current = holder_of(lease)
    if not current or current == holder:
        return True
    duration = float(((lease or {}).get("spec") or {}).get("leaseDurationSeconds") or 0)
    return at - observed.since > duration


class AdmissionLock:
    """The Lease-based lock of one operator (`holder` names it in the Lease)."""

    def __init__(self, session: Session, settings: LockSettings, holder: str) -> None:
        self.settings, self.holder = settings, holder
        self._session = session
        self._api = kubernetes.client.CoordinationV1Api(session.client)

    @contextlib.contextmanager
    def held(self) -> Iterator[Hold]:
        """Hold the lock for the block; released after it, whatever it raised."""
        lease = self._take()
        hold = Hold(self.settings, time.monotonic())
        try:
            yield hold
        finally:
            self._release(lease)

    def _take(self) -> dict[str, Any]:
        """Write the Lease in our name, waiting while another operator holds it; the Lease as written."""
        deadline = time.monotonic() + self.settings.wait_seconds
        reported, observed = False, None
        while True:
            lease, now = self._read(), time.monotonic()
            observed = Observed.of(lease, observed, now)
            if free(lease, self.holder, observed, now):
                written = self._write(lease, self._session.server_now())
                if written is not None:
                    return written
            elif not reported:
                log.info("admission waits for the lock %s, held by %s", self.settings.where, holder_of(lease))
                reported = True
            if now > deadline:
                raise LockBusy(
                    f"the admission lock {self.settings.where} stayed held by {holder_of(lease)} for "
                    f"{self.settings.wait_seconds:.0f}s"
                )
            time.sleep(POLL_SECONDS)

    def _read(self) -> dict[str, Any] | None:
        reply = self._session.send(
            self._api.read_namespaced_lease, self.settings.name, self.settings.namespace, tolerate={404}
        )
        return reply.body if isinstance(reply.body, dict) else None

    def _write(self, lease: dict[str, Any] | None, now: datetime.datetime) -> dict[str, Any] | None:
        """Take the Lease with one create or one replace at its resourceVersion; None when another took it first."""
        spec = (lease or {}).get("spec") or {}
        taken = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.settings.hold_seconds,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (holder_of(lease) != self.holder),
        }
        namespace, name = self.settings.namespace, self.settings.name
        if lease is None:
            metadata = {"name": name, "namespace": namespace, "labels": {ADMISSION_LOCK_LABEL: "true"}}
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": taken}
            reply = self._session.send(self._api.create_namespaced_lease, namespace, body, tolerate={409})
        else:
            body = {**lease, "spec": {**spec, **taken}}
            reply = self._session.send(self._api.replace_namespaced_lease, name, namespace, body, tolerate={409})
        return reply.body if reply.status == 200 else None

    def _release(self, lease: dict[str, Any]) -> None:
        """Clear our name from the Lease, at the resourceVersion we wrote: a 409 means our hold had expired and
        another operator took the Lease, which is then left alone."""
        spec = {**(lease.get("spec") or {}), "holderIdentity": None}
        body = {**lease, "spec": spec}
        try:
            self._session.send(
                self._api.replace_namespaced_lease,
                self.settings.name,
                self.settings.namespace,
                body,
                tolerate={409, 404},
            )
        except Exception:  # the Lease expires on its own; the next admission is not held up by a failed release
            log.warning("could not release the admission lock %s", self.settings.where, exc_info=True)
