"""The process kubelet runs a container from its image when the image is in the local store (`make images-operator`
builds the one these tests use): the image's root filesystem, entrypoint, environment and user, each overridden
by the pod spec as Kubernetes does; runAsUser, runAsGroup, fsGroup, runAsNonRoot and readOnlyRootFilesystem; and
an httpGet liveness probe that stops a container which does not answer. The test fails, naming the command,
when the image was not built."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testcluster import cluster as upstream_cluster
from testcluster.api import Api
from tests.upstream.helpers import OPERATOR_IMAGE, PODS, require_image, wait_for_pod


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[upstream_cluster.Cluster]:
    require_image(OPERATOR_IMAGE, "make images-operator")
    folder = tmp_path_factory.mktemp("images")
    made = upstream_cluster.up(folder, nodes=1)
    try:
        yield made
    finally:
        upstream_cluster.down(folder)


@pytest.fixture(scope="module")
def api(one_node: upstream_cluster.Cluster) -> Api:
    return Api(one_node.state, one_node.state.tokens["admin"])


def image_pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": OPERATOR_IMAGE, **container}],
            **spec,
        },
    }


def finished(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") in ("Succeeded", "Failed")


def terminated(api: Api, name: str, timeout: float = 90) -> dict[str, Any]:
    done = wait_for_pod(api, name, finished, timeout)
    status = done["status"]["containerStatuses"][0]
    assert status["imageID"].startswith("sha256:"), "ran from the image in the store"
    return dict(status["state"]["terminated"])


def pod_folder(cluster: upstream_cluster.Cluster, name: str) -> Path:
    return next(f for f in cluster.container_folders() if f.name.startswith(f"default_{name}_"))


def test_the_pod_spec_overrides_the_images_user_and_command_on_a_read_only_root(
    api: Api, one_node: upstream_cluster.Cluster
) -> None:
    script = (
        "import json, os\n"
        "def writable(path):\n"
        "    try:\n"
        "        open(path, 'w').close()\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
        "seen = {'ids': [os.getuid(), os.getgid(), sorted(os.getgroups())], 'cwd': os.getcwd(),\n"
        "    'venv': os.environ.get('VIRTUAL_ENV'), 'mine': os.environ.get('MINE'), 'home': os.environ['HOME'],\n"
        "    'root': writable('/opt/paralleljob/x'), 'scratch': writable('/scratch/x'),\n"
        "    'scratch_group': os.stat('/scratch').st_gid, 'debian': open('/etc/debian_version').read().strip()}\n"
        "open('/dev/termination-log', 'w').write(json.dumps(seen))\n"
    )
    container = {
        "command": ["python", "-c", script],
        "workingDir": "/work",
        "env": [{"name": "MINE", "value": "from the pod"}],
        "securityContext": {"runAsUser": 4242, "runAsGroup": 4243, "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    spec = {"securityContext": {"fsGroup": 4244}, "volumes": [{"name": "scratch", "emptyDir": {}}]}
    api.create(PODS, image_pod("overridden", container, **spec))
    state = terminated(api, "overridden")
    assert state["exitCode"] == 0, (pod_folder(one_node, "overridden") / "container.log").read_text()
    seen = json.loads(state["message"])
    assert seen["ids"] == [4242, 4243, [4243, 4244]]
    assert seen["cwd"] == "/work"  # made, as runtimes make a missing working directory
    assert (seen["venv"], seen["mine"], seen["home"]) == ("/opt/paralleljob", "from the pod", "/")
    assert not seen["root"], "readOnlyRootFilesystem"
    assert seen["scratch"] and seen["scratch_group"] == 4244, "the emptyDir belongs to the fsGroup"
    assert seen["debian"].startswith("12."), "the image's own root filesystem, not the machine's"


def test_args_alone_keep_the_images_entrypoint_and_its_user(api: Api, one_node: upstream_cluster.Cluster) -> None:
    api.create(PODS, image_pod("entrypoint", {"args": ["--help"]}))
    assert terminated(api, "entrypoint")["exitCode"] == 0
    folder = pod_folder(one_node, "entrypoint")
    sandbox = json.loads((folder / "sandbox.json").read_text())
    assert sandbox["command"] == ["paralleljob", "operator", "--help"]
    assert sandbox["user"]["uid"] == 65532 and not sandbox["readOnlyRoot"]
    assert "--liveness" in (folder / "container.log").read_text()


def test_run_as_non_root_refuses_an_image_run_as_root(api: Api) -> None:
    container = {"command": ["true"], "securityContext": {"runAsUser": 0, "runAsNonRoot": True}}
    api.create(PODS, image_pod("as-root", container))
    pending = wait_for_pod(api, "as-root", lambda p: bool((p.get("status") or {}).get("containerStatuses")))
    waiting = pending["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "runAsNonRoot" in waiting["message"]


def test_a_container_that_fails_its_liveness_probe_is_stopped(api: Api, one_node: upstream_cluster.Cluster) -> None:
    probe = {"httpGet": {"path": "/healthz", "port": 1}, "periodSeconds": 1, "failureThreshold": 2}
    container = {"command": ["sleep", "300"], "livenessProbe": probe}
    api.create(PODS, image_pod("unhealthy", container, terminationGracePeriodSeconds=1))
    state = terminated(api, "unhealthy", timeout=60)
    assert state["exitCode"] != 0
    probes = (pod_folder(one_node, "unhealthy") / "probes.log").read_text().splitlines()
    assert len(probes) == 2 and all("no answer" in line for line in probes), probes
