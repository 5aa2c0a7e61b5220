"""The one polling helper of the tests, the benchmarks and the test cluster: wait until a condition holds
(`wait_for`), until a value settles (`wait_until_steady`), or watch that one keeps holding (`holds_for`)."""

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


def wait_until_steady(
    value: Callable[[], Any],
    seconds: float,
    timeout: float = 60.0,
    what: str = "a steady value",
    *,
    interval: float = 0.05,
) -> Any:
    """`value()` once it has not changed for `seconds` (a count of requests that has stopped growing, say), asked
    every `interval` seconds through `wait_for`; TimeoutError after `timeout` naming `what` when it never settles."""
    seen = {"value": value(), "since": time.monotonic()}

    def settled() -> bool:
        now = value()
        if now != seen["value"]:
            seen.update(value=now, since=time.monotonic())
        return time.monotonic() - seen["since"] >= seconds

    wait_for(settled, timeout, f"{what} (unchanged for {seconds:g} s)", interval=interval)
    return seen["value"]


def holds_for(condition: Callable[[], Any], seconds: float, *, interval: float = 0.05) -> bool:
    """Whether `condition()` stays truthy for `seconds`, asked every `interval` seconds; False at its first falsy
    answer (what a test watches for: nothing changes what must stay)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            return False
        time.sleep(interval)
    return bool(condition())
