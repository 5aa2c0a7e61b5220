"""An invalid job: Valid=False with the message, one Event, no children, and no storm of API calls."""

from __future__ import annotations

import time

from tests.operator.conftest import job_doc, operator_calls, wait_for


def test_invalid_job_gets_a_condition_an_event_and_nothing_else(cluster, operator, emulator):
    bad = job_doc(
        deepspeed={
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 16,
            "zero_optimization": {"stage": 2},
        }
    )
    cluster.apply(bad)
    status = wait_for(lambda: cluster.status().get("conditions") and cluster.status(), what="a condition")
    valid = status["conditions"][0]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "InvalidSpec")
    assert "ZeRO" in valid["message"] or "zero" in valid["message"].lower()
    events = wait_for(lambda: [e for e in cluster.events() if e["reason"] == "InvalidSpec"], what="an Event")
    assert len(events) == 1
    writes_then = _operator_writes(emulator)
    time.sleep(3)
    assert _operator_writes(emulator) == writes_then, "an invalid job must not be retried"
    assert writes_then <= 2  # one status patch and one Event
    assert cluster.pods() == []
    assert cluster.core.list_namespaced_config_map("research").items == []


def _operator_writes(emulator):
    return sum(1 for verb, *_ in operator_calls(emulator) if verb in {"create", "patch", "delete"})
