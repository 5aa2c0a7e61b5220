"""The operator killed mid-creation and restarted: no duplicate pods, and the job converges."""

from __future__ import annotations

from paralleljob.k8s import writes
from tests.operator.helpers import job_doc, operator_calls, wait_for


def pod_creates(apiserver):
    return [c for c in operator_calls(apiserver) if c[0] == "create" and c[2] == "pods"]


def test_killed_mid_creation_converges_without_duplicates(cluster, operator, apiserver):
    cluster.add_nodes(16)
    # Pods take a quarter second each to create, so the operator is surely killed with some but not all made.
    apiserver.latency[("create", "pods")] = 0.25
    cluster.apply(job_doc())
    wait_for(lambda: 1 <= len(cluster.pods()) < 16 and True, timeout=30, what="creation under way")
    operator.kill()
    partial = len(cluster.pods())
    sent = len(pod_creates(apiserver))
    apiserver.latency.clear()
    operator.start()
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), timeout=30, what="placed")
    pods = cluster.pods()
    assert len(pods) == 16 and len({p["metadata"]["name"] for p in pods}) == 16
    # Only the creates in flight at the kill were lost (a batch of them at most), and the restarted operator
    # creates only what is missing: no pod is asked for twice but the lost ones.
    assert sent - partial <= writes.CREATES_IN_FLIGHT
    assert len(pod_creates(apiserver)) <= sent + (16 - partial)
    assert {p["metadata"]["labels"]["paralleljob.io/attempt"] for p in pods} == {"0"}


def test_an_attempt_runs_one_pod_template_across_an_edit_and_an_operator_restart(cluster, operator, apiserver):
    cluster.add_nodes(16)
    apiserver.latency[("create", "pods")] = 0.25
    cluster.apply(job_doc(template={"image": "trainer:v1"}))
    wait_for(lambda: 1 <= len(cluster.pods()) < 16 and True, timeout=30, what="creation under way")
    operator.kill()
    edit = {"spec": {"template": {"image": "trainer:v2"}}}
    cluster.custom.patch_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt", edit)
    apiserver.latency.clear()
    operator.start()
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), timeout=30, what="placed")
    images = {p["spec"]["containers"][0]["image"] for p in cluster.pods()}
    assert images == {"trainer:v1"}  # the attempt's record, not the edited spec
