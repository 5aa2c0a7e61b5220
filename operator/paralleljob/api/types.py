"""The ParallelJob API types (paralleljob.io/v1alpha1), the single source of the CRD schema.

Each dataclass is one object of the resource; each field carries its description, bounds and default
(see `paralleljob.api.fields`). The parser builds these from YAML, the validator checks them, and the CRD
generator writes them out as an openAPIV3Schema. Field names here are snake_case; in YAML they are camelCase.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from paralleljob.api.fields import RawObject, api_field
from paralleljob_contract import environment, jobfile

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

Precision = Literal["bf16", "fp16", "fp32"]
DataSource = Literal["synthetic", "text", "tokens"]
TokenDtype = Literal["uint16", "uint32"]
Fabric = Literal["auto", "infiniband", "roce", "efa", "tcp"]
VerifyPolicy = Literal["fail", "warn", "off"]
AddrFamily = Literal["AF_INET", "AF_INET6"]
AxisOrder = Literal["auto", "pipe,data,model", "data,pipe,model"]
Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed"]
Architecture = Literal["gpt", "llama"]
ExportFormat = Literal["hf"]


@dataclasses.dataclass(frozen=True)
class Parallelism:
    """The 3D layout: pipeline (PP) x tensor (TP) x data (DP) parallel sizes, or a GPU budget to choose them for."""

    pipeline: int | None = api_field(
        "Pipeline-parallel size (PP): the number of pipeline stages the model's layers are split into. "
        "Stages exchange activations point to point, so the planner lays consecutive stages close in the fabric. "
        "Required unless gpus or nodes gives a budget; with a budget, a size given here is kept.",
        default=None,
        minimum=1,
    )
    tensor: int | None = api_field(
        "Tensor-parallel size (TP): the number of GPUs that split each layer's matrices (Megatron-style). "
        "A tensor-parallel group all-reduces four times per layer and micro-batch, so it must fit in one "
        "NVLink domain: a node, or a multi-node NVLink clique (see spec.topology.nvlinkDomainLabel). "
        "Required unless gpus or nodes gives a budget; with a budget, a size given here is kept.",
        default=None,
        minimum=1,
    )
    data: int | None = api_field(
        "Data-parallel size (DP): the number of model replicas. Optional: when absent it is derived from "
        "spec.deepspeed as train_batch_size / (train_micro_batch_size_per_gpu * gradient_accumulation_steps), "
        "or chosen with the layout when gpus or nodes gives a budget. Total GPUs = pipeline * tensor * data.",
        default=None,
        minimum=1,
    )
    gpus: int | None = api_field(
        "A GPU budget instead of sizes: at first admission the operator chooses pipeline x tensor x data = gpus, "
        "the micro-batch and accumulation for spec.deepspeed.train_batch_size, activation recomputation and "
        "the ZeRO stage, by modeled step time on the free nodes (as paralleljob plan --auto does), and records "
        "the choice in status.layoutChoice; restarts re-place but never re-choose. Needs train_batch_size.",
        default=None,
        minimum=1,
    )
    nodes: int | None = api_field(
        "A budget in nodes: gpus = nodes * spec.gpusPerNode (which it needs). Exclusive with gpus.",
        default=None,
        minimum=1,
    )
    sequence_parallel: bool = api_field(
        "Megatron sequence parallelism inside each tensor-parallel group: norms and residual adds run on 1/tensor of "
        "the sequence, an all-gather precedes each column-parallel linear and a reduce-scatter follows each "
        "row-parallel one (the same bytes as the all-reduces they replace), and activations outside the "
        "parallel regions take 1/tensor of the memory. Needs tensor > 1, given explicitly, dividing "
        "model.sequenceLength.",
        default=False,
    )


@dataclasses.dataclass(frozen=True)
class Model:
    """The shape of the GPT model the bundled trainer builds."""

    layers: int = api_field("Number of transformer blocks. Split into spec.parallelism.pipeline stages.", minimum=1)
    hidden_size: int = api_field("Hidden (embedding) size; must be divisible by attentionHeads.", minimum=1)
    attention_heads: int = api_field(
        "Number of attention heads; must be divisible by spec.parallelism.tensor, since heads are split "
        "across tensor-parallel ranks.",
        minimum=1,
    )
    sequence_length: int = api_field("Tokens per sample (context length).", minimum=1)
    vocab_size: int = api_field(
        "Vocabulary size. With spec.parallelism.tensor > 1 the token embedding (first stage) and the LM head "
        "(last stage) are vocab-parallel: padded to a multiple of tensor x 128 (the padding masked out of the "
        "loss) and split over the tensor-parallel ranks, so any size works with any tensor size. Byte-level "
        "text data (spec.training.data.source: text) needs at least 256.",
        minimum=1,
    )
    ffn_hidden_size: int | None = api_field(
        "Inner size of each MLP. Default: 4 * hiddenSize for gpt, 8/3 * hiddenSize rounded up to a multiple of "
        "256 for llama. Must be divisible by spec.parallelism.tensor.",
        default=None,
        minimum=1,
    )
    precision: Precision = api_field(
        "Numeric precision: bf16 (the GPU default), fp16 (with loss scaling) or fp32 (CPU and exact tests). "
        "Sets bf16/fp16 in the DeepSpeed config; a contradicting spec.deepspeed is an error.",
        default=jobfile.DEFAULT_PRECISION,
    )
    activation_checkpoint_interval: int = api_field(
        "Recompute activations every this many layers in the backward pass, trading compute for memory "
        "(DeepSpeed PipelineModule activation_checkpoint_interval). 0 turns recomputation off.",
        default=jobfile.DEFAULT_ACTIVATION_CHECKPOINT_INTERVAL,
        minimum=0,
    )
    architecture: Architecture = api_field(
        "The block the bundled trainer builds. gpt: learned positions, LayerNorm, GELU MLP, biases. llama: "
        "rotary positions (ropeTheta), RMSNorm, SwiGLU MLP (gate, up, down), no biases, grouped-query "
        "attention (kvHeads); exported as LlamaForCausalLM (spec.checkpoint.export).",
        default=jobfile.DEFAULT_ARCHITECTURE,
    )
    kv_heads: int | None = api_field(
        "llama only: key/value heads of grouped-query attention. Default: attentionHeads (no grouping). Must "
        "divide attentionHeads, and kvHeads and spec.parallelism.tensor must divide one another: each "
        "tensor-parallel rank holds whole key/value groups, or every rank holds all of them when tensor > kvHeads.",
        default=None,
        minimum=1,
    )
    rope_theta: float = api_field(
        "llama only: base of the rotary position embeddings' frequencies (10000 in Llama 2, 500000 in Llama 3).",
        default=jobfile.DEFAULT_ROPE_THETA,
        minimum=1,
    )
    tie_embeddings: bool = api_field(
        "llama only: share one matrix between the token embedding and the LM head. With pipeline > 1 the first "
        "and the last stage each hold a copy whose gradients are summed every step (DeepSpeed's tied layers).",
        default=False,
    )


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """Where the training tokens come from."""

    source: DataSource = api_field(
        "synthetic: deterministic random tokens; text: a UTF-8 file or a folder read as bytes with a "
        "256-token byte-level vocabulary; tokens: a flat binary file of token ids (nanoGPT style), memory-mapped.",
        default=jobfile.DEFAULT_DATA_SOURCE,
    )
    path: str | None = api_field(
        "File or folder to read, as seen inside the pod (mount it with spec.template.volumes). "
        "Required for text and tokens.",
        default=None,
    )
    token_dtype: TokenDtype = api_field(
        "Integer type of the ids in a tokens file: uint16 (vocabularies up to 65536) or uint32.",
        default=jobfile.DEFAULT_TOKEN_DTYPE,
    )


@dataclasses.dataclass(frozen=True)
class Training:
    """How long to train, and on what."""

    steps: int = api_field("Optimizer steps to run (each consumes one global batch).", minimum=1)
    seed: int = api_field(
        "Seed of the model's initial weights and of the data order.", default=jobfile.DEFAULT_SEED, minimum=0
    )
    log_interval: int = api_field(
        "Report loss, throughput and progress every this many steps.", default=jobfile.DEFAULT_LOG_INTERVAL, minimum=1
    )
    data: TrainingData = api_field("The training data.", default_factory=TrainingData)
    warmup_steps: int | None = api_field(
        "Steps of linear learning-rate warmup before the cosine decay. Default: min(100, steps / 10). "
        "A scheduler section in spec.deepspeed replaces this schedule.",
        default=None,
        minimum=0,
    )
    min_lr_ratio: float = api_field(
        "Learning rate at the last step, as a fraction of the peak (the end of the cosine decay).",
        default=jobfile.DEFAULT_MIN_LR_RATIO,
        minimum=0,
        maximum=1,
    )


# spec.checkpoint.resumeFrom: a job name, or a folder relative to the volume's root; no segment starts with ".".
RESUME_FROM_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"
# Every volume source of a core/v1 Volume. The CRD declares them (as preserved objects) so that CEL, in the
# chart's ValidatingAdmissionPolicy, can see which one a volume uses: fields preserved as unknown are invisible
# to CEL. The projected sources a volume can combine are declared for the same reason.
VOLUME_SOURCES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
    "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs",
    "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume",
    "projected", "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
)  # fmt: skip
PROJECTED_SOURCES = (
    "clusterTrustBundle",
    "configMap",
    "downwardAPI",
    "podCertificate",
    "secret",
    "serviceAccountToken",
)
_PRESERVED: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _volume_source_properties() -> dict[str, Any]:
    sources = {name: {**_PRESERVED, "description": f"A {name} volume source."} for name in VOLUME_SOURCES}
    projection = {name: {**_PRESERVED, "description": f"A {name} projection."} for name in PROJECTED_SOURCES}
    sources["projected"] = {
        **_PRESERVED,
        "description": "A projected volume source.",
        "properties": {
            "sources": {
                "type": "array",
                "description": "The projections.",
                "items": {**_PRESERVED, "properties": projection},
            }
        },
    }
    return sources


VOLUME_SOURCE_PROPERTIES = _volume_source_properties()
VOLUME_KNOWN_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string", "description": "Volume name."},
    **VOLUME_SOURCE_PROPERTIES,
}
ENV_KNOWN_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string", "description": "Variable name."},
    "valueFrom": {
        **_PRESERVED,
        "description": "Where the value comes from.",
        "properties": {"secretKeyRef": {**_PRESERVED, "description": "A key of a Secret."}},
    },
}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where and how often the trainer saves DeepSpeed checkpoints; restarts resume from the newest complete one."""

    volume: RawObject | None = api_field(
        "The Kubernetes volume source mounted at path in every pod: required on a cluster, typically "
        "{persistentVolumeClaim: {claimName: ...}} on a ReadWriteMany volume shared by all nodes. Any number "
        "of jobs may share one claim. An explicit {emptyDir: {}} is accepted with a warning: it is deleted "
        "with its pod, so a gang restart starts from step 0. `paralleljob run` ignores it (DIR/checkpoints).",
        default=None,
        schema_properties=VOLUME_SOURCE_PROPERTIES,
    )
    path: str = api_field(
        "Where the volume is mounted in every pod. The job keeps its checkpoints in its own folder on it, "
        "<path>/<namespace>/<name> (global_stepN folders, each with a manifest.json, and `latest`), and "
        "rank 0's metrics.jsonl in <path>/<namespace>/<name>/metrics.",
        default="/checkpoints",
    )
    interval_steps: int = api_field(
        "Save a checkpoint every this many steps, and always at the last step. A gang restart loses at most "
        "this many steps.",
        default=100,
        minimum=1,
    )
    keep: int = api_field(
        "Complete checkpoints kept, newest first; older ones are deleted once a newer one is complete, so the "
        "one a restart resumes from is never deleted before its successor exists.",
        default=3,
        minimum=1,
    )
    resume_from: str | None = api_field(
        "Start from another job's checkpoint (fine-tuning, branching a sweep) while this job has none of its "
        "own: a job name in this namespace (its folder on the same volume), or a folder relative to the "
        "volume's root that holds global_stepN checkpoints. Mounted read-only and never written. The model, "
        "pipeline and tensor sizes, ZeRO stage and train batch must match the checkpoint's; DP may differ. "
        "Training continues from the checkpoint's step.",
        default=None,
        pattern=RESUME_FROM_PATTERN,
        pattern_fix="write a job name, or a folder relative to the volume's root with no leading / and no .. segment",
        max_length=253,
    )
    export: ExportFormat | None = api_field(
        "After the last step's checkpoint, also write the model in this format to <path>/<namespace>/<name>/"
        "export: hf is a Hugging Face folder (config.json, model.safetensors, generation_config.json) that "
        "transformers loads as LlamaForCausalLM or GPT2LMHeadModel. `paralleljob export` does the same for any "
        "checkpoint.",
        default=None,
    )


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
        "Restart the gang (reason NoProgress, counted against backoffLimit) when rank 0's reported training step "
        "has not advanced for this many seconds while the job is Running, e.g. a collective that never returns. "
        "Absent: no watchdog (the process-group timeout, spec.network.timeoutSeconds, still aborts a hung "
        "collective). Set it well above the slowest step plus a checkpoint write.",
        default=None,
        minimum=1,
        json_name="progressTimeoutSeconds",
    )


