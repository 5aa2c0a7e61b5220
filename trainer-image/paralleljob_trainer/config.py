"""The job file (`job.json`, see docs/architecture.md) read into typed, validated trainer settings.

This module owns every rule the trainer checks before it touches a process group: a bad config is found here,
on every rank independently, so each rank can exit with the same one-line message and nobody waits for a
peer. It deliberately does not import the `paralleljob` operator package: the trainer image ships without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

AXES = ("pipe", "data", "model")
DATA_SOURCES = ("synthetic", "text", "tokens")
TOKEN_DTYPES = ("uint16", "uint32")
PRECISIONS = ("bf16", "fp16", "fp32")
BYTE_VOCAB = 256


class ConfigError(ValueError):
    """The job file asks for something the trainer cannot run; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Sizes of the three parallel axes."""

    pipeline: int
    tensor: int
    data: int

    @property
    def world_size(self) -> int:
        return self.pipeline * self.tensor * self.data

    @property
    def name(self) -> str:
        return f"PP{self.pipeline}xTP{self.tensor}xDP{self.data}"

    def size_of(self, axis: str) -> int:
        return {"pipe": self.pipeline, "data": self.data, "model": self.tensor}[axis]


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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where training tokens come from."""

    source: str
    path: Path | None
    token_dtype: str


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Length of the run, its seed and its schedule."""

    steps: int
    seed: int
    log_interval: int
    warmup_steps: int
    min_lr_ratio: float
    data: DataConfig


@dataclasses.dataclass(frozen=True)
class PlanRank:
    """One rank of the plan and the (pipe, data, model) coordinates the planner gave it."""

    rank: int
    node_rank: int
    coords: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The planner's rank layout, as the trainer must reproduce it."""

    layout: Layout
    world_size: int
    ranks_per_node: int
    axis_order: tuple[str, ...]
    ranks: tuple[PlanRank, ...]


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything the trainer reads from job.json."""

    name: str
    namespace: str
    model: ModelConfig
    training: TrainingConfig
    checkpoint_interval: int
    deepspeed: Mapping[str, Any]
    plan: Plan

    @property
    def train_batch_size(self) -> int:
        return int(self.deepspeed["train_batch_size"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.deepspeed["train_micro_batch_size_per_gpu"])

    @property
    def gradient_accumulation_steps(self) -> int:
        return int(self.deepspeed["gradient_accumulation_steps"])


def load_job_config(path: Path) -> JobConfig:
    """Read and validate job.json; raises ConfigError with a one-line reason."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ConfigError(f"job file {path} does not exist") from error
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"job file {path} is not readable JSON: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"job file {path} must hold a JSON object")
    return parse_job_config(document)


def parse_job_config(document: Mapping[str, Any]) -> JobConfig:
    """Turn the job.json object into a validated JobConfig."""
    spec = _section(document, "spec")
    metadata = document.get("metadata") or {}
    plan = _parse_plan(_section(document, "plan"))
    model = _parse_model(_section(spec, "model", "spec.model"))
    training = _parse_training(_section(spec, "training", "spec.training"))
    checkpoint = spec.get("checkpoint") or {}
    job = JobConfig(
        name=str(metadata.get("name", "paralleljob")),
        namespace=str(metadata.get("namespace", "default")),
        model=model,
        training=training,
        checkpoint_interval=_int(checkpoint, "intervalSteps", "spec.checkpoint", default=0, minimum=0),
        deepspeed=dict(_section(document, "deepspeed")),
        plan=plan,
    )
    _check_layout_fits_model(job)
    _check_batch_arithmetic(job)
    return job


def _section(parent: Mapping[str, Any], key: str, where: str | None = None) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where or key}: missing or not an object in the job file")
    return value


def _int(section: Mapping[str, Any], key: str, where: str, *, default: int | None = None, minimum: int = 1) -> int:
    value = section.get(key, default)
    if value is None:
        raise ConfigError(f"{where}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}.{key}: must be at least {minimum}, got {value}")
    return value


