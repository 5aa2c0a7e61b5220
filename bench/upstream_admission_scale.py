"""Admission at 10,000 nodes and 50,000 pods on the upstream control plane (tests/upstream): the CPU cost of one
admission pass with a warm usage index, and the memory of `paralleljob operator` once its watches hold that
cluster. The same cluster, jobs and job as bench/admission_scale.py (which measures the planning inside a pass
in process, without a server), served by the real kube-apiserver and etcd.

    .venv/bin/python -m bench.upstream_admission_scale [--nodes 10000] [--pods-per-node 5] [--pending 100]

The bench writes the Nodes and the pods (bound with `spec.nodeName`, four CPU-only DaemonSet-like pods per node
and a GPU pod holding all 8 GPUs on every other node), 32 requests in flight, and kwok (`make kwok`,
bench/kwok.py) keeps them as the nodes' kubelets would: nodes Ready with their Leases renewed, pods Running.
The controller-manager runs whole, node-lifecycle controller included; no scheduler runs. A kubelet renews its
40 s Lease every 10 s, which this 2-core machine could not do for 10,000 nodes beside 50,000 pods, so kwok's
Leases last `--lease-seconds` (200: renewed every 50 s, 200 writes a second at most) and the node grace is 5/4
of that. Then `--pending` ParallelJobs wait unplaced and 20 placed ones hold nodes in their attempt records.

Prints:
1. one whole admission pass (`reconcile(..., admit=True)`) in this process, as the admin over HTTPS, from warm
   caches listed from the server: wall time and CPU time of the pass's thread (the API server is another process
   here, so the CPU time is the operator's alone), and the round's own read of every job's reservations;
2. the relist after a watch ends in 410 Gone: both of the operator's cluster-wide informers (the Nodes, and the
   bound pods of the usage index) list the whole cluster again into their warm caches, `--repeat` times: wall
   time, the CPU of the listing thread (the operator's) and of kube-apiserver and etcd meanwhile (theirs), the
   objects and pages read, and the records it corrected (0 on a quiet cluster);
3. `paralleljob operator` started against the cluster: its resident memory once both pod informers have listed
   the cluster and watch it (VmRSS), and its peak (VmHWM), from /proc; and how many node and Lease writes a
   second the cluster made meanwhile (kwok's heartbeats), with how many nodes were still Ready at the end.
Figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import requests

from bench import common, kwok
from paralleljob.handlers import reconcile
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.k8s import informer, reads
from paralleljob.k8s import session as k8s_session
from paralleljob.manifests import records
from paralleljob.planning.inventory import ClusterBuilder
from paralleljob.planning.usage import UsageIndex
from testcluster import controlplane
from testcluster import server as upstream
from testcluster.admin import job_doc, wait_for
from testcluster.api import Api
from testcluster.operators import Operator
from testcluster.proxy import FaultProxy

REPO = Path(__file__).resolve().parents[1]

JOBS = "/apis/paralleljob.io/v1alpha1/namespaces/{}/paralleljobs"


def in_parallel(work: Any, items: list[Any], threads: int = 32) -> None:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(work, items):
            pass


def write_cluster(api: Api, node_dicts: list[dict[str, Any]], pods: list[dict[str, Any]], fakes: kwok.Kwok) -> None:
    def pod(doc: dict[str, Any]) -> None:
        meta = {k: v for k, v in doc["metadata"].items() if k not in ("uid", "resourceVersion", "ownerReferences")}
        api.ok(api.send("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", {**doc, "metadata": meta}))

    for namespace in ("other-team", "queue", "research"):
        api.ok(api.send("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}))
    wait_for(lambda: api.send("GET", "/api/v1/namespaces/other-team/serviceaccounts/default").ok, what="accounts")
    seconds = kwok.write_nodes(api, [kwok.fake_node(doc) for doc in node_dicts], fakes)
    print(f"   wrote {len(node_dicts)} nodes, all Ready and untainted after {seconds:.0f} s", flush=True)
    started = time.perf_counter()
    in_parallel(pod, pods)
    print(f"   wrote {len(pods)} pods in {time.perf_counter() - started:.0f} s", flush=True)
    seconds = kwok.wait_running(api, len(pods), fakes)
    print(f"   all {len(pods)} pods Running {seconds:.0f} s later", flush=True)


def warm_view(session: k8s_session.Session, api: Api) -> reconcile.NodeView:
    """The caches an operator's informers hold, filled from a listing of the server."""
    nodes, usage = NodeWatch(), UsageIndex()
    nodes.replace(iter(kwok.list_all(api, "/api/v1/nodes")))
    usage.replace(iter(kwok.list_all(api, "/api/v1/pods", fieldSelector="spec.nodeName!=")))
    snapshot = nodes.snapshot()
    return reconcile.NodeView(snapshot.known, snapshot.not_ready, snapshot, usage.snapshot(), ClusterBuilder())


