"""Estimates of a 3D-parallel job from its model shape and batch: parameters, memory per GPU, communication
bytes per step, FLOPs per step, pipeline bubble, modeled step time and MFU.

These are models, not measurements. The formulas are the public ones in docs/planning.md (Megatron-LM,
Narayanan et al. 2021; ZeRO, Rajbhandari et al. 2019; Korthikanti et al. 2022); the model's own arithmetic
(parameters, FLOPs, parameters per stage) is the contract's (`paralleljob_contract.model`), which the
trainer's MFU uses too. The planner calls
`Workload.from_job()` and `estimate()`; the cost model prices the bytes from `comm_bytes()`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paralleljob.api import rules
from paralleljob.api.validation import ResolvedJob
from paralleljob_contract import model as model_math
from paralleljob_contract.layout import Layout
from paralleljob_contract.model import Architecture, ModelShape, Stage, padded_vocab_size

GIB = 1024**3
# CUDA context, NCCL buffers, allocator fragmentation: memory a GPU never has for the model.
RUNTIME_RESERVE_BYTES = 2 * GIB


@dataclasses.dataclass(frozen=True)
class Workload:
    """The numbers of a job that the formulas read (l, h, a, s, V, b, m, B, p, t, d, ZeRO)."""

    layers: int
    hidden: int
    heads: int
    sequence: int
    vocab: int
    ffn: int
    micro_batch: int
    micro_batches: int  # gradient accumulation steps: micro-batches per step through the pipeline
    layout: Layout  # the contract's pipeline x tensor x data sizes
    zero_stage: int = 0
    offload_optimizer: bool = False
    precision: str = "bf16"
    recompute: bool = False
    architecture: Architecture = "gpt"
    kv_heads: int | None = None
    tie_embeddings: bool = False
    sequence_parallel: bool = False

    @classmethod
    def from_job(cls, job: ResolvedJob) -> Workload:
        model, ds = job.spec.model, job.spec.deepspeed or {}
        zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
        return cls(
            layers=model.layers,
            hidden=model.hidden_size,
            heads=model.attention_heads,
            sequence=model.sequence_length,
            vocab=model.vocab_size,
            ffn=job.ffn_hidden_size,
            micro_batch=job.batch.micro_batch,
            micro_batches=job.batch.gradient_accumulation_steps,
            layout=Layout(job.pipeline, job.tensor, job.data),
            zero_stage=rules.zero_stage(job.spec),
            offload_optimizer=_offloads(zero),
            precision=model.precision,
            recompute=model.activation_checkpoint_interval > 0,
            architecture=model.architecture,
            kv_heads=model.kv_heads,
            tie_embeddings=model.tie_embeddings,
            sequence_parallel=bool(job.spec.parallelism.sequence_parallel),
        )

    @property
    def pipeline(self) -> int:
        return self.layout.pipeline

    @property
    def tensor(self) -> int:
        return self.layout.tensor

    @property
    def data(self) -> int:
        return self.layout.data

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def with_sizes(self, pipeline: int, tensor: int, data: int) -> Workload:
        """The same workload at other pipeline x tensor x data sizes."""
        return dataclasses.replace(self, layout=Layout(pipeline, tensor, data))

    @property
    def train_batch(self) -> int:
        return self.micro_batch * self.micro_batches * self.data

    @property
    def element_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            self.layers,
            self.hidden,
            self.sequence,
            self.vocab,
            self.ffn,
            architecture=self.architecture,
            attention_heads=self.heads,
            kv_heads=self.kv_heads,
            tie_embeddings=self.tie_embeddings,
        )

    @property
    def parameters(self) -> int:
        """P of the bundled trainer's model (`paralleljob_contract.model.parameter_count`)."""
        return model_math.parameter_count(self.shape)

    @property
    def parameters_per_gpu(self) -> float:
        """Psi: the parameters one GPU of the fuller end stage holds before ZeRO sharding."""
        return max(stage_parameters(self, stage) for stage in end_stages(self))

    @property
    def layers_per_stage(self) -> int:
        return model_math.layers_per_stage(self.layers, self.pipeline)


