"""Fixtures for tests against the upstream control plane: one cluster per test worker, started on first use
and stopped when the worker ends, with the chart installed by the real `helm install` as a user installs it.

Tests talk to it as users do: kubectl and helm from .tools/bin with a kubeconfig, or HTTPS requests with a
bearer token (`Api`). Each test works in namespaces of its own, since the cluster is shared by the worker's tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from testcluster import controlplane
from testcluster.api import CHART, RELEASE, RELEASE_NAMESPACE, Api, Tool


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.State]:
    folder = tmp_path_factory.mktemp("upstream")
    state = controlplane.up(folder)
    try:
        yield state
    finally:
        controlplane.down(folder)


@pytest.fixture(scope="session")
def admin_api(upstream: controlplane.State) -> Api:
    return Api(upstream, upstream.tokens["admin"])


@pytest.fixture(scope="session")
def kubectl(upstream: controlplane.State) -> Tool:
    return Tool("kubectl", upstream.kubeconfig)


@pytest.fixture(scope="session")
def helm(upstream: controlplane.State) -> Tool:
    return Tool("helm", upstream.kubeconfig)


@pytest.fixture(scope="session")
def chart(helm: Tool) -> str:
    """The chart installed once per cluster with `helm install` at its defaults (CRD included)."""
    helm("install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace", "--wait=false")
    return RELEASE


@pytest.fixture
def namespace(admin_api: Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin_api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    admin_api.send("DELETE", f"/api/v1/namespaces/{name}")
