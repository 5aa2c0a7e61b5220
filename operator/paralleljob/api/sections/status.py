"""The ParallelJob status: phase, conditions, placement, progress and the network verdict. The operator's
output, never read back to decide (`handlers.reconcile`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paralleljob.api.fields import RawObject, api_field
from paralleljob.api.sections.stragglers import SlowNode

if TYPE_CHECKING:
    pass

Phase = Literal["Pending", "Queued", "Running", "Restarting", "Succeeded", "Failed"]


@dataclasses.dataclass(frozen=True)
class Condition:
    """A Kubernetes API convention condition."""

    type: str = api_field(
        "Valid, LayoutChosen, Scheduled, NetworkReady (the trainer's network preflight), NetworkVerified (what "
        "NCCL chose), Ready, SlowerThanModeled (step time persistently above the modeled one), Succeeded or Failed."
    )
    status: Literal["True", "False", "Unknown"] = api_field("True, False or Unknown.")
    reason: str = api_field("One CamelCase word for machines.", default="")
    message: str = api_field("A sentence for people.", default="")
    last_transition_time: str | None = api_field("When status last changed.", default=None, format="date-time")
    observed_generation: int | None = api_field(
        "The metadata.generation this condition was computed from.", default=None, minimum=0
    )


@dataclasses.dataclass(frozen=True)
class NodePlacement:
    """Where one node rank runs."""

    node_rank: int = api_field("torchrun --node-rank of the pod.", minimum=0)
    node: str = api_field("Kubernetes node the pod is pinned to.")
    ranks: str = api_field("Global ranks of the pod, e.g. 0-7.")
    stages: list[int] = api_field("Pipeline stages the pod holds.", default_factory=list)
    pod: str | None = api_field("Pod name.", default=None)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Training progress: rank 0 reports it in the job's progress ConfigMap, the operator copies it after
    validation. For people only: the operator never acts on it."""

    step: int = api_field("Last completed optimizer step.", default=0, minimum=0)
    total_steps: int | None = api_field("spec.training.steps.", default=None, minimum=0)
    loss: float | None = api_field("Training loss at step.", default=None)
    tokens_per_second: float | None = api_field("Training throughput of the whole job.", default=None)
    validation_loss: float | None = api_field(
        "Held-out loss at the latest evaluation (spec.training.eval).", default=None
    )
    updated: str | None = api_field("When progress was last reported.", default=None, format="date-time")
    tflops_per_gpu: float | None = api_field(
        "Achieved model TFLOP/s per GPU at the median step time of the last log window.",
        default=None,
        json_name="tflopsPerGpu",
    )
    mfu: float | None = api_field(
        "Model FLOPs utilisation (0 to 1); absent where the GPU's peak is unknown, as on CPU.", default=None
    )
    step_seconds: float | None = api_field(
        "Measured median step time over the last log window, in seconds.", default=None, json_name="stepSeconds"
    )
    modeled_step_seconds: float | None = api_field(
        "The planner's modeled step time for this plan, in seconds.", default=None, json_name="modeledStepSeconds"
    )
    step_over_modeled: float | None = api_field(
        "stepSeconds / modeledStepSeconds: above 1, the job runs slower than planned.",
        default=None,
        json_name="stepOverModeled",
    )
    resumed_from_layout: str | None = api_field(
        "Layout (PPpxTPtxDPd) the checkpoint this attempt resumed from was saved at.", default=None
    )
    resumed_at_layout: str | None = api_field(
        "Layout this attempt resumed at; it differs from resumedFromLayout when the checkpoint was re-cut.",
        default=None,
    )
    stragglers: list[SlowNode] | None = api_field(
        "The nodes the last window of compute times named slower than their peers (spec.failurePolicy.stragglers); "
        "empty when none.",
        default=None,
    )


@dataclasses.dataclass(frozen=True)
class NetworkStatus:
    """What NCCL chose on the current attempt, reported by rank 0 after a warm-up collective over every rank."""

    verified: Literal["True", "False", "Unknown"] | None = api_field(
        "Whether NCCL uses the network the job planned; the NetworkVerified condition's status.", default=None
    )
    reason: str | None = api_field(
        "AsPlanned, SocketFallback, FewerNICs, NoGPUDirectRDMA, MNNVLOff, or NoNcclLog (a CPU run).", default=None
    )
    message: str | None = api_field(
        "What NCCL chose, e.g. 'NCCL uses IB over 8 NICs with GPUDirect RDMA'.", default=None
    )


