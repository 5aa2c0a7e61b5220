"""What the operator's handlers share while it runs: `RUNTIME` (set by `registry.configure()` and on startup),
the fence every handler, pass and loop step runs behind (`acting()`, `@fenced`: see `handlers.registry` on
fencing), what an admission that did not fit was judged against (`Judged`), and the bridge from a pass's thread
to the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import typing
from collections.abc import Hashable, Iterable
from typing import Any

from paralleljob.handlers import reconcile, start_failures
from paralleljob.handlers.admission_queue import AdmissionQueue, PriorityValues
from paralleljob.handlers.coalescer import Coalescer
from paralleljob.handlers.nodes import NodeSnapshot, NodeWatch
from paralleljob.k8s import admission_lock, informer, leadership
from paralleljob.k8s.session import Session
from paralleljob.planning.inventory import ClusterBuilder, Reservation
from paralleljob.planning.usage import UsageIndex

# How long a thread waits for the event loop to answer (it answers in microseconds unless it is stopping).
LOOP_ANSWER_SECONDS = 30


@dataclasses.dataclass
class Runtime:
    """What the handlers share, set by `configure()` and on startup."""

    settings: reconcile.Settings = dataclasses.field(default_factory=reconcile.Settings)
    metrics_port: int = 0
    kubeconfig: str | None = None
    session: Session | None = None
    nodes: NodeWatch = dataclasses.field(default_factory=NodeWatch)
    usage: UsageIndex = dataclasses.field(default_factory=UsageIndex)
    pulls: start_failures.PullFailures = dataclasses.field(default_factory=start_failures.PullFailures)
    builder: ClusterBuilder = dataclasses.field(default_factory=ClusterBuilder)
    informers: list[informer.Informer] = dataclasses.field(default_factory=list)  # admission waits for these
    job_pods: informer.Informer | None = None
    coalescer: Coalescer | None = None
    admissions: AdmissionQueue[reconcile.NodeView, Judged] | None = None
    priorities: PriorityValues | None = None
    loop: asyncio.AbstractEventLoop | None = None
    lease: leadership.LeaseSettings | None = None  # None: standalone, always acting
    election: leadership.Leadership | None = None
    lock_settings: admission_lock.LockSettings | None = None  # None: admissions take no cluster-wide lock
    lock: admission_lock.AdmissionLock | None = None
    rivals: list[leadership.Rival] = dataclasses.field(default_factory=list)  # those reported so far
    # Admission passes that raised in a row, by job: their backoff and when the job is told.
    admission_failures: dict[Hashable, int] = dataclasses.field(default_factory=dict)


RUNTIME = Runtime()


Action = typing.TypeVar("Action", bound=typing.Callable[..., Any])


def acting() -> bool:
    """Whether this replica may act now: standalone, or holding the Lease (with `--leader-elect`, a replica
    that has not taken the Lease yet is not acting)."""
    if RUNTIME.lease is None:
        return True
    return RUNTIME.election is not None and RUNTIME.election.leading


def fenced(otherwise: Any = None) -> typing.Callable[[Action], Action]:
    """Run the decorated handler, pass or loop step only while `acting()`; else return `otherwise`."""

    def wrap(action: Action) -> Action:
        if inspect.iscoroutinefunction(action):

            @functools.wraps(action)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                return await action(*args, **kwargs) if acting() else otherwise

            return typing.cast(Action, guarded_async)

        @functools.wraps(action)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            return action(*args, **kwargs) if acting() else otherwise

        return typing.cast(Action, guarded)

    return wrap


@dataclasses.dataclass(frozen=True, eq=False)
class Judged:
    """What an admission that did not fit was planned against: the node records, the usage (by its count of
    releases) and the other jobs' reservations."""

    nodes: NodeSnapshot  # compared by identity: the watch makes a new one whenever a node changes
    released: int
    held: frozenset[Reservation]

    @classmethod
    def of(cls, view: reconcile.NodeView, held: Iterable[Reservation]) -> Judged:
        return cls(view.snapshot, view.usage.released, frozenset(held))


def improved(judged: Judged, view: reconcile.NodeView) -> bool:
    """Whether a round's view may have room that a waiting job's judgment did not: a node changed, a pod
    released requests, or a reservation it counted is gone (or the reservations could not be read)."""
    if view.snapshot is not judged.nodes or view.usage.released != judged.released or view.round_held is None:
        return True
    return not judged.held <= view.round_held


def coalescer_of() -> Coalescer:
    assert RUNTIME.coalescer is not None
    return RUNTIME.coalescer


def on_loop(callback: typing.Callable[[], None]) -> None:
    assert RUNTIME.loop is not None
    RUNTIME.loop.call_soon_threadsafe(callback)


Result = typing.TypeVar("Result")


def on_loop_wait(callback: typing.Callable[[], Result]) -> Result:
    """Run `callback` on the event loop and return its result (from another thread)."""
    assert RUNTIME.loop is not None

    async def run() -> Result:
        return callback()

    return asyncio.run_coroutine_threadsafe(run(), RUNTIME.loop).result(LOOP_ANSWER_SECONDS)
