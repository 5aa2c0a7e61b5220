"""Where `paralleljob run` puts a job: the simulated nodes (N nodes x G slots), their GPUs, the layout a
GPU budget gets on them, and the operator's plan on them. Pure but for reading the GPUs this machine shows.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from paralleljob import planning
from paralleljob.api.validation import ResolvedJob
from paralleljob.planning import layout_search
from paralleljob_contract.layout import tensor_fits


class LocalShapeError(ValueError):
    """The requested simulated nodes cannot hold the job; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class LocalShape:
    """The simulated cluster: nodes x slots per node."""

    nodes: int
    gpus_per_node: int


def choose_shape(resolved: ResolvedJob, nodes: int | None, gpus_per_node: int | None) -> LocalShape:
    """Nodes and slots that fit the job: the spec's gpusPerNode, else one pipeline stage per node."""
    world, tp = resolved.world_size, resolved.tensor
    gpn = gpus_per_node or resolved.spec.gpus_per_node
    if gpn is None:
        gpn = world // nodes if nodes else tp * resolved.data
    if gpn <= 0 or world % gpn:
        raise LocalShapeError(
            f"--gpus-per-node {gpn} does not divide the job's {world} ranks; use a divisor of {world}."
        )
    if not tensor_fits(tp, gpn, multi_node_domain=False):
        raise LocalShapeError(
            f"--gpus-per-node {gpn} is not a multiple of tensor {tp}, so a tensor-parallel group would span "
            f"two simulated nodes; use a multiple of {tp}."
        )
    if nodes is not None and nodes * gpn != world:
        raise LocalShapeError(
            f"--nodes {nodes} x {gpn} slots is {nodes * gpn} ranks but the job has {world}; use --nodes {world // gpn}."
        )
    return LocalShape(world // gpn, gpn)


def visible_gpus() -> int:
    """GPUs this machine shows (nvidia-smi -L), without importing torch; 0 when there are none."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        listed = [d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
        return len(listed)
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def gpu_slices(shape: LocalShape, gpus: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of each simulated node: node R sees GPUs R*G..R*G+G-1, as if it were its own
    machine (torchrun numbers each node's local ranks from 0). None on a machine without GPUs: CPU and gloo."""
    if gpus == 0:
        return None
    world = shape.nodes * shape.gpus_per_node
    if gpus < world:
        raise LocalShapeError(
            f"the job needs {world} GPUs and this machine shows {gpus}; run it on the CPU with "
            "CUDA_VISIBLE_DEVICES= (empty), or shrink the job."
        )
    g = shape.gpus_per_node
    return [",".join(str(d) for d in range(r * g, (r + 1) * g)) for r in range(shape.nodes)]


def choose_locally(
    template: ResolvedJob, nodes: int | None, gpus_per_node: int | None
) -> tuple[layout_search.LayoutChoice, int, int] | str:
    """A job that gives a GPU budget: the layout search on the local shape (--nodes x --gpus-per-node, else
    spec.gpusPerNode, else one simulated node of the whole budget); the choice and that shape, or the line
    why not."""
    budget = layout_search.budget_of(template)
    assert budget is not None
    per_node = gpus_per_node or template.spec.gpus_per_node or (budget.gpus // nodes if nodes else budget.gpus)
    count = nodes or max(1, budget.gpus // max(1, per_node))
    if per_node < 1 or count * per_node != budget.gpus:
        return (
            f"spec.parallelism: {count} simulated nodes x {per_node} slots is not the budget of {budget.gpus} "
            "GPUs; give --nodes and --gpus-per-node that multiply to it."
        )
    offers = planning.pod_requests(template)
    cluster = planning.build_cluster(planning.local_cluster_nodes(count, per_node, offers=offers))
    outcome = layout_search.choose_layout(template, cluster, budget)
    if isinstance(outcome, layout_search.NoLayout):
        return outcome.problem().render()
    return outcome, count, per_node


def plan_locally(resolved: ResolvedJob, shape: LocalShape) -> planning.Plan | planning.Unschedulable:
    """The operator's planner on N simulated nodes; their slot count is the pods' GPU count (a planning option:
    the user's spec is planned as written)."""
    nodes = planning.local_cluster_nodes(shape.nodes, shape.gpus_per_node, offers=planning.pod_requests(resolved))
    options = planning.PlanningOptions(ranks_per_node=shape.gpus_per_node)
    return planning.plan_job(resolved, planning.build_cluster(nodes), options)
