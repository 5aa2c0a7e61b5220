"""The per-job metrics, the chart's dashboard and its alert rules, checked by a real Prometheus on the upstream
control plane: the product installed by `helm install` as a user installs it, a real Prometheus
(`tests.upstream.prometheus`) scraping the operator's /metrics every second and evaluating the chart's rules
(rendered by helm with thresholds the running job crosses, and `for: 0s`), while the quickstart runs on it.

The job reports every figure a panel draws, as a user's job would: it trains on a folder made by `paralleljob
data prepare` in the corpus claim with a tenth of its documents held out and evaluated every 4 steps (the
validation loss), it sets PARALLELJOB_PEAK_TFLOPS in its pod template as a user on a CPU or an unknown GPU does
(MFU), and one of its pods is held to a tenth of a core by the test kubelet's `throttle` fault until the trainer
names its node slow (`stragglers.action: Report`: the slowest node's factor), then given the machine's cores back.

One cluster and one run serve every assertion:
- every dashboard panel's query, with the dashboard's variables set to the job, returns data for the job (or, for
  the controller's panels, for the operator); a query that returns nothing, or that Prometheus refuses, fails the
  test;
- the stall alert fires for the job while one of its ranks is stopped (SIGSTOP) past its progress timeout;
- every job alert's expression returns the job (restarts, slower than modeled, stale checkpoint), and the
  operator alerts' expressions parse and their series exist;
- the series of the deleted job are gone after the next scrape.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from paralleljob.datasets.prepare import load_tokenizer, prepare
from testcluster import controlplane, polling
from testcluster.api import CHART, RELEASE, REPO
from testcluster.product import Product
from testcluster.prometheus import Prometheus
from testcluster.quickstart import JOB
from tests.datasets.corpus import train_tokenizer
from tests.upstream.helpers import wait_for

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "quickstart-on-a-cluster.yaml"
DASHBOARD = json.loads((CHART / "dashboards" / "paralleljob-training.json").read_text())
HANG_TIMEOUT_SECONDS = 30
TOKENIZER_VOCAB = 400
# A user's figure for a CPU core's fp32 peak (50 GFLOP/s): the trainer knows no peak for a CPU, so MFU is reported
# only where the user sets one, as on a GPU the trainer's table does not name.
PEAK_TFLOPS = "0.05"
STRAGGLER_WINDOW_STEPS = 4
# Thresholds the running quickstart crosses, so that each job alert's expression has the job to return.
RULE_VALUES = {
    "prometheusRule.enabled": "true",
    "prometheusRule.restartsPerHour": "0",
    "prometheusRule.slowerThanModeled": "1",
    "prometheusRule.checkpointMaxAgeSeconds": "1",
    **{
        f"prometheusRule.for.{name}": "0s"
        for name in (
            "stalled",
            "restartingOften",
            "slowerThanModeled",
            "checkpointStale",
            "rivalOperators",
            "notLeading",
        )
    },
}
OPERATOR_ALERTS = {
    "ParallelJobRivalOperators": "paralleljob_rival_operators",
    "ParallelJobOperatorNotLeading": "paralleljob_leader",
}


def small_quickstart() -> dict[str, Any]:
    """examples/quickstart-on-a-cluster.yaml at 1x2x2 on two 2-GPU nodes (4 ranks), long enough to outlast the test
    (it is deleted at the end), a step logged each step, and a progress timeout for the stall; on the prepared
    corpus with held-out evaluation (examples/quickstart-prepared.yaml's), a peak for MFU, and slow nodes
    reported (each node rank is one data-parallel replica, so each rank's peer is on the other node)."""
    job: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec = job["spec"]
    spec["parallelism"], spec["gpusPerNode"] = {"pipeline": 1, "tensor": 2, "data": 2}, 2
    spec["model"]["vocabSize"] = 512
    spec["training"].update(steps=2000, logInterval=1)
    spec["training"]["data"]["source"] = "tokens"
    spec["training"]["eval"] = {"heldOutFraction": 0.1, "intervalSteps": 4, "batches": 1}
    spec["template"]["env"] = [{"name": "PARALLELJOB_PEAK_TFLOPS", "value": PEAK_TFLOPS}]
    spec["checkpoint"]["intervalSteps"] = 4
    spec["failurePolicy"]["progressTimeoutSeconds"] = HANG_TIMEOUT_SECONDS
    spec["failurePolicy"]["stragglers"] = {"windowSteps": STRAGGLER_WINDOW_STEPS, "windows": 2, "action": "Report"}
    return job


def prepare_corpus(product: Product, folder: Path) -> None:
    """The operator's sources tokenized into the corpus claim's folder, as a user runs `paralleljob data prepare`
    onto the shared volume (with a tokenizer trained on this repository's sources, as scripts/train_tokenizer.py)."""
    tokenizer = load_tokenizer(train_tokenizer(folder / "tokenizer", vocab_size=TOKENIZER_VOCAB))
    corpus = product.corpus_folder()
    shutil.rmtree(corpus, ignore_errors=True)
    prepare([REPO / "operator" / "paralleljob"], tokenizer, corpus, workers=1)


def rendered_rules(product: Product, folder: Path) -> Path:
    """The chart's PrometheusRule as helm renders it with RULE_VALUES, as a Prometheus rules file."""
    values = ",".join(f"{key}={value}" for key, value in RULE_VALUES.items())
    text = product.helm(
        "template", RELEASE, str(CHART), "--show-only", "templates/prometheusrule.yaml", "--set", values
    )
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": yaml.safe_load(text)["spec"]["groups"]}))
    return path


def for_the_job(expr: str) -> str:
    """A dashboard query with its variables set as a user viewing the job sets them."""
    return expr.replace("$namespace", "default").replace("$job", JOB).replace("$__rate_interval", "5m")


def has_job(result: list[dict[str, Any]]) -> bool:
    return any(item["metric"].get("name") == JOB for item in result)


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    with Product.running(tmp_path, nodes=2, gpus_per_node=2) as made:
        yield made


def test_a_real_prometheus_sees_the_job_through_the_dashboard_and_the_alerts(product: Product, tmp_path: Path) -> None:
    metrics_port = controlplane.free_port()
    product.install(f"metrics.port={metrics_port}")
    prepare_corpus(product, tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(small_quickstart()))
    product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
    product.kubectl("apply", "-f", str(tmp_path / "job.yaml"))
    rules = rendered_rules(product, tmp_path)
    with Prometheus.running(tmp_path / "prometheus", f"127.0.0.1:{metrics_port}", rules) as prometheus:
        slow_down_a_node_until_named(product, prometheus)
        check_the_dashboard(product, prometheus)
        give_the_node_its_cores_back(product)
        check_the_stall_alert(product, prometheus)
        check_the_alert_expressions(product, prometheus, rules)
        check_a_deleted_jobs_series_go(product, prometheus, metrics_port)


def slow_down_a_node_until_named(product: Product, prometheus: Prometheus) -> None:
    """Pod 1 held to a tenth of a core once the job steps (tests/upstream/test_slow_node.py's throttle), until the
    trainer names its node: two slow windows in a row, and the operator's slowest-node series in Prometheus."""
    stepping = f'paralleljob_job_step{{name="{JOB}"}} >= 2'
    wait_for("the job stepping", lambda: prometheus.query(stepping), product, 300)
    product.cluster.fault("throttle", namespace="default", pod=f"{JOB}-1", cores="0.1")
    named = f'paralleljob_job_slowest_node_factor{{name="{JOB}"}}'
    wait_for("the throttled node named slow in Prometheus", lambda: has_job(prometheus.query(named)), product, 300)


def give_the_node_its_cores_back(product: Product) -> None:
    """The throttle's quota raised to every core of the machine, so that the stall check's in-place restart does
    not start its ranks at a tenth of a core."""
    product.cluster.fault("throttle", namespace="default", pod=f"{JOB}-1", cores=str(os.cpu_count() or 1))


def check_the_dashboard(product: Product, prometheus: Prometheus) -> None:
    def reported() -> bool:
        found = prometheus.query(f'paralleljob_job_checkpoint_age_seconds{{name="{JOB}"}}')
        return has_job(found) and has_job(prometheus.query(f'paralleljob_job_step_seconds{{name="{JOB}"}}'))

    wait_for("the job's step time and first checkpoint in Prometheus", reported, product, 420)
    namespaces = {s["namespace"] for s in prometheus.series("paralleljob_job_info")}
    jobs = {s["name"] for s in prometheus.series('paralleljob_job_info{namespace=~"default"}')}
    assert "default" in namespaces and JOB in jobs, "the namespace and job variables list the job"

    def without_data() -> list[str]:
        empty = []
        for panel in DASHBOARD["panels"]:
            for target in panel["targets"]:
                expr = for_the_job(target["expr"])
                result = prometheus.query(expr)
                per_job = "paralleljob_job_" in expr and "sum by (phase)" not in expr
                if not result or (per_job and not has_job(result)):
                    empty.append(f"{panel['title']}: {expr}")
        return empty

    # A rate() needs two scrapes of its counter: a CI rehearsal's job reached its first checkpoint so soon that the
    # controller's rate panels had one; the queries are asked again until each has data (a minute at most).
    try:
        polling.wait_for(lambda: not without_data(), 60, "every dashboard query with data")
    except TimeoutError:
        assert without_data() == [], "dashboard queries without data for the running job"


def check_the_stall_alert(product: Product, prometheus: Prometheus) -> None:
    """A stopped rank holds every collective: no step is reported past the progress timeout, and the alert fires
    (until the supervisors' in-place restart, which kills the stopped process, lets the job step again)."""
    pid = wait_for("rank 3's pid", lambda: product.rank_pid(f"{JOB}-1", 3), product, 60)
    os.kill(pid, signal.SIGSTOP)
    firing = f'ALERTS{{alertname="ParallelJobStalled", alertstate="firing", name="{JOB}"}}'
    wait_for("ParallelJobStalled firing", lambda: prometheus.query(firing), product, 180)
    restarted = f'paralleljob_job_restarts_total{{name="{JOB}", kind="in_place"}} > 0'
    wait_for("the in-place restart in Prometheus", lambda: prometheus.query(restarted), product, 240)
    stepping = f'paralleljob_job_seconds_since_step{{name="{JOB}"}} < {HANG_TIMEOUT_SECONDS}'
    wait_for("the job stepping again", lambda: prometheus.query(stepping), product, 300)


def check_the_alert_expressions(product: Product, prometheus: Prometheus, rules_file: Path) -> None:
    """Each job alert's expression returns the job within a minute of polling: one instant query is not enough,
    as the checkpoint's age (threshold 1 s) is below 1 s for a moment after each checkpoint (every 4 steps),
    which is where CI's one query fell."""
    rules = yaml.safe_load(rules_file.read_text())["groups"][0]["rules"]
    for rule in rules:
        result = prometheus.query(rule["expr"])  # fails on an expression Prometheus refuses
        if rule["alert"] in OPERATOR_ALERTS:
            assert prometheus.query(OPERATOR_ALERTS[rule["alert"]]), f"{rule['alert']}: the operator's series"
            assert not result, f"{rule['alert']} fires on a healthy single operator"
        elif rule["alert"] != "ParallelJobStalled":  # checked firing above, while the rank was stopped
            returns_job = lambda expr=rule["expr"]: has_job(prometheus.query(expr))  # noqa: E731
            wait_for(f"{rule['alert']}: {rule['expr']} returning the job", returns_job, product, 60)


def check_a_deleted_jobs_series_go(product: Product, prometheus: Prometheus, metrics_port: int) -> None:
    selector = f'{{__name__=~"paralleljob_job_.+", name="{JOB}"}}'
    assert prometheus.query(selector), "the job's series are there before it is deleted"
    product.kubectl("delete", "pj", JOB, "--wait=true", "--timeout=120s")
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    gone = lambda: f'name="{JOB}"' not in requests.get(metrics, timeout=10).text  # noqa: E731
    wait_for("the operator no longer exporting the deleted job", gone, product, 30)
    wait_for("the deleted job's series gone after the next scrape", lambda: not prometheus.query(selector), product, 30)