def admission(api: Api, session: k8s_session.Session, view: reconcile.NodeView, repeat: int) -> None:
    wall, cpu, round_wall = [], [], []
    for attempt in range(repeat):
        name = f"gpt-{attempt}"
        api.create(JOBS.format("research"), job_doc(name, **common.ADMISSION_JOB, deepspeed=common.ADMISSION_DEEPSPEED))
        started = time.perf_counter()
        held = frozenset(records.reservations_of(reads.list_reserving_config_maps(session), bound=view.usage.bound))
        round_wall.append(time.perf_counter() - started)
        in_round = dataclasses.replace(view, round_held=held)
        started, started_cpu = time.perf_counter(), time.thread_time()
        outcome = reconcile.reconcile(session, reconcile.Settings(), "research", name, in_round, admit=True)
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
        assert outcome.step == "admitted", outcome
    print(
        f"1. whole admission pass over HTTPS: CPU of the pass's thread {common.best_and_median(cpu)}; wall "
        f"{common.best_and_median(wall)}; the round's own read of every job's reservations (once per round): wall "
        f"{common.best_and_median(round_wall)}",
        flush=True,
    )


def relist(state: controlplane.State, session: k8s_session.Session, repeat: int) -> None:
    """What a 410 Gone costs: each informer's `relist()` into the cache it already holds (a first listing warms
    it), as after `Expired`."""
    server = [psutil.Process(state.pids[name]) for name in ("kube-apiserver", "etcd")]
    for source, cache in ((informer.NODES, NodeWatch()), (informer.BOUND_PODS, UsageIndex())):
        informer.Informer(session, source, cache).relist()
        wall, cpu, theirs, sizes = [], [], [], []
        for _ in range(repeat):
            counted = _Counted(cache)
            watched = informer.Informer(session, source, counted, synced=_set_event())
            before = sum(sum(p.cpu_times()[:2]) for p in server)
            started, started_cpu = time.perf_counter(), time.thread_time()
            watched.relist()
            wall.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
            theirs.append(sum(sum(p.cpu_times()[:2]) for p in server) - before)
            sizes.append(counted.objects)
        print(
            f"2. relist of {source.kind} ({sizes[-1]} objects, {-(-sizes[-1] // watched.page_size)} pages) after "
            f"410 Gone: wall {common.best_and_median(wall)}; operator CPU {common.best_and_median(cpu)}; "
            f"kube-apiserver and etcd CPU {common.best_and_median(theirs)}; corrected {watched.drift} records",
            flush=True,
        )


def _set_event() -> threading.Event:
    """A synced informer's flag: its relist corrects a warm cache, as after a 410."""
    event = threading.Event()
    event.set()
    return event


@dataclasses.dataclass
class _Counted:
    """A warm cache (NodeWatch or UsageIndex) that also counts what a relist gave it."""

    inner: Any
    objects: int = 0

    def replace(self, objects: Any) -> int:
        def counted() -> Any:
            for item in objects:
                self.objects += 1
                yield item

        return int(self.inner.replace(counted()))

    def observe(self, event_type: str, obj: Any) -> bool:
        return bool(self.inner.observe(event_type, obj))


