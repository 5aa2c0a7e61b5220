"""What the operator takes from rank 0's progress ConfigMap, as a table: plain numbers in range, and nothing
else; a report without a valid step is no progress at all."""

from __future__ import annotations

import pytest

from paralleljob.manifests import progress
from paralleljob_trainer import k8s_status

TOTAL = 100
CASES = {
    "valid": (
        {"step": "10", "loss": "2.5", "tokensPerSecond": "1000.04", "updated": "2026-12-01T08:00:00Z"},
        {
            "progress": {
                "step": 10,
                "totalSteps": TOTAL,
                "loss": 2.5,
                "tokensPerSecond": 1000.0,
                "updated": "2026-12-01T08:00:00Z",
            }
        },
    ),
    "validation-loss": (
        {"step": "10", "validationLoss": "2.75"},
        {"progress": {"step": 10, "totalSteps": TOTAL, "validationLoss": 2.75}},
    ),
    "validation-loss-not-a-number": (
        {"step": "10", "validationLoss": "low"},
        {"progress": {"step": 10, "totalSteps": TOTAL}},
    ),
    "checkpoint-only": ({"lastCheckpointStep": "40"}, {"lastCheckpointStep": 40}),
    "negative-step": ({"step": "-1", "loss": "2.5"}, {}),
    "non-numeric-step": ({"step": "ten"}, {}),
    "float-step": ({"step": "1.5"}, {}),
    "step-past-the-spec": ({"step": "101"}, {}),
    "huge-string": ({"step": "9" * 100000}, {}),
    "nan-and-inf": (
        {"step": "5", "loss": "nan", "tokensPerSecond": "inf"},
        {"progress": {"step": 5, "totalSteps": TOTAL}},
    ),
    "negative-throughput": ({"step": "5", "tokensPerSecond": "-3"}, {"progress": {"step": 5, "totalSteps": TOTAL}}),
    "bad-timestamp": ({"step": "5", "updated": "now; rm -rf /"}, {"progress": {"step": 5, "totalSteps": TOTAL}}),
    "checkpoint-negative": ({"lastCheckpointStep": "-4"}, {}),
    "status-lookalikes": ({"phase": "Succeeded", "restarts": "0", "placement": "[]"}, {}),
    "not-strings": ({"step": 5}, {}),
    "efficiency": (
        {"step": "5", "tflopsPerGpu": "0.0123", "mfu": "0.41", "stepSeconds": "3.0", "modeledStepSeconds": "1.5"},
        {
            "progress": {
                "step": 5,
                "totalSteps": TOTAL,
                "tflopsPerGpu": 0.0123,
                "mfu": 0.41,
                "stepSeconds": 3.0,
                "modeledStepSeconds": 1.5,
                "stepOverModeled": 2.0,
            }
        },
    ),
    "mfu-above-one-and-negative-time": (
        {"step": "5", "mfu": "1.7", "stepSeconds": "-1", "modeledStepSeconds": "2"},
        {"progress": {"step": 5, "totalSteps": TOTAL, "modeledStepSeconds": 2.0}},
    ),
    "resumed-at-another-layout": (
        {"step": "11", "resumedFromLayout": "PP2xTP2xDP2", "resumedAtLayout": "PP1xTP4xDP2"},
        {
            "progress": {
                "step": 11,
                "totalSteps": TOTAL,
                "resumedFromLayout": "PP2xTP2xDP2",
                "resumedAtLayout": "PP1xTP4xDP2",
            }
        },
    ),
    "resumed-layout-not-a-layout": (
        {"step": "11", "resumedFromLayout": "PP2xTP2xDP2", "resumedAtLayout": "<b>PP1</b>"},
        {"progress": {"step": 11, "totalSteps": TOTAL}},
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_only_validated_numbers_are_taken(case: str) -> None:
    data, expected = CASES[case]
    assert progress.status_of({"data": data}, TOTAL) == expected


@pytest.mark.parametrize(("name", "job"), [("gpt-progress", "gpt"), ("gpt-config", None), ("-progress", None)])
def test_the_job_is_known_from_the_config_map_name(name: str, job: str | None) -> None:
    assert progress.job_of(name) == job


def test_what_the_trainers_hook_writes_is_what_the_operator_takes() -> None:
    hook = k8s_status.ProgressReporter("http://127.0.0.1:9", "research", "gpt", token_path=None, ca_path=None)
    data = {**hook.progress_of({"step": 7, "loss": 2.123456, "tokens_per_s": 5771.96}), "lastCheckpointStep": "5"}
    found = progress.status_of({"data": data}, TOTAL)
    assert found["lastCheckpointStep"] == 5
    assert {k: v for k, v in found["progress"].items() if k != "updated"} == {
        "step": 7,
        "totalSteps": TOTAL,
        "loss": 2.1235,
        "tokensPerSecond": 5772.0,
    }
    assert found["progress"]["updated"] == data["updated"]


def test_the_latest_validation_loss_rides_on_every_report_after_it() -> None:
    hook = k8s_status.ProgressReporter("http://127.0.0.1:9", "research", "gpt", token_path=None, ca_path=None)
    assert "validationLoss" not in hook.progress_of({"step": 1, "loss": 3.0})
    evaluated = hook.progress_of({"step": 2, "loss": 2.9, "validation_loss": 3.123456})
    later = hook.progress_of({"step": 3, "loss": 2.8})
    assert evaluated["validationLoss"] == later["validationLoss"] == "3.1235"
    assert progress.status_of({"data": later}, TOTAL)["progress"]["validationLoss"] == 3.1235


STARTED = "2026-12-01T08:00:00Z"


@pytest.mark.parametrize(
    ("data", "budget", "expected"),
    [
        ({"inPlaceRestarts": "2", "updated": "2026-12-01T08:05:00Z"}, 3, 2),
        ({"inPlaceRestarts": "0", "updated": "2026-12-01T08:05:00Z"}, 3, 0),
        # The previous attempt's pods reported before this attempt's gang ran: not this attempt's restarts.
        ({"inPlaceRestarts": "2", "updated": "2026-12-01T07:59:59Z"}, 3, None),
        # More than the attempt's budget (the supervisors never restart past it): not believed.
        ({"inPlaceRestarts": "4", "updated": "2026-12-01T08:05:00Z"}, 3, None),
        ({"inPlaceRestarts": "-1", "updated": "2026-12-01T08:05:00Z"}, 3, None),
        ({"inPlaceRestarts": "two", "updated": "2026-12-01T08:05:00Z"}, 3, None),
        ({"inPlaceRestarts": "1"}, 3, None),
        ({"inPlaceRestarts": "1", "updated": "yesterday"}, 3, None),
    ],
    ids=["counted", "none", "previous-attempt", "past-budget", "negative", "not-a-number", "undated", "bad-date"],
)
def test_in_place_restarts_are_read_for_this_attempt_within_its_budget(data: dict, budget: int, expected) -> None:
    assert progress.in_place_restarts_of({"data": data}, STARTED, budget) == expected


def test_the_trainer_hook_reports_the_in_place_restarts_it_runs_under() -> None:
    hook = k8s_status.ProgressReporter("http://127.0.0.1:9", "research", "gpt", token_path=None, ca_path=None)
    reported = hook.progress_of({"step": 7, "loss": 2.0, "in_place_restarts": 2})
    assert progress.in_place_restarts_of({"data": reported}, "2000-01-01T00:00:00Z", 3) == 2


def test_the_hooks_efficiency_reaches_the_status_and_an_unknown_peak_leaves_mfu_out() -> None:
    hook = k8s_status.ProgressReporter("http://127.0.0.1:9", "research", "gpt", token_path=None, ca_path=None)
    record = {"step": 7, "loss": 2.0, "tflops_per_gpu": 0.01234567, "mfu": None, "step_seconds": 0.5}
    found = progress.status_of({"data": {**hook.progress_of(record | {"modeled_step_seconds": 0.25})}}, TOTAL)
    assert found["progress"]["tflopsPerGpu"] == 0.01235 and "mfu" not in found["progress"]
    assert found["progress"]["stepSeconds"] == 0.5 and found["progress"]["stepOverModeled"] == 2.0