@dataclasses.dataclass(frozen=True)
class Topology:
    """How the cluster's network is described by node labels."""

    levels: list[str] | None = api_field(
        "Node label keys that name the network domains, coarse to fine (e.g. a block, then a leaf switch). "
        "Default: recognised from the label families present on the nodes (GKE gce-topology-block/-subblock, "
        "EKS network-node-layer-1..3, network.topology.nvidia.com/*, topology.kubernetes.io/zone).",
        default=None,
    )
    nvlink_domain_label: str | None = api_field(
        "Node label whose value names a multi-node NVLink domain, usually nvidia.com/gpu.clique. "
        "Absent: each node is its own NVLink domain.",
        default=None,
        json_name="nvlinkDomainLabel",
    )
    axis_order: AxisOrder = api_field(
        "Order of the rank axes, slowest first. pipe,data,model is DeepSpeed's default; data,pipe,model puts "
        "consecutive pipeline stages of one replica on neighbouring ranks. auto lets the planner choose the "
        "one its cost model prefers.",
        default="auto",
    )
    allow_mixed_gpu_products: bool = api_field(
        "Allow nodes with different nvidia.com/gpu.product labels in one job. Off by default: the slowest "
        "GPU would pace every step.",
        default=False,
        json_name="allowMixedGPUProducts",
    )


