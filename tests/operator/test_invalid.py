"""An invalid job: Valid=False with the message, one Event, no children, and no storm of API calls."""

from __future__ import annotations

import time

import pytest

from tests.operator.conftest import job_doc, wait_for

ZERO_2_WITH_PIPELINE = {
    "deepspeed": {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 16,
        "zero_optimization": {"stage": 2},
    }
}
ENV_OVERRIDES_IDENTITY = {"template": {"env": [{"name": "PARALLELJOB_NODE_RANK", "value": "3"}]}}


@pytest.mark.parametrize(
    ("spec", "mentions"),
    [(ZERO_2_WITH_PIPELINE, "zero"), (ENV_OVERRIDES_IDENTITY, "spec.template.env[0].name: PARALLELJOB_NODE_RANK")],
    ids=["api-rule", "template-env-overrides-the-operator"],
)
def test_invalid_job_gets_a_condition_an_event_and_nothing_else(cluster, operator, emulator, spec, mentions):
    cluster.apply(job_doc(**spec))
    status = wait_for(lambda: cluster.status().get("conditions") and cluster.status(), what="a condition")
    valid = status["conditions"][0]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "InvalidSpec")
    assert mentions in valid["message"].lower() or mentions in valid["message"]
    events = wait_for(lambda: [e for e in cluster.events() if e["reason"] == "InvalidSpec"], what="an Event")
    assert len(events) == 1
    # The pass that our own status patch triggers may still be on its way on a loaded machine: let the
    # operator settle first, then require it to stay silent.
    calls_then = _settled(lambda: _operator_requests(emulator))
    time.sleep(3)
    assert _operator_requests(emulator) == calls_then, "an invalid job must not be retried"
    writes = [c for c in calls_then if c[0] in {"create", "patch", "delete"}]
    reads = [c for c in calls_then if c[0] in {"get", "list"}]
    assert len(writes) <= 2  # one status patch and one Event
    # Our own reads: the job once per pass (its creation, then our status patch), nothing else.
    assert len(reads) <= 2, reads
    assert cluster.pods() == []
    assert cluster.core.list_namespaced_config_map("research").items == []


def _operator_requests(emulator):
    """paralleljob.k8s's requests (kopf's list-and-watch is the framework's, made once at startup)."""
    assert emulator.emulator is not None
    return [c[:4] for c in emulator.emulator.calls if c[4].startswith("paralleljob-operator") and c[2]]


def _settled(read, quiet_seconds: float = 1.0, timeout: float = 20.0):
    """The value of `read()` once it has not changed for `quiet_seconds`."""
    deadline = time.monotonic() + timeout
    value = read()
    while time.monotonic() < deadline:
        time.sleep(quiet_seconds)
        latest = read()
        if latest == value:
            return value
        value = latest
    raise AssertionError(f"the operator kept calling the API for {timeout} s: {value[-5:]}")


def test_an_invalid_edit_to_a_running_job_keeps_the_running_attempt(cluster, operator):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    wait_for(lambda: len(cluster.pods()) == 16, what="16 pods")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    names = sorted(p["metadata"]["name"] for p in cluster.pods())
    cluster.custom.patch_namespaced_custom_object(
        "paralleljob.io",
        "v1alpha1",
        "research",
        "paralleljobs",
        "gpt",
        {"spec": {"template": {"env": [{"name": "PARALLELJOB_NODE_RANK", "value": "3"}]}}},
    )
    status = wait_for(
        lambda: (
            any(c["type"] == "Valid" and c["status"] == "False" for c in cluster.status().get("conditions", []))
            and cluster.status()
        ),
        what="Valid=False",
    )
    assert status["phase"] == "Running"
    assert "the running attempt continues" in status["message"]
    assert sorted(p["metadata"]["name"] for p in cluster.pods()) == names
