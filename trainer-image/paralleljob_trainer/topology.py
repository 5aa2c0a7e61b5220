"""The rank layout: DeepSpeed's ProcessTopology in the plan's axis order, checked against the plan and launcher.

The planner decides which global rank holds which (pipe, data, model) coordinates and which node runs which
ranks; DeepSpeed derives the coordinates from its topology, and torchrun places rank R on node
R // nproc-per-node. This module builds that topology and refuses to train when any of them disagree, because
a silent mismatch would put tensor-parallel peers on different nodes or feed replicas the wrong data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from deepspeed.runtime.pipe.topology import ProcessTopology

from paralleljob_trainer.config import AXES, ConfigError, Plan


@dataclasses.dataclass(frozen=True)
class Launch:
    """What the launcher told this process about its place (torchrun's environment)."""

    rank: int
    world_size: int
    local_world_size: int
    # PARALLELJOB_NODE_RANK, set by the operator and the local runner; None when absent.
    node_rank: int | None = None


def launch_from_environment(environ: Mapping[str, str]) -> Launch:
    """This process's Launch; ConfigError when torchrun's variables are missing or not integers."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise ConfigError(f"{', '.join(missing)} not set: start the trainer with torchrun")
    try:
        rank, world_size, local_world_size = (int(environ[name]) for name in names)
        node_rank = environ.get("PARALLELJOB_NODE_RANK")
        return Launch(rank, world_size, local_world_size, int(node_rank) if node_rank else None)
    except ValueError as error:
        raise ConfigError(f"launcher environment: {error}") from error


def check_launch_matches(plan: Plan, launch: Launch) -> None:
    """Raise ConfigError unless the launcher runs plan.ranksPerNode ranks per node, and this rank on its node."""
    per_node = plan.ranks_per_node
    if launch.local_world_size != per_node:
        raise ConfigError(
            f"LOCAL_WORLD_SIZE is {launch.local_world_size} but plan.ranksPerNode is {per_node}: "
            "torchrun --nproc-per-node and the plan disagree"
        )
    node = launch.rank // per_node
    if launch.node_rank is not None and launch.node_rank != node:
        raise ConfigError(
            f"PARALLELJOB_NODE_RANK is {launch.node_rank} but rank {launch.rank} with {per_node} ranks per node "
            f"runs on node {node}: torchrun --node-rank and the pod disagree"
        )
    planned = next((entry for entry in plan.ranks if entry.rank == launch.rank), None)
    if planned is not None and planned.node_rank != node:
        raise ConfigError(
            f"plan.nodes: rank {launch.rank} is listed under nodeRank {planned.node_rank}, but with {per_node} "
            f"ranks per node torchrun runs it on node {node}"
        )


@dataclasses.dataclass(frozen=True)
class RankCoords:
    """Where one rank sits on the three axes."""

    pipe: int
    data: int
    model: int


def build_topology(plan: Plan) -> ProcessTopology:
    """A ProcessTopology with the plan's axis order (default pipe, data, model: model varies fastest)."""
    axes = list(plan.axis_order)
    return ProcessTopology(axes=axes, dims=[plan.layout.size_of(axis) for axis in axes])


def coords_of(topology: ProcessTopology, rank: int) -> RankCoords:
    coord = topology.get_coord(rank)
    return RankCoords(pipe=coord.pipe, data=coord.data, model=coord.model)


def check_plan_matches(topology: ProcessTopology, plan: Plan, world_size: int) -> None:
    """Raise ConfigError unless every rank of the plan has the coordinates the topology gives it."""
    if world_size != plan.world_size:
        raise ConfigError(
            f"WORLD_SIZE is {world_size} but the plan has {plan.world_size} ranks "
            f"({plan.layout.name}); the launcher and plan disagree"
        )
    planned = {entry.rank: entry for entry in plan.ranks}
    if planned and sorted(planned) != list(range(world_size)):
        raise ConfigError(f"plan.nodes: ranks {sorted(planned)} do not cover 0..{world_size - 1}")
    for rank, entry in planned.items():
        actual = dataclasses.asdict(coords_of(topology, rank))
        wanted = {axis: int(entry.coords.get(axis, -1)) for axis in AXES}
        if actual != wanted:
            raise ConfigError(
                f"rank layout mismatch: plan puts rank {rank} (node {entry.node_rank}) at {wanted}, "
                f"DeepSpeed's {'x'.join(plan.axis_order)} topology at {actual}"
            )
