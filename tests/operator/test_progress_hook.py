"""Rank 0's progress hook against the upstream API server over HTTPS, with the token of the job's progress account and
RBAC enforced: progress reaches the job's progress ConfigMap, rate-limited, sent from a background thread so a
slow API never holds up a step, and API failures never reach training. That token may patch that one ConfigMap
and nothing else: not the job or its status, not another job's progress object, not Secrets. (That the operator
copies the numbers into status, validated, is tests/operator/test_progress_channel.py.)"""

from __future__ import annotations

import json
import threading

import kubernetes
import pytest
import requests

from paralleljob.manifests import labels, progress
from paralleljob.manifests import rbac as progress_rbac
from paralleljob_trainer import hooks, k8s_status
from tests.operator.helpers import job_doc


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def reporter(cluster, apiserver, tmp_path):
    """Rank 0's reporter with the token of the job's progress account, bound as the operator binds it."""
    job = cluster.apply(job_doc())
    for obj in [progress.build_config_map(job), *progress_rbac.build_progress_rbac(job)]:
        kubernetes.utils.create_from_dict(cluster.client, obj)
    token = tmp_path / "token"
    token.write_text(apiserver.token_for("research", labels.progress_account_name("gpt")) + "\n")
    return k8s_status.ProgressReporter(
        apiserver.url, "research", "gpt", token_path=token, ca_path=apiserver.ca, interval=10, clock=FakeClock()
    )


def reported(cluster):
    return cluster.core.read_namespaced_config_map("gpt-progress", "research").data or {}


def step(n, loss=2.5):
    return {"event": "step", "step": n, "loss": loss, "tokens_per_s": 1000.0 * n}


def test_progress_and_checkpoints_reach_the_progress_config_map(cluster, reporter):
    reporter.on_step(step(10, 3.0))
    assert reporter.wait_sent(5)
    data = reported(cluster)
    assert (data["step"], data["loss"], data["tokensPerSecond"]) == ("10", "3.0", "10000.0")
    reporter.on_checkpoint({"event": "checkpoint", "step": 10, "path": "/checkpoints/10"})
    assert reporter.wait_sent(5)
    assert reported(cluster)["lastCheckpointStep"] == "10"
    assert "progress" not in cluster.status()


def test_a_resume_at_another_layout_reports_both_layouts(cluster, reporter):
    record = {"event": "resume", "step": 10, "path": "/c/global_step10", "skipped": []}
    reporter.on_checkpoint(record | {"saved_layout": "PP2xTP2xDP2", "layout": "PP1xTP4xDP2"})
    reporter.on_step(step(11))
    reporter.flush()
    assert reporter.wait_sent(5)
    found = progress.status_of({"data": reported(cluster)}, 100)["progress"]
    assert (found["resumedFromLayout"], found["resumedAtLayout"]) == ("PP2xTP2xDP2", "PP1xTP4xDP2")


def test_steps_are_rate_limited_and_the_last_one_is_flushed(cluster, reporter, apiserver):
    for n in range(1, 6):
        reporter.on_step(step(n))
    assert reporter.wait_sent(5)
    assert reporter.patches == 1
    assert reported(cluster)["step"] == "1"
    reporter.clock.now = 11
    reporter.on_step(step(6))
    assert reporter.wait_sent(5)
    assert reported(cluster)["step"] == "6"
    reporter.on_step(step(7))
    reporter.on_finish({"event": "summary"})
    assert reported(cluster)["step"] == "7"
    assert reporter.patches == 3
    assert all(c[2] == "configmaps" for c in apiserver.calls if c[0] == "patch")


def test_a_stalled_api_never_holds_up_a_step_and_the_latest_report_wins(cluster, reporter, apiserver):
    """The API answers no status patch until the steps are done: if a step waited for the API, the steps would
    never finish. (How long a step takes under a slow API is measured in bench/progress_hook.py.)"""
    apiserver.held.add(("patch", "configmaps"))

    def train() -> None:
        reporter.on_step(step(1))
        for n in range(2, 20):
            reporter.clock.now += 11
            reporter.on_step(step(n))
        reporter.on_checkpoint({"event": "checkpoint", "step": 18})

    steps = threading.Thread(target=train)
    steps.start()
    steps.join(60)
    assert not steps.is_alive(), "a step waited for the API"
    assert reporter.patches == 0
    apiserver.held.clear()
    reporter.on_finish({"event": "summary"})
    data = reported(cluster)
    assert (data["step"], data["lastCheckpointStep"]) == ("19", "18")
    # One request in flight while the rest fold into one pending patch: far fewer than 20 requests.
    assert reporter.patches <= 3


def test_the_hook_only_touches_its_progress_config_map(cluster, reporter):
    reporter._send({"step": "1"})
    assert reporter.url.endswith("/api/v1/namespaces/research/configmaps/gpt-progress")
    assert cluster.job()["spec"]["parallelism"]["pipeline"] == 4


