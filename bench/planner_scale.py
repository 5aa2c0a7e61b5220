"""Planning time of a 128-node job on synthetic clusters of 1,000 / 10,000 / 100,000 nodes.

    .venv/bin/python -m bench.planner_scale [--sizes 1000,10000,100000] [--repeat 5] [--requests] [--spares N]

Prints, per cluster size: the time to load the NodeList from YAML (yaml C loader), to build the planner's
Cluster from the dicts (parsing), and to plan (plan_job, excluding parsing; best of --repeat), and the ratio of
planning time to loading time. The cluster has 8-GPU nodes, 32 nodes per leaf, 16 leaves per block and 30%
of the nodes busy. Times are CPU seconds of this process (time.process_time), so that other load on a shared
machine does not count; planning is single-threaded. With --requests every node also offers 96 CPUs, 1 TiB and
8 rdma/ib, every busy pod holds 16 CPUs and 128 GiB, and the job's pods request 64 CPUs, 512 GiB and 8 rdma/ib
(`spec.template.resources`), so the planner also checks those against what the bound pods leave free. With
--spares N the same job is planned a second time with spec.failurePolicy.spareNodes N (hot spares, issue 26),
and the columns `+spares` (its plan time) and `spares` (the extra time) follow; the result names how many of
the spares share a leaf, and a block, with the node rank they guard.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import yaml

from bench import common
from paralleljob import planning
from paralleljob.planning import synth


def best_of(repeat: int, action):  # type: ignore[no-untyped-def]
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = action()
        best = min(best, time.process_time() - start)
    return best, result


NODE_OFFERS = {"cpu": "96", "memory": "1Ti", "rdma/ib": "8"}
BUSY_POD_REQUESTS = {"cpu": "16", "memory": "128Gi"}
JOB_REQUESTS = {"cpu": "64", "memory": "512Gi", "rdma/ib": "8"}


def measure(size: int, job, repeat: int, requests: bool, spare_job=None) -> str:  # type: ignore[no-untyped-def]
    spec = synth.SynthSpec(
        nodes=size, gpus_per_node=8, leaves=max(1, size // 32), blocks=max(1, size // 512), busy=0.3, seed=1
    )
    nodes, pods = synth.synth_cluster(spec)
    if requests:
        for node in nodes:
            node["status"]["allocatable"].update(NODE_OFFERS)
        for pod in pods:
            pod["spec"]["containers"][0]["resources"].setdefault("requests", {}).update(BUSY_POD_REQUESTS)
    text = yaml.dump_all([synth.node_list(nodes), synth.pod_list(pods)], Dumper=yaml.CSafeDumper)
    load, docs = best_of(1, lambda: list(yaml.load_all(text, Loader=yaml.CSafeLoader)))
    node_dicts, pod_dicts, _ = planning.inventory.split_objects(docs)
    build, cluster = best_of(repeat, lambda: planning.build_cluster(node_dicts, pod_dicts))
    plan_s, plan = best_of(repeat, lambda: planning.plan_job(job, cluster))
    result = f"{len(plan.nodes)} nodes, cost {plan.cost.seconds:.3f} s vs naive {plan.naive_cost.seconds:.3f} s"
    columns = ""
    if spare_job is not None:
        spared_s, spared = best_of(repeat, lambda: planning.plan_job(spare_job, cluster))
        columns = f" {spared_s * 1e3:>8.1f}ms {(spared_s - plan_s) * 1e3:>7.1f}ms"
        result += (
            f"; {len(spared.spares)} spares, {_near(spared, -1)} in their guarded rank's leaf, "
            f"{_near(spared, 0)} in its block"
        )
    return (
        f"{size:>8} {load * 1e3:>8.0f}ms {build * 1e3:>6.0f}ms {plan_s * 1e3:>7.1f}ms{columns} {plan_s / load:>9.3f} "
        f"{plan_s / size * 1e6:>7.2f}us  {result}"
    )


def _near(plan, level: int) -> int:  # type: ignore[no-untyped-def]
    """How many spares share the domain at `level` (-1: the leaf, 0: the block) with the node rank they guard."""

    def domain(domains) -> str:  # type: ignore[no-untyped-def]
        return domains.get(plan.levels[level], "") if plan.levels else ""

    return sum(domain(spare.domains) == domain(plan.nodes[spare.guards].domains) for spare in plan.spares)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--requests", action="store_true", help="count CPU, memory and rdma/ib requests too")
    parser.add_argument("--spares", type=int, default=0, help="also plan with spec.failurePolicy.spareNodes N")
    args = parser.parse_args()
    job = common.gpt_175b_job("bench-128-nodes", 8, 8, 16, micro_batches=64)
    if args.requests:
        template = dataclasses.replace(job.spec.template, resources={"requests": JOB_REQUESTS})
        spec = dataclasses.replace(job.spec, template=template)
        job = dataclasses.replace(job, job=dataclasses.replace(job.job, spec=spec))
    spare_job = None
    extra = ""
    if args.spares:
        policy = dataclasses.replace(job.spec.failure_policy, spare_nodes=args.spares)
        spec = dataclasses.replace(job.spec, failure_policy=policy)
        spare_job = dataclasses.replace(job, job=dataclasses.replace(job.job, spec=spec))
        extra = f" {'+spares':>10} {'spares':>9}"
    print(f"{'nodes':>8} {'load YAML':>10} {'build':>8} {'plan':>9}{extra} {'plan/load':>9} {'per node':>9}  result")
    for size in (int(s) for s in args.sizes.split(",")):
        print(measure(size, job, args.repeat, args.requests, spare_job), flush=True)


if __name__ == "__main__":
    main()
