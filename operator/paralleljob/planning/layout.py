"""The rank layout: which (pipe, data, model) coordinates each global rank has.

It follows DeepSpeed's `ProcessTopology` exactly: the axes are listed slowest first and the rank is their
row-major (mixed-radix) number, so with the default order (pipe, data, model)
`rank = pipe * (dp * tp) + data * tp + model`. Pods get ranks `nodeRank * ranksPerNode + localRank`.
The planner, the SVG and the tests call this; the trainer builds the same topology from the plan's axisOrder.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

Axis = Literal["pipe", "data", "model"]
AxisOrder = tuple[Axis, Axis, Axis]

PIPE_DATA_MODEL: AxisOrder = ("pipe", "data", "model")  # DeepSpeed's default
DATA_PIPE_MODEL: AxisOrder = ("data", "pipe", "model")  # a replica's stages on neighbouring ranks
AXIS_ORDERS: dict[str, AxisOrder] = {",".join(order): order for order in (PIPE_DATA_MODEL, DATA_PIPE_MODEL)}


class Coord(NamedTuple):
    pipe: int
    data: int
    model: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Pipeline x tensor x data sizes and the axis order that numbers the ranks."""

    pipeline: int
    tensor: int
    data: int
    axis_order: AxisOrder = PIPE_DATA_MODEL

    def __post_init__(self) -> None:
        if min(self.pipeline, self.tensor, self.data) < 1:
            raise ValueError(f"parallel sizes must be positive, got {self.sizes}")
        if sorted(self.axis_order) != ["data", "model", "pipe"]:
            raise ValueError(f"axis order must name pipe, data and model once each, got {self.axis_order}")

    @property
    def sizes(self) -> dict[Axis, int]:
        return {"pipe": self.pipeline, "data": self.data, "model": self.tensor}

    @property
    def world_size(self) -> int:
        return self.pipeline * self.tensor * self.data

    def coord(self, rank: int) -> Coord:
        """The coordinates of a global rank (ProcessTopology.get_coord)."""
        values: dict[str, int] = {}
        for axis in reversed(self.axis_order):
            size = self.sizes[axis]
            rank, values[axis] = divmod(rank, size)
        return Coord(values["pipe"], values["data"], values["model"])

    def rank(self, coord: Coord) -> int:
        """The global rank at these coordinates (ProcessTopology.get_rank)."""
        values = coord._asdict()
        rank = 0
        for axis in self.axis_order:
            rank = rank * self.sizes[axis] + values[axis]
        return rank

    def with_order(self, order: AxisOrder) -> Layout:
        return dataclasses.replace(self, axis_order=order)


def node_ranks(node_rank: int, ranks_per_node: int) -> range:
    """Global ranks of one pod: torchrun's `node_rank * nproc_per_node + local_rank`."""
    start = node_rank * ranks_per_node
    return range(start, start + ranks_per_node)
