"""What the tests of tests/chart share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]


CHART = REPO / "charts" / "paralleljob-operator"


TOOLS_BIN = REPO / ".tools" / "bin"


RELEASE = "pj"


RELEASE_NAMESPACE = "paralleljob-system"


INSTALL_HINT = "run scripts/install-k8s-tools.sh to install helm and kubectl into .tools/bin"


def tool(name: str) -> str:
    """Path of a Kubernetes tool: .tools/bin first, then $PATH; fails the test (never skips) when absent."""
    candidate = TOOLS_BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found in {TOOLS_BIN} or on PATH: {INSTALL_HINT}", pytrace=False)
    return found


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=60)
    if check and completed.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{completed.stdout}\n{completed.stderr}", pytrace=False)
    return completed


@functools.cache
def _render_cached(values_json: str, namespace: str) -> str:
    completed = subprocess.run(
        [tool("helm"), "template", RELEASE, str(CHART), "--namespace", namespace, "--values", "-"],
        input=values_json,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if completed.returncode != 0:
        raise RenderError(completed.stderr)
    return completed.stdout


class RenderError(Exception):
    """helm template refused the values (schema or template failure); the message is helm's stderr."""


def render_text(values: dict[str, Any] | None = None, namespace: str = RELEASE_NAMESPACE) -> str:
    """`helm template` output for `values` (JSON is YAML, so the values go in as JSON on stdin)."""
    return _render_cached(json.dumps(values or {}, sort_keys=True), namespace)


def render(values: dict[str, Any] | None = None, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """The objects `helm template` renders for `values`."""
    return [doc for doc in yaml.safe_load_all(render_text(values, namespace)) if doc]


def only(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one object of `kind` (whose name ends with `name_suffix`)."""
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, got {[o['metadata']['name'] for o in matches]}"
    return matches[0]


# Values that turn on or change every switch the chart has; the defaults are the other case.
NON_DEFAULT_VALUES: dict[str, Any] = {
    "fullnameOverride": "gpu-operator-pj",
    "crds": {"enabled": True, "keep": False},
    "watchNamespaces": ["ml-team-a", "ml-team-b"],
    "image": {
        "repository": "registry.example.com/ml/paralleljob-operator",
        "digest": "sha256:" + "ab" * 32,
        "pullPolicy": "Always",
    },
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "serviceAccount": {"create": True, "name": "pj-operator", "annotations": {"iam.example.com/role": "pj"}},
    "operator": {
        "logLevel": "debug",
        "logFormat": "plain",
        "healthPort": 8181,
        "livenessProbe": {"initialDelaySeconds": 3, "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 2},
    },
    "replicas": 2,
    "leaderElection": {"enabled": True, "leaseName": "gpu-pj-leader", "leaseSeconds": 30},
    "admissionLock": {"enabled": True, "namespace": "platform", "name": "gpu-admission"},
    "jobDefaults": {
        "trainerImage": {"repository": "registry.example.com/ml/trainer", "tag": "2026.11"},
        "fabric": "infiniband",
        "ncclEnv": {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "=mlx5_0,mlx5_1"},
    },
    "policy": {
        "allowedVolumeTypes": ["persistentVolumeClaim", "emptyDir", "hostPath"],
        "allowedServiceAccounts": ["default", "trainer"],
        "forbiddenEnv": ["LD_*", "PYTHONPATH"],
        "allowedPriorityClasses": ["research-low"],
        "allowedMetadataDomains": ["app.kubernetes.io", "example.com"],
        "validatingAdmissionPolicy": {"enabled": True, "exemptPodCreators": False},
    },
    "jobPods": {
        "runAsUser": 2000,
        "runAsGroup": 2001,
        "fsGroup": 2002,
        "readOnlyRootFilesystem": False,
        "rdmaIpcLock": False,
    },
    "metrics": {
        "port": 9464,
        "service": {"enabled": True, "annotations": {"prometheus.io/scrape": "true"}},
        "serviceMonitor": {
            "enabled": True,
            "interval": "15s",
            "scrapeTimeout": "5s",
            "labels": {"release": "prometheus"},
        },
    },
    "grafanaDashboard": {
        "enabled": True,
        "label": "example.com/dashboard",
        "labelValue": "training",
        "namespace": "monitoring",
        "annotations": {"grafana_folder": "Training"},
    },
    "prometheusRule": {
        "enabled": True,
        "labels": {"release": "prometheus"},
        "severity": "critical",
        "restartsPerHour": 5,
        "slowerThanModeled": 2,
        "checkpointMaxAgeSeconds": 3600,
        "for": {
            "stalled": "2m",
            "restartingOften": "1m",
            "slowerThanModeled": "30m",
            "checkpointStale": "10m",
            "rivalOperators": "1m",
            "notLeading": "10m",
        },
    },
    "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
    "priorityClassName": "platform-critical",
    "podLabels": {"team": "ml-platform"},
    "podAnnotations": {"example.com/owner": "ml-platform"},
    "nodeSelector": {"kubernetes.io/os": "linux", "node-pool": "system"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}
                ]
            }
        }
    },
}
