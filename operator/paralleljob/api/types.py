"""The ParallelJob API types (paralleljob.io/v1alpha1), the single source of the CRD schema.

Each dataclass is one object of the resource; each field carries its description, bounds and default
(see `paralleljob.api.fields`). The spec's sections live beside their rules in `api.sections`; this module
holds the resource's names, the spec and object that gather them, and re-exports every section's types. The parser builds these from YAML, the validator checks them, and the CRD
generator writes them out as an openAPIV3Schema. Field names here are snake_case; in YAML they are camelCase.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paralleljob.api.fields import RawObject, api_field
from paralleljob.api.sections.checkpoint import RESUME_FROM_PATTERN, Checkpoint
from paralleljob.api.sections.deepspeed import DEEPSPEED_KNOWN_PROPERTIES
from paralleljob.api.sections.model import Model, Precision
from paralleljob.api.sections.network import (
    AddrFamily,
    AxisOrder,
    Fabric,
    Network,
    PreflightPolicy,
    RdmaResource,
    Topology,
    VerifyPolicy,
)
from paralleljob.api.sections.parallelism import Parallelism
from paralleljob.api.sections.status import (
    Condition,
    NetworkStatus,
    NodePlacement,
    ParallelJobStatus,
    Phase,
    Progress,
)
from paralleljob.api.sections.stragglers import SlowNode, StragglerAction, Stragglers
from paralleljob.api.sections.template import (
    ENV_KNOWN_PROPERTIES,
    PROJECTED_SOURCES,
    VOLUME_KNOWN_PROPERTIES,
    VOLUME_SOURCE_PROPERTIES,
    VOLUME_SOURCES,
    PodResourceClaim,
    PodTemplate,
)
from paralleljob.api.sections.training import DataSource, TokenDtype, Training, TrainingData

# The parser and the CRD generator resolve every section's annotations in this module's namespace.
__all__ = [
    "DEEPSPEED_KNOWN_PROPERTIES",
    "ENV_KNOWN_PROPERTIES",
    "PROJECTED_SOURCES",
    "RESUME_FROM_PATTERN",
    "VOLUME_KNOWN_PROPERTIES",
    "VOLUME_SOURCES",
    "VOLUME_SOURCE_PROPERTIES",
    "AddrFamily",
    "AxisOrder",
    "Checkpoint",
    "Condition",
    "DataSource",
    "Fabric",
    "FailurePolicy",
    "Model",
    "Network",
    "NetworkStatus",
    "NodePlacement",
    "ObjectMeta",
    "ParallelJob",
    "ParallelJobSpec",
    "ParallelJobStatus",
    "Parallelism",
    "Phase",
    "PodResourceClaim",
    "PodTemplate",
    "Precision",
    "PreflightPolicy",
    "Progress",
    "RawObject",
    "RdmaResource",
    "SlowNode",
    "StragglerAction",
    "Stragglers",
    "TokenDtype",
    "Topology",
    "Training",
    "TrainingData",
    "VerifyPolicy",
    "spec_to_dict",
]

GROUP = "paralleljob.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ParallelJob"
PLURAL = "paralleljobs"
SINGULAR = "paralleljob"
SHORT_NAMES = ("pj",)

# Pods are named <job>-<nodeRank>; a pod's hostname must be a DNS label of at most 63 characters,
# so the job name leaves room for "-" and a node rank of up to six digits.
MAX_NAME_LENGTH = 56


@dataclasses.dataclass(frozen=True)
class FailurePolicy:
    """What to do when a pod, a rank or a node fails."""

    backoff_limit: int = api_field(
        "Gang restarts allowed before the job is marked Failed. On a failure every pod is deleted and the "
        "whole gang is re-planned and restarted from the latest checkpoint.",
        default=3,
        minimum=0,
    )
    progress_timeout_seconds: int | None = api_field(
        "Restart a hung gang, e.g. a collective that never returns: each pod's supervisor restarts the gang in "
        "place when one of its ranks has made no progress (its heartbeat, every step) for this many seconds; "
        "the operator restarts it with new pods (reason NoProgress) when rank 0's reported step has not advanced "
        "for twice as long (this long once no in-place restart is left). Both count against backoffLimit. "
        "Absent: no watchdog (the process-group timeout, spec.network.timeoutSeconds, still aborts a hung "
        "collective). Set it well above the slowest step plus a checkpoint write, and above a start's slowest "
        "phase (process groups, engine build, checkpoint load).",
        default=None,
        minimum=1,
        json_name="progressTimeoutSeconds",
    )
    spare_nodes: int = api_field(
        "Hot spares: nodes the planner reserves for the job beyond its own, chosen by the same cost model in the "
        "NVLink domain and leaf of the nodes they would replace. Their GPUs are kept from other jobs. When a node "
        "of the gang is lost (deleted, or NotReady past the grace period), the spare that costs least takes its "
        "node rank: only that rank's pod is recreated, on the spare, and the pods on healthy nodes stay. "
        "Shown in status.spareNodes.",
        default=0,
        minimum=0,
        json_name="spareNodes",
    )
    allow_data_shrink: bool = api_field(
        "When a node is lost and no spare is left: resume with data parallelism reduced by the replicas that "
        "node carried, keeping tensor, pipeline and the global batch (more gradient accumulation), from the "
        "latest checkpoint; the job grows back to spec.parallelism.data when nodes return, at its next "
        "checkpoint. Never below minData. Default: false (the job waits for a replacement node).",
        default=False,
        json_name="allowDataShrink",
    )
    min_data: int | None = api_field(
        "The smallest data-parallel size allowDataShrink may shrink to. Default: 1.",
        default=None,
        minimum=1,
        json_name="minData",
    )
    slower_than_modeled_factor: float = api_field(
        "The SlowerThanModeled condition turns True when the measured median step time stays above this many "
        "times the planner's modeled one (status.progress.stepOverModeled) for 5 minutes while Running; it only "
        "reports, never restarts. 1.5 by default.",
        default=1.5,
        minimum=1,
        json_name="slowerThanModeledFactor",
    )
    allow_relayout: bool = api_field(
        "For a job whose size is a budget (parallelism.gpus or nodes): when a node is lost and no spare is left "
        "(and the DP shrink, if allowed, finds no smaller DP that places), resume at the best layout the planner "
        "finds for the GPUs left, pipeline and tensor included, keeping the global batch; the trainer re-cuts the "
        "checkpoint. The job grows back to its chosen layout at its next checkpoint once that fits again. "
        "Ignored for a job with fixed sizes (use allowDataShrink). Default: false.",
        default=False,
        json_name="allowRelayout",
    )
    in_place_restarts: int = api_field(
        "Restarts of the gang inside the pods it has, when a rank fails and no pod is lost: every pod's "
        "supervisor stops its ranks and starts them again from the latest checkpoint; no pod is deleted or "
        "scheduled. Each counts against backoffLimit; once they are spent, the next failure restarts the gang "
        "with new pods. 0: every failure restarts the gang with new pods.",
        default=3,
        minimum=0,
        json_name="inPlaceRestarts",
    )
    stragglers: Stragglers = api_field(
        "Naming (and optionally replacing) a node slower than its peers doing identical work.",
        default_factory=Stragglers,
    )


@dataclasses.dataclass(frozen=True)
class ParallelJobSpec:
    """The desired state: a 3D-parallel DeepSpeed training job."""

    parallelism: Parallelism = api_field(
        "The 3D layout: pipeline x tensor x data. The job uses pipeline * tensor * data GPUs."
    )
    model: Model = api_field("The GPT model the bundled trainer builds (also passed to a custom command).")
    training: Training = api_field("Steps, seed, logging and data.")
    gpus_per_node: int | None = api_field(
        "GPUs each pod takes on its node (torchrun --nproc-per-node). Default: the planner chooses from the "
        "nodes' allocatable nvidia.com/gpu. Tensor-parallel groups must fit: tensor divides gpusPerNode.",
        default=None,
        minimum=1,
        json_name="gpusPerNode",
    )
    deepspeed: RawObject | None = api_field(
        "Your DeepSpeed config (as in ds_config.json), passed to deepspeed.initialize unchanged except that "
        "train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps are completed "
        "from each other and DP, and bf16/fp16 follow spec.model.precision. ZeRO stage must be 0 or 1 "
        "when pipeline > 1.",
        default=None,
        schema_properties=DEEPSPEED_KNOWN_PROPERTIES,
    )
    checkpoint: Checkpoint | None = api_field(
        "Checkpointing (see docs/operator.md, Checkpoints). Without it a gang restart starts training from step 0.",
        default=None,
    )
    failure_policy: FailurePolicy = api_field("Gang restart policy.", default_factory=FailurePolicy)
    topology: Topology = api_field("Network topology labels and rank axis order.", default_factory=Topology)
    network: Network = api_field("Fabric and NCCL settings.", default_factory=Network)
    template: PodTemplate = api_field(
        "Pod settings: image, resources, scheduling, extra env and volumes.", default_factory=PodTemplate
    )
    command: list[str] | None = api_field(
        "Run your own DeepSpeed script instead of the bundled trainer, e.g. [python, /app/train.py]. It is "
        "started by torchrun once per GPU with the same job file, PARALLELJOB_* and NCCL environment; read "
        "them with the paralleljob_contract package (docs/contract.md).",
        default=None,
    )
    managed_by: str | None = api_field(
        "The controller that runs the job, when not this operator. kueue.x-k8s.io/multikueue: Kueue's MultiKueue "
        "dispatches it to a worker cluster (docs/install.md, MultiKueue); the operator here keeps only its "
        "Workload, never creates its pods, and the worker's status is mirrored into this one. Cannot change "
        "after creation.",
        default=None,
        max_length=63,
        json_name="managedBy",
    )


@dataclasses.dataclass(frozen=True)
class ObjectMeta:
    """The part of metadata the API reads."""

    name: str = api_field("Job name: a DNS-1123 label of at most 56 characters (pods are <name>-<nodeRank>).")
    namespace: str | None = api_field("Namespace.", default=None)
    labels: dict[str, str] | None = api_field("Labels.", default=None)
    annotations: dict[str, str] | None = api_field("Annotations.", default=None)


@dataclasses.dataclass(frozen=True)
class ParallelJob:
    """A ParallelJob as parsed from YAML."""

    metadata: ObjectMeta
    spec: ParallelJobSpec


def spec_to_dict(obj: Any) -> Any:
    """Serialise an API object to its YAML form (camelCase keys, None and empty defaults dropped)."""
    from paralleljob.api.fields import json_name  # local: keeps the module graph flat

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            if value is None:
                continue
            out[json_name(field)] = spec_to_dict(value)
        return out
    if isinstance(obj, list):
        return [spec_to_dict(item) for item in obj]
    if isinstance(obj, dict):
        return {key: spec_to_dict(value) for key, value in obj.items()}
    return obj