@dataclasses.dataclass(frozen=True)
class ParallelJobStatus:
    """The observed state, written by the operator alone."""

    phase: Phase | None = api_field(
        "Pending, Queued (waiting for its Kueue Workload to be admitted), Running, Restarting, Succeeded or Failed.",
        default=None,
    )
    message: str | None = api_field("Why the job is in its phase, for people.", default=None)
    conditions: list[Condition] | None = api_field(
        "Valid, Queued (jobs queued through Kueue), LayoutChosen (jobs that give a GPU budget), Scheduled, "
        "NetworkReady, NetworkVerified, Ready, SlowerThanModeled, Succeeded, Failed.",
        default=None,
    )
    observed_generation: int | None = api_field("Last metadata.generation acted on.", default=None, minimum=0)
    layout: str | None = api_field("pipeline x tensor x data, e.g. 8x4x2.", default=None)
    layout_choice: RawObject | None = api_field(
        "The layout the operator chose for a GPU budget (spec.parallelism.gpus or nodes), once, at first "
        "admission: pipeline, tensor, data, microBatch, gradientAccumulationSteps, activationRecomputation, "
        "zeroStage, the modeled stepSeconds, and the explanation. Restarts keep it.",
        default=None,
        json_name="layoutChoice",
    )
    world_size: int | None = api_field("Total ranks (GPUs).", default=None, minimum=0)
    nodes: int | None = api_field("Pods (node ranks).", default=None, minimum=0)
    gpus_per_node: int | None = api_field("Ranks per pod.", default=None, minimum=0, json_name="gpusPerNode")
    axis_order: str | None = api_field("Rank axis order the trainer uses.", default=None)
    placement: list[NodePlacement] | None = api_field("Per node rank: node, ranks and stages.", default=None)
    pods_ready: int | None = api_field("Pods running.", default=None, minimum=0)
    excluded_nodes: list[str] | None = api_field(
        "Nodes that broke an earlier attempt; re-planning leaves them out while the job fits without them.",
        default=None,
        json_name="excludedNodes",
    )
    restarts: int | None = api_field(
        "Restarts so far, against backoffLimit: gang restarts (new pods) and in-place restarts.",
        default=None,
        minimum=0,
    )
    in_place_restarts: int | None = api_field(
        "Of restarts, those made in place: a failed rank's gang restarted inside the pods it had.",
        default=None,
        minimum=0,
        json_name="inPlaceRestarts",
    )
    held_nodes: list[str] | None = api_field(
        "While a gang restarts: its old nodes, less the one blamed, kept from other jobs until heldUntil.",
        default=None,
        json_name="heldNodes",
    )
    held_until: str | None = api_field(
        "When a restarting gang's hold on heldNodes ends.", default=None, format="date-time", json_name="heldUntil"
    )
    spare_nodes: list[str] | None = api_field(
        "Hot spares (spec.failurePolicy.spareNodes) the job holds now: nodes kept free for it, each ready to take "
        "the node rank of a lost node.",
        default=None,
        json_name="spareNodes",
    )
    last_checkpoint_step: int | None = api_field(
        "Step of the newest complete checkpoint: saved, or resumed from at the start of an attempt.",
        default=None,
        minimum=0,
    )
    last_checkpoint_time: str | None = api_field(
        "When rank 0 reported the checkpoint of lastCheckpointStep complete (the checkpoint age metric's start).",
        default=None,
        format="date-time",
        json_name="lastCheckpointTime",
    )
    progress: Progress | None = api_field("Training progress.", default=None)
    nccl_env: dict[str, str] | None = api_field(
        "The NCCL and PyTorch environment the pods run with.", default=None, json_name="ncclEnv"
    )
    network: NetworkStatus | None = api_field(
        "What NCCL chose on this attempt (spec.network.verify), reported by rank 0.", default=None
    )
    start_time: str | None = api_field("When the current gang started.", default=None, format="date-time")
    completion_time: str | None = api_field("When the job finished.", default=None, format="date-time")
