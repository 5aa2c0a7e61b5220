"""The rank layout: pipeline x tensor x data sizes, the axis order that numbers the ranks, and the groups.

It follows DeepSpeed's `ProcessTopology` exactly: the axes are listed slowest first and a global rank is their
row-major (mixed-radix) number, so with the default order (pipe, data, model)
`rank = pipe * (dp * tp) + data * tp + model`. A pod (one per node) runs ranks
`nodeRank * ranksPerNode + localRank`. The planner, the local runner, the bundled trainer and users' own
scripts all derive coordinates and groups from here; nothing lists them per rank.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

from paralleljob_contract.errors import ContractError

Axis = Literal["pipe", "data", "model"]
AxisOrder = tuple[Axis, Axis, Axis]

AXES: AxisOrder = ("pipe", "data", "model")
PIPE_DATA_MODEL: AxisOrder = AXES  # DeepSpeed's default: model (tensor) varies fastest
DATA_PIPE_MODEL: AxisOrder = ("data", "pipe", "model")  # a replica's stages on neighbouring ranks
AXIS_ORDERS: dict[str, AxisOrder] = {",".join(order): order for order in (PIPE_DATA_MODEL, DATA_PIPE_MODEL)}


class Coord(NamedTuple):
    """Where one rank sits on the three axes."""

    pipe: int
    data: int
    model: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Pipeline x tensor x data sizes and the axis order that numbers the ranks (torchtitan's ParallelDims)."""

    pipeline: int
    tensor: int
    data: int
    axis_order: AxisOrder = PIPE_DATA_MODEL

    def __post_init__(self) -> None:
        for field, value in (("pipeline", self.pipeline), ("tensor", self.tensor), ("data", self.data)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ContractError(f"parallelism.{field}: must be a positive integer, got {value!r}")
        if sorted(self.axis_order) != sorted(AXES):
            raise ContractError(
                f"axisOrder: must name pipe, data and model once each, got {list(self.axis_order)}; "
                f"use one of {', '.join(AXIS_ORDERS)}"
            )

    @property
    def sizes(self) -> dict[Axis, int]:
        return {"pipe": self.pipeline, "data": self.data, "model": self.tensor}

    @property
    def world_size(self) -> int:
        return self.pipeline * self.tensor * self.data

    @property
    def name(self) -> str:
        return f"PP{self.pipeline}xTP{self.tensor}xDP{self.data}"

    def size_of(self, axis: str) -> int:
        return self.sizes[_axis(axis)]

    def coord(self, rank: int) -> Coord:
        """The coordinates of a global rank (ProcessTopology.get_coord)."""
        if not 0 <= rank < self.world_size:
            raise ContractError(f"rank {rank} is outside {self.name} (world size {self.world_size})")
        values: dict[str, int] = {}
        for axis in reversed(self.axis_order):
            rank, values[axis] = divmod(rank, self.sizes[axis])
        return Coord(values["pipe"], values["data"], values["model"])

    def rank(self, coord: Coord) -> int:
        """The global rank at these coordinates (ProcessTopology.get_rank)."""
        values = coord._asdict()
        rank = 0
        for axis in self.axis_order:
            rank = rank * self.sizes[axis] + values[axis]
        return rank

    def group(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate of `rank` but `axis`: its TP ("model"), PP ("pipe") or DP
        ("data") group, in order along the axis."""
        values = self.coord(rank)._asdict()
        members = []
        for index in range(self.size_of(axis)):
            values[_axis(axis)] = index
            members.append(self.rank(Coord(**values)))
        return members

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, ordered by their lowest rank (ProcessTopology.get_axis_comm_lists)."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            members = self.group(rank, axis)
            seen.setdefault(members[0], members)
        return [seen[first] for first in sorted(seen)]

    def with_order(self, order: AxisOrder) -> Layout:
        return dataclasses.replace(self, axis_order=order)


def _axis(axis: str) -> Axis:
    if axis not in AXES:
        raise ContractError(f"axis {axis!r} is not one of {', '.join(AXES)}")
    return axis


def axis_order_of(names: object) -> AxisOrder:
    """An axis order from its JSON form (a list of names) or its comma form ("pipe,data,model")."""
    listed = names.split(",") if isinstance(names, str) else list(names) if isinstance(names, list | tuple) else None
    if listed is None or not all(isinstance(axis, str) for axis in listed) or sorted(listed) != sorted(AXES):
        raise ContractError(f"axisOrder: must order exactly {', '.join(AXES)}, got {names!r}")
    return (_axis(listed[0]), _axis(listed[1]), _axis(listed[2]))


def node_ranks(node_rank: int, ranks_per_node: int) -> range:
    """Global ranks of one pod: torchrun's `node_rank * nproc_per_node + local_rank`."""
    start = node_rank * ranks_per_node
    return range(start, start + ranks_per_node)


def global_rank(node_rank: int, ranks_per_node: int, local_rank: int) -> int:
    return node_rank * ranks_per_node + local_rank


def tensor_fits(tensor: int, ranks_per_node: int, multi_node_domain: bool) -> bool:
    """The one "TP fits one NVLink domain" rule: a tensor-parallel group stays inside one node (ranksPerNode
    is a multiple of tensor), or, in a multi-node NVLink domain (a GB200 NVL72 rack), spans whole nodes of it
    (tensor is a multiple of ranksPerNode). Anything else runs TP all-reduces over the network."""
    if ranks_per_node % tensor == 0:
        return True
    return multi_node_domain and tensor % ranks_per_node == 0
