"""The kopf handlers and the operator's watches: each one only turns a watch event into a reconcile request.

kopf watches ParallelJobs (their own changes) and rank 0's progress ConfigMaps (copied into status by
`handlers.progress`, apart from reconciles). Three informers (`paralleljob.k8s.informer`) watch the rest:
the pods labelled with a job (phase changes, deletions: each asks for a pass over its job; selected by the
API server, whereas kopf would list and watch every pod of the cluster and filter them itself), and what
admission plans from: Nodes (readiness, capacity, labels) in `NodeWatch`, and every bound pod's requests in
the usage index. Whenever GPUs may have been freed
(a Node changed, a bound pod ended or went away, a job was deleted, finished or restarted) the `RECHECK` pass
offers every job waiting in the admission queue again and requests a pass over every job whose attempt record
is live (the `-config` ConfigMaps labelled as reserving nodes); it reads no job's status. Supervision
passes run on the coalescer's threads; admissions on the admission queue's one worker, in its order, so a
restart never waits behind them; an admission pass first claims its job's key in the coalescer, so a job never
has two passes at once, whoever runs them (watch events, timers, resyncs, the admission worker). No handler stores progress in annotations and none adds a finalizer, so
deleting a job never waits for the operator, and a quiet cluster sees no writes. `configure()` must be
called before kopf starts.

Fencing (`--leader-elect`, `paralleljob.k8s.leadership`): `acting()` (in `handlers.runtime`, with `RUNTIME`)
is the one check of whether this replica may act, and `@fenced` applies it to every kopf handler, every coalescer pass (its timers included), every
admission pass and every request for one; a replica without the Lease keeps its watches (warm caches) and its
liveness endpoint, and writes nothing. A new handler, worker or loop must be decorated with `@fenced` (or
call `acting()` before each unit of work); once leading, it makes a pass over every job (`EVERY_JOB`), since
events seen while standing by were dropped.

The admission lock (`--admission-lock`, `paralleljob.k8s.admission_lock`): with it, every admission pass holds
the cluster-wide Lease while it reads the reservations, plans and writes the placement, so that the admission
workers of several operators (one per team) take turns; an operator that cannot take it in time retries the
pass with backoff and says so in the job's Reconciled condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any

import kopf

from paralleljob.api import types as api_types
from paralleljob.handlers import (
    coalescer,
    failures,
    job_metrics,
    metrics,
    progress,
    queueing,
    reconcile,
    start_failures,
)
from paralleljob.handlers.admission_queue import AdmissionQueue, Order, PriorityValues
from paralleljob.handlers.coalescer import Coalescer, Next
from paralleljob.handlers.runtime import (
    RUNTIME,
    Judged,
    Runtime,
    acting,
    coalescer_of,
    fenced,
    improved,
    on_loop,
    on_loop_wait,
)
from paralleljob.k8s import admission_lock, events, informer, leadership, reads
from paralleljob.k8s import session as session_config
from paralleljob.k8s.session import Session, connect
from paralleljob.manifests import labels as child_labels
from paralleljob.manifests import progress as progress_manifests
from paralleljob.manifests import records
from paralleljob.planning.inventory import Reservation

# What moved to handlers.runtime stays reachable here, where the handlers' callers found it.
__all__ = ["RUNTIME", "Judged", "Runtime", "acting", "configure", "fenced"]

log = logging.getLogger(__name__)
RECHECK = "recheck-unfinished-jobs"
EVERY_JOB = "pass-over-every-job"
RIVAL_OPERATOR = "RivalOperator"
# kopf's own API calls: watches end server-side after WATCH_SERVER_SECONDS and are abandoned client-side a
# little later, so a connection that died silently is noticed; other requests time out like ours.
WATCH_SERVER_SECONDS = 300
WATCH_CLIENT_SECONDS = 330
CONNECT_SECONDS = 10
REQUEST_SECONDS = 60
# A start that raised is run again this soon (kopf's default is 60 s): until then the replica neither acts nor
# stands by.
STARTUP_RETRY_SECONDS = 5.0


def configure(
    settings: reconcile.Settings,
    metrics_port: int = 0,
    kubeconfig: str | None = None,
    lease: leadership.LeaseSettings | None = None,
    admission_lock: admission_lock.LockSettings | None = None,
) -> None:
    RUNTIME.settings, RUNTIME.metrics_port, RUNTIME.kubeconfig = settings, metrics_port, kubeconfig
    if kubeconfig is not None:
        kopf.on.login()(_login_with_kubeconfig)
    RUNTIME.lease, RUNTIME.lock_settings = lease, admission_lock
    if settings.kueue:  # Kueue hook (handlers.queueing): a Workload's admission or eviction asks for a pass
        queueing.watch_workloads(_request)


def _view() -> reconcile.NodeView:
    """What a supervision pass needs of the watches: which nodes exist and which are NotReady."""
    snapshot = RUNTIME.nodes.snapshot()
    return reconcile.NodeView(snapshot.known, snapshot.not_ready, snapshot, pull_failures=RUNTIME.pulls.snapshot())


def _admission_view() -> reconcile.NodeView:
    """What an admission round plans from: the node records, the usage and every job's reservations of one
    moment, from the records that reserve nodes (no reservations when they cannot be read: each pass reads its
    own, and every waiting job ahead is tried again)."""
    snapshot, usage = RUNTIME.nodes.snapshot(), RUNTIME.usage.snapshot()
    held: frozenset[Reservation] | None = None
    try:
        assert RUNTIME.session is not None
        found = reads.list_reserving_config_maps(RUNTIME.session)
        held = frozenset(records.reservations_of(found, bound=usage.bound))
    except Exception as error:  # the API is down: the passes will fail and be retried
        log.warning("an admission round could not read the reservations: %s: %s", type(error).__name__, error)
    return reconcile.NodeView(snapshot.known, snapshot.not_ready, snapshot, usage, RUNTIME.builder, round_held=held)


@fenced(otherwise=Next())
def _pass(key: Hashable) -> Next:
    """A supervision pass (a coalescer thread): never admits, hands unplaced jobs to the admission queue."""
    assert RUNTIME.session is not None
    if key == RECHECK:
        return Next(keys=tuple(_jobs_to_recheck(RUNTIME.session)))
    if key == EVERY_JOB:
        return Next(keys=tuple(_every_job(RUNTIME.session)))
    if isinstance(key, progress.ProgressKey):
        copied = progress.copy_progress(RUNTIME.session, key)
        # A report of in-place restarts is counted by the job's own pass, into the attempt record.
        wanted = copied.in_place_reported or copied.stragglers_changed or copied.lost_peers_reported
        return Next(keys=((key.namespace, key.name),) if wanted else ())
    namespace, name = typing.cast(tuple[str, str], key)
    outcome = reconcile.reconcile(RUNTIME.session, RUNTIME.settings, namespace, name, _view())
    offer = _offer_later(namespace, name, outcome.admission) if outcome.admission is not None else None
    return Next(keys=(RECHECK,) if outcome.wake_others else (), after=outcome.requeue_after, then=offer)


def _order(namespace: str, name: str, request: reconcile.AdmissionRequest) -> Order:
    assert RUNTIME.priorities is not None
    priority = RUNTIME.priorities.value(request.priority_class)
    return Order.of(namespace, name, restarting=request.restarting, priority=priority, created=request.created)


def _offer_later(namespace: str, name: str, request: reconcile.AdmissionRequest) -> Callable[[], None]:
    """The offer a supervision pass makes once it is over (an admission pass would find the job's key still
    taken by it); its order is read now, in the pass's thread (a PriorityClass may be read from the API)."""
    order = _order(namespace, name, request)
    assert RUNTIME.admissions is not None
    admissions = RUNTIME.admissions
    return lambda: admissions.offer((namespace, name), order)


