"""Failed rank -> every pod of its gang deleted, while 100 other jobs wait for admission, on the upstream
control plane (tests/upstream).

    .venv/bin/python -m bench.upstream_restart_latency [--pending 100] [--repeat 3]

A 16-node job (4x4x4 on 4-GPU nodes) runs on all 16 nodes; `--pending` more 16-node jobs wait, unschedulable.
The real scheduler binds the gang's pods and kwok (`make kwok`, bench/kwok.py) plays the nodes' kubelets: it keeps
the nodes Ready, marks bound pods Running and removes deleted ones. The bench writes what a crashed rank's
kubelet would (its pod Failed with exit code 1).
Each round relabels a node (every waiting job is offered to the admission queue at once), then marks one
rank's pod Failed, and measures the wall time from that status write to the moment every pod of the gang
carries a deletionTimestamp (or is gone), listing the gang's pods every 5 ms; then the time until kwok has
removed them all and the next attempt's pods are Running. The operator runs as
`paralleljob operator` in a subprocess with the admin's kubeconfig; figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common, kwok
from paralleljob.manifests import timestamps
from testcluster import controlplane
from testcluster.admin import job_doc
from testcluster.api import Api
from testcluster.operators import Operator
from testcluster.polling import wait_for

REPO = Path(__file__).resolve().parents[1]

NAMESPACE = "research"
JOBS = f"/apis/paralleljob.io/v1alpha1/namespaces/{NAMESPACE}/paralleljobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def gang(api: Api, attempt: int) -> list[dict]:  # type: ignore[type-arg]
    selector = f"paralleljob.io/job=gpt,paralleljob.io/attempt={attempt}"
    return list(api.ok(api.send("GET", PODS, labelSelector=selector))["items"])


def fail(api: Api, pod: dict) -> None:  # type: ignore[type-arg]
    """What a kubelet writes when the pod's one container exits 1: the phase, the conditions and its state."""
    now = timestamps.now()
    state = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}}
    conditions = [{"type": kind, "status": "False", "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")]
    container = pod["spec"]["containers"][0]
    status = {
        "phase": "Failed",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}, *conditions],
        "containerStatuses": [
            {"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
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
    state = controlplane.up(workdir / "cluster", node_grace=kwok.node_grace())
    api = Api(state, state.tokens["admin"])
    operator, kubelets = None, contextlib.ExitStack()
    samples: list[float] = []
    gone: list[float] = []
    try:
        kubectl = [str(controlplane.binary("kubectl")), "--kubeconfig", str(state.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")], check=True, capture_output=True)
        api.ok(api.send("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
        fakes = kubelets.enter_context(kwok.Kwok(state, workdir / "kwok.log"))
        common.write_nodes(api, 16, fakes, gpus=4)
        common.write_checkpoint_claim(api, NAMESPACE)
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
            wait_for(lambda a=attempt: all(p["status"].get("phase") == "Running" for p in gang(api, a)), 120, "kwok")
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
            fail(api, failed)
            while not all(p["metadata"].get("deletionTimestamp") for p in gang(api, attempt)):
                time.sleep(0.005)
            samples.append(time.perf_counter() - started)
            print(
                f"round {attempt}: every pod of the gang deleted {samples[-1] * 1e3:.0f} ms after the failure",
                flush=True,
            )
            # kwok confirms the deletions as a kubelet would; then the operator's hold and the next attempt.
            wait_for(lambda a=attempt: not gang(api, a), 120, "the old gang gone")
            gone.append(time.perf_counter() - started)
            if attempt + 1 < args.repeat:
                wait_for(lambda a=attempt: all(p["status"].get("phase") == "Running" for p in gang(api, a + 1))
                         and len(gang(api, a + 1)) == 16, 300, "the next gang Running")  # fmt: skip
                print(f"   the next gang Running {time.perf_counter() - started:.1f} s after the failure", flush=True)
    finally:
        if operator is not None:
            operator.stop()
        kubelets.close()
        controlplane.down(workdir / "cluster")
    print(
        f"failed rank -> gang deleted with {args.pending} jobs pending: best {min(samples) * 1e3:.0f} ms, "
        f"median {statistics.median(samples) * 1e3:.0f} ms, worst {max(samples) * 1e3:.0f} ms; every old pod "
        f"removed by kwok after a median {statistics.median(gone):.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
