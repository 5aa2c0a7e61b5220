"""The chart's RBAC is least privilege: no wildcards, nothing on Secrets, cluster-wide only what must be, and
namespaced permissions confined to the watched namespaces when they are listed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.helpers import NON_DEFAULT_VALUES, RELEASE_NAMESPACE, only, render

RBAC_KINDS = {"ClusterRole", "Role"}
CASES = {"all-namespaces": {}, "listed-namespaces": NON_DEFAULT_VALUES}


def rules_of(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", rule)
        for o in objects
        if o["kind"] in RBAC_KINDS
        for rule in o["rules"]
    ]


def grants(objects: list[dict[str, Any]], kinds: set[str]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples granted by roles of `kinds`."""
    return {
        (group, resource, verb)
        for o in objects
        if o["kind"] in kinds
        for rule in o["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("case", CASES)
def test_no_rule_uses_a_wildcard(case: str) -> None:
    offending = [
        (role, rule)
        for role, rule in rules_of(render(CASES[case]))
        if any(
            "*" in item
            for field in ("apiGroups", "resources", "verbs", "resourceNames")
            for item in rule.get(field, [])
        )
    ]
    assert offending == []


@pytest.mark.parametrize("case", CASES)
def test_nothing_grants_access_to_secrets(case: str) -> None:
    offending = [
        (role, rule)
        for role, rule in rules_of(render(CASES[case]))
        if any(r.split("/")[0] == "secrets" for r in rule["resources"])
    ]
    assert offending == []


@pytest.mark.parametrize("case", CASES)
def test_no_rule_grants_escalate_bind_or_impersonate(case: str) -> None:
    verbs = {verb for _, rule in rules_of(render(CASES[case])) for verb in rule["verbs"]}
    assert verbs.isdisjoint({"escalate", "bind", "impersonate", "deletecollection"})


def test_all_namespaces_get_one_cluster_role_for_jobs_and_only_the_three_lease_roles() -> None:
    objects = render()
    roles = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if o["kind"] in {"Role", "RoleBinding"}]
    assert sorted(roles) == [
        "Role/pj-paralleljob-operator-admission-lock",
        "Role/pj-paralleljob-operator-leader-election",
        "Role/pj-paralleljob-operator-node-leases",
        "RoleBinding/pj-paralleljob-operator-admission-lock",
        "RoleBinding/pj-paralleljob-operator-leader-election",
        "RoleBinding/pj-paralleljob-operator-node-leases",
    ]
    binding = only(objects, "ClusterRoleBinding", "-jobs")
    assert binding["roleRef"]["name"] == only(objects, "ClusterRole", "-jobs")["metadata"]["name"]


def test_listed_namespaces_get_a_role_and_binding_each_and_no_cluster_wide_job_access() -> None:
    objects = render(NON_DEFAULT_VALUES)
    job_roles = {
        o["metadata"]["namespace"] for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-jobs")
    }
    bindings = {
        o["metadata"]["namespace"]
        for o in objects
        if o["kind"] == "RoleBinding" and o["metadata"]["name"].endswith("-jobs")
    }
    assert job_roles == bindings == set(NON_DEFAULT_VALUES["watchNamespaces"])
    namespaced_resources = {
        "pods",
        "services",
        "configmaps",
        "events",
        "paralleljobs",
        "paralleljobs/status",
        "serviceaccounts",
        "roles",
        "rolebindings",
    }
    cluster_wide = {g for g in grants(objects, {"ClusterRole"}) if g[1] in namespaced_resources}
    # Outside the watched namespaces the operator only reads which pods hold GPUs (list, watch) and which nodes
    # other ParallelJobs' attempt records reserve (list, label-selected ConfigMaps), so that it plans no GPU twice.
    assert cluster_wide == {("", "pods", "list"), ("", "pods", "watch"), ("", "configmaps", "list")}


@pytest.mark.parametrize("case", CASES)
def test_leader_election_renews_only_its_own_lease_and_only_lists_the_others(case: str) -> None:
    objects = render(CASES[case])
    lease = (CASES[case].get("leaderElection") or {}).get("leaseName") or only(objects, "Deployment")["metadata"][
        "name"
    ]
    role = only(objects, "Role", "-leader-election")
    assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
    lease_rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert lease_rules == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]
    assert {g for g in grants(objects, {"ClusterRole"}) if g[1] == "leases"} == {
        ("coordination.k8s.io", "leases", "list")
    }


