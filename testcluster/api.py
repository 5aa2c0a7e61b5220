"""Talking to the test cluster as its users do: HTTPS requests with a bearer token (`Api`), kubectl and helm from
.tools/bin with a kubeconfig (`Tool`), and where the chart is and what its release is called."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import requests

from testcluster import controlplane

REPO = controlplane.REPO
CHART = REPO / "charts" / "paralleljob-operator"
RELEASE, RELEASE_NAMESPACE = "paralleljob", "paralleljob-system"


class Api:
    """HTTPS requests to the API server as one user (a bearer token), verifying its certificate."""

    def __init__(self, state: controlplane.State, token: str, server: str | None = None) -> None:
        self.state, self.token, self.server = state, token, server or state.server
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def send(self, method: str, path: str, body: Any = None, **params: str) -> requests.Response:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        data = None if body is None else json.dumps(body)
        # `verify` per request: a session's own is overridden by $REQUESTS_CA_BUNDLE, which this machine sets.
        return self.session.request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers=headers,
            timeout=30,
            verify=str(self.state.ca),
        )

    def ok(self, response: requests.Response) -> dict[str, Any]:
        assert response.ok, f"{response.request.method} {response.url}: {response.status_code} {response.text}"
        return dict(response.json())

    def create(self, path: str, body: Any, **params: str) -> dict[str, Any]:
        return self.ok(self.send("POST", path, body, **params))


class Tool:
    """kubectl or helm from .tools/bin, as one user of the cluster."""

    def __init__(self, name: str, kubeconfig: Path) -> None:
        self.path, self.kubeconfig = str(controlplane.binary(name)), kubeconfig

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.kubeconfig.parent / "helm"),
        }
        done = subprocess.run(
            [self.path, *args], input=stdin, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{Path(self.path).name} {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return self.run(*args, stdin=stdin).stdout