@dataclasses.dataclass(frozen=True)
class RdmaResource:
    """An extended resource that gives a pod RDMA devices."""

    name: str = api_field("Resource name, e.g. rdma/hca_shared_devices_a, rdma/ib or nvidia.com/hostdev.")
    count: int | None = api_field(
        "How many to request per pod. Default: the node's allocatable count for exclusive (SR-IOV, host-device) "
        "plugins and for any plugin offering at most 2 per GPU, 1 for shared plugins (names with 'shared'); "
        "where the kind cannot be told, 1 with a warning.",
        default=None,
        minimum=1,
    )


@dataclasses.dataclass(frozen=True)
class Network:
    """The fabric between nodes, the NCCL settings derived from it, and how the network is proven at start."""

    fabric: Fabric = api_field(
        "Inter-node fabric: infiniband, roce, efa or tcp. auto detects it from node labels and allocatable "
        "resources (see docs/operator.md). A declared or detected RDMA fabric sets NCCL_NET, so a missing "
        "transport fails at init instead of falling back to TCP sockets; only a declared tcp disables IB.",
        default="auto",
    )
    nccl_env: dict[str, str] | None = api_field(
        "NCCL or PyTorch environment variables that override the derived ones, e.g. {NCCL_DEBUG: INFO}. "
        "{NCCL_NET: ''} removes the fail-closed transport choice.",
        default=None,
        json_name="ncclEnv",
    )
    rdma_resource: RdmaResource | None = api_field(
        "RDMA resource requested by every pod. Default: vpc.amazonaws.com/efa (all of the node's) for efa, "
        "the RDMA resource the nodes offer for infiniband and roce.",
        default=None,
    )
    ib_hcas: list[str] | None = api_field(
        "InfiniBand/RoCE adapters NCCL may use, e.g. [mlx5_0, mlx5_1]; written as NCCL_IB_HCA with '=' so "
        "mlx5_1 does not also match mlx5_10.",
        default=None,
        json_name="ibHCAs",
    )
    gid_index: int | None = api_field(
        "RoCE GID index (NCCL_IB_GID_INDEX). Default: NCCL's automatic choice (steered by addrFamily and "
        "addrRange); force it only where the platform documents one, e.g. 3 on OCI bare metal.",
        default=None,
        minimum=-1,
    )
    addr_family: AddrFamily | None = api_field(
        "Address family of the GID NCCL chooses automatically (NCCL_IB_ADDR_FAMILY). Default: NCCL's (AF_INET).",
        default=None,
    )
    addr_range: str | None = api_field(
        "CIDR the automatically chosen GID must fall in (NCCL_IB_ADDR_RANGE), e.g. 10.0.0.0/8.",
        default=None,
        pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$",
    )
    cross_nic: int | None = api_field(
        "NCCL_CROSS_NIC: 0 keeps rings on one rail (rail-optimised fabrics), 1 lets them cross (fat trees). "
        "Default: NCCL's 2, same NIC preferred.",
        default=None,
        minimum=0,
        maximum=2,
    )
    traffic_class: int | None = api_field(
        "RoCE/IB traffic class of the data (NCCL_IB_TC), the lossless class of your switches, e.g. 41 on OCI.",
        default=None,
        minimum=0,
        maximum=255,
    )
    fifo_traffic_class: int | None = api_field(
        "Traffic class of NCCL's control messages (NCCL_IB_FIFO_TC), e.g. 84 on GKE A3 Ultra.",
        default=None,
        minimum=0,
        maximum=255,
    )
    service_level: int | None = api_field(
        "InfiniBand service level (NCCL_IB_SL). Default: NCCL's 0.", default=None, minimum=0, maximum=15
    )
    qps_per_connection: int | None = api_field(
        "Queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION); multi-level RoCE/ECMP fabrics want 4 for "
        "routing entropy. Default: NCCL's 1.",
        default=None,
        minimum=1,
        maximum=128,
    )
    socket_interface: str | None = api_field(
        "Network interface for NCCL's bootstrap and TCP transport (NCCL_SOCKET_IFNAME). Default: =eth0, the "
        "pod's own interface.",
        default=None,
    )
    imex_channel_claim: str | None = api_field(
        "Name of the spec.template.resourceClaims entry that gives each pod an IMEX channel (a ComputeDomain's "
        "channel claim on GB200/GB300 NVL72). With it, tensor-parallel groups may span the nodes of one "
        "NVLink domain and NCCL uses multi-node NVLink; without it the planner keeps them inside a node.",
        default=None,
    )
    verify: VerifyPolicy = api_field(
        "Network proof at start. The trainer's preflight (RDMA devices, libibverbs, EFA plugin, memlock, IMEX "
        "channel) runs before the process groups form and a failure sets NetworkReady=False; then NCCL's own "
        "INIT,NET lines and a warm-up collective are classified into NetworkVerified. fail: a degraded network "
        "(socket fallback, fewer NICs, no GPUDirect RDMA, no MNNVL) fails the job; warn: it is reported; off: "
        "neither check runs.",
        default="warn",
    )
    timeout_seconds: int = api_field(
        "Collective timeout: a rank waiting longer for a dead peer fails instead of hanging, which triggers "
        "a gang restart.",
        default=environment.DEFAULT_PG_TIMEOUT_SECONDS,
        minimum=10,
    )


