"""The two Kubernetes releases the tests run on: the pinned one and the newest the Go module proxy serves
(`PARALLELJOB_KUBERNETES=next`, testcluster/controlplane.py). `make test` runs the tests marked `both_releases`
again on the next one; these show that such a run really has the release it names, servers and all.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from testcluster import controlplane

pytestmark = pytest.mark.both_releases


def test_the_api_server_runs_the_release_the_variable_names(upstream: controlplane.State) -> None:
    code, body = controlplane.get(upstream, "/version")
    assert code == 200, body
    assert json.loads(body)["gitVersion"] == controlplane.version(controlplane.release())


@pytest.mark.parametrize("server", ["kube-scheduler", "kube-controller-manager"])
def test_the_scheduler_and_controller_manager_are_of_the_same_release(server: str) -> None:
    done = subprocess.run(
        [str(controlplane.binary(server)), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["Kubernetes", controlplane.version(controlplane.release())]


def test_the_next_release_is_newer_than_the_pinned_one() -> None:
    def minor(name: str) -> tuple[int, ...]:
        return tuple(int(part) for part in controlplane.version(name).removeprefix("v").split("."))

    assert minor("next") > minor("pinned")


def test_an_unknown_release_is_refused_with_the_ones_there_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELJOB_KUBERNETES", "1.99")
    with pytest.raises(controlplane.ControlPlaneError) as refused:
        controlplane.binary("kube-apiserver")
    assert str(refused.value) == "PARALLELJOB_KUBERNETES='1.99': the releases are pinned, next (tools/README.md)"
