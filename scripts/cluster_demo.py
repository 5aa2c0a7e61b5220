"""`make cluster-demo`: the operator and the bundled trainer on a Kubernetes cluster on this machine.

Starts the upstream control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, built by
`make tools`) with the process kubelet and a few fake 4-GPU nodes (tests/upstream), installs the chart with
`helm install` (the operator runs as its Deployment's pod), fills the quickstart's corpus claim with this
repository's Python sources, applies examples/quickstart-volumes.yaml and examples/quickstart-on-a-cluster.yaml
with kubectl, and shows `kubectl get pj -w`: the loss falls as in `paralleljob run`. The kubeconfig is printed
so you can run kubectl yourself; Ctrl-C stops everything.

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

from testcluster.product import Product  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="fake 4-GPU nodes")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the quickstart")
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "cluster-demo")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    product = Product(args.workdir, nodes=args.nodes)
    try:
        product.install()
        product.fill_corpus()
        job = yaml.safe_load((REPO / "examples" / "quickstart-on-a-cluster.yaml").read_text())
        job["spec"]["training"]["steps"] = args.steps
        (args.workdir / "quickstart.yaml").write_text(yaml.safe_dump(job))
        product.kubectl("apply", "-f", str(REPO / "examples" / "quickstart-volumes.yaml"))
        product.kubectl("apply", "-f", str(args.workdir / "quickstart.yaml"))
        cluster = product.cluster
        print(f"cluster up: {args.nodes} fake GPU nodes, the operator installed by helm and running as a pod")
        print(f"  export KUBECONFIG={cluster.kubeconfig}")
        print(f"  {product.kubectl.path} get pj,pods   # in another shell; pod logs: {cluster.folder}/kubelet/pods/*/")
        print(
            f"  kill a pod's processes: python scripts/local_cluster.py fault {cluster.folder} kill-container --pod quickstart-1"
        )
        print("watching the job (Ctrl-C to stop the cluster):", flush=True)
        subprocess.run([product.kubectl.path, "--kubeconfig", str(cluster.kubeconfig), "get", "pj", "-w"], check=False)
    except KeyboardInterrupt:
        pass
    finally:
        product.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