def _offer(namespace: str, name: str, request: reconcile.AdmissionRequest) -> None:
    assert RUNTIME.admissions is not None
    RUNTIME.admissions.offer((namespace, name), _order(namespace, name, request))


@fenced()
def _admission_pass(key: Hashable, view: reconcile.NodeView) -> Judged | None:
    """An admission pass (the admission worker's thread), never beside a supervision pass over the same job: it
    claims the job's key in the coalescer first. Returns what a job that did not fit was judged against, so
    that it keeps its place in the queue."""
    if not on_loop_wait(lambda: coalescer_of().claim(key)):
        # Its supervision pass is running: another follows it, and offers the job again if it still waits.
        log.debug("admission of %s waits for the pass over it that is running", key)
        return None
    try:
        return _admit_claimed(key, view)
    finally:
        on_loop(lambda: coalescer_of().release(key))


def _admit_claimed(key: Hashable, view: reconcile.NodeView) -> Judged | None:
    """The admission pass over a claimed key; what it asks of the scheduler goes to the loop."""
    assert RUNTIME.session is not None
    namespace, name = typing.cast(tuple[str, str], key)
    started = time.perf_counter()
    try:
        with _admission_hold() as fence:
            outcome = reconcile.reconcile(
                RUNTIME.session, RUNTIME.settings, namespace, name, view, admit=True, fence=fence
            )
        log.info("admission pass of %s/%s: %s in %.3fs", namespace, name, outcome.step, time.perf_counter() - started)
    except Exception as error:
        failed = RUNTIME.admission_failures[key] = RUNTIME.admission_failures.get(key, 0) + 1
        delay = coalescer.retry_delay(failed)
        log.exception("admission of %s/%s failed (%d in a row); retrying in %.0fs", namespace, name, failed, delay)
        _report_failure(key, error, failed)
        on_loop(lambda: coalescer_of().request_later(key, delay))
        return None  # the retry offers it again
    RUNTIME.admission_failures.pop(key, None)
    if outcome.admission is not None:  # not admitted by this pass (its own timer will bring it back)
        _offer(namespace, name, outcome.admission)

    def follow_up() -> None:
        coalescer_of().request_later(key, outcome.requeue_after)
        if outcome.wake_others:
            coalescer_of().request(RECHECK)

    on_loop(follow_up)
    return Judged.of(view, outcome.held) if outcome.held is not None else None


