"""Fixtures for the strict cluster's own tests: one API server per module, and raw HTTP requests to it with a
chosen token, so each test sees the exact status code, reason and message a client would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cluster.apiserver import ClusterThread


class Client:
    """HTTP to the API server as one user (its bearer token), optionally under a chosen User-Agent."""

    def __init__(self, cluster: ClusterThread, token: str | None, agent: str | None = None) -> None:
        self.cluster, self.token, self.agent = cluster, token, agent

    def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/merge-patch+json",
        stream: bool = False,
        **params: str,
    ) -> requests.Response:
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.agent is not None:
            headers["User-Agent"] = self.agent
        data = body if isinstance(body, bytes) else (json.dumps(body) if body is not None else None)
        return requests.request(
            method,
            self.cluster.url + path,
            data=data,
            headers=headers,
            params=params,
            timeout=30,
            verify=str(self.cluster.ca),
            stream=stream,
        )

    def create(self, path: str, body: Any, **params: str) -> requests.Response:
        return self.send("POST", path, body, **params)

    def patch(self, path: str, body: Any, **params: str) -> requests.Response:
        return self.send("PATCH", path, body, **params)

    def ok(self, response: requests.Response) -> dict[str, Any]:
        assert response.status_code < 300, response.text
        return response.json()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterThread]:
    thread = ClusterThread(Path(tmp_path_factory.mktemp("cluster"))).start()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def admin(cluster: ClusterThread) -> Client:
    client = Client(cluster, cluster.server.tokens.admin_token)
    client.ok(client.create("/api/v1/namespaces", {"metadata": {"name": "research"}}))
    return client


def refusal(response: requests.Response) -> tuple[int, str, str]:
    """(code, reason, message) of a refused request, checked to be a Status as the API sends it."""
    body = response.json()
    assert (body["kind"], body["status"], body["code"]) == ("Status", "Failure", response.status_code), body
    return response.status_code, body["reason"], body["message"]
