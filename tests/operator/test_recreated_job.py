"""A job deleted and created again under the same name: the new one never adopts the old one's children,
which the garbage collector removes some time after the delete (asynchronously, as on a real cluster)."""

from __future__ import annotations

from tests.operator.helpers import job_doc, wait_for


def owner_uid(obj):
    return obj["metadata"]["ownerReferences"][0]["uid"]


def test_a_recreated_job_waits_for_the_old_children_and_makes_its_own(cluster, operator, apiserver):
    cluster.add_nodes(16)
    old = cluster.apply(job_doc())
    wait_for(lambda: len(cluster.pods()) == 16, what="the first job's pods")
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    # The garbage collector removes the old job's children 2 s after the delete (the controller-manager paused).
    apiserver.pause_controllers(2.0)
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt")
    new = cluster.apply(job_doc())
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    uid = new["metadata"]["uid"]

    def converged():
        pods = cluster.pods()
        return len(pods) == 16 and all(owner_uid(p) == uid for p in pods) and cluster.status().get("message", "")

    wait_for(lambda: (converged() or "").startswith("16 pods"), timeout=30, what="the new job's own pods")
    config = cluster.core.api_client.sanitize_for_serialization(
        cluster.core.read_namespaced_config_map("gpt-config", "research")
    )
    service = cluster.core.api_client.sanitize_for_serialization(
        cluster.core.read_namespaced_service("gpt", "research")
    )
    assert owner_uid(config) == owner_uid(service) == uid
    # Nothing of the old job was taken for the new one's, so its gang never broke.
    assert cluster.status()["restarts"] == 0


def test_a_job_recreated_while_its_namesakes_pods_are_stuck_on_a_lost_node_says_so_and_starts(cluster, operator):
    cluster.add_nodes(17)
    cluster.apply(job_doc())
    cluster.start_running()
    lost = cluster.core.read_namespaced_pod("gpt-3", "research").spec.node_name
    cluster.set_node_ready(lost, False)  # its kubelet is gone: gpt-3 can never finish terminating by itself
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt")
    wait_for(lambda: [p["metadata"]["name"] for p in cluster.pods()] == ["gpt-3"], what="only the stuck pod left")
    new = cluster.apply(job_doc())
    uid = new["metadata"]["uid"]
    message = wait_for(
        lambda: "deleted job of the same name" in cluster.status().get("message", "") and cluster.status()["message"],
        what="a message",
    )
    assert "gpt-3" in message
    # The Event is posted after the status write it goes with.
    wait_for(lambda: [e for e in cluster.events() if e["reason"] == "WaitingForPreviousJob"], what="the Event")
    wait_for(
        lambda: len(cluster.pods()) == 16 and all(owner_uid(p) == uid for p in cluster.pods()),
        timeout=30,
        what="the new job's own pods, after the stuck one was force-deleted",
    )
