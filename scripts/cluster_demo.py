"""`make cluster-demo`: the operator and the bundled trainer on a simulated control plane, on this machine.

Starts the strict test cluster of tests/cluster (an API server that enforces RBAC, the CRD's schema and CEL
rules; a scheduler; a kubelet that runs pods as local processes) with a few fake GPU nodes, applies the chart's
CRD and RBAC from `helm template` with kubectl, runs the operator as the chart's ServiceAccount, applies the
quickstart (with a checkpoint PVC and synthetic data, which a cluster needs), and shows `kubectl get pj -w`.
The kubeconfig is printed so you can run kubectl yourself; Ctrl-C stops everything.

    .venv/bin/python scripts/cluster_demo.py [--nodes 4] [--steps 60] [--workdir runs/cluster-demo]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.chart.conftest import tool  # noqa: E402
from tests.cluster.product import Product, cluster_quickstart  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="fake 4-GPU nodes")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the quickstart")
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "cluster-demo")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    product = Product(args.workdir, nodes=args.nodes).start()
    try:
        job = args.workdir / "quickstart.yaml"
        job.write_text(yaml.safe_dump(cluster_quickstart(steps=args.steps, checkpoint_every=10)))
        product.kubectl("apply", "--validate=false", "-f", str(job))
        kubeconfig = product.cluster.kubeconfig
        print(f"simulated cluster up: {args.nodes} fake GPU nodes, the operator running as the chart's account")
        print(f"  export KUBECONFIG={kubeconfig}")
        print(f"  {tool('kubectl')} get pj,pods   # in another shell; pod logs: {args.workdir}/kubelet/pods/*/")
        pid = f"{args.workdir}/kubelet/pods/default_quickstart-1_*/pid"
        print(f"  kill a pod's processes: kill -9 -- -$(cat {pid})   (the gang restarts from the last checkpoint)")
        print("watching the job (Ctrl-C to stop the cluster):", flush=True)
        subprocess.run([tool("kubectl"), "--kubeconfig", str(kubeconfig), "get", "pj", "-w"], check=False)
    except KeyboardInterrupt:
        pass
    finally:
        product.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
