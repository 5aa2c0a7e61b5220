"""The operator's Helm chart as the test cluster renders it: `helm template` of charts/paralleljob-operator with
given values, the one object of a kind, and what an operator run takes from the chart (its ServiceAccount and RBAC,
its leader-election flags and Lease name). helm comes from .tools/bin, else $PATH (`make tools` installs it).
The chart's tests (tests/chart) and the operator's scenarios and benchmarks all render through here.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from testcluster import controlplane
from testcluster.api import CHART, RELEASE_NAMESPACE

# `helm template`'s release name; the installed product's is `api.RELEASE`.
RELEASE = "pj"
INSTALL_HINT = "run scripts/install-k8s-tools.sh to install helm and kubectl into .tools/bin"
# The chart's objects that make the operator's identity and permissions (the rest is its Deployment).
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


class RenderError(Exception):
    """helm template refused the values (schema or template failure); the message is helm's stderr."""


def tool_path(name: str) -> str | None:
    """Path of a Kubernetes tool: .tools/bin first, then $PATH; None when neither has it."""
    candidate = controlplane.BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


@functools.cache
def _render_cached(values_json: str, namespace: str) -> str:
    helm = tool_path("helm")
    if helm is None:
        raise FileNotFoundError(f"helm not found in {controlplane.BIN} or on PATH: {INSTALL_HINT}")
    completed = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", namespace, "--values", "-"],
        input=values_json,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if completed.returncode != 0:
        raise RenderError(completed.stderr)
    return completed.stdout


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


def chart_rbac(
    watch_namespaces: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    release_namespace: str = RELEASE_NAMESPACE,
) -> tuple[dict[str, Any], ...]:
    """The operator's ServiceAccount and RBAC as `helm template` renders them with the chart's defaults (and
    these `watchNamespaces` and other values) for a release in `release_namespace`."""
    merged = {**({"watchNamespaces": list(watch_namespaces)} if watch_namespaces else {}), **(values or {})}
    return tuple(o for o in render(merged or None, release_namespace) if o["kind"] in RBAC_KINDS)


def install_operator_rbac(
    server: Any,
    client: kubernetes.client.ApiClient,
    watch_namespaces: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    release_namespace: str = RELEASE_NAMESPACE,
) -> Path:
    """Apply the chart's ServiceAccount and RBAC (as the admin), with the namespaces they go in, and return a
    kubeconfig for that account."""
    objects = chart_rbac(watch_namespaces, values, release_namespace)
    core = kubernetes.client.CoreV1Api(client)
    existing = {n.metadata.name for n in core.list_namespace().items}
    for namespace in sorted(
        {release_namespace, *(o["metadata"].get("namespace") or release_namespace for o in objects)}
    ):
        if namespace not in existing:
            core.create_namespace({"metadata": {"name": namespace}})
    for obj in objects:
        kubernetes.utils.create_from_dict(client, obj)
    (account,) = (o for o in objects if o["kind"] == "ServiceAccount")
    return Path(server.kubeconfig_for(account["metadata"]["namespace"], account["metadata"]["name"]))


def chart_leader_election_args() -> list[str]:
    """The leader-election flags of the chart's Deployment (its Lease, in the release namespace)."""
    args = only(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith(("--leader-elect", "--leader-election-"))]


def chart_lease_name() -> str:
    (flag,) = (a for a in chart_leader_election_args() if a.startswith("--leader-election-lease="))
    return flag.split("=", 1)[1]


def read_chart_lease(client: kubernetes.client.ApiClient) -> Any:
    """The chart's leader-election Lease (its name from the Deployment's flags, in the release namespace), read
    with `client`: who holds it, and its uid for the Events posted about it."""
    return kubernetes.client.CoordinationV1Api(client).read_namespaced_lease(chart_lease_name(), RELEASE_NAMESPACE)
