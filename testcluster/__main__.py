"""A Kubernetes cluster on this machine: the upstream control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, built by `make tools`) and the test suite's process kubelet with fake GPU nodes, whose
pods run as local processes.

    python -m testcluster up DIR [--nodes 2] [--gpus-per-node 4]   # prints the kubeconfig's path
    KUBECONFIG=DIR/kubeconfig kubectl get nodes
    python -m testcluster fault DIR kill-node --node gpu-1          # or silence, resume, kill-container
    python -m testcluster down DIR

`up` returns once the API server is ready and every node is Ready; everything runs in the background until
`down`. Logs are in DIR/logs, and each pod's folder (its container log, volumes and root) in DIR/kubelet/pods.
scripts/local_cluster.py runs this from any folder. The tests and `make cluster-demo` use the same code
(testcluster/cluster.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testcluster import cluster, controlplane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the cluster in DIR and print its kubeconfig's path")
    up.add_argument("dir", type=Path)
    up.add_argument("--nodes", type=int, default=2, help="fake GPU nodes (default 2)")
    up.add_argument("--gpus-per-node", type=int, default=4, help="nvidia.com/gpu of each node (default 4)")
    down = commands.add_parser("down", help="stop what `up` started in DIR")
    down.add_argument("dir", type=Path)
    fault = commands.add_parser("fault", help="a kubelet fault: silence, resume, kill-node, kill-container")
    fault.add_argument("dir", type=Path)
    fault.add_argument("kind", choices=["silence", "resume", "kill-node", "kill-container"])
    fault.add_argument("--node", default="")
    fault.add_argument("--namespace", default="default")
    fault.add_argument("--pod", default="")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            started = cluster.up(args.dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
            print(started.kubeconfig)
        elif args.command == "down":
            cluster.down(args.dir)
        else:
            where = (
                {"node": args.node} if args.kind != "kill-container" else {"namespace": args.namespace, "pod": args.pod}
            )
            cluster.attach(args.dir).fault(args.kind, **where)
    except controlplane.ControlPlaneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
