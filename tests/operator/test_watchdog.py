"""The progress watchdog: a Running gang whose rank 0 stops advancing is restarted with reason NoProgress."""

from __future__ import annotations

import datetime

import pytest

from paralleljob.handlers import watchdog
from paralleljob.manifests import timestamps
from tests.operator.helpers import job_doc, wait_for

NOW = datetime.datetime(2026, 1, 31, 12, 0, 0, tzinfo=datetime.UTC)


def ago(seconds: float) -> str:
    return timestamps.format_time(NOW - datetime.timedelta(seconds=seconds))


@pytest.mark.parametrize(
    ("progress", "running_since", "timeout", "hung", "mentions"),
    [
        ({"step": 40, "updated": ago(30)}, ago(900), 600, False, ""),
        ({"step": 40, "updated": ago(700)}, ago(900), 600, True, "not advanced past step 40"),
        (None, ago(700), 600, True, "no training step within 600s"),
        (None, ago(100), 600, False, ""),
        # A step reported by the previous attempt: the restarted gang gets the whole timeout for its first.
        ({"step": 40, "updated": ago(5000)}, ago(100), 600, False, ""),
        ({"step": 40, "updated": ago(5000)}, ago(700), 600, True, "no training step within 600s"),
        ({"step": 40, "updated": ago(5000)}, ago(5000), None, False, ""),
    ],
    ids=[
        "advancing",
        "stuck-at-a-step",
        "never-reported",
        "still-starting",
        "restarted-gang-within-timeout",
        "restarted-gang-silent",
        "watchdog-off",
    ],
)
def test_the_watchdog_calls_a_gang_hung_only_after_a_quiet_timeout(progress, running_since, timeout, hung, mentions):
    verdict = watchdog.judge_progress(progress, running_since, timeout, at=NOW)
    assert verdict.hung is hung
    assert mentions in verdict.message
    if not hung and timeout is not None:
        assert 0 < verdict.recheck_in <= timeout + 1


@pytest.mark.parametrize(
    ("progress", "running_since", "hung", "mentions"),
    [
        ({"step": 40, "updated": ago(700)}, ago(900), False, ""),
        ({"step": 40, "updated": ago(1300)}, ago(1400), True, "the pods did not restart it in place"),
        (None, ago(1100), False, ""),
        (None, ago(1300), True, "no training step within 1200s of the gang starting (twice"),
    ],
    ids=["past-the-timeout", "past-twice-the-timeout", "starting-past-the-timeout", "starting-past-twice"],
)
def test_with_in_place_restarts_left_the_watchdog_waits_twice_the_timeout(progress, running_since, hung, mentions):
    # The pods' supervisors restart a hung gang in place at the timeout; the operator is their backstop.
    verdict = watchdog.judge_progress(progress, running_since, 600, at=NOW, in_place_first=True)
    assert verdict.hung is hung
    assert mentions in verdict.message
    if not hung:
        assert 0 < verdict.recheck_in <= 1201


@pytest.mark.parametrize(
    ("in_place", "mentions"),
    [
        (0, "no training step within 2s of the gang starting"),
        (2, "no training step within 4s of the gang starting (tw"),
    ],
    ids=["no-in-place-budget", "in-place-budget-left"],
)
def test_a_hung_gang_restarts_with_reason_no_progress_counted_against_the_backoff_limit(
    cluster, operator, in_place, mentions
):
    cluster.add_nodes(16)
    policy = {"backoffLimit": 2, "progressTimeoutSeconds": 2, "inPlaceRestarts": in_place}
    cluster.apply(job_doc(failurePolicy=policy))
    wait_for(lambda: len(cluster.pods()) == 16, what="16 pods")
    # Every pod's supervisor watches its ranks' heartbeats with the same timeout.
    command = cluster.pods()[0]["spec"]["containers"][0]["command"]
    assert "--progress-timeout=2" in command and f"--in-place-restarts={in_place}" in command
    cluster.bind_all()
    status = wait_for(lambda: cluster.status().get("restarts") == 1 and cluster.status(), timeout=30, what="restart")
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "NoProgress")
    assert mentions in ready["message"]
    wait_for(lambda: [e for e in cluster.events() if e["reason"] == "NoProgress"], what="the NoProgress Event")
