"""Fixtures for operator tests: the upstream control plane (testcluster/server.py: kube-apiserver, etcd and
kube-controller-manager, one per test worker, shared by its tests one after another and reset between them),
the operator as a `paralleljob operator` process talking to it through the fault proxy as the ServiceAccount
the chart renders, with the chart's RBAC from `helm template` applied, a kubernetes client (the admin's,
straight to the server) for the test's own reads and writes, and builders.

Fixtures only; what the tests share besides them is tests.operator.helpers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from testcluster import server as upstream
from testcluster.server import UpstreamServer
from tests.operator.helpers import Cluster, Operator, install_operator_rbac


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamServer]:
    """The worker's upstream control plane, started on first use (testcluster/server.py)."""
    yield from upstream.started(tmp_path_factory.mktemp("operator-control-plane"))


@pytest.fixture
def apiserver(control_plane: UpstreamServer) -> Iterator[UpstreamServer]:
    """The control plane for one test: nothing recorded at the start; reset to how it was after start-up, and
    every fault lifted, at the end."""
    control_plane.begin()
    yield control_plane
    denied = list(control_plane.denied)
    control_plane.reset()
    assert denied == [], "the API server refused requests (least privilege or a missing permission)"


@pytest.fixture
def server(apiserver: UpstreamServer) -> UpstreamServer:
    """The API server of the test: the upstream control plane."""
    return apiserver


@pytest.fixture
def cluster(server: Any) -> Cluster:
    return Cluster(server)


@pytest.fixture
def operator_args() -> Sequence[str]:
    """Extra `paralleljob operator` flags; a test module overrides this fixture to change them."""
    return Operator.ARGS


@pytest.fixture
def operator(server: Any, cluster: Cluster, tmp_path: Path, operator_args: Sequence[str]) -> Iterator[Operator]:
    kubeconfig = install_operator_rbac(server, cluster.client)
    process = Operator(server, tmp_path / "operator.log", kubeconfig, operator_args).start()
    yield process
    process.stop()
    sys.stderr.write((tmp_path / "operator.log").read_text()[-4000:])
