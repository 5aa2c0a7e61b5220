"""Every dashboard query and alert expression, evaluated by a real Prometheus (Debian's binary,
`tests.upstream.prometheus`) that scrapes the operator's own metrics registry (`handlers.metrics` and the per-job
collector) on a loopback port, with one running job observed as the job watch hands it over. Fast and without a
cluster; the same checks on the upstream test cluster, with the quickstart training, are
tests/upstream/test_prometheus.py's."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml

from paralleljob.handlers import job_metrics, metrics
from testcluster import polling
from testcluster.prometheus import Prometheus
from tests.chart.helpers import CHART, render

DASHBOARD = json.loads((CHART / "dashboards" / "paralleljob-training.json").read_text())
NOW = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
JOB: dict[str, Any] = {
    "metadata": {"namespace": "research", "name": "gpt-probe"},
    "spec": {"training": {"steps": 100}, "failurePolicy": {"progressTimeoutSeconds": 1}},
    "status": {
        "phase": "Running",
        "layout": "1x2x2",
        "worldSize": 4,
        "gpusPerNode": 2,
        "restarts": 1,
        "inPlaceRestarts": 1,
        "lastCheckpointStep": 8,
        "lastCheckpointTime": "2026-01-01T00:00:00Z",
        "progress": {
            "step": 10,
            "totalSteps": 100,
            "loss": 5.0,
            "validationLoss": 5.2,
            "tokensPerSecond": 900.0,
            "tflopsPerGpu": 0.01,
            "mfu": 0.3,
            "stepSeconds": 2.0,
            "modeledStepSeconds": 1.0,
            "updated": "2026-01-01T00:00:00Z",
            "stragglers": [{"node": "node-1", "factor": 1.8}],
        },
    },
}
VALUES = {
    "prometheusRule": {
        "enabled": True,
        "restartsPerHour": 0,
        "slowerThanModeled": 1,
        "checkpointMaxAgeSeconds": 1,
        "for": dict.fromkeys(
            ("stalled", "restartingOften", "slowerThanModeled", "checkpointStale", "rivalOperators", "notLeading"), "0s"
        ),
    }
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    folder = tmp_path_factory.mktemp("prometheus")
    rule = next(o for o in render(VALUES) if o["kind"] == "PrometheusRule")
    rules = folder / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    metrics.RECONCILES.labels(outcome="Reconciled").inc()
    metrics.PLANNING.observe(0.02)
    metrics.LEADER.set(1)
    port = free_port()
    prometheus_client.start_http_server(port, addr="127.0.0.1")
    # The counter restarts from 0 on the first scrape, then the job's restarts arrive, as a job's first restart.
    job_metrics.JOBS.observe({**JOB, "status": {**JOB["status"], "restarts": 0, "inPlaceRestarts": 0}})
    with Prometheus.running(folder, f"127.0.0.1:{port}", rules) as server:
        _wait(lambda: server.query('paralleljob_job_step{name="gpt-probe"}'))
        job_metrics.JOBS.observe(JOB)
        _wait(lambda: server.query('paralleljob_job_restarts_total{name="gpt-probe"} > 0'))
        time.sleep(3)  # a few more scrapes, so that rate() and increase() have their samples
        yield server
    job_metrics.JOBS.forget("research", "gpt-probe")


def _wait(condition: Any, timeout: float = 30) -> None:
    try:
        polling.wait_for(condition, timeout, "Prometheus to scrape the operator's metrics", interval=0.2)
    except TimeoutError as error:
        pytest.fail(str(error))


TARGETS = [(panel["title"], target["expr"]) for panel in DASHBOARD["panels"] for target in panel["targets"]]


@pytest.mark.parametrize(("title", "expr"), TARGETS, ids=[f"{t}/{e[:40]}" for t, e in TARGETS])
def test_every_panel_query_returns_data_for_the_job(prometheus: Prometheus, title: str, expr: str) -> None:
    query = expr.replace("$namespace", "research").replace("$job", "gpt-probe").replace("$__rate_interval", "1m")
    result = prometheus.query(query)
    assert result, f"{title}: {query} returned nothing"
    if "paralleljob_job_" in query and "sum by (phase)" not in query:
        assert {item["metric"].get("name") for item in result} == {"gpt-probe"}


def test_every_alert_expression_parses_and_the_job_alerts_return_the_job(prometheus: Prometheus) -> None:
    rule = next(o for o in render(VALUES) if o["kind"] == "PrometheusRule")
    for alert in rule["spec"]["groups"][0]["rules"]:
        result = prometheus.query(alert["expr"])
        if alert["alert"] in ("ParallelJobRivalOperators", "ParallelJobOperatorNotLeading"):
            assert result == [], f"{alert['alert']} fires on one healthy operator"
        else:
            assert [item["metric"].get("name") for item in result] == ["gpt-probe"], alert["alert"]


def test_the_job_alerts_fire(prometheus: Prometheus) -> None:
    def firing() -> set[str]:
        return {item["metric"]["alertname"] for item in prometheus.query('ALERTS{alertstate="firing"}')}

    expected = {
        "ParallelJobStalled",
        "ParallelJobRestartingOften",
        "ParallelJobSlowerThanModeled",
        "ParallelJobCheckpointStale",
    }
    _wait(lambda: expected <= firing())
    assert not firing() & {"ParallelJobRivalOperators", "ParallelJobOperatorNotLeading"}


def test_a_forgotten_jobs_series_are_gone_after_the_next_scrape(prometheus: Prometheus, tmp_path: Path) -> None:
    other = {**JOB, "metadata": {"namespace": "research", "name": "gpt-gone"}}
    job_metrics.JOBS.observe(other)
    _wait(lambda: prometheus.query('paralleljob_job_step{name="gpt-gone"}'))
    job_metrics.JOBS.forget("research", "gpt-gone")
    _wait(lambda: not prometheus.query('{__name__=~"paralleljob_job_.+", name="gpt-gone"}'))
    assert prometheus.query('paralleljob_job_step{name="gpt-probe"}'), "the other job's series stay"
