"""The admission queue: jobs waiting for GPUs, admitted one at a time by one dedicated worker, in a defined
order, off the path of gang supervision.

Supervision passes (the `Coalescer`'s threads) never plan: a pass that finds a job without a placement
`offer()`s it here and returns, so a gang restart never waits behind admissions. One worker thread admits in
rounds: it takes every waiting job, takes one snapshot (the watches' caches and every job's reservations), and
runs each job's admission pass in `Order` against that snapshot. As it is the only admitter, two admissions
never plan onto the same GPUs (each reads the placements the previous ones wrote); as the snapshot is the
round's (a pass counts the reservations the round began with as well as those it reads), GPUs freed during a
round cannot go to a job behind one that was already found not to fit: they wait for the next round, which
the change that freed them requests. Order, the first difference deciding:

1. restarting jobs before new ones (a restarting gang was already running: its progress is at stake);
2. higher PriorityClass value first (`spec.template.priorityClassName`; none, or one that does not exist, is 0);
3. earlier creation first;
4. namespace and name, so that the order is total.

A job that does not fit keeps its place, with what it was judged against (the jobs after it are still
tried: a large job that does not fit yet does not hold small ones back). A round is not only the jobs offered
for it: a job's own pass (its status changed, its timer fell due) offers it alone, and without more, a round
of that one job taken just after GPUs were freed would admit it ahead of every job waiting before it. So each
job keeping its place ahead of an offered one is tried again first, unless the round's snapshot has no more
room than the one it was judged against (`improved`): then it would not fit either, and trying it would make
each lone offer cost a pass per job ahead of it. A job leaves the queue when its pass admits it or finds it
no longer waiting (deleted, invalid, finished). The worker starts admitting once the watches have listed the
cluster.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

# How long a PriorityClass value is trusted before it is read again.
PRIORITY_CACHE_SECONDS = 60.0
Snapshot = TypeVar("Snapshot")
Judgment = TypeVar("Judgment")


@dataclasses.dataclass(frozen=True, order=True)
class Order:
    """A job's place in the queue: tuples compare field by field, so the smallest is admitted first."""

    new: bool  # False (restarting) sorts first
    minus_priority: int
    created: str  # RFC 3339 in UTC sorts as text
    namespace: str
    name: str

    @classmethod
    def of(cls, namespace: str, name: str, *, restarting: bool, priority: int, created: str) -> Order:
        return cls(not restarting, -priority, created, namespace, name)


class PriorityValues:
    """PriorityClass name -> value, read through `lookup` and kept for PRIORITY_CACHE_SECONDS."""

    def __init__(self, lookup: Callable[[str], int | None]) -> None:
        self._lookup = lookup
        self._known: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def value(self, name: str | None) -> int:
        if not name:
            return 0
        with self._lock:
            found = self._known.get(name)
        if found is not None and time.monotonic() - found[1] < PRIORITY_CACHE_SECONDS:
            return found[0]
        value = self._lookup(name) or 0
        with self._lock:
            self._known[name] = (value, time.monotonic())
        return value


class AdmissionQueue(Generic[Snapshot, Judgment]):
    """Waiting jobs by key, and the one thread that admits them in rounds, in `Order`: `admit(key, snapshot)`
    for each key of a round, with the round's `snapshot()`. It returns what a job that still waits for GPUs
    was judged against (it keeps its place), or None when the job left the queue (admitted, gone).
    `improved(judgment, snapshot)`: whether the snapshot may have room that the judgment did not."""

    def __init__(
        self,
        admit: Callable[[Hashable, Snapshot], Judgment | None],
        snapshot: Callable[[], Snapshot],
        ready: Callable[[float], bool] = lambda _: True,
        improved: Callable[[Judgment, Snapshot], bool] = lambda _, __: True,
    ) -> None:
        self._admit = admit
        self._snapshot = snapshot
        self._ready = ready
        self._improved = improved
        self._waiting: dict[Hashable, Order] = {}  # offered since the last round
        self._kept: dict[Hashable, tuple[Order, Judgment]] = {}  # found not to fit: they keep their place
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.admitted: list[Hashable] = []  # keys in the order their passes ran (bounded, for tests and logs)

    def start(self) -> AdmissionQueue[Snapshot, Judgment]:
        self._thread = threading.Thread(target=self._run, name="admission", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def offer(self, key: Hashable, order: Order) -> None:
        """Ask for an admission pass over `key` (thread-safe; a key already waiting takes the newer order)."""
        self.offer_all([(key, order)])

    def offer_all(self, offers: Iterable[tuple[Hashable, Order]]) -> None:
        """Offer several keys at once: they enter the same round, so their order decides among them."""
        with self._changed:
            self._waiting.update(offers)
            self._changed.notify()

    def offer_kept(self) -> None:
        """Offer every job keeping its place again, for the next round (GPUs may have been freed)."""
        with self._changed:
            for key, (order, _) in self._kept.items():
                self._waiting.setdefault(key, order)
            if self._waiting:
                self._changed.notify()

    def forget(self, key: Hashable) -> None:
        """The job is gone: it leaves the queue (a job kept last in order would never be tried again)."""
        with self._changed:
            self._waiting.pop(key, None)
            self._kept.pop(key, None)

    def waiting(self) -> list[Hashable]:
        """The waiting keys (offered, or keeping their place), first to be admitted first."""
        with self._changed:
            orders = {key: order for key, (order, _) in self._kept.items()} | self._waiting  # an offer is newer
        return sorted(orders, key=orders.__getitem__)

    def take_round(self) -> list[Hashable] | None:
        """Every key offered since the last round and every key keeping its place ahead of one of them, in
        order; blocks until a key is offered; None once stopped. Call `settle` for each key once tried."""
        taken = self._take_round()
        if taken is None:
            return None
        orders = {key: order for key, (order, _) in taken[1].items()} | taken[0]
        return sorted(orders, key=orders.__getitem__)

    def _take_round(self) -> tuple[dict[Hashable, Order], dict[Hashable, tuple[Order, Judgment]]] | None:
        """The keys offered, and those keeping their place ahead of one of them (not offered again)."""
        with self._changed:
            while not self._waiting and not self._stopped:
                self._changed.wait()
            if self._stopped:
                return None
            offered, self._waiting = self._waiting, {}
            last = max(offered.values())
            ahead = {key: kept for key, kept in self._kept.items() if kept[0] < last and key not in offered}
            return offered, ahead

    def settle(self, key: Hashable, order: Order, judgment: Judgment | None) -> None:
        """After a key's pass: it keeps its place while it still waits (a judgment), else leaves the queue."""
        with self._changed:
            if judgment is not None:
                self._kept[key] = (order, judgment)
            else:
                self._kept.pop(key, None)

    def _run(self) -> None:
        while not self._stopped and not self._ready(1.0):
            pass
        while (taken := self._take_round()) is not None:
            offered, ahead = taken
            snapshot = self._snapshot()
            again = {key: order for key, (order, judged) in ahead.items() if self._improved(judged, snapshot)}
            orders = again | offered
            for key in sorted(orders, key=orders.__getitem__):
                self.admitted = [*self.admitted[-999:], key]
                judgment = None
                try:
                    judgment = self._admit(key, snapshot)
                except Exception:  # the action reports and retries its own failures; never let the worker die
                    log.exception("admission of %s failed", key)
                self.settle(key, orders[key], judgment)