@dataclasses.dataclass(frozen=True)
class PodResourceClaim:
    """One dynamic resource claim of every pod (a Kubernetes PodResourceClaim)."""

    name: str = api_field(
        "Name of the claim in the pod; the training container lists it in resources.claims.",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
    )
    resource_claim_template_name: str | None = api_field(
        "ResourceClaimTemplate each pod gets its own claim from, e.g. the channel template of a ComputeDomain "
        "(its spec.channel.resourceClaimTemplate.name).",
        default=None,
        json_name="resourceClaimTemplateName",
    )
    resource_claim_name: str | None = api_field(
        "An existing ResourceClaim that every pod shares.", default=None, json_name="resourceClaimName"
    )


@dataclasses.dataclass(frozen=True)
class PodTemplate:
    """What every pod of the job gets besides what the operator derives."""

    image: str | None = api_field(
        "Container image with the trainer (or your script). Default: the operator's configured trainer image.",
        default=None,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = api_field(
        "Image pull policy of the training container.", default=None
    )
    resources: RawObject | None = api_field(
        "Extra resource requests and limits ({requests: {cpu: ..., memory: ...}, limits: {...}}). "
        "nvidia.com/gpu and the RDMA resource are set by the operator.",
        default=None,
    )
    node_selector: dict[str, str] | None = api_field(
        "Only nodes with all of these labels are considered by the planner and the scheduler.", default=None
    )
    tolerations: list[RawObject] | None = api_field(
        "Tolerations of the pods; the planner skips nodes whose NoSchedule/NoExecute taints are not tolerated.",
        default=None,
    )
    env: list[RawObject] | None = api_field(
        "Extra environment variables of the training container.", default=None, schema_properties=ENV_KNOWN_PROPERTIES
    )
    volumes: list[RawObject] | None = api_field(
        "Extra pod volumes (e.g. the training data). The operator's admission policy lists the volume types allowed.",
        default=None,
        schema_properties=VOLUME_KNOWN_PROPERTIES,
    )
    volume_mounts: list[RawObject] | None = api_field(
        "Where the extra volumes are mounted in the training container.", default=None
    )
    service_account_name: str | None = api_field(
        "ServiceAccount of the pods. Default: a per-job account, mounted on node rank 0 only, that may only update "
        "this job's progress ConfigMap (<name>-progress). The operator's admission policy lists the accounts "
        "a job may name.",
        default=None,
    )
    priority_class_name: str | None = api_field("PriorityClass of the pods.", default=None)
    labels: dict[str, str] | None = api_field("Extra labels of the pods.", default=None)
    annotations: dict[str, str] | None = api_field("Extra annotations of the pods.", default=None)
    resource_claims: list[PodResourceClaim] | None = api_field(
        "Dynamic resource claims of every pod, e.g. a ComputeDomain's IMEX channel or DRA network devices; "
        "each is also given to the training container (resources.claims).",
        default=None,
    )


# DeepSpeed config keys the validator reads; declared in the CRD so that CEL rules can see them
# (fields preserved as unknown are invisible to CEL).
DEEPSPEED_KNOWN_PROPERTIES: dict[str, Any] = {
    "train_batch_size": {"type": "integer", "minimum": 1, "description": "Global batch in samples."},
    "train_micro_batch_size_per_gpu": {
        "type": "integer",
        "minimum": 1,
        "description": "Samples per micro-batch on one GPU.",
    },
    "gradient_accumulation_steps": {
        "type": "integer",
        "minimum": 1,
        "description": "Micro-batches per optimizer step; with pipeline parallelism, the micro-batches in "
        "flight through the pipeline.",
    },
    "gradient_clipping": {"type": "number", "minimum": 0, "description": "Clip the global gradient norm."},
    "zero_optimization": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "ZeRO settings. With pipeline parallelism only stage 0 or 1 is allowed.",
        "properties": {
            "stage": {"type": "integer", "minimum": 0, "maximum": 3, "description": "ZeRO stage."},
            "offload_optimizer": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "description": "Optimizer state offload; needs ZeRO stage >= 1.",
                "properties": {"device": {"type": "string", "description": "cpu, nvme or none."}},
            },
        },
    },
    "bf16": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "bf16 settings; enabled must agree with spec.model.precision.",
        "properties": {"enabled": {"type": "boolean", "description": "Whether bf16 is on."}},
    },
    "fp16": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "fp16 settings; enabled must agree with spec.model.precision.",
        "properties": {"enabled": {"type": "boolean", "description": "Whether fp16 is on."}},
    },
}


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