def test_without_leader_election_and_admission_lock_there_is_no_lease_permission() -> None:
    off = {"leaderElection": {"enabled": False}, "admissionLock": {"enabled": False}}
    objects = render({**off, "recovery": {"lostNodeLeaseSeconds": 0}})
    assert {g for g in grants(objects, {"ClusterRole", "Role"}) if g[1] == "leases"} == set()
    assert [o for o in objects if o["kind"] in {"Role", "RoleBinding"}] == []


@pytest.mark.parametrize("case", CASES)
def test_the_admission_lock_is_one_lease_in_its_namespace_named_in_the_operators_flag(case: str) -> None:
    objects = render(CASES[case])
    lock = {"namespace": "kube-system", "name": "paralleljob-admission", **(CASES[case].get("admissionLock") or {})}
    role, binding = only(objects, "Role", "-admission-lock"), only(objects, "RoleBinding", "-admission-lock")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == lock["namespace"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lock["name"]],
            "verbs": ["get", "update"],
        },
    ]
    args = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--admission-lock={lock['namespace']}/{lock['name']}" in args


def test_without_the_admission_lock_the_flag_says_none_and_there_is_no_role() -> None:
    objects = render({"admissionLock": {"enabled": False}})
    assert [o for o in objects if o["metadata"]["name"].endswith("-admission-lock")] == []
    args = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--admission-lock")] == ["--admission-lock=none"]


def test_releases_in_two_namespaces_at_their_defaults_share_one_admission_lock() -> None:
    locks = set()
    for team in ("team-a", "team-b"):
        objects = render({"fullnameOverride": f"{team}-pj", "watchNamespaces": [team]}, f"{team}-ops")
        args = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        role = only(objects, "Role", "-admission-lock")
        locks.add((*(a for a in args if a.startswith("--admission-lock")), role["metadata"]["namespace"]))
    assert locks == {("--admission-lock=kube-system/paralleljob-admission", "kube-system")}


def test_every_binding_names_the_operator_service_account() -> None:
    for case, values in CASES.items():
        objects = render(values)
        account = only(objects, "ServiceAccount")
        for binding in (o for o in objects if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}):
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": RELEASE_NAMESPACE}
            ], case


def test_nodes_are_read_only_and_cluster_wide() -> None:
    for values in CASES.values():
        node_grants = {(g, r, v) for g, r, v in grants(render(values), {"ClusterRole"}) if r == "nodes"}
        assert node_grants == {("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch")}


@pytest.mark.parametrize("case", CASES)
def test_labelling_slow_nodes_grants_node_patch_and_passes_the_key_only_when_enabled(case: str) -> None:
    def node_verbs_and_flags(values: dict[str, Any]) -> tuple[set[str], list[str]]:
        objects = render({**CASES[case], **values})
        args = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        verbs = {v for _, r, v in grants(objects, {"ClusterRole", "Role"}) if r == "nodes"}
        return verbs, [a for a in args if a.startswith("--slow-node-label")]

    assert node_verbs_and_flags({}) == ({"get", "list", "watch"}, [])
    enabled = {"slowNodeLabel": {"enabled": True, "key": "example.com/slow"}}
    assert node_verbs_and_flags(enabled) == ({"get", "list", "watch", "patch"}, ["--slow-node-label=example.com/slow"])


@pytest.mark.parametrize("case", CASES)
def test_node_leases_are_read_in_kube_node_lease_only_while_the_gang_s_report_is_acted_on(case: str) -> None:
    role = only(render(CASES[case]), "Role", "-node-leases")
    assert role["metadata"]["namespace"] == "kube-node-lease"
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]
    off = render({**CASES[case], "recovery": {"lostNodeLeaseSeconds": 0}})
    assert [o for o in off if o["metadata"]["name"].endswith("-node-leases")] == []
    args = only(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lost-node-lease=0" in args


def test_namespaces_are_listed_only_when_the_operator_watches_listed_namespaces() -> None:
    """kopf's namespace observer lists and watches namespaces only when it is not cluster-wide."""

    def namespace_verbs(values: dict[str, Any]) -> set[str]:
        return {v for _, r, v in grants(render(values), {"ClusterRole"}) if r == "namespaces"}

    assert namespace_verbs({}) == set()
    assert namespace_verbs(NON_DEFAULT_VALUES) == {"list", "watch"}


def test_the_operator_holds_every_permission_it_grants_to_a_job_progress_account() -> None:
    """Kubernetes refuses to let a subject create a Role granting more than it holds (no `escalate` here)."""
    from paralleljob.manifests import rbac as progress_rbac

    owner = {
        "apiVersion": "paralleljob.io/v1alpha1",
        "kind": "ParallelJob",
        "metadata": {"name": "quickstart", "namespace": "default", "uid": "u"},
    }
    role = progress_rbac.build_role(owner)
    needed = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert needed <= grants(render(), {"ClusterRole"})
