"""An invalid job: Valid=False with the message, one Event, no children, and no storm of API calls.

The decisions alone (an invalid edit to a running job, an invalid edit after success) are tables in
`test_step_decisions.py`; these show the operator process making and writing them."""

from __future__ import annotations

import kubernetes
import pytest

from tests.operator.helpers import finish_operator_passes, job_doc, made_here, operator_requests, wait_for

ZERO_2_WITH_PIPELINE = {
    "deepspeed": {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 16,
        "zero_optimization": {"stage": 2},
    }
}
ENV_OVERRIDES_IDENTITY = {"template": {"env": [{"name": "PARALLELJOB_NODE_RANK", "value": "3"}]}}
# Without a volume the checkpoints would be written inside the container and vanish with it.
CHECKPOINT_WITHOUT_VOLUME = {"checkpoint": {"intervalSteps": 10}}


def stored_before_the_rule_existed(cluster, doc):
    """The API refuses this job now (the CRD's CEL rule); one stored under an older CRD without the rule."""
    cluster.server.add_unchecked(doc)


def applied(cluster, doc):
    cluster.apply(doc)


@pytest.mark.parametrize(
    ("spec", "write", "mentions"),
    [
        (ZERO_2_WITH_PIPELINE, stored_before_the_rule_existed, "zero"),
        (ENV_OVERRIDES_IDENTITY, applied, "spec.template.env[0].name: PARALLELJOB_NODE_RANK"),
        (CHECKPOINT_WITHOUT_VOLUME, stored_before_the_rule_existed, "spec.checkpoint.volume: is required on a cluster"),
    ],
    ids=["api-rule-of-a-newer-crd", "template-env-overrides-the-operator", "checkpoint-without-a-volume"],
)
def test_invalid_job_gets_a_condition_an_event_and_nothing_else(cluster, operator, spec, write, mentions):
    write(cluster, job_doc(**spec))
    status = wait_for(lambda: cluster.status().get("conditions") and cluster.status(), what="a condition")
    valid = status["conditions"][0]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "InvalidSpec")
    assert mentions in valid["message"].lower() or mentions in valid["message"]
    events = wait_for(lambda: [e for e in cluster.events() if e["reason"] == "InvalidSpec"], what="an Event")
    assert len(events) == 1
    # Two more changes to the job, each answered by a pass that reads it; once both passes are seen, every
    # earlier pass (the one our own status patch triggered included) has ended: none may have written again.
    finish_operator_passes(cluster)
    calls = operator_requests(cluster.server)
    writes = [c for c in calls if c[0] in {"create", "patch", "delete"}]
    assert len(writes) == 2, writes  # one status patch and one Event: an invalid job is never retried
    # Our own reads: the job and its attempt record (the ConfigMap, none here) once per pass, nothing else;
    # besides them only the informers' one listing each at start-up (Nodes, bound pods and the jobs' pods:
    # paralleljob.k8s.informer), as kopf's own list-and-watch.
    reads = [c[:3] for c in calls if c[0] in {"get", "list"}]
    gets = [r for r in reads if r[0] == "get"]
    assert {r for r in gets} == {("get", "paralleljob.io", "paralleljobs"), ("get", "", "configmaps")}
    assert gets.count(("get", "", "configmaps")) == gets.count(("get", "paralleljob.io", "paralleljobs")), calls
    lists = [r for r in reads if r[0] == "list"]
    assert sorted(lists) == [("list", "", "nodes"), ("list", "", "pods"), ("list", "", "pods")], calls
    assert cluster.pods() == []
    assert made_here(cluster.core.list_namespaced_config_map("research")) == []  # the cluster's root CA only


def test_the_api_refuses_a_checkpoint_without_a_volume_with_the_fix(cluster):
    with pytest.raises(kubernetes.client.ApiException) as refused:
        cluster.apply(job_doc(**CHECKPOINT_WITHOUT_VOLUME))
    assert refused.value.status == 422
    assert "checkpoint.volume is required: set {persistentVolumeClaim" in refused.value.body


def _edit_into_invalid(cluster):
    env = {"spec": {"template": {"env": [{"name": "PARALLELJOB_NODE_RANK", "value": "3"}]}}}
    cluster.custom.patch_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt", env)
    wait_for(
        lambda: any(c["type"] == "Valid" and c["status"] == "False" for c in cluster.status().get("conditions", [])),
        what="Valid=False",
    )


def test_a_running_job_edited_invalid_still_records_its_completion(cluster, operator):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    cluster.start_running()
    _edit_into_invalid(cluster)
    cluster.set_pod_phase("gpt-0", "Succeeded")
    status = wait_for(lambda: cluster.status().get("phase") == "Succeeded" and cluster.status(), what="Succeeded")
    assert status["completionTime"]
    wait_for(lambda: len(cluster.pods()) == 1, what="the running ranks deleted, rank 0 kept for its logs")


def test_a_gang_restart_with_an_invalid_spec_stops_at_pending_and_releases_the_reservation(cluster, operator):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    cluster.start_running()
    _edit_into_invalid(cluster)
    cluster.set_pod_phase("gpt-5", "Failed", reason="Error")
    status = wait_for(
        lambda: (
            cluster.status().get("restarts") == 1 and cluster.status().get("phase") == "Pending" and cluster.status()
        ),
        what="Pending after the restart",
    )
    assert "placement" not in status and "heldNodes" not in status
    wait_for(lambda: cluster.pods() == [], what="the old generation gone")
    # While the old pods terminate, the message may say so first (a loaded machine's slow kubelet).
    wait_for(lambda: "invalid spec" in cluster.status()["message"], what="the message naming the invalid spec")


def _edit_spec(cluster, patch):
    cluster.custom.patch_namespaced_custom_object(
        "paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt", patch
    )


def _valid(cluster):
    return {c["type"]: c for c in cluster.status().get("conditions", [])}.get("Valid", {})


def _succeed(cluster):
    cluster.set_pod_phase("gpt-0", "Succeeded")
    wait_for(lambda: [e for e in cluster.events() if e["reason"] == "Completed"], what="the Completed Event")


def test_a_job_that_succeeded_while_its_spec_was_invalid_stays_succeeded_and_a_fix_clears_valid_false(
    cluster, operator
):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    cluster.start_running()
    _edit_into_invalid(cluster)
    _succeed(cluster)
    finish_operator_passes(cluster)  # every pass after the completion, the one its own status write caused too
    status = cluster.status()
    assert (status["phase"], _valid(cluster).get("status")) == ("Succeeded", "False"), status.get("message")
    assert "invalid spec" not in status["message"]
    assert len([e for e in cluster.events() if e["reason"] == "InvalidSpec"]) == 1  # the edit's, none after the end
    _edit_spec(cluster, {"spec": {"template": {"env": None}}})
    finish_operator_passes(cluster)
    assert (cluster.status()["phase"], _valid(cluster).get("status")) == ("Succeeded", "True")
