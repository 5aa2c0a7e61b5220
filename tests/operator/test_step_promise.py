"""The SlowerThanModeled decision as a table: the measured median step time against the planner's modeled one, by
the job's factor, held for HOLD_SECONDS before it is True; no condition for a job that never went above it."""

from __future__ import annotations

import datetime

import pytest

from paralleljob.handlers.step_promise import HOLD_SECONDS, decide

NOW = datetime.datetime(2026, 12, 4, 16, 0, tzinfo=datetime.UTC)


def since(seconds: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


CASES = {
    # measured, modeled, factor, the condition now, (status, reason) next or None
    "no-figures-yet": (None, 1.0, 1.5, None, None),
    "no-model": (2.0, None, 1.5, None, None),
    "as-modeled-never-set": (1.4, 1.0, 1.5, None, None),
    "first-window-above": (2.0, 1.0, 1.5, None, ("Unknown", "Checking")),
    "above-again-after-as-modeled": (2.0, 1.0, 1.5, {"status": "False"}, ("Unknown", "Checking")),
    "above-not-long-enough": (
        2.0,
        1.0,
        1.5,
        {"status": "Unknown", "lastTransitionTime": since(60)},
        ("Unknown", "Checking"),
    ),
    "above-for-the-hold": (
        2.0,
        1.0,
        1.5,
        {"status": "Unknown", "lastTransitionTime": since(HOLD_SECONDS)},
        ("True", "SlowerThanModeled"),
    ),
    "still-slow": (3.0, 1.0, 1.5, {"status": "True", "lastTransitionTime": since(900)}, ("True", "SlowerThanModeled")),
    "recovered": (1.2, 1.0, 1.5, {"status": "True"}, ("False", "AsModeled")),
    "dipped-while-checking": (
        1.2,
        1.0,
        1.5,
        {"status": "Unknown", "lastTransitionTime": since(60)},
        ("False", "AsModeled"),
    ),
    "a-larger-factor-allows-it": (2.0, 1.0, 3.0, None, None),
    "at-the-factor-exactly": (1.5, 1.0, 1.5, None, None),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_slower_than_modeled(case: str) -> None:
    measured, modeled, factor, current, expected = CASES[case]
    verdict = decide(measured, modeled, factor, current, NOW)
    assert (None if verdict is None else (verdict.status, verdict.reason)) == expected


def test_the_message_gives_both_times_and_the_ratio() -> None:
    verdict = decide(2.5, 1.0, 1.5, {"status": "True"}, NOW)
    assert verdict is not None and "2.5 s is 2.5x the modeled 1 s (factor 1.5)" in verdict.message
