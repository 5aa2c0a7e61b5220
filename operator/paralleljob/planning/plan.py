"""The planner's outcomes: a `Plan` (where every node rank runs, the rank layout, estimates and cost) or an
`Unschedulable` (what is missing), and the Plan's JSON form.

`Plan.to_dict()` is the `plan` object of job.json that the trainer, the operator and the local runner read
(schema in docs/planning.md); `Plan.from_dict()` rebuilds it. Keys are stable: add, never rename.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from paralleljob.api.problems import Problem, error
from paralleljob_contract.layout import AxisOrder, Coord, Layout

ESTIMATES_NOTE = (
    "models, not measurements: memory, FLOPs, bytes, step time and MFU follow the formulas and assumptions "
    "in docs/planning.md"
)


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """One pod: its node rank, the node it is pinned to, and the ranks it runs."""

    node_rank: int
    node: str
    gpus: int
    ranks: tuple[int, ...]
    coords: tuple[Coord, ...]
    domains: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(sorted({coord.pipe for coord in self.coords}))

    @property
    def rank_range(self) -> str:
        """ "0-7" (or "3" for a single rank)."""
        first, last = self.ranks[0], self.ranks[-1]
        return str(first) if first == last else f"{first}-{last}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodeRank": self.node_rank,
            "node": self.node,
            "gpus": self.gpus,
            "ranks": list(self.ranks),
            "coords": [coord._asdict() for coord in self.coords],
            "stages": list(self.stages),
            "domains": dict(self.domains),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> NodePlan:
        return cls(
            node_rank=int(raw["nodeRank"]),
            node=str(raw["node"]),
            gpus=int(raw["gpus"]),
            ranks=tuple(int(r) for r in raw["ranks"]),
            coords=tuple(Coord(int(c["pipe"]), int(c["data"]), int(c["model"])) for c in raw["coords"]),
            domains={str(k): str(v) for k, v in (raw.get("domains") or {}).items()},
        )


@dataclasses.dataclass(frozen=True)
class SpareNode:
    """A hot spare (spec.failurePolicy.spareNodes): a node kept free for the job, to take a lost node rank's place.
    `guards` is the node rank it was chosen for, the one it sits nearest in the fabric."""

    node: str
    gpus: int
    guards: int
    domains: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpus": self.gpus, "guards": self.guards, "domains": dict(self.domains)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SpareNode:
        domains = {str(k): str(v) for k, v in (raw.get("domains") or {}).items()}
        return cls(str(raw["node"]), int(raw["gpus"]), int(raw.get("guards") or 0), domains)


@dataclasses.dataclass(frozen=True)
class Estimates:
    """Modeled figures for the job on the chosen GPUs; all byte figures are per GPU."""

    parameters: float
    memory: Mapping[str, float]  # weights, gradients, optimizer, activations, reserve, total
    gpu_memory: float | None  # bytes per GPU from nvidia.com/gpu.memory, None when unlabelled
    bubble_fraction: float
    bytes_per_step: Mapping[str, float]  # tensor, pipeline, data
    flops_per_step: float  # hardware FLOPs: with the recomputed forward when activations are recomputed
    step_seconds: float
    mfu: float  # model FLOPs (no recomputation) / (step seconds x GPUs x peak)
    assumptions: Mapping[str, Any]
    memory_stage: str = "only"  # the pipeline stage `memory` describes: first, last or only
    memory_by_stage: Mapping[str, float] = dataclasses.field(default_factory=dict)  # stage -> total bytes
    model_flops_per_step: float = 0.0

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory is None else self.memory["total"] <= self.gpu_memory

    def to_dict(self) -> dict[str, Any]:
        return {
            "note": ESTIMATES_NOTE,
            "parameters": self.parameters,
            "memoryPerGPU": {
                **self.memory,
                "gpuMemory": self.gpu_memory,
                "fits": self.fits,
                "stage": self.memory_stage,
                "byStage": dict(self.memory_by_stage),
            },
            "bubbleFraction": self.bubble_fraction,
            "bytesPerStep": dict(self.bytes_per_step),
            "flopsPerStep": self.flops_per_step,
            "modelFlopsPerStep": self.model_flops_per_step,
            "stepSeconds": self.step_seconds,
            "mfu": self.mfu,
            "assumptions": dict(self.assumptions),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Estimates:
        raw_memory = raw["memoryPerGPU"]
        memory = {k: float(v) for k, v in raw_memory.items() if k not in ("gpuMemory", "fits", "stage", "byStage")}
        gpu_memory = raw_memory.get("gpuMemory")
        return cls(
            parameters=float(raw["parameters"]),
            memory=memory,
            gpu_memory=None if gpu_memory is None else float(gpu_memory),
            bubble_fraction=float(raw["bubbleFraction"]),
            bytes_per_step={k: float(v) for k, v in raw["bytesPerStep"].items()},
            flops_per_step=float(raw["flopsPerStep"]),
            step_seconds=float(raw["stepSeconds"]),
            mfu=float(raw["mfu"]),
            assumptions=dict(raw.get("assumptions") or {}),
            memory_stage=str(raw_memory.get("stage") or "only"),
            memory_by_stage={str(k): float(v) for k, v in (raw_memory.get("byStage") or {}).items()},
            model_flops_per_step=float(raw.get("modelFlopsPerStep") or 0.0),
        )


@dataclasses.dataclass(frozen=True)
class PlacementCost:
    """Modeled communication seconds per step: by kind of group, and the slowest link level each reaches."""

    seconds: float
    by_group: Mapping[str, float]  # tensor, pipeline, data
    levels: Mapping[str, str]  # tensor, pipeline, data -> node, nvlink, leaf, block or top

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "byGroup": dict(self.by_group), "levels": dict(self.levels)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PlacementCost:
        return cls(float(raw["seconds"]), dict(raw["byGroup"]), dict(raw["levels"]))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where every node rank of a job runs, how ranks map to (pipe, data, model), and what it should cost."""

    layout: Layout
    ranks_per_node: int
    nodes: tuple[NodePlan, ...]
    estimates: Estimates
    cost: PlacementCost
    naive_cost: PlacementCost | None  # free nodes in name order, DeepSpeed's axis order; None if they lack
    gpu_product: str = ""
    levels: tuple[str, ...] = ()
    nvlink_domain_label: str | None = None
    warnings: tuple[str, ...] = ()
    spares: tuple[SpareNode, ...] = ()

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def axis_order(self) -> AxisOrder:
        return self.layout.axis_order

    def node_names(self) -> list[str]:
        return [node.node for node in self.nodes]

    def spare_names(self) -> list[str]:
        return [spare.node for spare in self.spares]

    def with_replacement(self, node_rank: int, spare: SpareNode) -> Plan:
        """The plan with `spare` in node rank `node_rank`'s place (same ranks and coordinates), and one spare fewer."""
        old = self.nodes[node_rank]
        moved = dataclasses.replace(old, node=spare.node, domains=dict(spare.domains))
        nodes = tuple(moved if entry.node_rank == node_rank else entry for entry in self.nodes)
        return dataclasses.replace(self, nodes=nodes, spares=tuple(s for s in self.spares if s.node != spare.node))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the `plan` object of job.json (schema in docs/planning.md)."""
        naive = self.naive_cost
        return {
            "layout": {"pipeline": self.layout.pipeline, "tensor": self.layout.tensor, "data": self.layout.data},
            "worldSize": self.world_size,
            "ranksPerNode": self.ranks_per_node,
            "axisOrder": list(self.axis_order),
            "gpuProduct": self.gpu_product,
            "levels": list(self.levels),
            "nvlinkDomainLabel": self.nvlink_domain_label,
            "nodes": [node.to_dict() for node in self.nodes],
            "estimates": self.estimates.to_dict(),
            "cost": {
                "unit": "modeled communication seconds per training step",
                "planned": self.cost.seconds,
                "naive": None if naive is None else naive.seconds,
                "detail": {"planned": self.cost.to_dict(), "naive": None if naive is None else naive.to_dict()},
            },
            "warnings": list(self.warnings),
            "spares": [spare.to_dict() for spare in self.spares],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Plan:
        """Rebuild a Plan from its JSON form (e.g. read back from job.json)."""
        layout = raw["layout"]
        order = cast(AxisOrder, tuple(raw.get("axisOrder") or ("pipe", "data", "model")))
        detail = (raw.get("cost") or {}).get("detail") or {}
        return cls(
            layout=Layout(int(layout["pipeline"]), int(layout["tensor"]), int(layout["data"]), order),
            ranks_per_node=int(raw["ranksPerNode"]),
            nodes=tuple(NodePlan.from_dict(node) for node in raw["nodes"]),
            estimates=Estimates.from_dict(raw["estimates"]),
            cost=PlacementCost.from_dict(detail["planned"]),
            naive_cost=PlacementCost.from_dict(detail["naive"]) if detail.get("naive") else None,
            gpu_product=str(raw.get("gpuProduct") or ""),
            levels=tuple(raw.get("levels") or ()),
            nvlink_domain_label=raw.get("nvlinkDomainLabel"),
            warnings=tuple(raw.get("warnings") or ()),
            spares=tuple(SpareNode.from_dict(spare) for spare in raw.get("spares") or ()),
        )


@dataclasses.dataclass(frozen=True)
class Shortfall:
    """Why some nodes do not qualify: how many, and the phrase that follows the count."""

    count: int
    singular: str  # "is cordoned"
    plural: str  # "are cordoned"

    def render(self) -> str:
        return f"{self.count} {self.singular if self.count == 1 else self.plural}"


@dataclasses.dataclass(frozen=True)
class Unschedulable:
    """The job cannot be placed now; `message` says what it needs and why the nodes fall short."""

    nodes_needed: int
    gpus_per_node: int
    gpu_product: str
    qualifying: int
    shortfalls: tuple[Shortfall, ...]
    message: str

    def problem(self) -> Problem:
        """As a Problem, so the CLI and the operator's conditions print it like validation errors."""
        return error("spec", f"unschedulable: {self.message}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "unschedulable": True,
            "message": self.message,
            "nodesNeeded": self.nodes_needed,
            "gpusPerNode": self.gpus_per_node,
            "gpuProduct": self.gpu_product,
            "qualifying": self.qualifying,
            "shortfalls": [s.render() for s in self.shortfalls],
        }
