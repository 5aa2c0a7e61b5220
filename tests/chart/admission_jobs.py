"""The jobs the chart's ValidatingAdmissionPolicy is tested on, the chart values of the default policy and an
administrator's widened one, and the operator's own verdict on each (`api.policy`): shared by the offline check
with cel-python (tests/chart/test_admission_policy.py) and the real API server's (tests/upstream/
test_admission_policy.py)."""

from __future__ import annotations

from typing import Any

import yaml

from paralleljob.api import crd, policy, validate_document
from tests.api.helpers import BASE

SPEC_SCHEMA = crd.spec_schema()

ENABLED = {"policy": {"validatingAdmissionPolicy": {"enabled": True}}}
WIDENED = {
    "policy": {
        "allowedVolumeTypes": [*policy.DEFAULT_VOLUME_TYPES, "hostPath", "secret"],
        "allowedServiceAccounts": ["default", "deployer"],
        "forbiddenEnv": ["PYTHONPATH"],
        "allowedPriorityClasses": ["system-cluster-critical"],
        "allowedMetadataDomains": ["app.kubernetes.io", "kubernetes.io"],
        "validatingAdmissionPolicy": {"enabled": True},
    }
}

# The job the admission policy is tested on is the Python policy tests' own (tests/api/test_policy.py).
JOBS = {
    "plain": {},
    "host-path-root": {"template": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}},
    "host-path-checkpoint": {"checkpoint": {"volume": {"hostPath": {"path": "/"}}}},
    "secret-volume": {"template": {"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}},
    "projected-secret": {
        "template": {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "d"}}]}}]}
    },
    "projected-token": {
        "template": {"volumes": [{"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}
    },
    "env-secret": {"template": {"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "d", "key": "k"}}}]}},
    "another-account": {"template": {"serviceAccountName": "deployer"}},
    "default-account": {"template": {"serviceAccountName": "default"}},
    "ld-preload": {"template": {"env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}},
    "ld-preload-nccl": {"network": {"ncclEnv": {"LD_LIBRARY_PATH": "/x"}}},
    "pythonpath": {"template": {"env": [{"name": "PYTHONPATH", "value": "/x"}]}},
    "priority-class": {"template": {"priorityClassName": "system-cluster-critical"}},
    "apparmor-unconfined": {
        "template": {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}
    },
    "own-labels": {"template": {"labels": {"team": "a", "app.kubernetes.io/name": "gpt"}}},
}


def job(name: str) -> dict[str, Any]:
    doc = yaml.safe_load(BASE)
    doc["spec"].update(JOBS[name])
    doc["spec"] = crd.apply_defaults(SPEC_SCHEMA, doc["spec"])
    return doc


def operator_problems(values: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    settings = values["policy"]
    admission = policy.AdmissionPolicy(
        volume_types=tuple(settings.get("allowedVolumeTypes", policy.DEFAULT_VOLUME_TYPES)),
        service_accounts=tuple(settings.get("allowedServiceAccounts", policy.DEFAULT_SERVICE_ACCOUNTS)),
        forbidden_env=tuple(settings.get("forbiddenEnv", policy.DEFAULT_FORBIDDEN_ENV)),
        priority_classes=tuple(settings.get("allowedPriorityClasses", ())),
        metadata_domains=tuple(settings.get("allowedMetadataDomains", policy.DEFAULT_METADATA_DOMAINS)),
    )
    resolved = validate_document(doc).resolved
    assert resolved is not None
    return [p.render() for p in policy.check_policy(resolved.spec, admission)]
