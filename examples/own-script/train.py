"""Your own DeepSpeed pipeline script under paralleljob: no bundled trainer, just the contract.

paralleljob starts this file once per GPU under torchrun (spec.command). Everything it needs to know about
its place in the job comes from the `paralleljob_contract` package (docs/contract.md): the job file
(layout, model shape, resolved DeepSpeed batch config, steps) and the environment (node rank, job file path,
output folder, process-group timeout). It builds DeepSpeed's PipelineModule over the plan's topology and
trains a small next-token model on a sequence that is easy to learn, so the loss visibly falls.

Rank 0 appends `{"event": "step", "step", "loss"}` lines to $PARALLELJOB_OUTPUT_DIR/metrics.jsonl, which is
what `paralleljob run` and the operator's progress show; every rank writes `rank-<R>.json` with the ranks and
groups it sees, so you (and the test) can check them against the plan.

Run it here:  paralleljob run examples/own-script/job.yaml   (from the repository root)
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import ProcessTopology
from torch import nn

from paralleljob_contract import ContractError, Launch, PodEnvironment, load_job_config


class Embed(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids)


class Block(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def batches(vocab: int, sequence: int, micro: int, seed: int):  # type: ignore[no-untyped-def]
    """Counting sequences (x, x+1, ...) mod vocab from random starts: the next token is always learnable."""
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(sequence + 1)
    while True:
        starts = torch.randint(0, vocab, (micro, 1), generator=generator)
        ids = (starts + steps) % vocab
        yield ids[:, :-1], ids[:, 1:]


def main() -> int:
    try:
        env = PodEnvironment.from_environ(os.environ)
        launch = Launch.from_environ(os.environ)
        job = load_job_config(env.config_path)
    except ContractError as error:
        print(f"own-script: {error}", file=sys.stderr)
        return 2
    layout, model = job.plan.layout, job.model
    if layout.tensor != 1:
        print("own-script: this example has no tensor parallelism; set spec.parallelism.tensor: 1", file=sys.stderr)
        return 2
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(
        dist_backend=backend, timeout=datetime.timedelta(seconds=env.process_group_timeout_seconds)
    )
    # DeepSpeed's own topology, in the plan's axis order: the same ranks, coordinates and groups as the plan.
    order = list(layout.axis_order)
    topology = ProcessTopology(axes=order, dims=[layout.size_of(axis) for axis in order])
    torch.manual_seed(job.training.seed)
    specs = [
        LayerSpec(Embed, model.vocab_size, model.hidden_size),
        *[LayerSpec(Block, model.hidden_size, model.ffn_hidden_size) for _ in range(model.layers)],
        LayerSpec(Head, model.hidden_size, model.vocab_size),
    ]
    module = PipelineModule(layers=specs, topology=topology, loss_fn=next_token_loss, partition_method="uniform")
    config = {key: value for key, value in job.deepspeed.items() if key not in ("optimizer", "scheduler")}
    lr = float((job.deepspeed.get("optimizer") or {}).get("params", {}).get("lr", 1e-2))
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)

    rank = dist.get_rank()
    coord = layout.coord(rank)
    grid = engine.grid
    seen = {
        "rank": rank,
        "launch_rank": launch.rank,
        "node_rank": env.node_rank,
        "coord": coord._asdict(),
        "stage": engine.stage_id,
        "pipe_group": list(grid.pp_group),
        "data_group": list(grid.dp_group),
    }
    output = Path(env.output_dir or ".")
    output.mkdir(parents=True, exist_ok=True)
    (output / f"rank-{rank}.json").write_text(json.dumps(seen))

    data = batches(model.vocab_size, model.sequence_length, job.micro_batch_size, job.training.seed + coord.data)
    for step in range(1, job.training.steps + 1):
        loss = float(engine.train_batch(data_iter=data))
        if rank == 0 and (step % job.training.log_interval == 0 or step == job.training.steps):
            with (output / "metrics.jsonl").open("a") as metrics:
                metrics.write(json.dumps({"event": "step", "step": step, "loss": loss}) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
