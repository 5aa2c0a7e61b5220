"""`paralleljob run JOB.yaml`: validate, plan and train a ParallelJob on this machine as simulated nodes.

Exit codes: 0 the job succeeded; 1 invalid, unschedulable, or training failed after its restarts; 2 bad usage;
130 interrupted (every process is stopped first).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

from paralleljob import planning
from paralleljob.api import documents, verdicts
from paralleljob.api.problems import errors_of
from paralleljob.api.validation import ResolvedJob
from paralleljob.local import report, runner, throttle
from paralleljob.local import shape as local_shape
from paralleljob.planning import plan_text


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run a ParallelJob on this machine (one torchrun per simulated node)",
        description="Validate and plan JOB with the operator's code, then run it here: N simulated nodes with G "
        "slots each, one torchrun per node with the environment a pod gets. CPU/gloo unless CUDA is present. "
        "A failed node stops the whole gang, which restarts from the latest checkpoint up to "
        "spec.failurePolicy.backoffLimit.",
    )
    parser.add_argument("job", metavar="JOB.yaml", help="a file with one ParallelJob")
    parser.add_argument("--nodes", type=int, help="simulated nodes (default: fits the job)")
    parser.add_argument(
        "--gpus-per-node", type=int, help="slots per node (default: spec.gpusPerNode, else one stage per node)"
    )
    parser.add_argument("--output", type=Path, help="output folder (default: runs/<job name>)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the output folder's checkpoints instead of starting afresh"
    )
    parser.add_argument(
        "--throttle-node",
        type=int,
        metavar="R",
        help="for tests: hold node rank R to a fraction of its CPU share with a cgroup quota (a real slow node; root)",
    )
    parser.add_argument("--throttle-share", type=float, default=1 / 3, help="that fraction (default 1/3)", metavar="F")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    docs, problems = documents.load_path(args.job)
    for problem in errors_of(problems):
        print(f"{args.job}: {problem.render()}")
    if problems:
        return 1
    if len(docs) != 1:
        print(f"{args.job}: (yaml): holds {len(docs)} documents; paralleljob run takes one ParallelJob.")
        return 1
    result, lines = verdicts.report(docs[0], args.job, cluster=False)
    for line in lines:
        print(line)
    if not result.ok or result.resolved is None:
        return 1
    return run_valid(args, result.resolved, console)


def run_valid(args: argparse.Namespace, resolved: ResolvedJob, console: Console) -> int:
    """Train a job validated once by `run`: choose its layout when it gives a budget, plan it, run it."""
    nodes, gpus_per_node = args.nodes, args.gpus_per_node
    if resolved.needs_layout:
        chosen = local_shape.choose_locally(resolved, nodes, gpus_per_node)
        if isinstance(chosen, str):
            print(f"{args.job}: {chosen}")
            return 1
        choice, nodes, gpus_per_node = chosen
        resolved = choice.winner.job
        for line in choice.explanation:
            console.print(f"layout: {line}", markup=False)
    try:
        shape = local_shape.choose_shape(resolved, nodes, gpus_per_node)
        devices = local_shape.gpu_slices(shape, local_shape.visible_gpus())
    except local_shape.LocalShapeError as exc:
        print(f"{args.job}: {exc}")
        return 1
    outcome = local_shape.plan_locally(resolved, shape)
    if isinstance(outcome, planning.Unschedulable):
        print(f"{args.job}: {outcome.problem().render()}")
        return 1
    console.print(
        f"[bold]{resolved.name}[/]: {shape.nodes} simulated nodes x {shape.gpus_per_node} slots on this machine ({'GPUs' if devices else 'CPU'})"
    )
    console.file.write(plan_text.render_table(resolved.name, outcome))
    output = (args.output or Path("runs") / resolved.name).resolve()
    local = runner.LocalRun(resolved, shape, outcome, output, console, devices)
    try:
        local.prepare(Path(args.job).resolve(), resume=args.resume)
        local.throttled = make_throttle(args, shape.nodes)
    except OSError as error:
        print(f"{args.job}: cannot write the output folder {output}: {error.strerror or error}")
        return 1
    except throttle.ThrottleError as error:
        print(f"{args.job}: {error}")
        return 1
    try:
        summary = local.execute()
    finally:
        if local.throttled is not None:
            local.throttled.remove()
    report.print_summary(console, summary)
    report.write_summary(summary, output / "summary.json")
    return 0 if summary.succeeded else 1


def make_throttle(args: argparse.Namespace, nodes: int) -> throttle.Throttle | None:
    """--throttle-node's cgroup, or None without it."""
    if args.throttle_node is None:
        return None
    made = throttle.make(args.throttle_node, args.throttle_share, nodes, uuid.uuid4().hex[:8])
    print(f"node rank {made.node_rank} throttled to {made.cores:.2f} CPUs ({made.path})")
    return made
