"""The job file (`job.json`): one schema, written by the operator and the local runner, read by the trainer and by
users' own scripts. docs/contract.md describes it field by field.

The file has a constant size: identity, the resolved spec, the resolved DeepSpeed config and the plan's
layout (sizes, axis order, nodes, ranks per node), never a per-node or per-rank list. A rank's coordinates
and groups follow from the layout (`paralleljob_contract.layout`), its node rank from its environment
(`paralleljob_contract.environment`). Each field has one default, defined here and used by the API's
resolution too. Reading validates everything a rank checks before it touches a process group, so each rank
exits with the same one-line message and nobody waits for a peer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paralleljob_contract import hf_config
from paralleljob_contract import model as model_math
from paralleljob_contract.efficiency import Modeled, parse_modeled
from paralleljob_contract.errors import ContractError
from paralleljob_contract.job_fields import boolean as _bool
from paralleljob_contract.job_fields import choice as _choice
from paralleljob_contract.job_fields import integer as _int
from paralleljob_contract.job_fields import optional_section as _optional_section
from paralleljob_contract.job_fields import section as _section
from paralleljob_contract.layout import AXES, Layout, axis_order_of
from paralleljob_contract.model import ModelShape, RopeScaling, default_ffn_hidden_size
from paralleljob_contract.training_data import DATA_SOURCES as DATA_SOURCES
from paralleljob_contract.training_data import DEFAULT_DATA_SOURCE as DEFAULT_DATA_SOURCE
from paralleljob_contract.training_data import DEFAULT_TOKEN_DTYPE as DEFAULT_TOKEN_DTYPE
from paralleljob_contract.training_data import TOKEN_DTYPES as TOKEN_DTYPES
from paralleljob_contract.training_data import DataConfig as DataConfig
from paralleljob_contract.training_data import EvalConfig, check_prepared_folders, parse_data, parse_eval

# The schema version this package writes and reads; a reader refuses any other.
VERSION = 1
FILE_NAME = "job.json"

PRECISIONS = ("bf16", "fp16", "fp32")
ARCHITECTURES = ("gpt", "llama")
EXPORT_FORMATS = ("hf",)
BYTE_VOCAB = 256

# One default per field (the API's CRD defaults and its resolution use these).
DEFAULT_PRECISION = "bf16"
DEFAULT_ACTIVATION_CHECKPOINT_INTERVAL = 0
DEFAULT_SEED = 1234
DEFAULT_LOG_INTERVAL = 10
DEFAULT_MIN_LR_RATIO = 0.1
DEFAULT_CHECKPOINT_INTERVAL = 0
# Complete checkpoints kept when spec.checkpoint.keep is absent: the newest and two to fall back to.
DEFAULT_CHECKPOINT_KEEP = 3
DEFAULT_ARCHITECTURE = "gpt"
DEFAULT_ROPE_THETA = 10000.0


def default_warmup_steps(steps: int) -> int:
    """spec.training.warmupSteps when unset: a tenth of the run, at least 1 and at most 100."""
    return min(100, max(1, steps // 10))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder-only GPT."""

    layers: int
    hidden_size: int
    attention_heads: int
    sequence_length: int
    vocab_size: int
    ffn_hidden_size: int
    precision: str
    activation_checkpoint_interval: int
    architecture: str = DEFAULT_ARCHITECTURE
    # llama only: key/value heads of grouped-query attention (None: as many as attention heads).
    kv_heads: int | None = None
    rope_theta: float = DEFAULT_ROPE_THETA
    tie_embeddings: bool = False
    # From a pretrained folder's config.json (`hf_config`). activation: gpt's gelu, or GPT-2's tanh gelu_new.
    norm_eps: float = 1e-5
    rope_scaling: RopeScaling | None = None
    activation: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @property
    def query_groups(self) -> int:
        """Key/value heads: kvHeads, or one per attention head."""
        return self.kv_heads or self.attention_heads

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            self.layers,
            self.hidden_size,
            self.sequence_length,
            self.vocab_size,
            self.ffn_hidden_size,
            architecture="llama" if self.architecture == "llama" else "gpt",
            attention_heads=self.attention_heads,
            kv_heads=self.kv_heads,
            tie_embeddings=self.tie_embeddings,
        )


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Length of the run, its seed and its schedule."""

    steps: int
    seed: int
    log_interval: int
    warmup_steps: int
    min_lr_ratio: float
    data: DataConfig
    evaluation: EvalConfig | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan's layout, as every rank must reproduce it: sizes, axis order, nodes and ranks per node."""

    layout: Layout
    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def axis_order(self) -> tuple[str, ...]:
        return self.layout.axis_order

    def to_dict(self) -> dict[str, Any]:
        """The `plan` object of job.json."""
        layout = self.layout
        return {
            "layout": {"pipeline": layout.pipeline, "tensor": layout.tensor, "data": layout.data},
            "axisOrder": list(layout.axis_order),
            "worldSize": layout.world_size,
            "nodes": self.nodes,
            "ranksPerNode": self.ranks_per_node,
        }


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything a rank reads from job.json."""

    name: str
    namespace: str
    model: ModelConfig
    training: TrainingConfig
    checkpoint_interval: int
    deepspeed: Mapping[str, Any]
    plan: Plan
    uid: str | None = None
    checkpoint_keep: int = DEFAULT_CHECKPOINT_KEEP
    # spec.parallelism.sequenceParallel: Megatron-SP inside each tensor-parallel group.
    sequence_parallel: bool = False
    # spec.checkpoint.export: a format the trainer exports the final checkpoint to (None: no export).
    export: str | None = None
    # The planner's step time and peak for this plan (job.json's `modeled`), reported beside the measured ones.
    modeled: Modeled | None = None
    pretrained: Path | None = None  # spec.model.pretrained.path: a Hugging Face folder (None: random weights)

    @property
    def train_batch_size(self) -> int:
        return int(self.deepspeed["train_batch_size"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.deepspeed["train_micro_batch_size_per_gpu"])

    @property
    def gradient_accumulation_steps(self) -> int:
        return int(self.deepspeed["gradient_accumulation_steps"])

    @property
    def zero_stage(self) -> int:
        return int((self.deepspeed.get("zero_optimization") or {}).get("stage", 0))


def make_plan(layout: Layout, ranks_per_node: int) -> Plan:
    """The plan of `layout` on pods of `ranks_per_node` ranks; ContractError unless they divide evenly."""
    if ranks_per_node < 1 or layout.world_size % ranks_per_node:
        raise ContractError(f"plan.ranksPerNode: {ranks_per_node} does not divide worldSize {layout.world_size}")
    return Plan(layout, layout.world_size // ranks_per_node, ranks_per_node)


def job_document(
    *,
    name: str,
    namespace: str,
    spec: Mapping[str, Any],
    deepspeed: Mapping[str, Any],
    plan: Plan,
    uid: str | None = None,
    modeled: Modeled | None = None,
) -> dict[str, Any]:
    """The job.json object: the one writer, for the operator's ConfigMap and the local runner's file. `uid`
    is the ParallelJob's on a cluster (checkpoints record it); a local run has none."""
    return {
        "version": VERSION,
        "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
        "spec": dict(spec),
        "deepspeed": dict(deepspeed),
        "plan": plan.to_dict(),
        **({"modeled": modeled.to_dict()} if modeled else {}),
    }


