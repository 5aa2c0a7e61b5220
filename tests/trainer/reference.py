"""A single-process, plain-PyTorch GPT: the yardstick the parallel trainer's losses are compared against.

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
from paralleljob_trainer import data, weights
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


@dataclasses.dataclass(frozen=True)
class ReferenceStep:
    loss: float
    grad_norm: float
    lr: float


def _optimizer(job: JobConfig, model: nn.Module) -> torch.optim.Optimizer:
    section = job.deepspeed["optimizer"]
    params = {key: value for key, value in section["params"].items() if key != "torch_adam"}
    if section["type"].lower() == "sgd":
        return torch.optim.SGD(model.parameters(), **params)
    params["betas"] = tuple(params.get("betas", (0.9, 0.999)))
    return torch.optim.AdamW(model.parameters(), **params)


def train_reference(job: JobConfig) -> dict[int, ReferenceStep]:
    """Train the job's model in one process on whole global batches; per step its loss, grad norm and lr."""
    torch.use_deterministic_algorithms(True)
    model = ReferenceGPT(job.model, job.training.seed)
    optimizer = _optimizer(job, model)
    training = job.training
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, training.warmup_steps, training.steps, training.min_lr_ratio)
    )
    stream = data.open_stream(training.data, job.model.vocab_size, job.model.sequence_length, training.seed)
    clip = float(job.deepspeed["gradient_clipping"])
    steps: dict[int, ReferenceStep] = {}
    for step in range(1, training.steps + 1):
        inputs, labels = stream.global_batch(step, slice(None), job.train_batch_size)
        logits = model(inputs)
        loss = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        schedule.step()
        steps[step] = ReferenceStep(loss=loss.item(), grad_norm=float(norm), lr=float(lr))
    return steps
