"""Leader election on a coordination.k8s.io Lease, with fencing, and the detection of rival operators.

One active operator per Lease: the kubernetes client's own leader election (`kubernetes.leaderelection`, its
`LeaseLock`) runs on this operator's connection. A candidate takes the Lease when it is free or has expired,
then renews it every `retry_seconds`; a replica that does not hold it acts on nothing (`handlers.registry`
asks `Leadership.leading` before every pass, admission, timer and progress copy) and reports who holds it.
A leader that has not renewed for `renew_deadline_seconds` exits the process at once (`os._exit`): that is
shorter than the Lease's duration, so it has stopped acting before any other replica may take the Lease,
and its Deployment starts it again as a candidate. A watchdog thread enforces the deadline even when a
renewal request hangs (the client's LeaseLock sets no request timeout).

Rival operators: each operator's Lease carries the label `paralleljob.io/operator-lease` and, in the
annotation `paralleljob.io/managed-namespaces`, the namespaces it manages (`*`: all). The leader lists the
labelled Leases of the whole cluster every `lease_seconds`; one that is held and fresh, is not its own, and
manages a namespace this operator also manages is a rival: a second operator (another Helm release, or one
started by hand with another Lease name) that acts on the same jobs. So is one whose namespaces are disjoint
but whose Lease announces another admission lock (annotation `paralleljob.io/admission-lock`, the
`--admission-lock` Lease, empty for none): it books the same GPUs without taking turns with this one.
`Leadership` hands the rivals to its `on_rivals` callback whenever the set changes; the handlers log, post an
Event on the Lease and set a metric.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kubernetes
import urllib3
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock import leaselock

from paralleljob.k8s.session import Session
from paralleljob.manifests import timestamps

log = logging.getLogger(__name__)
# The client's elector logs every renewal of a held Lease ("leader ... has successfully acquired lease") and
# every retry of a standby at info: a line every second or two in the operator's pod log. Its warnings and
# errors stay; who leads, and when that changes, is logged here once.
logging.getLogger(leaderelection.logger.name).setLevel(logging.WARNING)

LOST_LEASE_EXIT = 3
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
OPERATOR_LEASE_LABEL = "paralleljob.io/operator-lease"
MANAGED_NAMESPACES = "paralleljob.io/managed-namespaces"
ADMISSION_LOCK = "paralleljob.io/admission-lock"
EVERY_NAMESPACE = "*"


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is, how it is timed (controller-runtime's defaults: 15 s, 10 s, 2 s), and the
    namespaces this operator manages (None: all), which its Lease announces to other operators."""

    name: str = "paralleljob-operator"
    namespace: str = "default"
    lease_seconds: int = 15
    renew_deadline_seconds: int = 10
    retry_seconds: int = 2
    managed: tuple[str, ...] | None = None
    admission_lock: str = ""  # namespace/name of the --admission-lock Lease; empty: none

    @classmethod
    def timed(
        cls,
        name: str,
        namespace: str,
        lease_seconds: int,
        managed: tuple[str, ...] | None,
        admission_lock: str = "",
    ) -> LeaseSettings:
        """Settings whose renew deadline (2/3) and retry period (1/7) follow the Lease duration."""
        lease_seconds = max(lease_seconds, 3)
        renew, retry = max(lease_seconds * 2 // 3, 2), max(lease_seconds // 7, 1)
        return cls(name, namespace, lease_seconds, renew, retry, managed, admission_lock)

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class Rival:
    """Another operator's Lease that is held and manages some of the namespaces this operator manages."""

    lease: str  # namespace/name
    holder: str
    shared: tuple[str, ...] | None  # the namespaces both manage (None: every namespace; (): none)
    # Set when the namespaces are disjoint but the admission locks differ: (theirs, ours), "" for none.
    locks: tuple[str, str] | None = None

    def describe(self) -> str:
        if self.locks is not None:
            theirs, ours = (lock or "no admission lock" for lock in self.locks)
            return f"operator {self.holder} (Lease {self.lease}) admits under {theirs}, this one under {ours}"
        scope = "every namespace" if self.shared is None else "namespaces " + ", ".join(self.shared)
        return f"operator {self.holder} (Lease {self.lease}) also manages ParallelJobs in {scope}"


def own_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (from its service account), else `default`."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as found:
            return found.read().strip() or default
    except OSError:
        return default


def identity() -> str:
    """This replica's name in the Lease: the pod's hostname, made unique per process."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def managed_text(managed: tuple[str, ...] | None) -> str:
    return EVERY_NAMESPACE if managed is None else ",".join(sorted(managed))


def managed_of(text: str | None) -> tuple[str, ...] | None:
    """The namespaces a Lease's annotation names (absent or `*`: every namespace)."""
    if text is None or text.strip() == EVERY_NAMESPACE:
        return None
    return tuple(sorted(part.strip() for part in text.split(",") if part.strip()))


def shared_namespaces(mine: tuple[str, ...] | None, theirs: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The namespaces two operators both manage: None for every namespace, () for none."""
    if mine is None or theirs is None:
        return theirs if mine is None else mine
    return tuple(sorted(set(mine) & set(theirs)))


def rivals(leases: Sequence[Mapping[str, Any]], settings: LeaseSettings, at: datetime.datetime) -> list[Rival]:
    """The operator Leases, other than this one, that are held, not expired at `at`, and overlap ours or, with
    disjoint namespaces, announce another admission lock."""
    found = []
    for lease in leases:
        metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        where = f"{metadata.get('namespace')}/{metadata.get('name')}"
        holder, renewed = spec.get("holderIdentity"), spec.get("renewTime") or spec.get("acquireTime")
        if where == settings.where or not holder or not renewed:
            continue
        age = timestamps.seconds_since(renewed, at)
        if age is None or age > float(spec.get("leaseDurationSeconds") or settings.lease_seconds):
            continue
        annotations = metadata.get("annotations") or {}
        shared = shared_namespaces(settings.managed, managed_of(annotations.get(MANAGED_NAMESPACES)))
        their_lock = str(annotations.get(ADMISSION_LOCK) or "")
        if shared != ():
            found.append(Rival(where, str(holder), shared))
        elif their_lock != settings.admission_lock:
            found.append(Rival(where, str(holder), shared, (their_lock, settings.admission_lock)))
    return sorted(found, key=lambda rival: rival.lease)


class _AnnouncingLock(leaselock.LeaseLock):
    """The client's LeaseLock on our connection: it labels the Lease as an operator's and announces the
    namespaces it manages, and records when this replica last wrote the Lease (for the fence)."""

    def __init__(self, session: Session, settings: LeaseSettings, holder: str) -> None:
        super().__init__(settings.name, settings.namespace, holder)  # type: ignore[no-untyped-call]  # the client's LeaseLock is unannotated
        self.api_instance = kubernetes.client.CoordinationV1Api(session.client)
        self._settings = settings
        self.renewed_at: float | None = None

    def _announce(self, metadata: Any) -> Any:
        if metadata is None or isinstance(metadata, dict):
            metadata = kubernetes.client.V1ObjectMeta(**(metadata or {}))
        metadata.labels = {**(metadata.labels or {}), OPERATOR_LEASE_LABEL: "true"}
        managed = managed_text(self._settings.managed)
        announced = {MANAGED_NAMESPACES: managed, ADMISSION_LOCK: self._settings.admission_lock}
        metadata.annotations = {**(metadata.annotations or {}), **announced}
        return metadata

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        body = kubernetes.client.V1Lease(
            metadata=self._announce({"name": name}),
            spec=self.get_lease_spec(election_record),  # type: ignore[no-untyped-call]  # the client's LeaseLock is unannotated
        )
        try:
            self.lease_reference = self.api_instance.create_namespaced_lease(namespace, body)
        except kubernetes.client.ApiException as error:
            log.info("could not create the Lease %s: %s", self._settings.where, error.reason)
            return False
        self.renewed_at = time.monotonic()
        return True

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        if self.lease_reference is not None:
            self.lease_reference.metadata = self._announce(self.lease_reference.metadata)
        done = bool(super().update(name, namespace, updated_record))  # type: ignore[no-untyped-call]  # the client's LeaseLock is unannotated
        if done:
            self.renewed_at = time.monotonic()
        return done

    def reference(self) -> dict[str, Any]:
        """The Lease as an Event's involvedObject needs it (with its uid, which `kubectl describe` matches)."""
        uid = getattr(getattr(self.lease_reference, "metadata", None), "uid", None)
        metadata = {"name": self._settings.name, "namespace": self._settings.namespace, "uid": uid}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata}

    def holder(self) -> str | None:
        """Who holds the Lease now, as last read (None when unknown)."""
        return getattr(getattr(self.lease_reference, "spec", None), "holder_identity", None)


class Leadership:
    """One replica's candidacy: `start()` campaigns in the background; `leading` is True while it holds the
    Lease. `on_lost` (default: exit the process at once) is called when a leader cannot renew in time;
    `on_rivals` with the current rivals whenever they change, while leading."""

    def __init__(
        self,
        session: Session,
        settings: LeaseSettings,
        on_lost: Callable[[], None] | None = None,
        on_rivals: Callable[[list[Rival]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.identity = identity()
        self._session = session
        self._lock = _AnnouncingLock(session, settings, self.identity)
        self._leading = threading.Event()
        self._on_lost = on_lost or _exit_at_once
        self._on_rivals = on_rivals
        config = electionconfig.Config(
            self._lock,
            settings.lease_seconds,
            settings.renew_deadline_seconds,
            settings.retry_seconds,
            self._leading.set,
            self._lost,
        )
        self._election = leaderelection.LeaderElection(config)

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def lease(self) -> dict[str, Any]:
        """The Lease, to post Events on."""
        return self._lock.reference()

    def start(self, on_leading: Callable[[], None] | None = None) -> None:
        """Campaign in the background; `on_leading` is called (on a thread) once this replica holds the Lease."""

        def campaign() -> None:
            self.wait_until_leading()
            if on_leading is not None:
                on_leading()
            if self._on_rivals is not None:
                self._watch_rivals()

        threading.Thread(target=campaign, name="lease-candidate", daemon=True).start()

    def wait_until_leading(self, report_every: float = 30.0) -> None:
        """Block until this replica holds the Lease, reporting the holder meanwhile; then start the fence."""
        threading.Thread(target=self._election.run, name="lease-election", daemon=True).start()
        reported: tuple[str | None, float] = (None, 0.0)
        while not self._leading.wait(1.0):
            holder = self._lock.holder()
            fresh = holder != reported[0] or time.monotonic() - reported[1] > report_every
            if holder and holder != self.identity and fresh:
                log.warning("not acting: Lease %s is held by %s (another replica)", self.settings.where, holder)
                reported = (holder, time.monotonic())
        log.warning("%s leads: it holds the Lease %s", self.identity, self.settings.where)
        threading.Thread(target=self._fence, name="lease-fence", daemon=True).start()

    def _fence(self) -> None:
        """Stop at once when the Lease has not been renewed within the renew deadline, even if a renewal hangs."""
        while True:
            time.sleep(0.2)
            renewed = self._lock.renewed_at
            if renewed is None or time.monotonic() - renewed > self.settings.renew_deadline_seconds:
                self._lost()
                return

    def _lost(self) -> None:
        self._leading.clear()
        log.critical("%s lost the Lease %s: stopping at once", self.identity, self.settings.where)
        self._on_lost()

    def _watch_rivals(self) -> None:
        assert self._on_rivals is not None
        known: list[Rival] | None = None
        while self.leading:
            try:
                found = rivals(list_operator_leases(self._session), self.settings, datetime.datetime.now(datetime.UTC))
            except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                log.warning("could not list the operators' Leases: %s", error)
                found = known or []
            if found != known:
                self._on_rivals(found)
                known = found
            time.sleep(self.settings.lease_seconds)


def list_operator_leases(session: Session) -> list[dict[str, Any]]:
    """Every operator's Lease in the cluster (selected by label, so node heartbeats are not read)."""
    api = kubernetes.client.CoordinationV1Api(session.client)
    reply = session.send(api.list_lease_for_all_namespaces, label_selector=OPERATOR_LEASE_LABEL)
    return list((reply.body or {}).get("items") or [])


def _exit_at_once() -> None:
    # Not sys.exit: no cleanup may run another API call once another replica may be leading.
    logging.shutdown()
    os._exit(LOST_LEASE_EXIT)
