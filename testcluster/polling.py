"""The one polling helper of the tests, the benchmarks and the test cluster: wait until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    tolerate: tuple[type[Exception], ...] = (),
) -> Any:
    """The first truthy value `condition()` returns, asked every `interval` seconds; TimeoutError after `timeout`
    naming `what` and the last answer. An exception of a `tolerate` type counts as an answer that is not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = condition()
        except tolerate as error:
            last = error
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)
