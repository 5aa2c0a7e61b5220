"""A real Prometheus for the cluster tests: Debian's `prometheus` binary (scripts/install-prometheus.sh), started by
the test like the control plane, with its own configuration, storage folder and loopback port, scraping the
operator's /metrics every second and evaluating the chart's rules every second. Stopped when the test ends.

Used by tests/upstream/test_prometheus.py.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from testcluster import controlplane, polling

SCRAPE_SECONDS = 1


class Prometheus:
    """One Prometheus server and its HTTP API."""

    def __init__(self, folder: Path, target: str, rules: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: run scripts/install-prometheus.sh (part of `make tools`)", pytrace=False)
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "paralleljob-operator", "static_configs": [{"targets": [target]}]}],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = controlplane.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (folder / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @classmethod
    @contextlib.contextmanager
    def running(cls, folder: Path, target: str, rules: Path) -> Iterator[Prometheus]:
        server = cls(folder, target, rules)
        try:
            server.wait_ready()
            yield server
        finally:
            server.stop()

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, "prometheus exited at start; see prometheus.log"
            return requests.get(f"{self.url}/-/ready", timeout=2).ok

        try:
            polling.wait_for(ready, timeout, "prometheus /-/ready", interval=0.2, tolerate=(requests.RequestException,))
        except TimeoutError:
            pytest.fail("prometheus did not become ready", pytrace=False)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; fails the test, naming the query, when Prometheus refuses it."""
        response = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = response.json()
        assert response.ok and body.get("status") == "success", f"{expr!r}: {body.get('error', response.text)}"
        return list(body["data"]["result"])

    def series(self, match: str) -> list[dict[str, str]]:
        response = requests.get(f"{self.url}/api/v1/series", params={"match[]": match}, timeout=30)
        assert response.ok, response.text
        return list(response.json()["data"])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
