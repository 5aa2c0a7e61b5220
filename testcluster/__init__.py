"""A Kubernetes cluster on one machine, for the tests, the benchmarks and `make cluster-demo`: not part of the product.

`controlplane` runs the upstream control plane built by `make tools` (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) with its own PKI (`pki`); `kubelet` is a process kubelet whose fake GPU nodes run pods as
local processes in a sandbox of their own (`sandbox`, `containers`, `images` for the images' root filesystems);
`cluster` starts and stops the whole (the entry point, `python -m testcluster up DIR`, and scripts/local_cluster.py
use it); `proxy` is a fault proxy in front of the API server; `server` is the operator tests' API server (the
control plane behind the proxy, reset between tests); `kueue` runs the Kueue controller; `product` installs the
chart and runs the quickstart on the cluster (`quickstart`); `api` talks to it as a user does (HTTPS, kubectl, helm).

What the operator's tests and the benchmarks both drive lives here too, so that no benchmark imports `tests.*`:
`admin` is the cluster as its administrator sees it through the kubernetes client (fake GPU Nodes, jobs, binding
pods), `operators` the operator as a process and a rival Lease holder, `chart` the chart rendered by `helm
template` (its RBAC and leader-election flags), and `trainer_harness` the trainer without a cluster: job files and
torchrun gangs on this machine, which the trainer tests and the trainer benchmarks run alike, and `netns` the
network namespaces on one bridge that the link check's ranks run in.
"""