def end_stages(work: Workload) -> tuple[Stage, ...]:
    """The pipeline stages whose memory bounds the job: the first and the last (one stage when p = 1)."""
    return model_math.end_stages(work.pipeline)


def stage_parameters(work: Workload, stage: Stage) -> float:
    """Parameters one GPU of `stage` holds before ZeRO sharding (`paralleljob_contract.model`)."""
    return model_math.stage_parameters(work.shape, work.pipeline, work.tensor, stage)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per GPU on one pipeline stage: `stage` is first, last, or only (when p = 1)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    stage: Stage = "only"
    reserve: float = RUNTIME_RESERVE_BYTES

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.reserve


@dataclasses.dataclass(frozen=True)
class CommBytes:
    """Bytes one GPU sends per training step in each kind of group."""

    tensor: float
    pipeline: float
    data: float


def memory_per_gpu(work: Workload) -> Memory:
    """The fuller of the first and the last stage (`Memory.stage` says which); ties go to the first."""
    return max((stage_memory(work, stage) for stage in end_stages(work)), key=lambda memory: memory.total)


def stage_memory(work: Workload, stage: Stage) -> Memory:
    """Model states by ZeRO stage (16 bytes/param mixed precision) plus the stage's 1F1B activations."""
    psi, nd, e = stage_parameters(work, stage), work.data, work.element_bytes
    optimizer_bytes = 12 if e == 2 else 8  # fp32 master + Adam moments, or just the moments in fp32
    weights = e * psi / (nd if work.zero_stage >= 3 else 1)
    gradients = e * psi / (nd if work.zero_stage >= 2 else 1)
    optimizer = 0.0 if work.offload_optimizer else optimizer_bytes * psi / (nd if work.zero_stage >= 1 else 1)
    return Memory(weights, gradients, optimizer, activation_bytes(work, stage), stage)


def activation_bytes(work: Workload, stage: Stage = "first") -> float:
    """Korthikanti et al.: per layer sbh(10 + 24/t) with TP for GPT, without their 5as/ht term for the
    attention scores; 2sbh when only layer inputs are kept. Sequence parallelism splits the 10sbh that TP
    leaves whole (norm and dropout inputs) and the kept inputs over the t ranks too.

    Llama's block, counted the same way in 16-bit bytes: the two RMSNorm inputs and the two matmul inputs
    they feed (8sbh, whole on every TP rank), then split over TP: Q, K and V (2sb(h + 2 kv_hidden)), the
    attention output (2sbh) and the SwiGLU's gate, up, silu(gate) and product (8sb ffn).

    The trainer's attention is PyTorch's scaled_dot_product_attention, which on GPUs runs FlashAttention or
    the memory-efficient kernel: the a*s^2 scores are recomputed in the backward pass, never stored (at
    s = 8192 they would be four times the rest of the layer). Under 1F1B the first stage holds min(p, m)
    micro-batches in flight, the last one; the last stage also keeps the fp32 logits that cross-entropy saves
    for backward (4sbV/t bytes: the head and loss are vocab-parallel).
    """
    s, b, h, t = work.sequence, work.micro_batch, work.hidden, work.tensor
    scale = work.element_bytes / 2  # the published figures assume 16-bit activations
    if work.architecture == "llama":
        whole, split = 8 * h, 4 * h + 4 * work.shape.kv_hidden + 8 * work.ffn
    else:
        whole, split = 10 * h, 24 * h
    shards = t if work.sequence_parallel else 1
    full_layer = s * b * (whole / shards + split / t) * scale
    in_flight = min(work.pipeline, work.micro_batches) if stage == "first" else 1
    # The fp32 logits cross-entropy keeps: b x s x V/t on each rank (vocab-parallel, padded vocabulary).
    logits = 4 * s * b * padded_vocab_size(work.vocab, t) / t if stage in ("last", "only") else 0.0
    if work.recompute:
        # Each kept input is 2sbh; one layer's full activations exist while it is recomputed.
        return 2 * s * b * h / shards * scale * work.layers_per_stage * in_flight + full_layer + logits
    return full_layer * work.layers_per_stage * in_flight + logits


