"""The retry delay of a pass that keeps failing: 1 s, doubling, at most 60 s, however many failures."""

from __future__ import annotations

import pytest

from paralleljob.handlers import coalescer


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (1024, 60.0), (1025, 60.0), (10**6, 60.0)],
)
def test_the_delay_doubles_to_its_cap_and_stays_there(failures: int, seconds: float) -> None:
    # 1,025 failures in a row raised OverflowError (2 ** 1024 does not fit a float) and the admission pass
    # that computed it never retried; seen on the upstream control plane with a pass that failed every time.
    assert coalescer.retry_delay(failures) == seconds
