"""The rank layout on DeepSpeed: its ProcessTopology in the plan's axis order, checked against the contract's
layout and the launcher.

The contract (`paralleljob_contract.layout`) says which global rank holds which (pipe, data, model)
coordinates, and that a pod of `ranksPerNode` ranks runs ranks `nodeRank * ranksPerNode + localRank`;
DeepSpeed derives the coordinates from its topology, and torchrun places rank R on node R // nproc-per-node.
This module builds that topology and refuses to train when any of them disagree, because a silent mismatch
would put tensor-parallel peers on different nodes or feed replicas the wrong data.
"""

from __future__ import annotations

from deepspeed.runtime.pipe.topology import ProcessTopology

from paralleljob_contract.environment import NODE_RANK, Launch
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import Plan
from paralleljob_contract.layout import Coord


def check_launch_matches(plan: Plan, launch: Launch) -> None:
    """Raise ContractError unless the launcher runs plan.ranksPerNode ranks per node, and this rank on its node."""
    per_node = plan.ranks_per_node
    if launch.local_world_size != per_node:
        raise ContractError(
            f"LOCAL_WORLD_SIZE is {launch.local_world_size} but plan.ranksPerNode is {per_node}: "
            "torchrun --nproc-per-node and the plan disagree"
        )
    node = launch.rank // per_node
    if launch.node_rank is not None and launch.node_rank != node:
        raise ContractError(
            f"{NODE_RANK} is {launch.node_rank} but rank {launch.rank} with {per_node} ranks per node "
            f"runs on node {node}: torchrun --node-rank and the pod disagree"
        )


def build_topology(plan: Plan) -> ProcessTopology:
    """A ProcessTopology with the plan's axis order (default pipe, data, model: model varies fastest)."""
    axes = list(plan.axis_order)
    return ProcessTopology(axes=axes, dims=[plan.layout.size_of(axis) for axis in axes])


def coords_of(topology: ProcessTopology, rank: int) -> Coord:
    coord = topology.get_coord(rank)
    return Coord(pipe=coord.pipe, data=coord.data, model=coord.model)


def check_plan_matches(topology: ProcessTopology, plan: Plan, world_size: int) -> None:
    """Raise ContractError unless WORLD_SIZE is the plan's and DeepSpeed's topology numbers every rank as the
    contract's layout does."""
    if world_size != plan.world_size:
        raise ContractError(
            f"WORLD_SIZE is {world_size} but the plan has {plan.world_size} ranks "
            f"({plan.layout.name}); the launcher and plan disagree"
        )
    for rank in range(world_size):
        wanted, actual = plan.layout.coord(rank), coords_of(topology, rank)
        if actual != wanted:
            raise ContractError(
                f"rank layout mismatch: the plan puts rank {rank} at {wanted._asdict()}, "
                f"DeepSpeed's {'x'.join(plan.axis_order)} topology at {actual._asdict()}"
            )
