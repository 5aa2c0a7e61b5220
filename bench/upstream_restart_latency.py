"""Failed rank -> every pod of its gang deleted, while 100 other jobs wait for admission, on the upstream
control plane (tests/upstream).

    .venv/bin/python bench/upstream_restart_latency.py [--pending 100] [--repeat 3]

A 16-node job (4x4x4 on 4-GPU nodes) runs on all 16 nodes; `--pending` more 16-node jobs wait, unschedulable.
The real scheduler binds the gang's pods; the bench writes their status as a kubelet would (Running, then one
rank Failed with exit code 1), with no kubelet and no node-lifecycle controller (the nodes are written once).
Each round relabels a node (every waiting job is offered to the admission queue at once), then marks one
rank's pod Failed, and measures the wall time from that status write to the moment every pod of the gang
carries a deletionTimestamp (or is gone), listing the gang's pods every 5 ms. The operator runs as
`paralleljob operator` in a subprocess with the admin's kubeconfig; figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.upstream_scale import write_nodes  # noqa: E402
from paralleljob.k8s import timestamps  # noqa: E402
from tests.operator.conftest import Operator, job_doc  # noqa: E402
from tests.upstream import controlplane  # noqa: E402
from tests.upstream.cluster import wait_for  # noqa: E402
from tests.upstream.conftest import Api  # noqa: E402

NAMESPACE = "research"
JOBS = f"/apis/paralleljob.io/v1alpha1/namespaces/{NAMESPACE}/paralleljobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def gang(api: Api, attempt: int) -> list[dict]:  # type: ignore[type-arg]
    selector = f"paralleljob.io/job=gpt,paralleljob.io/attempt={attempt}"
    return list(api.ok(api.send("GET", PODS, labelSelector=selector))["items"])


def report(api: Api, pod: dict, phase: str) -> None:  # type: ignore[type-arg]
    """What the kubelet writes: the phase, the conditions and the container's state."""
    now, ready = timestamps.now(), "True" if phase == "Running" else "False"
    if phase == "Running":
        state = {"running": {"startedAt": now}}
    else:
        state = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}}
    conditions = [{"type": kind, "status": ready, "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")]
    container = pod["spec"]["containers"][0]
    status = {
        "phase": phase,
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}, *conditions],
        "containerStatuses": [
            {"name": container["name"], "image": container["image"], "imageID": "", "ready": ready == "True",
             "restartCount": 0, "state": state}
        ],
    }  # fmt: skip
    api.ok(api.send("PATCH", f"{PODS}/{pod['metadata']['name']}/status", {"status": status}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="upstream-restart-"))
    state = controlplane.up(workdir / "cluster", controllers="*,-node-lifecycle-controller")
    api = Api(state, state.tokens["admin"])
    operator = None
    samples = []
    try:
        kubectl = [str(controlplane.binary("kubectl")), "--kubeconfig", str(state.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")], check=True, capture_output=True)
        api.ok(api.send("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
        write_nodes(api, 16, gpus=4)
        # The job's checkpoint claim, bound to a volume: the real scheduler leaves a pod whose claim is missing
        # or unbound Pending.
        volume = {
            "metadata": {"name": "ckpt"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "hostPath": {"path": "/tmp/ckpt"}},
        }  # fmt: skip
        api.ok(api.send("POST", "/api/v1/persistentvolumes", volume))
        claim = {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "ckpt",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }  # fmt: skip
        api.ok(api.send("POST", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", claim))
        operator = Operator(None, workdir / "operator.log", state.kubeconfig).start()  # type: ignore[arg-type]
        api.ok(api.send("POST", JOBS, job_doc(failurePolicy={"backoffLimit": args.repeat + 1})))
        # The gang is placed before the others are created, so that it is the one that runs.
        wait_for(lambda: len(gang(api, 0)) == 16, 300, "the gang's pods")
        for i in range(args.pending):
            api.ok(api.send("POST", JOBS, job_doc(f"waiting-{i}")))

        def pending() -> bool:
            jobs = api.ok(api.send("GET", JOBS))["items"]
            waiting = [j for j in jobs if j["metadata"]["name"].startswith("waiting-")]
            return sum(1 for j in waiting if (j.get("status") or {}).get("phase") == "Pending") >= args.pending

        wait_for(pending, 900, "every waiting job Pending")
        for attempt in range(args.repeat):
            pods = wait_for(
                lambda a=attempt: (
                    (p := gang(api, a)) and len(p) == 16 and all(x["spec"].get("nodeName") for x in p) and p
                ),
                300,
                "the gang's pods bound",
            )
            for pod in pods:
                report(api, pod, "Running")
            wait_for(
                lambda: api.ok(api.send("GET", f"{JOBS}/gpt")).get("status", {}).get("phase") == "Running",
                120,
                "Running",
            )
            api.ok(
                api.send(
                    "PATCH", "/api/v1/nodes/gpu-00000", {"metadata": {"labels": {"example.com/round": str(attempt)}}}
                )
            )
            failed = next(p for p in pods if p["metadata"]["name"] == "gpt-5")
            started = time.perf_counter()
            report(api, failed, "Failed")
            while not all(p["metadata"].get("deletionTimestamp") for p in gang(api, attempt)):
                time.sleep(0.005)
            samples.append(time.perf_counter() - started)
            print(
                f"round {attempt}: every pod of the gang deleted {samples[-1] * 1e3:.0f} ms after the failure",
                flush=True,
            )
            # No kubelet confirms the deletions: the bench does, so the next attempt's pods can be created.
            for pod in gang(api, attempt):
                api.send("DELETE", f"{PODS}/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})
    finally:
        if operator is not None:
            operator.stop()
        controlplane.down(workdir / "cluster")
    print(
        f"failed rank -> gang deleted with {args.pending} jobs pending: best {min(samples) * 1e3:.0f} ms, "
        f"median {statistics.median(samples) * 1e3:.0f} ms, worst {max(samples) * 1e3:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
