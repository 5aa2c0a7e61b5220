"""A job deleted and created again under the same name: the new one never adopts the old one's children,
which the garbage collector removes some time after the delete (asynchronously, as on a real cluster)."""

from __future__ import annotations

from tests.operator.conftest import job_doc, wait_for


def owner_uid(obj):
    return obj["metadata"]["ownerReferences"][0]["uid"]


def test_a_recreated_job_waits_for_the_old_children_and_makes_its_own(cluster, operator, emulator):
    cluster.add_nodes(16)
    emulator.emulator.gc_delay = 2.0
    old = cluster.apply(job_doc())
    wait_for(lambda: len(cluster.pods()) == 16, what="the first job's pods")
    wait_for(lambda: cluster.status().get("message", "").startswith("16 pods"), what="placed")
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt")
    new = cluster.apply(job_doc())
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    uid = new["metadata"]["uid"]

    def converged():
        pods = cluster.pods()
        return len(pods) == 16 and all(owner_uid(p) == uid for p in pods) and cluster.status().get("message", "")

    wait_for(lambda: (converged() or "").startswith("16 pods"), timeout=30, what="the new job's own pods")
    client = emulator.emulator
    assert client is not None
    config = cluster.core.api_client.sanitize_for_serialization(
        cluster.core.read_namespaced_config_map("gpt-config", "research")
    )
    service = cluster.core.api_client.sanitize_for_serialization(
        cluster.core.read_namespaced_service("gpt", "research")
    )
    assert owner_uid(config) == owner_uid(service) == uid
    # Nothing of the old job was taken for the new one's, so its gang never broke.
    assert cluster.status()["restarts"] == 0
