"""Jobs that ask the operator for more than their creator's policy allows: Valid=False naming the field and the
rule, a Warning Event, and nothing created for them, while the cluster has room to run them."""

from __future__ import annotations

from tests.operator.helpers import job_doc, made_here, wait_for

ESCALATIONS = {
    "host-path-root": (
        {"template": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}},
        "spec.template.volumes[0].hostPath: hostPath volumes are not allowed by the ParallelJob policy",
    ),
    "another-service-account": (
        {"template": {"serviceAccountName": "deployer"}},
        "spec.template.serviceAccountName: deployer is not allowed by the ParallelJob policy",
    ),
    "ld-preload": (
        {"network": {"ncclEnv": {"LD_PRELOAD": "/data/hook.so"}}},
        "spec.network.ncclEnv.LD_PRELOAD: LD_PRELOAD is forbidden by the ParallelJob policy (forbidden env: LD_*)",
    ),
    "apparmor-unconfined": (
        {"template": {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}},
        "spec.template.annotations: container.apparmor.security.beta.kubernetes.io/trainer: key domains not allowed",
    ),
    "privileged-priority-class": (
        {"template": {"priorityClassName": "system-cluster-critical"}},
        "spec.template.priorityClassName: system-cluster-critical is not allowed by the ParallelJob policy",
    ),
}


def test_each_escalation_is_refused_with_the_field_and_the_rule_and_nothing_is_created(cluster, operator):
    cluster.add_nodes(16)
    for name, (spec, _) in ESCALATIONS.items():
        cluster.apply(job_doc(name, **spec))
    for name, (_, message) in ESCALATIONS.items():
        valid = wait_for(lambda name=name: _valid_condition(cluster, name), what=f"{name}: Valid")
        assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec"), name
        assert message in valid["message"], (name, valid["message"])
        assert cluster.status(name)["phase"] == "Pending"
    refused = wait_for(
        lambda: len(names := {e["involvedObject"]["name"] for e in _warnings(cluster)}) == len(ESCALATIONS) and names,
        what="a Warning Event per job",
    )
    assert refused == set(ESCALATIONS)
    assert cluster.core.list_namespaced_pod("research").items == []
    assert made_here(cluster.core.list_namespaced_config_map("research")) == []
    assert cluster.core.list_namespaced_service("research").items == []
    assert made_here(cluster.core.list_namespaced_service_account("research")) == []


def _valid_condition(cluster, name):
    return next((c for c in cluster.status(name).get("conditions", []) if c["type"] == "Valid"), None)


def _warnings(cluster):
    return [e for e in cluster.events() if e["type"] == "Warning" and e["reason"] == "InvalidSpec"]
