"""A single-process, plain-PyTorch GPT and Llama: the yardsticks the parallel trainer's losses are compared against.

It shares with the trainer only what defines the experiment (the seeded initial weights, the global batches,
the LR formula); the model, the loss over the whole global batch, the gradient clipping and the optimizer
step are written here independently of DeepSpeed, tensor parallelism and pipelining.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional

from paralleljob_contract.jobfile import JobConfig, ModelConfig
from paralleljob_trainer import data, evaluation, weights
from paralleljob_trainer.optimization import warmup_cosine


class Block(nn.Module):
    def __init__(self, model: ModelConfig, seed: int, layer: int) -> None:
        super().__init__()
        h, f = model.hidden_size, model.ffn_hidden_size
        out_std = weights.residual_std(model.layers)
        self.heads = model.attention_heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv = _linear(weights.normal(seed, layer, "qkv", (3 * h, h)), bias=True)
        self.attn_out = _linear(weights.normal(seed, layer, "attn_out", (h, h), out_std), bias=True)
        self.mlp_up = _linear(weights.normal(seed, layer, "mlp_up", (f, h)), bias=True)
        self.mlp_down = _linear(weights.normal(seed, layer, "mlp_down", (h, f), out_std), bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        context = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(context.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_down(functional.gelu(self.mlp_up(self.ln2(x))))


def _linear(weight: torch.Tensor, bias: bool) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias:
            layer.bias.zero_()
    return layer


class ReferenceGPT(nn.Module):
    def __init__(self, model: ModelConfig, seed: int) -> None:
        super().__init__()
        h, v, s = model.hidden_size, model.vocab_size, model.sequence_length
        self.tokens = nn.Embedding(v, h)
        self.positions = nn.Embedding(s, h)
        with torch.no_grad():
            self.tokens.weight.copy_(weights.normal(seed, 0, "tokens", (v, h)))
            self.positions.weight.copy_(weights.normal(seed, 0, "positions", (s, h)))
        self.blocks = nn.ModuleList(Block(model, seed, layer) for layer in range(1, model.layers + 1))
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = _linear(weights.normal(seed, model.layers + 1, "lm_head", (v, h)), bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [b, s, heads, d]: pair i with i + d/2 and rotate the pair by position x theta^(-2i/d)."""
    seq, half = x.shape[1], x.shape[-1] // 2
    frequencies = torch.tensor([theta ** (-2 * i / x.shape[-1]) for i in range(half)], dtype=torch.float32)
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * frequencies[None, :]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class LlamaReferenceBlock(nn.Module):
    def __init__(self, model: ModelConfig, seed: int, layer: int) -> None:
        super().__init__()
        h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_dim
        heads, groups = model.attention_heads, model.query_groups
        out_std = weights.residual_std(model.layers)
        self.heads, self.groups, self.head_dim, self.theta = heads, groups, d, model.rope_theta
        self.norm1, self.norm2 = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
        self.q = _linear(weights.normal(seed, layer, "q", (heads * d, h)), bias=False)
        self.k = _linear(weights.normal(seed, layer, "k", (groups * d, h)), bias=False)
        self.v = _linear(weights.normal(seed, layer, "v", (groups * d, h)), bias=False)
        self.o = _linear(weights.normal(seed, layer, "o", (h, h), out_std), bias=False)
        self.gate = _linear(weights.normal(seed, layer, "gate", (f, h)), bias=False)
        self.up = _linear(weights.normal(seed, layer, "up", (f, h)), bias=False)
        self.down = _linear(weights.normal(seed, layer, "down", (h, f), out_std), bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        n = _rms(x, self.norm1)
        q = _rotate(self.q(n).view(b, s, self.heads, self.head_dim), self.theta)
        k = _rotate(self.k(n).view(b, s, self.groups, self.head_dim), self.theta)
        v = self.v(n).view(b, s, self.groups, self.head_dim)
        # Query head i reads key/value head i // (heads / groups).
        k, v = (t.repeat_interleave(self.heads // self.groups, dim=2) for t in (k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.head_dim**0.5
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        context = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, s, h)
        x = x + self.o(context)
        n = _rms(x, self.norm2)
        return x + self.down(functional.silu(self.gate(n)) * self.up(n))


class ReferenceLlama(nn.Module):
    def __init__(self, model: ModelConfig, seed: int) -> None:
        super().__init__()
        h, v = model.hidden_size, model.vocab_size
        self.tokens = nn.Parameter(weights.normal(seed, 0, "tokens", (v, h)))
        self.blocks = nn.ModuleList(LlamaReferenceBlock(model, seed, layer) for layer in range(1, model.layers + 1))
        self.norm = nn.Parameter(torch.ones(h))
        self.lm_head = (
            None if model.tie_embeddings else nn.Parameter(weights.normal(seed, model.layers + 1, "lm_head", (v, h)))
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens[tokens]
        for block in self.blocks:
            x = block(x)
        head = self.tokens if self.lm_head is None else self.lm_head
        return _rms(x, self.norm) @ head.T


def reference_model(model: ModelConfig, seed: int) -> nn.Module:
    return ReferenceLlama(model, seed) if model.architecture == "llama" else ReferenceGPT(model, seed)


@dataclasses.dataclass(frozen=True)
class ReferenceStep:
    loss: float
    grad_norm: float
    lr: float
    # The held-out loss after this step's update, on the steps spec.training.eval evaluates.
    validation_loss: float | None = None


def _optimizer(job: JobConfig, model: nn.Module) -> torch.optim.Optimizer:
    section = job.deepspeed["optimizer"]
    params = {key: value for key, value in section["params"].items() if key != "torch_adam"}
    if section["type"].lower() == "sgd":
        return torch.optim.SGD(model.parameters(), **params)
    params["betas"] = tuple(params.get("betas", (0.9, 0.999)))
    return torch.optim.AdamW(model.parameters(), **params)


def _schedule(job: JobConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    training = job.training
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, training.warmup_steps, training.steps, training.min_lr_ratio)
    )


def train_reference(job: JobConfig, *, faulty_resume: tuple[int, str] | None = None) -> dict[int, ReferenceStep]:
    """Train the job's model in one process on whole global batches; per step its loss, grad norm and lr.

    `faulty_resume` (step, what) plays a resume after `step` that loses `what`: "optimizer" (fresh AdamW
    moments and step, the schedule kept) or "data" (the batches start again from the first)."""
    torch.use_deterministic_algorithms(True)
    model = reference_model(job.model, job.training.seed)
    optimizer = _optimizer(job, model)
    training = job.training
    schedule = _schedule(job, optimizer)
    held_out = training.evaluation.held_out_fraction if training.evaluation else 0.0
    stream = data.open_stream(training.data, job.model.vocab_size, job.model.sequence_length, training.seed, held_out)
    eval_stream = data.open_eval_stream(training, job.model.vocab_size, job.model.sequence_length)
    clip = float(job.deepspeed["gradient_clipping"])
    steps: dict[int, ReferenceStep] = {}
    resumed_at, lost = faulty_resume or (training.steps + 1, "")
    for step in range(1, training.steps + 1):
        if step == resumed_at + 1 and lost == "optimizer":
            optimizer = _optimizer(job, model)
            schedule = _schedule(job, optimizer)
            for _ in range(resumed_at):
                optimizer.step()  # no gradients: only the schedule advances
                schedule.step()
        batch = step - resumed_at if step > resumed_at and lost == "data" else step
        inputs, labels = stream.global_batch(batch, slice(None), job.train_batch_size)
        logits = model(inputs)
        loss = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        schedule.step()
        validation = _validation_loss(job, model, eval_stream) if evaluation.is_evaluation_step(job, step) else None
        steps[step] = ReferenceStep(loss.item(), float(norm), float(lr), validation)
    return steps


def _validation_loss(job: JobConfig, model: nn.Module, stream: data.TokenStream | None) -> float:
    """The mean loss over the evaluation's whole global batches, without gradients."""
    assert stream is not None and job.training.evaluation is not None
    losses = []
    with torch.no_grad():
        for index in range(job.training.evaluation.batches):
            inputs, labels = stream.global_batch(index, slice(None), job.train_batch_size)
            logits = model(inputs)
            losses.append(functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).item())
    return sum(losses) / len(losses)
