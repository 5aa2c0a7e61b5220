"""The administrator's admission policy, as a table: each way a job could ask the operator for more than a pod
creator's rights is refused with the field and the rule, what the defaults allow passes, and an administrator can
widen each rule."""

from __future__ import annotations

import pytest
import yaml

from paralleljob.api import policy, validate_document
from paralleljob.api import types as t
from tests.api.helpers import BASE


def spec_with(template: str = "{}", network: str = "{}", checkpoint_volume: str | None = None) -> t.ParallelJobSpec:
    doc = yaml.safe_load(BASE)
    doc["spec"]["template"] = yaml.safe_load(template)
    doc["spec"]["network"] = yaml.safe_load(network)
    if checkpoint_volume is not None:
        doc["spec"]["checkpoint"]["volume"] = yaml.safe_load(checkpoint_volume)
    result = validate_document(doc)
    assert result.resolved is not None, [p.render() for p in result.problems]
    return result.resolved.spec


ESCALATIONS = {
    "host-path-root": (
        spec_with("{volumes: [{name: host, hostPath: {path: /}}], volumeMounts: [{name: host, mountPath: /host}]}"),
        "spec.template.volumes[0].hostPath: hostPath volumes are not allowed",
    ),
    "host-path-checkpoint": (
        spec_with(checkpoint_volume="{hostPath: {path: /var/lib/kubelet}}"),
        "spec.checkpoint.volume.hostPath: hostPath volumes are not allowed",
    ),
    "another-service-account": (
        spec_with("{serviceAccountName: cluster-admin-bot}"),
        "spec.template.serviceAccountName: cluster-admin-bot is not allowed",
    ),
    "ld-preload-in-env": (
        spec_with("{env: [{name: LD_PRELOAD, value: /data/evil.so}]}"),
        "spec.template.env[0].name: LD_PRELOAD is forbidden by the ParallelJob policy (forbidden env: LD_*)",
    ),
    "ld-preload-in-nccl-env": (
        spec_with(network="{ncclEnv: {LD_PRELOAD: /data/evil.so}}"),
        "spec.network.ncclEnv.LD_PRELOAD: LD_PRELOAD is forbidden",
    ),
    "apparmor-unconfined": (
        spec_with("{annotations: {container.apparmor.security.beta.kubernetes.io/trainer: unconfined}}"),
        "spec.template.annotations: container.apparmor.security.beta.kubernetes.io/trainer: key domains not allowed",
    ),
    "privileged-priority-class": (
        spec_with("{priorityClassName: system-node-critical}"),
        "spec.template.priorityClassName: system-node-critical is not allowed by the ParallelJob policy "
        "(priority classes allowed: none)",
    ),
    "secret-volume": (
        spec_with("{volumes: [{name: s, secret: {secretName: db}}]}"),
        "spec.template.volumes[0].secret: secret volumes are not allowed",
    ),
    "secret-through-projected": (
        spec_with("{volumes: [{name: p, projected: {sources: [{configMap: {name: c}}, {secret: {name: db}}]}}]}"),
        "spec.template.volumes[0].projected.sources[1].secret: projecting a secret is not allowed",
    ),
    "secret-through-env": (
        spec_with("{env: [{name: DB, valueFrom: {secretKeyRef: {name: db, key: password}}}]}"),
        "spec.template.env[0].valueFrom.secretKeyRef: reading Secrets is not allowed",
    ),
    "foreign-label-domain": (
        spec_with("{labels: {kueue.x-k8s.io/queue-name: other-team}}"),
        "spec.template.labels: kueue.x-k8s.io/queue-name: key domains not allowed",
    ),
}


@pytest.mark.parametrize("case", ESCALATIONS, ids=list(ESCALATIONS))
def test_an_escalation_is_refused_naming_the_field_and_the_rule(case: str) -> None:
    spec, expected = ESCALATIONS[case]
    found = [problem.render() for problem in policy.check_policy(spec, policy.AdmissionPolicy())]
    assert len(found) == 1 and found[0].startswith(expected), found
    assert "ask the cluster administrator" in found[0]


ALLOWED_BY_DEFAULT = {
    "plain": spec_with(),
    "default-account": spec_with("{serviceAccountName: default}"),
    "data-volumes": spec_with(
        "{volumes: [{name: d, persistentVolumeClaim: {claimName: data}}, {name: c, configMap: {name: tok}},"
        " {name: e, emptyDir: {}}, {name: t, projected: {sources: [{serviceAccountToken: {path: t}}]}}]}"
    ),
    "plain-env-and-nccl": spec_with("{env: [{name: WANDB_MODE, value: offline}]}", "{ncclEnv: {NCCL_DEBUG: INFO}}"),
    "own-metadata": spec_with("{labels: {team: a, app.kubernetes.io/name: gpt}, annotations: {owner: me}}"),
}


@pytest.mark.parametrize("case", ALLOWED_BY_DEFAULT, ids=list(ALLOWED_BY_DEFAULT))
def test_what_a_pod_creator_could_do_in_their_own_namespace_passes(case: str) -> None:
    assert policy.check_policy(ALLOWED_BY_DEFAULT[case], policy.AdmissionPolicy()) == []


WIDENED = {
    "host-path-listed": ("host-path-root", {"volume_types": (*policy.DEFAULT_VOLUME_TYPES, "hostPath")}),
    "account-listed": ("another-service-account", {"service_accounts": ("default", "cluster-admin-bot")}),
    "env-not-forbidden": ("ld-preload-in-env", {"forbidden_env": ()}),
    "domain-listed": ("apparmor-unconfined", {"metadata_domains": ("kubernetes.io",)}),
    "class-listed": ("privileged-priority-class", {"priority_classes": ("system-node-critical",)}),
    "secrets-listed": ("secret-through-projected", {"volume_types": (*policy.DEFAULT_VOLUME_TYPES, "secret")}),
}


@pytest.mark.parametrize("case", WIDENED, ids=list(WIDENED))
def test_an_administrator_can_widen_each_rule(case: str) -> None:
    escalation, settings = WIDENED[case]
    assert policy.check_policy(ESCALATIONS[escalation][0], policy.AdmissionPolicy(**settings)) == []


@pytest.mark.parametrize(
    ("key", "owned"),
    [
        ("paralleljob.io/job", True),
        ("team.paralleljob.io/x", True),
        ("app.kubernetes.io/managed-by", True),
        ("app.kubernetes.io/name", False),
        ("notparalleljob.io/x", False),
        ("paralleljob.io", False),
    ],
)
def test_operator_keys_are_refused_by_the_api_whatever_the_policy(key: str, owned: bool) -> None:
    doc = yaml.safe_load(BASE)
    doc["spec"]["template"] = {"labels": {key: "x"}}
    problems = [p.render() for p in validate_document(doc).problems]
    assert any(p.startswith("spec.template.labels: " + key) for p in problems) == owned, problems