@dataclasses.dataclass(frozen=True)
class Condition:
    """A Kubernetes API convention condition."""

    type: str = api_field(
        "Valid, LayoutChosen, Scheduled, NetworkReady (the trainer's network preflight), NetworkVerified (what "
        "NCCL chose), Ready, Succeeded or Failed."
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
    updated: str | None = api_field("When progress was last reported.", default=None, format="date-time")


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

    phase: Phase | None = api_field("Pending, Running, Restarting, Succeeded or Failed.", default=None)
    message: str | None = api_field("Why the job is in its phase, for people.", default=None)
    conditions: list[Condition] | None = api_field(
        "Valid, LayoutChosen (jobs that give a GPU budget), Scheduled, NetworkReady, NetworkVerified, Ready, "
        "Succeeded, Failed.",
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
    restarts: int | None = api_field("Gang restarts so far.", default=None, minimum=0)
    held_nodes: list[str] | None = api_field(
        "While a gang restarts: its old nodes, less the one blamed, kept from other jobs until heldUntil.",
        default=None,
        json_name="heldNodes",
    )
    held_until: str | None = api_field(
        "When a restarting gang's hold on heldNodes ends.", default=None, format="date-time", json_name="heldUntil"
    )
    last_checkpoint_step: int | None = api_field(
        "Step of the newest complete checkpoint: saved, or resumed from at the start of an attempt.",
        default=None,
        minimum=0,
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
