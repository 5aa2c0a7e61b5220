"""The rank layout: DeepSpeed's ProcessTopology in the plan's axis order, checked against the plan.

The planner decides which global rank holds which (pipe, data, model) coordinates; DeepSpeed derives the same
thing from its topology. This module builds that topology and refuses to train when the two disagree, because
a silent mismatch would put tensor-parallel peers on different nodes or feed replicas the wrong data.
"""

from __future__ import annotations

import dataclasses

from deepspeed.runtime.pipe.topology import ProcessTopology

from paralleljob_trainer.config import AXES, ConfigError, Plan


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
            f"({plan.layout.pipeline}x{plan.layout.tensor}x{plan.layout.data}); the launcher and plan disagree"
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
