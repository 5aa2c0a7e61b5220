"""A create the API refuses for good (422 invalid, 403 quota): the attempt fails with the API's message in a
condition and an Event, once per attempt, and the job ends Failed at its backoff limit; no retry storm."""

from __future__ import annotations

from tests.operator.helpers import finish_operator_passes, job_doc, operator_calls, wait_for

INVALID = 'Pod "gpt-0" is invalid: spec.volumes[4].persistentVolumeClaim.claimName: Required value'


def test_a_refused_pod_fails_the_attempt_with_the_api_message_and_no_storm(cluster, operator, apiserver):
    cluster.add_nodes(16)
    apiserver.rejects["pods"] = (422, "Invalid", INVALID)
    cluster.apply(job_doc(failurePolicy={"backoffLimit": 1}))
    status = wait_for(lambda: cluster.status().get("phase") == "Failed" and cluster.status(), what="Failed")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Scheduled"]["status"], conditions["Scheduled"]["reason"]) == ("False", "CreateFailed")
    assert INVALID in conditions["Scheduled"]["message"]
    assert INVALID in status["message"]
    # One per attempt, the second posted after the status write that fails the job.
    refused = wait_for(
        lambda: len(found := [e for e in cluster.events() if e["reason"] == "CreateFailed"]) >= 2 and found,
        what="two CreateFailed Events",
    )
    assert len(refused) == 2 and INVALID in refused[0]["message"]
    finish_operator_passes(cluster)  # every pass so far has ended: no retry is on its way
    pod_creates = [c for c in operator_calls(apiserver) if c[:3] == ("create", "", "pods")]
    assert len(pod_creates) == 2  # the first pod of each attempt, then nothing more