def load_job_config(path: Path | str) -> JobConfig:
    """Read and validate job.json; raises ContractError with a one-line reason."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ContractError(f"job file {path} does not exist") from error
    except (OSError, json.JSONDecodeError) as error:
        raise ContractError(f"job file {path} is not readable JSON: {error}") from error
    if not isinstance(document, dict):
        raise ContractError(f"job file {path} must hold a JSON object")
    return parse_job_config(document)


def parse_job_config(document: Mapping[str, Any]) -> JobConfig:
    """Turn the job.json object into a validated JobConfig."""
    _check_version(document)
    spec = _section(document, "spec")
    metadata = _optional_section(document, "metadata", "metadata")
    plan = parse_plan(_section(document, "plan"))
    model_section = _section(spec, "model", "spec.model")
    model, pretrained = hf_config.applied(_parse_model(model_section), model_section)
    training = _parse_training(_section(spec, "training", "spec.training"))
    checkpoint = _optional_section(spec, "checkpoint", "spec.checkpoint")
    export = checkpoint.get("export")
    if export is not None and export not in EXPORT_FORMATS:
        raise ContractError(f"spec.checkpoint.export: must be one of {', '.join(EXPORT_FORMATS)}, got {export!r}")
    job = JobConfig(
        name=str(metadata.get("name", "paralleljob")),
        namespace=str(metadata.get("namespace", "default")),
        uid=str(metadata["uid"]) if metadata.get("uid") else None,
        checkpoint_keep=_int(checkpoint, "keep", "spec.checkpoint", default=DEFAULT_CHECKPOINT_KEEP),
        model=model,
        training=training,
        checkpoint_interval=_int(
            checkpoint, "intervalSteps", "spec.checkpoint", default=DEFAULT_CHECKPOINT_INTERVAL, minimum=0
        ),
        deepspeed=dict(_section(document, "deepspeed")),
        plan=plan,
        sequence_parallel=_bool(
            _optional_section(spec, "parallelism", "spec.parallelism"), "sequenceParallel", "spec.parallelism"
        ),
        export=export,
        modeled=parse_modeled(document.get("modeled")),
        pretrained=pretrained,
    )
    _check_layout_fits_model(job)
    check_prepared_folders(training.data, training.evaluation, model.vocab_size, "spec.training")
    _check_architecture(job)
    _check_batch_arithmetic(job)
    return job


def _check_version(document: Mapping[str, Any]) -> None:
    version = document.get("version")
    if version != VERSION:
        found = "missing" if version is None else f"{version!r}"
        raise ContractError(
            f"version: {found}, but this reader reads job file version {VERSION}; "
            "run a trainer image of the operator's release"
        )


def _parse_model(section: Mapping[str, Any]) -> ModelConfig:
    where = "spec.model"
    hidden = _int(section, "hiddenSize", where)
    architecture = _choice(section, "architecture", where, ARCHITECTURES, DEFAULT_ARCHITECTURE)
    rope_theta = section.get("ropeTheta", DEFAULT_ROPE_THETA)
    if isinstance(rope_theta, bool) or not isinstance(rope_theta, int | float) or rope_theta < 1:
        raise ContractError(f"{where}.ropeTheta: must be a number of at least 1, got {rope_theta!r}")
    return ModelConfig(
        layers=_int(section, "layers", where),
        hidden_size=hidden,
        attention_heads=_int(section, "attentionHeads", where),
        sequence_length=_int(section, "sequenceLength", where),
        vocab_size=_int(section, "vocabSize", where),
        ffn_hidden_size=_int(section, "ffnHiddenSize", where, default=default_ffn_hidden_size(hidden, architecture)),
        precision=_choice(section, "precision", where, PRECISIONS, DEFAULT_PRECISION),
        activation_checkpoint_interval=_int(
            section, "activationCheckpointInterval", where, default=DEFAULT_ACTIVATION_CHECKPOINT_INTERVAL, minimum=0
        ),
        architecture=architecture,
        kv_heads=_int(section, "kvHeads", where) if "kvHeads" in section else None,
        rope_theta=float(rope_theta),
        tie_embeddings=_bool(section, "tieEmbeddings", where),
    )


def _parse_training(section: Mapping[str, Any]) -> TrainingConfig:
    where = "spec.training"
    steps = _int(section, "steps", where)
    data = parse_data(_optional_section(section, "data", f"{where}.data"), f"{where}.data")
    min_lr_ratio = section.get("minLrRatio", DEFAULT_MIN_LR_RATIO)
    if isinstance(min_lr_ratio, bool) or not isinstance(min_lr_ratio, int | float) or not 0.0 <= min_lr_ratio <= 1.0:
        raise ContractError(f"{where}.minLrRatio: must be between 0 and 1, got {min_lr_ratio}")
    return TrainingConfig(
        steps=steps,
        seed=_int(section, "seed", where, default=DEFAULT_SEED, minimum=0),
        log_interval=_int(section, "logInterval", where, default=DEFAULT_LOG_INTERVAL),
        warmup_steps=_int(section, "warmupSteps", where, default=default_warmup_steps(steps), minimum=0),
        min_lr_ratio=float(min_lr_ratio),
        data=data,
        evaluation=parse_eval(section.get("eval"), data, f"{where}.eval"),
    )


def parse_plan(section: Mapping[str, Any]) -> Plan:
    """The `plan` object of job.json, validated."""
    layout_section = _section(section, "layout", "plan.layout")
    sizes = {axis: _int(layout_section, axis, "plan.layout") for axis in ("pipeline", "tensor", "data")}
    try:
        order = axis_order_of(section.get("axisOrder") or list(AXES))
    except ContractError as error:
        raise ContractError(f"plan.{error}") from None
    layout = Layout(sizes["pipeline"], sizes["tensor"], sizes["data"], order)
    world_size = _int(section, "worldSize", "plan", default=layout.world_size)
    if world_size != layout.world_size:
        raise ContractError(f"plan.worldSize: {world_size} is not pipeline x tensor x data = {layout.world_size}")
    plan = make_plan(layout, _int(section, "ranksPerNode", "plan", default=world_size))
    nodes = _int(section, "nodes", "plan", default=plan.nodes)
    if nodes != plan.nodes:
        raise ContractError(
            f"plan.nodes: {nodes} nodes x {plan.ranks_per_node} ranks per node is not worldSize {world_size}"
        )
    return plan


def _check_layout_fits_model(job: JobConfig) -> None:
    model, layout = job.model, job.plan.layout
    if not model_math.layers_fill_stages(model.layers, layout.pipeline):
        raise ContractError(
            f"spec.model.layers ({model.layers}) is smaller than parallelism.pipeline ({layout.pipeline}): "
            "every pipeline stage needs at least one layer"
        )
    if not model_math.heads_split(model.attention_heads, layout.tensor):
        raise ContractError(
            f"spec.model.attentionHeads ({model.attention_heads}) is not divisible by parallelism.tensor "
            f"({layout.tensor}): each tensor-parallel rank must hold whole heads"
        )
    if not model_math.hidden_per_head(model.hidden_size, model.attention_heads):
        raise ContractError(
            f"spec.model.hiddenSize ({model.hidden_size}) is not divisible by attentionHeads ({model.attention_heads})"
        )
    if not model_math.ffn_split(model.ffn_hidden_size, layout.tensor):
        raise ContractError(
            f"spec.model.ffnHiddenSize ({model.ffn_hidden_size}) is not divisible by parallelism.tensor "
            f"({layout.tensor})"
        )
    if job.training.data.source == "text" and model.vocab_size < BYTE_VOCAB:
        raise ContractError(
            f"spec.model.vocabSize ({model.vocab_size}) is below {BYTE_VOCAB}: text data is read as bytes"
        )


def _check_batch_arithmetic(job: JobConfig) -> None:
    ds = job.deepspeed
    missing = [
        key
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        if key not in ds
    ]
    if missing:
        raise ContractError(f"deepspeed: {', '.join(missing)} missing; the job file must resolve all three")
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        _int(ds, key, "deepspeed")
    product = job.micro_batch_size * job.gradient_accumulation_steps * job.plan.layout.data
    if product != job.train_batch_size:
        raise ContractError(
            f"deepspeed.train_batch_size ({job.train_batch_size}) != micro batch {job.micro_batch_size} x "
            f"gradient accumulation {job.gradient_accumulation_steps} x data parallel {job.plan.layout.data}"
        )


def _check_architecture(job: JobConfig) -> None:
    """The llama fields (kvHeads, ropeTheta) and sequence parallelism against the model and the layout."""
    model, tensor, where = job.model, job.plan.layout.tensor, "spec.model"
    if model.architecture != "llama" and model.kv_heads is not None:
        raise ContractError(f"{where}.kvHeads: grouped-query attention needs architecture llama")
    if model.architecture != "llama" and model.tie_embeddings:
        raise ContractError(f"{where}.tieEmbeddings: tied embeddings need architecture llama")
    kv = model.query_groups
    if model.attention_heads % kv:
        raise ContractError(
            f"{where}.kvHeads ({kv}) does not divide attentionHeads ({model.attention_heads}): each key/value "
            "head serves a whole group of query heads"
        )
    if kv % tensor and tensor % kv:
        raise ContractError(
            f"{where}.kvHeads ({kv}) and parallelism.tensor ({tensor}) must divide one another: each tensor-parallel "
            "rank holds whole key/value groups, or all of them when tensor > kvHeads"
        )
    if model.architecture == "llama" and model.head_dim % 2:
        raise ContractError(
            f"{where}.hiddenSize / attentionHeads ({model.head_dim}) must be even: rotary embeddings rotate pairs"
        )
    if job.sequence_parallel and (tensor == 1 or model.sequence_length % tensor):
        raise ContractError(
            f"spec.parallelism.sequenceParallel needs parallelism.tensor > 1 dividing model.sequenceLength "
            f"({model.sequence_length}); tensor is {tensor}"
        )