def memory(state: controlplane.State, api: Api, workdir: Path, pods: int) -> None:
    """The operator through the fault proxy (no faults: it only counts the operator's requests)."""
    proxy = FaultProxy(state).start()
    kubeconfig = proxy.kubeconfig_for("admin", workdir)
    operator = Operator(None, workdir / "operator.log", kubeconfig, ["--log-level", "info"]).start()
    assert operator.process is not None
    try:
        started = time.perf_counter()
        pages = -(-pods // 500)

        def ours(verb: str, resource: str) -> int:
            return sum(
                1
                for r in list(proxy.requests)
                if (r.verb, r.resource) == (verb, resource) and r.agent.startswith("paralleljob")
            )

        # Synced: every page of the usage informer's listing was asked for, and then both pod informers (the
        # usage index's and the job pods') watch.
        wait_for(
            lambda: ours("list", "pods") >= pages and ours("watch", "pods") >= 2,
            timeout=1800,
            what="the usage informer watching",
        )
        listed = time.perf_counter() - started
        # The watches' steady state, while whatever the listings left behind is collected.
        node_writes = kwok.writes_per_second(api, "/api/v1/nodes", 15)
        lease_writes = kwok.writes_per_second(api, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", 15)
        status = Path(f"/proc/{operator.process.pid}/status").read_text()
        fields = {line.split(":")[0]: line.split(":")[1].strip() for line in status.splitlines()}
        rss, peak = (int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM"))
        print(
            f"3. operator memory with {pods} pods watched: RSS {rss:.0f} MiB, peak {peak:.0f} MiB (listed and "
            f"watching after {listed:.0f} s); meanwhile {node_writes:.1f} node writes/s and {lease_writes:.0f} Lease "
            f"writes/s, {kwok.ready_nodes(api)} nodes Ready and untainted",
            flush=True,
        )
    finally:
        operator.stop()
        proxy.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods-per-node", type=int, default=5)
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--lease-seconds",
        type=int,
        default=200,
        help="kwok's node Leases (renewed every quarter of it; a kubelet's are 40 s, more than 2 cores can renew "
        "at 10,000 nodes beside 50,000 pods); the node grace is 5/4 of it",
    )
    args = parser.parse_args()
    node_dicts, pods = common.synth_objects(args.nodes, args.pods_per_node)
    print(f"cluster: {len(node_dicts)} nodes, {len(pods)} pods", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="upstream-admission-"))
    # With the namespace controller that the operator tests leave out: the bench deletes its job namespaces
    # before it measures memory.
    state = controlplane.up(workdir / "cluster", scheduler=False, node_grace=kwok.node_grace(args.lease_seconds))
    try:
        upstream.install_crd(state)
        api = Api(state, state.tokens["admin"])
        api.session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=64))
        with kwok.Kwok(state, workdir / "kwok.log", args.lease_seconds) as fakes:
            write_cluster(api, node_dicts, pods, fakes)
            jobs = common.other_jobs(args.pending)
            placed = 0
            for job in jobs:
                created = api.create(JOBS.format("queue"), job)
                if created["metadata"]["name"].startswith("placed-"):
                    api.create("/api/v1/namespaces/queue/configmaps", common.placed_record(node_dicts, created, placed))
                    placed += 1
            assert placed == common.PLACED
            session = k8s_session.connect(str(state.kubeconfig))
            view = warm_view(session, api)
            admission(api, session, view, args.repeat)
            relist(state, session, args.repeat)
            # The operator's memory is measured over the nodes and pods alone.
            for namespace in ("queue", "research"):
                api.send("DELETE", f"/api/v1/namespaces/{namespace}")
            wait_for(lambda: api.send("GET", "/api/v1/namespaces/queue").status_code == 404, 300, "queue deleted")
            memory(state, api, workdir, len(pods))
    finally:
        controlplane.down(workdir / "cluster")
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
