"""kwok (sigs.k8s.io/kwok, built by `make kwok`) as the kubelet of the scale benches' fake nodes.

A bench writes its Nodes once, annotated for kwok and with their capacity, and kwok does what each node's
kubelet would: it makes the node Ready, renews its Lease every quarter of its length (a kubelet's: 40 s, so
every 10 s), reports its status every 10 to 20 min, marks the pods bound to it Running and removes the ones
being deleted.
So the controller-manager runs with its node-lifecycle controller, at a grace of 5/4 of the Lease (50 s for a
kubelet's 40 s, as upstream), and lifts the not-ready taint itself: the cluster the operator watches is kept
alive the way a real one is, rather than written once and frozen.

    state = controlplane.up(folder, node_grace=node_grace())
    with Kwok(state, workdir / "kwok.log") as fakes:
        seconds = write_nodes(api, [fake_node(doc) for doc in docs], fakes)
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import time
from pathlib import Path
from typing import Any

from testcluster import controlplane
from testcluster.api import Api

REPO = Path(__file__).resolve().parents[1]
BINARY = REPO / ".tools" / "bin" / "kwok"
STAGES = REPO / ".tools" / "share" / "kwok"
ANNOTATION = "kwok.x-k8s.io/node"
# A kubelet's Lease lasts 40 s and is renewed every quarter of that; the controller-manager's node grace is 50 s
# upstream. A bench on a small machine may stretch both (`node_grace`): at 10,000 nodes beside 50,000 pods, this
# 2-core machine could not renew every 10 s, and 1,391 nodes went NotReady within 11 minutes.
LEASE_SECONDS = 40
# kwok's workers for node stages, Leases and pod stages: 4 each by default, too few to renew 10,000 Leases
# every 10 s against a busy API server.
PARALLELISM = 32


class Kwok:
    """kwok, managing the nodes annotated for it, as the admin; stopped at the end of the `with`."""

    def __init__(self, state: controlplane.State, log: Path, lease_seconds: int = LEASE_SECONDS) -> None:
        if not BINARY.exists() or not any(STAGES.glob("*.yaml")):
            raise SystemExit(f"kwok is not built: run `make kwok` first ({BINARY}, {STAGES})")
        options = log.with_suffix(".yaml")
        options.write_text(
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\n"
            "kind: KwokConfiguration\n"
            "options:\n"
            + "".join(
                f"  {key}: {PARALLELISM}\n"
                for key in ("nodeLeaseParallelism", "nodePlayStageParallelism", "podPlayStageParallelism")
            )
        )
        self.command = [
            str(BINARY),
            f"--kubeconfig={state.kubeconfig}",
            f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
            f"--node-lease-duration-seconds={lease_seconds}",
            "--cidr=10.128.0.0/9",  # pod IPs for 50,000 pods
            "--node-ip=10.0.0.1",
            "--server-address=127.0.0.1:0",
            "--v=WARN",  # a line per write otherwise: 1,000 a second at 10,000 nodes
            f"--config={options}",
            *(f"--config={stage}" for stage in sorted(STAGES.glob("*.yaml"))),
        ]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Kwok:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"kwok exited ({self.process.returncode}); see {self.log}")


def node_grace(lease_seconds: int = LEASE_SECONDS) -> str:
    """The controller-manager's node grace for kwok's Leases of `lease_seconds`, as upstream's 50 s is for 40 s."""
    return f"{lease_seconds * 5 // 4}s"


def fake_node(doc: dict[str, Any]) -> dict[str, Any]:
    """A bench's Node for kwok to keep: its annotation, its labels and capacity, no conditions (kwok's to write)."""
    metadata = {**doc["metadata"], "annotations": {**doc["metadata"].get("annotations", {}), ANNOTATION: "fake"}}
    status = {key: doc["status"][key] for key in ("capacity", "allocatable") if key in doc["status"]}
    return {"metadata": metadata, "status": status}


def write_nodes(api: Api, docs: list[dict[str, Any]], kwok: Kwok, threads: int = 32, timeout: float = 1800) -> float:
    """Create the Nodes and wait until every one is Ready and untainted; the seconds that took."""
    started = time.perf_counter()

    def one(doc: dict[str, Any]) -> None:
        api.ok(api.send("POST", "/api/v1/nodes", doc))

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, docs))
    while (waiting := len(docs) - ready_nodes(api)) > 0:
        kwok.alive()
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{waiting} of {len(docs)} nodes not Ready and untainted after {timeout:.0f} s")
        time.sleep(2)
    return time.perf_counter() - started


def ready_nodes(api: Api) -> int:
    """Nodes Ready with no taint (the node-lifecycle controller lifts not-ready once kwok reports Ready)."""
    return sum(
        1
        for node in list_all(api, "/api/v1/nodes")
        if not node["spec"].get("taints")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
    )


def running_pods(api: Api, path: str = "/api/v1/pods") -> int:
    """Running pods under `path` (all, or a namespace's). A field selector leaves out remainingItemCount, so the
    whole list is counted."""
    return len(list_all(api, path, fieldSelector="status.phase=Running"))


def wait_running(api: Api, count: int, kwok: Kwok, timeout: float = 1800) -> float:
    """Wait until `count` pods are Running (kwok's pod-ready stage); the seconds that took."""
    started = time.perf_counter()
    while (found := running_pods(api)) < count:
        kwok.alive()
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{found} of {count} pods Running after {timeout:.0f} s")
        time.sleep(2)
    return time.perf_counter() - started


def list_all(api: Api, path: str, **params: str) -> list[dict[str, Any]]:
    items, token = [], ""
    while True:
        page = api.ok(api.send("GET", path, limit="500", **params, **({"continue": token} if token else {})))
        items += page["items"]
        token = page["metadata"].get("continue") or ""
        if not token:
            return items


def writes_per_second(api: Api, path: str, seconds: float = 30.0) -> float:
    """How many writes the objects under `path` get a second, counted from a watch over `seconds`: what an
    informer of them would process (nodes: the operator's; Leases: the node-lifecycle controller's)."""
    version = api.ok(api.send("GET", path, limit="1"))["metadata"]["resourceVersion"]
    response = api.session.get(
        api.server + path,
        params={"watch": "1", "resourceVersion": version, "timeoutSeconds": str(int(seconds))},
        headers={"Accept": "application/json"},
        stream=True,
        timeout=seconds + 30,
        verify=str(api.state.ca),
    )
    response.raise_for_status()
    started, events = time.perf_counter(), 0
    for line in response.iter_lines():
        if line:
            events += 1
    return events / max(time.perf_counter() - started, 1e-9)