def _choice(section: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    value = section.get(key, default)
    if value not in choices:
        raise ConfigError(f"{where}.{key}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _parse_model(section: Mapping[str, Any]) -> ModelConfig:
    where = "spec.model"
    hidden = _int(section, "hiddenSize", where)
    return ModelConfig(
        layers=_int(section, "layers", where),
        hidden_size=hidden,
        attention_heads=_int(section, "attentionHeads", where),
        sequence_length=_int(section, "sequenceLength", where),
        vocab_size=_int(section, "vocabSize", where),
        ffn_hidden_size=_int(section, "ffnHiddenSize", where, default=4 * hidden),
        precision=_choice(section, "precision", where, PRECISIONS, "bf16"),
        activation_checkpoint_interval=_int(section, "activationCheckpointInterval", where, default=0, minimum=0),
    )


def _parse_training(section: Mapping[str, Any]) -> TrainingConfig:
    where = "spec.training"
    steps = _int(section, "steps", where)
    data_section = section.get("data") or {}
    source = _choice(data_section, "source", f"{where}.data", DATA_SOURCES, "synthetic")
    raw_path = data_section.get("path")
    if source != "synthetic" and not raw_path:
        raise ConfigError(f"{where}.data.path: required when source is {source}")
    path = Path(os.path.expanduser(str(raw_path))) if raw_path else None
    if path is not None and source != "synthetic" and not path.exists():
        raise ConfigError(f"{where}.data.path: {path} does not exist")
    min_lr_ratio = float(section.get("minLrRatio", 0.1))
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ConfigError(f"{where}.minLrRatio: must be between 0 and 1, got {min_lr_ratio}")
    return TrainingConfig(
        steps=steps,
        seed=_int(section, "seed", where, default=1234, minimum=0),
        log_interval=_int(section, "logInterval", where, default=10),
        warmup_steps=_int(section, "warmupSteps", where, default=min(100, max(1, steps // 10)), minimum=0),
        min_lr_ratio=min_lr_ratio,
        data=DataConfig(
            source=source,
            path=path,
            token_dtype=_choice(data_section, "tokenDtype", f"{where}.data", TOKEN_DTYPES, "uint16"),
        ),
    )


def _parse_plan(section: Mapping[str, Any]) -> Plan:
    layout_section = _section(section, "layout", "plan.layout")
    layout = Layout(
        pipeline=_int(layout_section, "pipeline", "plan.layout"),
        tensor=_int(layout_section, "tensor", "plan.layout"),
        data=_int(layout_section, "data", "plan.layout"),
    )
    axis_order = tuple(section.get("axisOrder") or AXES)
    if sorted(axis_order) != sorted(AXES):
        raise ConfigError(f"plan.axisOrder: must order exactly {', '.join(AXES)}, got {list(axis_order)}")
    world_size = _int(section, "worldSize", "plan", default=layout.world_size)
    if world_size != layout.world_size:
        raise ConfigError(f"plan.worldSize: {world_size} is not pipeline x tensor x data = {layout.world_size}")
    ranks_per_node = _int(section, "ranksPerNode", "plan", default=world_size)
    if world_size % ranks_per_node:
        raise ConfigError(f"plan.ranksPerNode: {ranks_per_node} does not divide worldSize {world_size}")
    return Plan(
        layout=layout,
        world_size=world_size,
        ranks_per_node=ranks_per_node,
        axis_order=axis_order,
        ranks=_parse_plan_ranks(section),
    )


def _parse_plan_ranks(section: Mapping[str, Any]) -> tuple[PlanRank, ...]:
    ranks: list[PlanRank] = []
    for node in section.get("nodes") or []:
        node_ranks, coords = node.get("ranks") or [], node.get("coords") or []
        if len(node_ranks) != len(coords):
            raise ConfigError(f"plan.nodes[{node.get('nodeRank')}]: ranks and coords differ in length")
        for rank, coord in zip(node_ranks, coords, strict=True):
            ranks.append(PlanRank(rank=int(rank), node_rank=int(node.get("nodeRank", 0)), coords=coord))
    return tuple(sorted(ranks, key=lambda r: r.rank))


def _check_layout_fits_model(job: JobConfig) -> None:
    model, layout = job.model, job.plan.layout
    if model.layers < layout.pipeline:
        raise ConfigError(
            f"spec.model.layers ({model.layers}) is smaller than parallelism.pipeline ({layout.pipeline}): "
            "every pipeline stage needs at least one layer"
        )
    if model.attention_heads % layout.tensor:
        raise ConfigError(
            f"spec.model.attentionHeads ({model.attention_heads}) is not divisible by parallelism.tensor "
            f"({layout.tensor}): each tensor-parallel rank must hold whole heads"
        )
    if model.hidden_size % model.attention_heads:
        raise ConfigError(
            f"spec.model.hiddenSize ({model.hidden_size}) is not divisible by attentionHeads ({model.attention_heads})"
        )
    if model.ffn_hidden_size % layout.tensor:
        raise ConfigError(
            f"spec.model.ffnHiddenSize ({model.ffn_hidden_size}) is not divisible by parallelism.tensor "
            f"({layout.tensor})"
        )
    if job.training.data.source == "text" and model.vocab_size < BYTE_VOCAB:
        raise ConfigError(
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
        raise ConfigError(f"deepspeed: {', '.join(missing)} missing; the job file must resolve all three")
    product = job.micro_batch_size * job.gradient_accumulation_steps * job.plan.layout.data
    if product != job.train_batch_size:
        raise ConfigError(
            f"deepspeed.train_batch_size ({job.train_batch_size}) != micro batch {job.micro_batch_size} x "
            f"gradient accumulation {job.gradient_accumulation_steps} x data parallel {job.plan.layout.data}"
        )


def parameter_count(model: ModelConfig) -> int:
    """Parameters of the full (unsharded) model: embeddings, blocks, final LN and the untied LM head."""
    h, f = model.hidden_size, model.ffn_hidden_size
    per_block = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    embeddings = (model.vocab_size + model.sequence_length) * h
    return embeddings + model.layers * per_block + 2 * h + model.vocab_size * h


def flops_per_step(model: ModelConfig, tokens: int) -> float:
    """Model FLOPs of one training step over `tokens` tokens (forward + backward, no recomputation).

    Per token and block the forward pass does 2 FLOPs per weight of its matmuls, 2 (4h^2 + 2hf), and 4sh in
    attention (QK^T and AV): 8h^2 + 4hf + 4sh. Backward costs twice the forward, hence the 3. The LM head
    adds 2hV forward, 6hV in all: about 6 FLOPs per parameter and token, plus attention. With f = 4h this is Narayanan et al.'s (SC21)
    72 B s l h^2 (1 + s/6h), plus 6 B s h V for the logits. Activation recomputation is hardware work, not
    model work, so it is deliberately not counted: MFU compares model FLOPs with the peak.
    """
    h, f, s, layers, v = (
        model.hidden_size,
        model.ffn_hidden_size,
        model.sequence_length,
        model.layers,
        model.vocab_size,
    )
    return 3 * tokens * layers * (8 * h * h + 4 * h * f + 4 * s * h) + 6 * tokens * h * v
