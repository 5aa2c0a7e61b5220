"""A child name held by someone else's object (not this job's, not a deleted namesake's leftover): the job says
so in Scheduled=False NameConflict naming the kind and the name, releases its reservation (no placement, none of
its pods left), posts a Warning Event, and is admitted once the object is gone. A foreign pod with a rank's name
is no longer counted as created."""

from __future__ import annotations

import kubernetes

from tests.operator.helpers import job_doc, wait_for

FOREIGN = {"team": "someone-else"}
# Two nodes of 4 GPUs: small, so that the test stays quick.
TWO_NODES = {"parallelism": {"pipeline": 2, "tensor": 4, "data": 1}}

# job name -> (kind, name) of the foreign object created before the job.
CONFLICTS = {
    "svc": ("Service", "svc"),
    "cm": ("ConfigMap", "cm-config"),
    "role": ("Role", "role-progress"),
    "pod": ("Pod", "pod-1"),
}


def create_foreign(cluster, kind: str, name: str) -> None:
    """Another team's object, made with kubectl's rights before the job."""
    metadata = {"name": name, "namespace": "research", "labels": FOREIGN}
    rbac = kubernetes.client.RbacAuthorizationV1Api(cluster.core.api_client)
    creators = {
        "Service": (cluster.core.create_namespaced_service, {"spec": {"clusterIP": "None"}}),
        "ConfigMap": (cluster.core.create_namespaced_config_map, {"data": {"owner": "someone-else"}}),
        "Role": (rbac.create_namespaced_role, {"rules": []}),
        "Pod": (cluster.core.create_namespaced_pod, {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    }
    create, rest = creators[kind]
    create("research", {"kind": kind, "metadata": metadata, **rest})


def scheduled(cluster, job):
    return next((c for c in cluster.status(job).get("conditions", []) if c["type"] == "Scheduled"), None)


def test_a_foreign_holder_of_a_child_name_is_reported_releases_the_reservation_and_waits_until_it_is_gone(
    cluster, operator
):
    cluster.add_nodes(2 * len(CONFLICTS))
    for job, (kind, name) in CONFLICTS.items():
        create_foreign(cluster, kind, name)
        cluster.apply(job_doc(job, **TWO_NODES))
    for job, (kind, name) in CONFLICTS.items():
        condition = wait_for(
            lambda job=job: (c := scheduled(cluster, job)) and c["reason"] == "NameConflict" and c, what=job
        )
        assert condition["status"] == "False"
        assert condition["message"].startswith(f"{kind} {name} already exists and is not this ParallelJob's")
        wait_for(lambda job=job: cluster.pods(job) == [], what=f"{job}'s pods deleted")
        assert "placement" not in cluster.status(job)
    warned = {e["involvedObject"]["name"] for e in cluster.events() if e["reason"] == "NameConflict"}
    assert warned == set(CONFLICTS)
    # The foreign pod was never taken for the job's own.
    foreign = cluster.core.read_namespaced_pod("pod-1", "research")
    assert foreign.metadata.labels == FOREIGN
    # Once the foreign object is gone the job is admitted again: the operator looks every 30 s, and at once on
    # any change of the job.
    cluster.core.delete_namespaced_service("svc", "research")
    cluster.custom.patch_namespaced_custom_object(
        "paralleljob.io", "v1alpha1", "research", "paralleljobs", "svc", {"metadata": {"annotations": {"retry": "1"}}}
    )
    wait_for(lambda: len(cluster.pods("svc")) == 2, what="svc's 2 pods")
    service = cluster.core.read_namespaced_service("svc", "research")
    assert service.metadata.owner_references[0].name == "svc"
