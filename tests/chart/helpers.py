"""What the tests of tests/chart share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest. Rendering the chart is `testcluster.chart`'s (the operator's scenarios and the benchmarks
render through it too); its names are imported here for the chart's tests.
"""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest

from testcluster.chart import CHART, INSTALL_HINT, RELEASE, RELEASE_NAMESPACE, RenderError, only, render, render_text
from testcluster.chart import tool_path as _tool_path

__all__ = [
    "CHART",
    "NON_DEFAULT_VALUES",
    "RELEASE",
    "RELEASE_NAMESPACE",
    "REPO",
    "RenderError",
    "only",
    "render",
    "render_text",
    "run_helm",
    "tool",
]

REPO = pathlib.Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """Path of a Kubernetes tool: .tools/bin first, then $PATH; fails the test (never skips) when absent."""
    found = _tool_path(name)
    if found is None:
        pytest.fail(f"{name} not found in .tools/bin or on PATH: {INSTALL_HINT}", pytrace=False)
    return found


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=60)
    if check and completed.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{completed.stdout}\n{completed.stderr}", pytrace=False)
    return completed


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
