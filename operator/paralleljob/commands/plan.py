"""`paralleljob plan JOB.yaml [--cluster NODES.yaml] [--pods PODS.yaml] [-o table|json|yaml|svg] [--out FILE]`.

Validates the job, reads the cluster (files, or the live cluster through the kubeconfig when --cluster is
absent): Nodes, bound Pods and other ParallelJobs, whose placements not yet bound are subtracted
(`planning.job_reservations`); calls `paralleljob.planning.plan_job()` and prints the plan. The live cluster
is read as the operator reads it (`paralleljob.k8s.informer`: Nodes and bound pods listed in pages into the
Node records and the GPU-usage index, so a cluster of 50,000 pods is never in memory at once), and pods
from files go through the same usage index. Exit 0 planned, 1 invalid or unschedulable, 2 usage.

Reasons (validation errors, unschedulable messages) go to standard output in table mode, as
`paralleljob validate` prints them, and to standard error with -o json|yaml|svg, so that standard output
holds only the machine-readable document.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple, TextIO

import yaml

from paralleljob import planning
from paralleljob.api import documents, verdicts
from paralleljob.api.problems import errors_of, warnings_of
from paralleljob.commands import plan_auto
from paralleljob.k8s import live
from paralleljob.planning import costmodel, inventory, picture, plan_text
from paralleljob.planning.usage import UsageIndex, UsageSnapshot

FORMATS = ("table", "json", "yaml", "svg")


class UsageError(Exception):
    """Bad arguments or unreadable inputs: exit 2."""


class Inputs(NamedTuple):
    """What the planner reads: node records in natural order, the usage of bound pods, the ParallelJobs."""

    nodes: tuple[inventory.NodeInfo, ...]
    usage: UsageSnapshot
    jobs: list[Mapping[str, Any]]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "plan",
        help="place a ParallelJob on a cluster: node ranks, rank layout, estimates",
        description="Place a ParallelJob's ranks on a cluster's nodes, topology-aware (see docs/planning.md). "
        "Exit 0 when planned, 1 when the job is invalid or unschedulable, 2 on bad usage.",
    )
    parser.add_argument("job", metavar="JOB.yaml", help="ParallelJob YAML (one or more documents), or - for stdin")
    parser.add_argument(
        "--cluster",
        metavar="NODES.yaml",
        help="Nodes as `kubectl get nodes -o json` (fastest: read with the C JSON parser) or `-o yaml` prints "
        "them (may also hold Pods and ParallelJobs); default: the live cluster",
    )
    parser.add_argument(
        "--pods",
        metavar="PODS.yaml",
        help="bound Pods (`kubectl get pods -A -o yaml`) and ParallelJobs (`kubectl get paralleljobs -A -o yaml`), "
        "added to the cluster's; an object listed in both counts once",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig of the live cluster (default: $KUBECONFIG, then in-cluster)"
    )
    parser.add_argument("-o", "--output", choices=FORMATS, default="table", help="output format (default table)")
    parser.add_argument("--out", metavar="FILE", help="write the output to FILE instead of standard output")
    parser.add_argument(
        "--bandwidth",
        action="append",
        default=[],
        metavar="LEVEL=GBPS",
        help="override a link bandwidth per GPU in GB/s; LEVEL is node, nvlink, leaf, block or top",
    )
    parser.add_argument(
        "--auto",
        action="store_true",
        help="choose the layout (PP x TP x DP, micro-batch, recomputation, ZeRO) for a GPU budget: the job's "
        "own size, or --gpus / --nodes",
    )
    parser.add_argument(
        "--gpus", metavar="N|A..B", help="with --auto: the GPU budget, or a range to show how throughput scales"
    )
    parser.add_argument("--nodes", type=int, metavar="N", help="with --auto: the budget in nodes (x GPUs per node)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    reasons = sys.stdout if args.output == "table" else sys.stderr
    try:
        options = planning.PlanningOptions(costmodel.CostModel(bandwidths=_bandwidths(args.bandwidth)))
        request = _budget_request(args)
        jobs = _load_jobs(args.job, reasons)
        if jobs is None:
            return 1
        found = _load_cluster(args.cluster, args.pods, args.kubeconfig)
    except UsageError as exc:
        print(f"paralleljob plan: {exc}", file=sys.stderr)
        return 2
    if request is None and any(job.needs_layout for _, job in jobs):
        request = plan_auto.BudgetRequest()  # a job that gives a GPU budget is planned as --auto would
    if request is not None:
        return _run_auto(args, jobs, found, request, options, reasons)
    outcomes, ok = _plan_all(jobs, found, options, reasons)
    if not outcomes:
        return 1
    # Only the picture needs the whole cluster again; building it is a pass over every node.
    cluster = inventory.ClusterBuilder().build(found.nodes, found.usage.usage) if args.output == "svg" else None
    text = render(outcomes, cluster, args.output)
    return _finish(text, args.out, ok)


def _budget_request(args: argparse.Namespace) -> plan_auto.BudgetRequest | None:
    """The --auto budget, or None without --auto (where --gpus and --nodes are refused)."""
    if not args.auto:
        if args.gpus is not None or args.nodes is not None:
            raise UsageError("--gpus and --nodes choose a budget for --auto; add --auto")
        return None
    if args.output == "svg":
        raise UsageError("--auto prints table, json or yaml; plan the chosen layout without --auto for svg")
    try:
        return plan_auto.parse_budget(args.gpus, args.nodes)
    except plan_auto.BudgetError as exc:
        raise UsageError(str(exc)) from None


def _run_auto(
    args: argparse.Namespace,
    jobs: list[tuple[str, Any]],
    found: Inputs,
    request: plan_auto.BudgetRequest,
    options: planning.PlanningOptions,
    reasons: TextIO,
) -> int:
    builder = inventory.ClusterBuilder()

    def cluster_for(job: Any, held: list[planning.Reservation]) -> planning.Cluster:
        others = planning.job_reservations(found.jobs, exclude=(job.namespace, job.name), bound=found.usage.bound)
        return builder.build(found.nodes, found.usage.usage, [*others, *held])

    chosen, ok = plan_auto.choose_all(jobs, cluster_for, request, options, reasons)
    if not chosen:
        return 1
    return _finish(plan_auto.render(chosen, request, args.output, plan_text.render_table), args.out, ok)


def _finish(text: str, out: str | None, ok: bool) -> int:
    try:
        _write(text, out)
    except OSError as exc:
        print(f"paralleljob plan: cannot write --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


def _write(text: str, path: str | None) -> None:
    if path is None:
        sys.stdout.write(text)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _bandwidths(pairs: list[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for pair in pairs:
        level, _, value = pair.partition("=")
        if level not in costmodel.LEVEL_NAMES:
            raise UsageError(f"--bandwidth {pair}: level must be one of {', '.join(costmodel.LEVEL_NAMES)}")
        try:
            found[level] = float(value)
        except ValueError:
            raise UsageError(f"--bandwidth {pair}: GBPS must be a number") from None
    return found


def _load_jobs(path: str, reasons: TextIO) -> list[tuple[str, Any]] | None:
    """(label, resolved job) for each document, or None after printing to `reasons` why one is invalid."""
    docs, problems = documents.load_path(path)
    for problem in errors_of(problems):
        print(f"{path}: {problem.render()}", file=reasons)
    if errors_of(problems):
        return None
    jobs: list[tuple[str, Any]] = []
    valid = True
    for doc in docs:
        label = path if len(docs) == 1 else f"{path} (document {doc.index + 1})"
        result, lines = verdicts.report(doc, label)
        if not result.ok:
            valid = False
            print("\n".join(lines), file=reasons)
            continue
        for problem in warnings_of(result.problems):
            print(f"{label}: {problem.render()}", file=sys.stderr)
        jobs.append((label, result.resolved))
    return jobs if valid else None


def _load_cluster(cluster_path: str | None, pods_path: str | None, kubeconfig: str | None = None) -> Inputs:
    """Nodes, pod usage and ParallelJobs: from --cluster or the live cluster, plus --pods; repeats count once."""
    if cluster_path is None:
        nodes, usage, jobs = _live_cluster(kubeconfig)
    else:
        objects = inventory.split_objects(_read_yaml(cluster_path))
        if not objects.nodes:
            raise UsageError(f"{cluster_path}: contains no Node objects (write `kubectl get nodes -o json` to it)")
        nodes = inventory.sort_nodes(inventory.node_info(node) for node in objects.nodes)
        usage, jobs = UsageIndex.of(objects.pods), objects.jobs
    if pods_path is not None:
        extra = inventory.split_objects(_read_yaml(pods_path))
        for pod in extra.pods:
            usage.observe("ADDED", pod)  # the same pod read live and from the file counts once
        jobs = [*jobs, *extra.jobs]
    return Inputs(nodes, usage.snapshot(), inventory.unique_objects(jobs))


def _read_yaml(path: str) -> list[Any]:
    docs, problems = documents.load_path(path)
    if errors_of(problems):
        raise UsageError(f"{path}: {errors_of(problems)[0].render()}")
    return [doc.body for doc in docs]


def _live_cluster(
    kubeconfig: str | None = None,
) -> tuple[tuple[inventory.NodeInfo, ...], UsageIndex, list[Mapping[str, Any]]]:
    """The live cluster's node records, the usage index of its bound pods and its ParallelJobs (k8s.live), or
    a UsageError line."""
    try:
        found = live.read_cluster(kubeconfig)
    except live.LiveClusterError as exc:
        raise UsageError(f"{exc}; pass --cluster FILE") from None
    return found.nodes, found.usage, found.jobs


def _plan_all(
    jobs: list[tuple[str, Any]],
    found: Inputs,
    options: planning.PlanningOptions,
    reasons: TextIO,
) -> tuple[list[tuple[str, planning.Plan]], bool]:
    """Plan each job in turn; later jobs see the GPUs the earlier plans hold (as reservations), and every job
    sees the GPUs that other ParallelJobs' placements not yet bound hold (the job itself excepted)."""
    outcomes: list[tuple[str, planning.Plan]] = []
    reservations: list[planning.Reservation] = []
    builder = inventory.ClusterBuilder()
    ok = True
    for label, job in jobs:
        held = planning.job_reservations(found.jobs, exclude=(job.namespace, job.name), bound=found.usage.bound)
        cluster = builder.build(found.nodes, found.usage.usage, [*held, *reservations])
        outcome = planning.plan_job(job, cluster, options)
        if isinstance(outcome, planning.Unschedulable):
            print(f"{label}: {outcome.problem().render()}", file=reasons)
            ok = False
            continue
        outcomes.append((job.name, outcome))
        reservations += planning.reservations_of(outcome, job.name)
    return outcomes, ok


def render(outcomes: list[tuple[str, planning.Plan]], cluster: planning.Cluster | None, output: str) -> str:
    if output == "json":
        dicts = [plan.to_dict() for _, plan in outcomes]
        return json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump_all([plan.to_dict() for _, plan in outcomes], sort_keys=False, width=120)
    if output == "svg":
        return "\n".join(picture.render_svg(plan, cluster, name) for name, plan in outcomes) + "\n"
    return "".join(plan_text.render_table(name, plan) for name, plan in outcomes)
