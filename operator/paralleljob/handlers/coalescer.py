"""At most one reconcile per job at a time, and bursts of watch events folded into one more pass.

The kopf handlers only *request* a reconcile of a key (namespace, name). The first request starts a worker
that runs the blocking reconcile in a thread of the coalescer's own pool (never asyncio's default one, which
kopf and the client share); requests that arrive meanwhile mark the key dirty and return,
so 1,024 pod events cost a handful of passes, not 1,024. A pass that raises is retried with exponential
backoff (event handlers are not retried by kopf), and each failure is handed to `on_failure` with the number
of failures in a row, so a pass that keeps failing is reported on the job, not only in the log. A pass may also name other keys to request now (a freed
GPU wakes the waiting jobs) and ask to be run again after a delay (a starting gang whose start timeout
falls due): one timer per key, the latest pass's wish replacing earlier ones. Only this scheduling lives in
memory: every pass reads the job and its pods from the API afresh.

A pass run elsewhere (the admission queue's worker) keeps the same rule through `claim()` and `release()`: a
key claimed runs no pass here until released, and one that is running here cannot be claimed. Requests that
arrive meanwhile, and a refused claim, mark the key dirty, so one more pass follows here, after the other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` failed passes in a row: 1 s, doubling, at most 60 s. The
    exponent is capped before the power is taken: 2 ** 1024 does not fit a float, and an admission pass that
    had failed 1,024 times in a row raised OverflowError instead of waiting."""
    doublings = min(max(failures - 1, 0), 32)
    return min(FIRST_RETRY_SECONDS * 2.0**doublings, MAX_RETRY_SECONDS)


# Passes that may run at once (each waits mostly on the API server).
THREADS = 8


@dataclasses.dataclass(frozen=True)
class Next:
    """What a pass asks for: these keys requested now, its own key again after `after` seconds, and `then`
    called (on the event loop) once the key is free, unless another pass over it follows, which decides
    again: a hand-off to a pass run elsewhere (the admission queue) that must not find the key still taken."""

    keys: tuple[Hashable, ...] = ()
    after: float | None = None
    then: Callable[[], None] | None = None


@dataclasses.dataclass
class _Worker:
    dirty: bool = True
    claimed: bool = False  # a pass over the key runs outside the coalescer: none here until it is released


class Coalescer:
    """Runs `action(key)` in a thread, never twice at once for one key, and does what its `Next` asks."""

    def __init__(
        self,
        action: Callable[[Hashable], Next],
        threads: int = THREADS,
        on_failure: Callable[[Hashable, Exception, int], None] | None = None,
    ) -> None:
        self._action = action
        self._on_failure = on_failure
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="supervision")
        self._workers: dict[Hashable, _Worker] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self, key: Hashable) -> None:
        """Ask for a pass over `key`; returns at once (must be called on the event loop)."""
        worker = self._workers.get(key)
        if worker is not None:
            worker.dirty = True
            return
        self._workers[key] = _Worker()
        self._start(key)

    def claim(self, key: Hashable) -> bool:
        """Take `key` for a pass run outside the coalescer (on the event loop). False while a pass over it runs
        (or waits to retry) here: that one is then followed by another, which sees what the refused one would
        have done."""
        worker = self._workers.get(key)
        if worker is not None:
            worker.dirty = True
            return False
        self._workers[key] = _Worker(dirty=False, claimed=True)
        return True

    def release(self, key: Hashable) -> None:
        """The claimed pass is over (on the event loop): the passes requested meanwhile run now, as one."""
        worker = self._workers[key]
        if not worker.dirty:
            del self._workers[key]
            return
        worker.claimed = False
        self._start(key)

    def _start(self, key: Hashable) -> None:
        task = asyncio.get_running_loop().create_task(self._run(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def request_later(self, key: Hashable, after: float | None) -> None:
        """Replace the key's timer: a pass `after` seconds from now (None: no timer). On the event loop."""
        self._schedule(key, after)

    def _schedule(self, key: Hashable, after: float | None) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if after is not None:
            self._timers[key] = asyncio.get_running_loop().call_later(max(after, 0.0), self.request, key)

    async def _run(self, key: Hashable) -> None:
        worker = self._workers[key]
        delay, failures = FIRST_RETRY_SECONDS, 0
        then: Callable[[], None] | None = None
        try:
            while worker.dirty:
                worker.dirty, then = False, None
                try:
                    wanted = await asyncio.get_running_loop().run_in_executor(self._pool, self._action, key)
                    delay, failures, then = FIRST_RETRY_SECONDS, 0, wanted.then
                    for follow_up in wanted.keys:
                        self.request(follow_up)
                    self._schedule(key, wanted.after)
                except Exception as error:
                    failures += 1
                    log.exception("reconcile of %s failed (%d in a row); retrying in %.0fs", key, failures, delay)
                    await self._report(key, error, failures)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_SECONDS)
                    worker.dirty = True
        finally:
            del self._workers[key]
        if then is not None:
            then()

    async def _report(self, key: Hashable, error: Exception, failures: int) -> None:
        """Hand a failure to `on_failure`; a report that fails itself (the API is down) is only logged."""
        if self._on_failure is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._on_failure, key, error, failures)
        except Exception:
            log.warning("could not report the failure of %s on the job", key, exc_info=True)