@contextlib.contextmanager
def _admission_hold() -> Iterator[Callable[[], None] | None]:
    """The cluster-wide admission lock for one pass, when configured; yields the check to make before the
    placement is written (None without the lock)."""
    if RUNTIME.lock is None:
        yield None
        return
    with RUNTIME.lock.held() as hold:
        yield hold.check


def _report_failure(key: Hashable, error: Exception, failed: int) -> None:
    """A pass over a job raised `failed` times in a row: say so on the job (`handlers.failures`)."""
    if RUNTIME.session is None or not isinstance(key, tuple):
        return
    namespace, name = typing.cast(tuple[str, str], key)
    try:
        failures.report(RUNTIME.session, namespace, name, error, failed)
    except Exception:
        log.warning("could not report the failure of %s/%s on the job", namespace, name, exc_info=True)


def _jobs_to_recheck(session: Session) -> list[tuple[str, str]]:
    """GPUs may have been freed: every job waiting in the admission queue is tried again (all of them in one
    round, so the order decides who gets freed GPUs first), and every job whose record has a live attempt,
    which may have lost its node, gets a pass. Only jobs a pass has found waiting are in the queue, so an
    invalid or finished job is never offered."""
    found = reads.list_reserving_config_maps(session, RUNTIME.settings.namespaces)
    placed = [key for key, record in _records_by_job(found) if record.live]
    assert RUNTIME.admissions is not None
    RUNTIME.admissions.offer_kept()
    return placed


def _records_by_job(
    config_maps: Iterable[Mapping[str, Any]],
) -> Iterator[tuple[tuple[str, str], records.AttemptRecord]]:
    """(namespace, job) and the attempt record of each job's `-config` ConfigMap that has one."""
    for config_map in config_maps:
        metadata = config_map.get("metadata") or {}
        job = (metadata.get("labels") or {}).get(child_labels.JOB_LABEL)
        record = records.record_of(config_map)
        if job and record is not None:
            yield (str(metadata.get("namespace")), str(job)), record


def _every_job(session: Session) -> list[tuple[str, str]]:
    """Every job this operator manages, for one pass each: when it starts to lead, the events it saw while
    standing by were dropped, so the queue and the timers know none of the jobs."""
    jobs = reads.list_jobs(session, RUNTIME.settings.namespaces)
    return [(job["metadata"]["namespace"], job["metadata"]["name"]) for job in jobs]


@fenced()
def _request(key: Hashable) -> None:
    if RUNTIME.coalescer is not None:
        RUNTIME.coalescer.request(key)


def _login_with_kubeconfig(**_: Any) -> kopf.ConnectionInfo:
    """kopf's connection from `--kubeconfig`: kopf's own login reads only in-cluster or $KUBECONFIG, so with the
    flag alone the operator ran out of credentials and exited. Registered only when the flag is given."""
    config = session_config.configuration_of(RUNTIME.kubeconfig)
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    scheme, _separator, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