def test_the_progress_account_may_patch_only_its_own_jobs_progress_object(cluster, reporter, apiserver):
    cluster.core.create_namespaced_config_map("research", {"metadata": {"name": "other-progress"}})
    other = k8s_status.ProgressReporter(
        apiserver.url, "research", "other", token_path=reporter.token_path, ca_path=apiserver.ca, interval=0
    )
    other.on_step(step(1))
    assert other.wait_sent(5)
    assert other.patches == 0
    assert apiserver.denied == [
        'configmaps "other-progress" is forbidden: User "system:serviceaccount:research:gpt-progress" cannot '
        'patch resource "configmaps" in API group "" in the namespace "research"'
    ]
    apiserver.denied.clear()


JOBS = "/apis/paralleljob.io/v1alpha1/namespaces/research/paralleljobs"
CORE = "/api/v1/namespaces/research"
# What rank 0's token could do before, and what else a token in a pod might try.
REFUSED = {
    "patch-the-job": ("PATCH", f"{JOBS}/gpt", {"spec": {"training": {"steps": 1}}}),
    "fake-success-in-status": ("PATCH", f"{JOBS}/gpt/status", {"status": {"phase": "Succeeded"}}),
    "reset-restarts-and-fake-placement": ("PATCH", f"{JOBS}/gpt/status", {"status": {"restarts": 0, "placement": []}}),
    "read-the-job": ("GET", f"{JOBS}/gpt", None),
    "patch-the-attempt-config-map": ("PATCH", f"{CORE}/configmaps/gpt-config", {"data": {"plan.json": "{}"}}),
    "read-its-progress-object": ("GET", f"{CORE}/configmaps/gpt-progress", None),
    "delete-its-progress-object": ("DELETE", f"{CORE}/configmaps/gpt-progress", None),
    "create-a-config-map": ("POST", f"{CORE}/configmaps", {"metadata": {"name": "x"}}),
    "read-a-secret": ("GET", f"{CORE}/secrets/db", None),
    "list-secrets": ("GET", f"{CORE}/secrets", None),
    "list-pods": ("GET", f"{CORE}/pods", None),
    "widen-its-role": ("PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/research/roles/gpt-progress", {}),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_rank_zeros_token_can_do_nothing_else(reporter, apiserver, case):
    method, path, body = REFUSED[case]
    headers = {"Authorization": f"Bearer {reporter.token_path.read_text().strip()}"}
    if method == "PATCH":
        headers["Content-Type"] = "application/merge-patch+json"
    reply = requests.request(
        method, apiserver.url + path, json=body, headers=headers, verify=str(apiserver.ca), timeout=30
    )
    assert reply.status_code == 403, reply.text
    assert 'User "system:serviceaccount:research:gpt-progress" cannot' in reply.json()["message"]
    apiserver.denied.clear()


def test_api_errors_never_reach_training(tmp_path, capsys):
    dead = k8s_status.ProgressReporter("http://127.0.0.1:9", "ns", "gone", token_path=None, ca_path=None, interval=0)
    dead.on_step(step(1))
    assert dead.wait_sent(5)
    dead.on_checkpoint({"step": 1})
    dead.on_finish({})
    assert dead.patches == 0
    assert capsys.readouterr().err.count("status report failed") == 1


def test_missing_job_is_reported_not_raised(apiserver, tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text(apiserver.admin_token)
    reporter = k8s_status.ProgressReporter(apiserver.url, "research", "absent", token_path=token, ca_path=apiserver.ca)
    reporter.on_step(step(1))
    assert reporter.wait_sent(5)
    assert "404" in capsys.readouterr().err


def test_the_trainer_loads_it_from_the_pod_environment(monkeypatch, tmp_path):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"spec": {"training": {"steps": 77}}}))
    monkeypatch.setenv("PARALLELJOB_NAMESPACE", "research")
    monkeypatch.setenv("PARALLELJOB_JOB_NAME", "gpt")
    monkeypatch.setenv("PARALLELJOB_CONFIG", str(config))
    monkeypatch.setenv("PARALLELJOB_STATUS_API", "http://127.0.0.1:1")
    hook = hooks.load_hook("paralleljob_trainer.k8s_status:create_hook")
    assert isinstance(hook, k8s_status.ProgressReporter)
    assert hook.url == "http://127.0.0.1:1/api/v1/namespaces/research/configmaps/gpt-progress"


def test_progress_is_rounded_for_kubectl_get(cluster, reporter):
    reporter.on_step({"event": "step", "step": 3, "loss": 3.0373973846435547, "tokens_per_s": 5771.955798357906})
    reporter.on_finish({"event": "summary"})
    data = reported(cluster)
    assert (data["loss"], data["tokensPerSecond"]) == ("3.0374", "5772.0")
