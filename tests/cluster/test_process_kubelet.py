"""The process kubelet runs a bound pod's command as a local process in its own mount namespace: volumes at
their real mountPaths, the ServiceAccount token where the Kubernetes client looks, peers' DNS names in
/etc/hosts; it reports phase, exit codes and Ready, honours graceful deletion, and simulates node faults."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cluster import apiserver, faults
from tests.cluster.apiserver import ClusterThread
from tests.cluster.conftest import Client
from tests.cluster.kubelet import ProcessKubelet
from tests.cluster.scheduler import Scheduler

PODS = "/api/v1/namespaces/research/pods"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterThread]:
    kubelet = functools.partial(ProcessKubelet, root=tmp_path / "kubelet", grace_cap=5)
    thread = ClusterThread(tmp_path, components=[Scheduler, kubelet]).start()
    yield thread
    thread.stop()


@pytest.fixture
def admin(cluster: ClusterThread) -> Client:
    client = Client(cluster, cluster.server.tokens.admin_token)
    client.ok(client.create("/api/v1/namespaces", {"metadata": {"name": "research"}}))
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-0", "labels": {"kubernetes.io/hostname": "gpu-0"}},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    client.ok(client.create("/api/v1/nodes", node))
    return client


def shell_pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", script], **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def wait_pod(admin: Client, name: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = admin.send("GET", f"{PODS}/{name}")
        if response.status_code == 200 and done(found := response.json()):
            return found
        time.sleep(0.1)
    raise AssertionError(f"pod {name}: {admin.send('GET', f'{PODS}/{name}').text[:2000]}")


def phase(wanted: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: (pod.get("status") or {}).get("phase") == wanted


def log_of(cluster: ClusterThread, name: str) -> str:
    (folder,) = (cluster.workdir / "kubelet" / "pods").glob(f"research_{name}_*")
    return (folder / "container.log").read_text()


SEES_ITS_WORLD = """
set -e
cat /etc/paralleljob/job.json; echo
echo "host $(hostname)"
grep -q 'gpt-0.gpt' /etc/hosts && echo "resolves gpt-0.gpt"
test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo "has a token"
cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo
echo "node $NODE_NAME api $KUBERNETES_SERVICE_HOST"
echo step-100 > /checkpoints/latest
touch /dev/shm/nccl && echo "private shm"
"""


def test_a_pod_runs_with_its_volumes_token_hosts_and_environment(cluster, admin):
    admin.ok(
        admin.create(
            "/api/v1/namespaces/research/configmaps",
            {"metadata": {"name": "gpt-config"}, "data": {"job.json": '{"layout": "2x2x2"}'}},
        )
    )
    volumes = [
        {"name": "config", "configMap": {"name": "gpt-config"}},
        {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}},
    ]
    container = {
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/paralleljob", "readOnly": True},
            {"name": "checkpoint", "mountPath": "/checkpoints"},
        ],
    }
    pod = shell_pod("gpt-0", SEES_ITS_WORLD, hostname="gpt-0", subdomain="gpt", volumes=volumes, container=container)
    admin.ok(admin.create(PODS, pod))
    done = wait_pod(admin, "gpt-0", phase("Succeeded"))
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert log_of(cluster, "gpt-0").splitlines() == [
        '{"layout": "2x2x2"}',
        "host gpt-0",
        "resolves gpt-0.gpt",
        "has a token",
        "research",
        "node gpu-0 api 127.0.0.1",
        "private shm",
    ]
    # The claim is a folder shared by every pod that mounts it; nothing was written to the machine's own paths.
    assert (cluster.workdir / "kubelet" / "pvc" / "research" / "ckpt" / "latest").read_text() == "step-100\n"
    assert not Path("/etc/paralleljob").exists() and not Path("/checkpoints").exists()


def test_a_failing_container_fails_the_pod_with_its_exit_code(cluster, admin):
    admin.ok(admin.create(PODS, shell_pod("crash", "exit 3")))
    done = wait_pod(admin, "crash", phase("Failed"))
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert {c["type"]: c["status"] for c in done["status"]["conditions"]}["Ready"] == "False"


def test_a_running_pod_is_ready_and_a_killed_one_fails_with_137(cluster, admin):
    admin.ok(admin.create(PODS, shell_pod("sleeper", "sleep 300")))
    running = wait_pod(admin, "sleeper", phase("Running"))
    assert {c["type"]: c["status"] for c in running["status"]["conditions"]}["Ready"] == "True"
    assert running["status"]["podIP"].startswith("127.0.")
    faults.kill_container(cluster, "research", "sleeper")
    done = wait_pod(admin, "sleeper", phase("Failed"))
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_graceful_deletion_sends_sigterm_then_removes_the_pod(cluster, admin):
    script = "trap 'echo got SIGTERM; exit 0' TERM; echo started; while true; do sleep 0.1; done"
    admin.ok(admin.create(PODS, shell_pod("graceful", script, terminationGracePeriodSeconds=30)))
    wait_pod(admin, "graceful", lambda p: phase("Running")(p) and "started" in log_of(cluster, "graceful"))
    admin.ok(admin.send("DELETE", f"{PODS}/graceful"))
    deadline = time.monotonic() + 30
    while admin.send("GET", f"{PODS}/graceful").status_code != 404 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert admin.send("GET", f"{PODS}/graceful").status_code == 404
    assert "got SIGTERM" in log_of(cluster, "graceful")


def test_a_pull_error_keeps_the_pod_pending_and_is_retried_after_a_backoff(cluster, admin):
    faults.fail_image_pulls(cluster, "registry.example.com/missing:1")
    faults.kubelet_of(cluster).pull_backoff = 1.0  # each state lasts long enough for the test to see it
    admin.ok(admin.create(PODS, shell_pod("no-image", "true", container={"image": "registry.example.com/missing:1"})))
    pending = wait_pod(admin, "no-image", lambda p: bool((p.get("status") or {}).get("containerStatuses")))
    assert pending["status"]["phase"] == "Pending"
    assert pending["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    # As the kubelet does: it backs off, then pulls again (and fails again).
    reasons = []

    def reason_changed(pod):
        reason = pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
        if not reasons or reasons[-1] != reason:
            reasons.append(reason)
        return reasons[-2:] == ["ImagePullBackOff", "ErrImagePull"]

    wait_pod(admin, "no-image", reason_changed)
    assert reasons[0] in ("ErrImagePull", "ImagePullBackOff")


def test_a_lost_node_kills_its_pods_and_reports_nothing(cluster, admin):
    admin.ok(admin.create(PODS, shell_pod("on-lost-node", "sleep 300")))
    wait_pod(admin, "on-lost-node", phase("Running"))
    faults.lose_node(cluster, "gpu-0")
    node = admin.ok(admin.send("GET", "/api/v1/nodes/gpu-0"))
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "Unknown"
    deadline = time.monotonic() + 30
    kubelet = faults.kubelet_of(cluster)
    while kubelet.running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kubelet.running == {}
    # The API still shows it Running: nobody is left to report its end.
    assert admin.ok(admin.send("GET", f"{PODS}/on-lost-node"))["status"]["phase"] == "Running"


def test_a_finished_pod_that_is_deleted_goes_at_once(cluster, admin):
    """Its containers have exited already: the kubelet confirms the deletion without waiting for anything."""
    admin.ok(admin.create(PODS, shell_pod("done", "exit 1")))
    wait_pod(admin, "done", phase("Failed"))
    admin.ok(admin.send("DELETE", f"{PODS}/done"))
    deadline = time.monotonic() + 30
    while admin.send("GET", f"{PODS}/done").status_code != 404 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert admin.send("GET", f"{PODS}/done").status_code == 404


def test_a_killed_container_takes_every_process_it_started_with_it(cluster, admin):
    """A process that left the container's process group (torchrun's ranks do) dies with the container."""
    script = "setsid sleep 300 & echo $! > /tmp/escaped.pid; wait"
    admin.ok(
        admin.create(
            PODS,
            shell_pod(
                "leaky",
                script,
                container={"volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]},
                volumes=[{"name": "tmp", "emptyDir": {}}],
            ),
        )
    )
    wait_pod(admin, "leaky", phase("Running"))
    (folder,) = (cluster.workdir / "kubelet" / "pods").glob("research_leaky_*")
    pid_file = folder / "volumes" / "tmp" / "escaped.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    escaped = psutil.Process(int(pid_file.read_text()))
    faults.kill_container(cluster, "research", "leaky")
    wait_pod(admin, "leaky", phase("Failed"))
    escaped.wait(10)
    assert not escaped.is_running()


def test_an_empty_dir_over_the_checkouts_parent_still_leaves_the_python_environment_visible(cluster, admin):
    # A pod with an emptyDir at /tmp, from a checkout under /tmp (as CI clones might be), would see neither the
    # repository nor its .venv: here the emptyDir goes over the checkout's own parent, wherever that is.
    parent = str(apiserver.REPO.parent)
    script = f"test -x {sys.executable} && test -d {apiserver.REPO}/tests && touch {parent}/scratch && echo sees-both"
    container = {"volumeMounts": [{"name": "scratch", "mountPath": parent}]}
    pod = shell_pod("covered", script, volumes=[{"name": "scratch", "emptyDir": {}}], container=container)
    admin.ok(admin.create(PODS, pod))
    wait_pod(admin, "covered", phase("Succeeded"))
    assert log_of(cluster, "covered").splitlines() == ["sees-both"]
    assert not (apiserver.REPO.parent / "scratch").exists(), "the emptyDir is the pod's, not the machine's folder"