@kopf.on.startup(backoff=STARTUP_RETRY_SECONDS)
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    """What can fail (the connection, the metrics port) comes before anything that runs on its own (the watches,
    the admission worker, the campaign for the Lease): kopf runs a start that raised again, and one that had
    campaigned before it raised left its first candidacy renewing the Lease while the second, which the fence
    asks, never got it. That replica held the Lease and acted on nothing, so no standby could take over (issue
    39: two replicas on one host network, the second's metrics port taken)."""
    # Our Events are posted by paralleljob.k8s.events; kopf's own log-to-Event posting would add writes.
    settings.posting.enabled = False
    settings.watching.server_timeout = WATCH_SERVER_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_SECONDS
    settings.watching.connect_timeout = CONNECT_SECONDS
    settings.networking.connect_timeout = CONNECT_SECONDS
    settings.networking.request_timeout = REQUEST_SECONDS
    connected = await asyncio.to_thread(connect, RUNTIME.kubeconfig)
    metrics.serve(RUNTIME.metrics_port)
    RUNTIME.session = session = connected
    RUNTIME.loop = asyncio.get_running_loop()
    RUNTIME.coalescer = Coalescer(_pass, on_failure=_report_failure)
    RUNTIME.priorities = PriorityValues(lambda name: reads.priority_value(session, name))
    wake = lambda: on_loop(lambda: _request(RECHECK))  # noqa: E731 - called from the informers' threads
    RUNTIME.informers = [
        informer.Informer(session, informer.NODES, RUNTIME.nodes, wake).start(),
        informer.Informer(session, informer.BOUND_PODS, RUNTIME.usage, wake).start(),
    ]
    RUNTIME.job_pods = informer.Informer(
        session, informer.JOB_PODS, JobPods(RUNTIME.settings.namespaces, RUNTIME.pulls)
    ).start()
    RUNTIME.admissions = AdmissionQueue(
        _admission_pass, _admission_view, ready=_watches_synced, improved=improved
    ).start()
    if RUNTIME.lease is None:
        metrics.LEADER.set(1)
    else:
        RUNTIME.election = leadership.Leadership(session, RUNTIME.lease, on_rivals=_report_rivals)
    if RUNTIME.lock_settings is not None:
        holder = RUNTIME.election.identity if RUNTIME.election is not None else leadership.identity()
        RUNTIME.lock = admission_lock.AdmissionLock(session, RUNTIME.lock_settings, holder)
    if RUNTIME.election is not None:  # last: once it leads, its passes use all of the above
        RUNTIME.election.start(on_leading=_now_leading)
    log.info("paralleljob operator started: %s", RUNTIME.settings)


def _now_leading() -> None:
    """The Lease is ours (a leadership thread): a pass over every job, as events seen while standing by were
    dropped."""
    metrics.LEADER.set(1)
    on_loop(lambda: _request(EVERY_JOB))


def _report_rivals(rivals: list[leadership.Rival]) -> None:
    """Another operator manages some of the same namespaces (a leadership thread): a log line and an Event on
    this operator's Lease per newly seen rival, and the rival count as a metric."""
    metrics.RIVAL_OPERATORS.set(len(rivals))
    new = [rival for rival in rivals if rival not in RUNTIME.rivals]
    RUNTIME.rivals = list(rivals)
    assert RUNTIME.session is not None and RUNTIME.election is not None
    lease = RUNTIME.election.lease()
    for rival in new:
        if rival.locks is not None:
            message = f"{rival.describe()}: their admissions and ours can pick the same free GPUs at the same "
            message += "moment; give every release the same admissionLock.namespace and admissionLock.name"
        else:
            message = f"{rival.describe()}: two operators would book the same GPUs; uninstall one, or give them "
            message += "disjoint watchNamespaces"
        log.error("rival operator: %s", message)
        events.post(RUNTIME.session, lease, "Warning", RIVAL_OPERATOR, message)


class JobPods:
    """The job-pods informer's sink: every event of a pod labelled with a job asks for a pass over that job
    (a pod of a namespace this operator does not watch is left alone); it keeps only the failed image pulls
    it sees (`start_failures.PullFailures`)."""

    def __init__(self, namespaces: tuple[str, ...] | None, pulls: start_failures.PullFailures) -> None:
        self._namespaces = namespaces
        self._pulls = pulls

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> int:
        for obj in objects:
            self.observe("ADDED", obj)
        return 0

    def observe(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        metadata = obj.get("metadata") or {}
        job = (metadata.get("labels") or {}).get(child_labels.JOB_LABEL)
        namespace = metadata.get("namespace")
        if job and (self._namespaces is None or namespace in self._namespaces):
            self._pulls.observe(event_type, obj)
            on_loop(lambda: _request((namespace, job)))
        return False


def _watches_synced(timeout: float) -> bool:
    """Whether every informer has listed the cluster once (waits up to `timeout` seconds)."""
    return all(each.synced.wait(timeout) for each in RUNTIME.informers)


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    for each in [*RUNTIME.informers, *([RUNTIME.job_pods] if RUNTIME.job_pods else [])]:
        each.stop()
    if RUNTIME.admissions is not None:
        RUNTIME.admissions.stop()


@kopf.on.event(api_types.GROUP, api_types.VERSION, api_types.PLURAL)
@fenced()
async def job_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    if event["type"] == "DELETED":
        # Its reservation and pods are going: the waiting jobs may fit now.
        metrics.observe_phase(namespace or "", name, None)
        job_metrics.JOBS.forget(namespace or "", name)
        if RUNTIME.admissions is not None:
            RUNTIME.admissions.forget((namespace, name))
        _request(RECHECK)
        return
    job_metrics.JOBS.observe(event["object"])
    _request((namespace, name))


@kopf.on.event("", "v1", "configmaps", labels={progress_manifests.PROGRESS_LABEL: kopf.PRESENT})
@fenced()
async def progress_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    job = progress_manifests.job_of(name)
    if job is not None and event["type"] != "DELETED":
        _request(progress.ProgressKey(namespace or "", job))
