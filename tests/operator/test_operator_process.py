"""The operator process itself: its flags, its metrics, and its API calls' timeouts."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.request

import kubernetes
import pytest

from paralleljob import cli
from paralleljob.k8s import informer, reads, session, writes
from paralleljob.planning import usage
from tests.operator.helpers import Operator, job_doc, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


METRICS_PORT = free_port()


@pytest.fixture
def operator_args():
    return [*Operator.ARGS, "--metrics-port", str(METRICS_PORT)]


@pytest.mark.parametrize("pattern", ["team-*", "!kube-system", "ml-[ab]"])
def test_namespace_globs_are_refused_with_a_clear_message(pattern, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["operator", "--namespace", pattern])
    assert exited.value.code == 2
    assert "globs and negations are not supported" in capsys.readouterr().err


def jobs_gauge(phase: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'paralleljob_jobs{{phase="{phase}"}}'):
            return float(line.split()[-1])
    return None


def test_a_deleted_job_leaves_the_jobs_by_phase_metric(cluster, operator):
    cluster.apply(job_doc())  # no nodes: it waits, Pending
    wait_for(lambda: cluster.status().get("phase") == "Pending", what="Pending")
    wait_for(lambda: jobs_gauge("Pending") == 1.0, what="the job counted")
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt")
    wait_for(lambda: jobs_gauge("Pending") == 0.0, timeout=10, what="the deleted job no longer counted")


def test_every_api_call_gives_up_on_a_server_that_never_answers():
    """A connection that the server accepts and never answers must not hang a worker (or the admission lock)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        configuration.retries = 0
        api = session.from_configuration(configuration, timeout=(0.5, 0.5))
        calls = {
            "get job": lambda: reads.get_job(api, "ns", "gpt"),
            "read node": lambda: reads.node_exists(api, "gpu-000"),
            "list bound pods": lambda: informer.Informer(api, informer.BOUND_PODS, usage.UsageIndex()).relist(),
            "patch status": lambda: writes.patch_job_status(api, "ns", "gpt", {"phase": "Running"}),
            "delete pod": lambda: writes.delete_pod(api, "ns", "gpt-0"),
        }
        hung = []
        for what, call in calls.items():
            worker = threading.Thread(target=lambda c=call: _swallow(c), daemon=True)
            worker.start()
            worker.join(5)
            if worker.is_alive():
                hung.append(what)
        assert hung == []


def _swallow(call) -> None:
    with contextlib.suppress(Exception):
        call()


def test_kopf_peering_is_refused_and_names_leader_election():
    args = cli.build_parser().parse_args(["operator", "--peering", "paralleljob"])
    with pytest.raises(SystemExit, match=r"--peering is not supported .* run replicas with --leader-elect"):
        args.run(args)
