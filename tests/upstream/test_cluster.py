"""The test cluster itself, as `scripts/local_cluster.py` gives it to a user: the process kubelet registers Ready
GPU nodes with the real API server, runs a pod with the projected ServiceAccount token the API server's
admission added, reports its exit and termination message, honours graceful deletion, and a node that stops
heartbeating is marked NotReady and tainted by the real node-lifecycle controller, and Ready again when it resumes.
A killed container takes every process it started with it, and a pod's volumes never hide the repository and the
Python environment its command runs from (testcluster/sandbox.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from testcluster import cluster as upstream_cluster
from testcluster import controlplane, polling
from testcluster.api import REPO, Api
from tests.upstream.helpers import PODS, wait_for_pod

SCRIPT = REPO / "scripts" / "local_cluster.py"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[upstream_cluster.Cluster]:
    """Two 8-GPU nodes, started and stopped with the script a user runs."""
    folder = tmp_path_factory.mktemp("small")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "up", str(folder), "--nodes", "2", "--gpus-per-node", "8"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder.resolve() / "kubeconfig")
    try:
        yield upstream_cluster.attach(folder)
    finally:
        subprocess.run([sys.executable, str(SCRIPT), "down", str(folder)], timeout=120, check=True)
        state = controlplane.State.load(folder.resolve())
        assert state.pids == {}, "down stops everything up started"


@pytest.fixture(scope="module")
def api(small: upstream_cluster.Cluster) -> Api:
    return Api(small.state, small.state.tokens["admin"])


def node_view(api: Api, name: str) -> tuple[str, set[str]]:
    node = api.ok(api.send("GET", f"/api/v1/nodes/{name}"))
    ready = next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")
    return ready, {t["key"] for t in node["spec"].get("taints") or []}


def pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python", "command": [sys.executable, "-c", script]}
    return {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def test_the_nodes_are_ready_gpu_nodes(api: Api) -> None:
    nodes = api.ok(api.send("GET", "/api/v1/nodes"))["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["gpu-0", "gpu-1"]
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node_view(api, node["metadata"]["name"]) == ("True", set())


def test_a_pod_runs_with_its_projected_token_and_reports_its_termination_message(api: Api) -> None:
    script = (
        "import json, os, urllib.request, ssl\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "token, namespace = open(sa + '/token').read(), open(sa + '/namespace').read()\n"
        "host = os.environ['KUBERNETES_SERVICE_HOST'] + ':' + os.environ['KUBERNETES_SERVICE_PORT']\n"
        "request = urllib.request.Request(f'https://{host}/apis/authentication.k8s.io/v1/selfsubjectreviews',\n"
        "    data=b'{}', method='POST', headers={'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'})\n"
        "context = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "user = json.load(urllib.request.urlopen(request, context=context))['status']['userInfo']\n"
        "open('/dev/termination-log', 'w').write(user['username'] + ' ' + namespace)\n"
        "raise SystemExit(3)\n"
    )
    api.create(PODS, pod("whoami", script))
    done = wait_for_pod(api, "whoami", lambda p: p["status"].get("phase") == "Failed")
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    # The pod authenticated as its ServiceAccount with the token the API server's admission projected into it.
    assert terminated["message"] == "system:serviceaccount:default:default default"
    assert {c["type"]: c["status"] for c in done["status"]["conditions"]}["PodScheduled"] == "True"


def test_a_deleted_pod_gets_sigterm_and_goes_when_its_process_exits(api: Api, small: upstream_cluster.Cluster) -> None:
    script = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('SIGTERM', flush=True) or exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    api.create(PODS, pod("sleeper", script, terminationGracePeriodSeconds=30))
    wait_for_pod(api, "sleeper", lambda p: p["status"].get("phase") == "Running")

    def log() -> str:
        folders = [f for f in small.container_folders() if f.name.startswith("default_sleeper_")]
        return (folders[0] / "container.log").read_text() if folders else ""

    # Running is reported once the process starts; its handler is in place once it says so.
    polling.wait_for(lambda: "ready" in log(), 60, "the handler installed")
    api.ok(api.send("DELETE", f"{PODS}/sleeper"))
    polling.wait_for(lambda: api.send("GET", f"{PODS}/sleeper").status_code == 404, 30, "the pod to go")
    assert "SIGTERM" in log()


def test_a_silent_node_goes_not_ready_and_tainted_and_comes_back(api: Api, small: upstream_cluster.Cluster) -> None:
    small.fault("silence", node="gpu-1")
    unreachable = {"node.kubernetes.io/unreachable"}
    polling.wait_for(lambda: node_view(api, "gpu-1") == ("Unknown", unreachable), 60, "gpu-1 NotReady")
    assert node_view(api, "gpu-0") == ("True", set())
    small.fault("resume", node="gpu-1")
    polling.wait_for(lambda: node_view(api, "gpu-1") == ("True", set()), 60, "gpu-1 Ready again")


def test_what_happened_on_a_silent_node_is_acted_on_when_it_resumes(api: Api, small: upstream_cluster.Cluster) -> None:
    """A pod deleted while its node's kubelet is silent goes once it resumes, and a pod whose container ended
    meanwhile reports its end then, as a kubelet does on its return. Before, both stayed as the silence left them:
    the deleted pod Terminating for ever (the soak's orphan, seed 39), the ended one Running."""
    waits = (
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: exit(0))\n"
        "pathlib.Path('/scratch/ready').touch()\n"
        "while not pathlib.Path('/scratch/end').exists(): time.sleep(0.1)\n"
    )
    scratch = {"volumes": [{"name": "scratch", "emptyDir": {}}], "nodeName": "gpu-1"}
    for name in ("doomed", "ending"):
        made = pod(name, waits, terminationGracePeriodSeconds=30, **scratch)
        made["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        api.create(PODS, made)
    folders = {}
    for name in ("doomed", "ending"):
        wait_for_pod(api, name, lambda p: p["status"].get("phase") == "Running")
        (folders[name],) = (f for f in small.container_folders() if f.name.startswith(f"default_{name}_"))
        ready = folders[name] / "volumes" / "scratch" / "ready"
        polling.wait_for(ready.exists, 30, f"{name}'s handler installed")

    small.fault("silence", node="gpu-1")
    api.ok(api.send("DELETE", f"{PODS}/doomed"))
    (folders["ending"] / "volumes" / "scratch" / "end").touch()
    ended = int((folders["ending"] / "pid").read_text())
    polling.wait_for(lambda: not psutil.pid_exists(ended), 30, "ending's container to end")
    assert api.send("GET", f"{PODS}/doomed").status_code == 200, "a silent kubelet confirms nothing"
    assert api.ok(api.send("GET", f"{PODS}/ending"))["status"]["phase"] == "Running", "nor reports anything"

    small.fault("resume", node="gpu-1")
    polling.wait_for(lambda: api.send("GET", f"{PODS}/doomed").status_code == 404, 60, "doomed to go")
    done = wait_for_pod(api, "ending", lambda p: p["status"].get("phase") == "Succeeded", timeout=30)
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_a_killed_container_takes_every_process_it_started_with_it(api: Api, small: upstream_cluster.Cluster) -> None:
    """A process that left the container's process group (torchrun's ranks do) dies with the container."""
    script = (
        "import subprocess, time\n"
        "escaped = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "open('/scratch/escaped.pid', 'w').write(str(escaped.pid))\n"
        "time.sleep(600)\n"
    )
    mounts = [{"name": "scratch", "mountPath": "/scratch"}]
    leaky = pod("leaky", script, volumes=[{"name": "scratch", "emptyDir": {}}])
    leaky["spec"]["containers"][0]["volumeMounts"] = mounts
    api.create(PODS, leaky)
    wait_for_pod(api, "leaky", lambda p: p["status"].get("phase") == "Running")
    (folder,) = (f for f in small.container_folders() if f.name.startswith("default_leaky_"))
    pid_file = folder / "volumes" / "scratch" / "escaped.pid"
    polling.wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the escaped process's pid")
    escaped = psutil.Process(int(pid_file.read_text()))
    small.fault("kill-container", namespace="default", pod="leaky")
    done = wait_for_pod(api, "leaky", lambda p: p["status"].get("phase") == "Failed")
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    escaped.wait(10)
    assert not escaped.is_running()


def test_an_empty_dir_over_the_checkouts_parent_still_leaves_the_python_environment_visible(
    api: Api, small: upstream_cluster.Cluster
) -> None:
    # A pod with an emptyDir at /tmp, from a checkout under /tmp (as CI clones might be), would see neither the
    # repository nor its venv: here the emptyDir goes over the checkout's own parent, wherever that is.
    parent = REPO.parent
    script = (
        "import pathlib\n"
        f"assert pathlib.Path({str(REPO / 'tests')!r}).is_dir()\n"
        f"pathlib.Path({str(parent / 'scratch')!r}).touch()\n"
        "print('sees-both')\n"
    )
    covered = pod("covered", script, volumes=[{"name": "scratch", "emptyDir": {}}])
    covered["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": str(parent)}]
    api.create(PODS, covered)
    wait_for_pod(api, "covered", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    (folder,) = (f for f in small.container_folders() if f.name.startswith("default_covered_"))
    assert (folder / "container.log").read_text().splitlines() == ["sees-both"]
    assert not (parent / "scratch").exists(), "the emptyDir is the pod's, not the machine's folder"


def test_the_state_file_names_every_process(small: upstream_cluster.Cluster) -> None:
    state = json.loads((small.folder / "state.json").read_text())
    assert set(state["pids"]) == {"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet"}


def test_a_missing_binary_is_named_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controlplane, "BIN", tmp_path)
    with pytest.raises(controlplane.ControlPlaneError, match="run `make tools`"):
        controlplane.up(tmp_path / "cluster")