def comm_bytes(work: Workload) -> CommBytes:
    """Per-GPU bytes per step: TP all-reduces, PP activations and gradients, DP gradient all-reduce."""
    s, b, h, t, e = work.sequence, work.micro_batch, work.hidden, work.tensor, work.element_bytes
    m = work.micro_batches
    # Two all-reduces forward and two backward per layer; full recomputation repeats the forward two.
    all_reduces = 6 if work.recompute else 4
    tensor = work.layers_per_stage * m * all_reduces * 2 * (t - 1) / t * b * s * h * e
    pipeline = 2 * m * b * s * h / t * e if work.pipeline > 1 else 0.0
    nd = work.data
    data = 2 * (nd - 1) / nd * work.parameters_per_gpu * e
    return CommBytes(tensor, pipeline, data)


def flops_per_step(work: Workload) -> float:
    """Hardware FLOPs per step: what the GPUs execute, with the recomputed forward when recomputing (k = 4)."""
    return _flops(work, work.recompute)


def model_flops_per_step(work: Workload) -> float:
    """Model FLOPs per step (k = 3, no recomputation counted): the numerator of MFU."""
    return _flops(work, False)


def _flops(work: Workload, recompute: bool) -> float:
    return model_math.training_flops(work.shape, work.train_batch * work.sequence, recompute)


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Modeled seconds of one training step, by what they are spent on (docs/planning.md, Estimates)."""

    compute: float  # matmuls at kernel efficiency, spread over the GPUs
    tensor: float  # TP all-reduces of the slowest group, inside the pipeline's time slots
    pipeline: float  # activations and gradients between neighbouring stages
    bubble: float  # 1F1B idle slots: (p-1)/m of the compute and in-pipeline communication
    data: float  # the gradient all-reduce after the last micro-batch

    @property
    def total(self) -> float:
        return self.compute + self.tensor + self.pipeline + self.bubble + self.data


def step_time(
    work: Workload, peak_flops: float, kernel_efficiency: float, tensor: float, pipeline: float, data: float
) -> StepTime:
    """(slowest stage's FLOPs/(TP * peak * efficiency) + TP + PP) * (m+p-1)/m + DP, split by where it goes.

    A pipeline moves at the pace of its slowest stage (`slowest_stage_flops`); with p = 1 this is the
    hardware FLOPs / (world * peak * efficiency). `tensor`, `pipeline` and `data` are the modeled
    communication seconds of the slowest group of each kind.
    """
    compute = slowest_stage_flops(work) / (work.tensor * peak_flops * kernel_efficiency)
    in_pipeline = compute + tensor + pipeline
    bubble = in_pipeline * (work.pipeline - 1) / work.micro_batches  # 1F1B: m + p - 1 slots for m
    return StepTime(compute, tensor, pipeline, bubble, data)


def slowest_stage_flops(work: Workload) -> float:
    """Hardware FLOPs per step of one data-parallel replica's slowest pipeline stage: ceil(l/p) blocks, plus
    the LM head on the last stage (6hV per token, never recomputed), the end that also holds the logits.

    DeepSpeed gives the stages an even share of blocks and the head to the last, so the last stage works
    longest and every other stage waits for it each micro-batch: for a 24-layer, 51,200-token GPT over 2
    stages that is 11% more than an even split of the FLOPs.
    """
    # The contract's training FLOPs of a model with the stage's blocks: they include the head term once.
    stage = dataclasses.replace(work.shape, layers=work.layers_per_stage)
    tokens = work.micro_batch * work.micro_batches * work.sequence
    return model_math.training_flops(stage, tokens, work.recompute)


def bubble_fraction(work: Workload) -> float:
    """Share of a 1F1B step the pipeline idles: (p-1)/(m+p-1)."""
    p, m = work.pipeline, work.micro_batches
    return (p - 1) / (m + p - 1)


def _offloads(zero: Any) -> bool:
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    return isinstance(offload, dict) and offload.get("device", "none") not in ("none", None)
