"""At most one reconcile per job at a time, and bursts of watch events folded into one more pass.

The kopf handlers only *request* a reconcile of a key (namespace, name). The first request starts a worker
that runs the blocking reconcile in a thread; requests that arrive meanwhile mark the key dirty and return,
so 1,024 pod events cost a handful of passes, not 1,024. A pass that raises is retried with exponential
backoff (event handlers are not retried by kopf). Only this scheduling lives in memory: every pass reads
the job and its pods from the API afresh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0


@dataclasses.dataclass
class _Worker:
    dirty: bool = True


class Coalescer:
    """Runs `action(key)` in a thread, never twice at once for one key; a list it returns is requested."""

    def __init__(self, action: Callable[[Hashable], object]) -> None:
        self._action = action
        self._workers: dict[Hashable, _Worker] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self, key: Hashable) -> None:
        """Ask for a pass over `key`; returns at once (must be called on the event loop)."""
        worker = self._workers.get(key)
        if worker is not None:
            worker.dirty = True
            return
        self._workers[key] = _Worker()
        task = asyncio.get_running_loop().create_task(self._run(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def busy(self) -> bool:
        return bool(self._workers)

    async def _run(self, key: Hashable) -> None:
        worker = self._workers[key]
        delay = FIRST_RETRY_SECONDS
        try:
            while worker.dirty:
                worker.dirty = False
                try:
                    follow_ups = await asyncio.to_thread(self._action, key)
                    delay = FIRST_RETRY_SECONDS
                    # An action may name further keys to reconcile (a node change names the unfinished jobs).
                    for follow_up in follow_ups if isinstance(follow_ups, list) else ():
                        self.request(follow_up)
                except Exception:
                    log.exception("reconcile of %s failed; retrying in %.0fs", key, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_SECONDS)
                    worker.dirty = True
        finally:
            del self._workers[key]
