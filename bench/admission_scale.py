"""Admission at 10,000 nodes and 50,000 pods, in process: the cost of planning inside one admission pass with a
warm usage index, and of warming that index. No API server: the caches are filled from the synthesized cluster
as a listing would fill them. The same cluster and jobs serve bench/upstream_admission_scale.py, which measures
the whole pass over HTTPS and the operator's memory on the upstream control plane.

    .venv/bin/python -m bench.admission_scale [--nodes 10000] [--pods-per-node 5] [--pending 100] [--repeat 10]

The cluster: 8-GPU nodes under 32-node leaves and 512-node blocks (`paralleljob cluster synth`); on every node
four DaemonSet-like pods (CPU and memory only), on half of the nodes a GPU pod holding all 8 GPUs; plus
`--pending` ParallelJobs waiting unplaced and 20 placed ones whose pods are not bound yet (reservations, in
their attempt records).
The job admitted: 8x8x16 (PP x TP x DP), 1,024 GPUs on 128 nodes.

Prints the CPU time of filling the caches (`NodeWatch`, `UsageIndex`) from the cluster, then of planning inside
one admission pass from them: the round's snapshot, the reservations of the other jobs, the cluster assembled by
the `ClusterBuilder` and the plan (best and median of --repeat). Figures are recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from bench import common
from paralleljob.handlers import reconcile
from paralleljob.handlers.nodes import NodeWatch
from paralleljob.manifests import records
from paralleljob.planning.inventory import ClusterBuilder
from paralleljob.planning.usage import UsageIndex
from testcluster.admin import job_doc


def planning_in_process(view: reconcile.NodeView, config_maps: list[dict[str, Any]], repeat: int) -> list[float]:
    from paralleljob.api import validate_document
    from paralleljob.handlers import placement

    resolved = validate_document(job_doc("gpt", **common.ADMISSION_JOB, deepspeed=common.ADMISSION_DEEPSPEED)).resolved
    assert resolved is not None
    samples = []
    for _ in range(repeat):
        started = time.process_time()
        usage = view.usage.without([])
        held = records.reservations_of(config_maps, exclude=("research", "gpt"), bound=usage.bound)
        outcome = placement.plan(resolved, view.snapshot, usage.usage, held, builder=view.builder)
        samples.append(time.process_time() - started)
        assert outcome.plan is not None, outcome.reason
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods-per-node", type=int, default=5)
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    node_dicts, pods = common.synth_objects(args.nodes, args.pods_per_node)
    pod_bytes = statistics.mean(len(json.dumps(p)) for p in pods[:1000])
    print(f"cluster: {len(node_dicts)} nodes, {len(pods)} pods ({pod_bytes:.0f} bytes of JSON each)", flush=True)
    nodes, usage = NodeWatch(), UsageIndex()
    started = time.process_time()
    nodes.replace(iter(node_dicts))
    usage.replace(iter(pods))
    print(f"warming the caches from a listing: {time.process_time() - started:.2f} s CPU", flush=True)
    snapshot = nodes.snapshot()
    view = reconcile.NodeView(snapshot.known, snapshot.not_ready, snapshot, usage.snapshot(), ClusterBuilder())
    jobs = common.other_jobs(args.pending)
    held = [
        common.placed_record(node_dicts, {**job, "metadata": {**job["metadata"], "uid": f"uid-{i}"}}, i)
        for i, job in enumerate(jobs[-common.PLACED :])
    ]
    planning_in_process(view, held, 1)  # the first pass fills the builder's records; passes after it are warm
    print(
        f"planning in an admission pass (warm), CPU: {common.best_and_median(planning_in_process(view, held, args.repeat))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
