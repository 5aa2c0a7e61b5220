"""Small functions run on every rank of a fresh gloo group by `run_on_ranks`, for the collective code paths.

Each worker returns a picklable result per rank; the test compares the ranks' results. The group has a short
timeout, so a rank left waiting by a peer that skipped a collective fails fast instead of hanging the test.
"""

from __future__ import annotations

import datetime
import multiprocessing
import traceback
from collections.abc import Callable
from pathlib import Path
from types import MethodType
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from testcluster import trainer_harness as harness

PG_TIMEOUT_S = 10


def _rank_main(target: Callable[..., Any], rank: int, world: int, port: int, args: tuple[Any, ...], queue: Any) -> None:
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        queue.put((rank, "ok", target(*args)))
    except Exception:
        queue.put((rank, "raised", traceback.format_exc(limit=3)))


def run_on_ranks(target: Callable[..., Any], world: int, *args: Any, timeout: float = 90) -> list[tuple[str, Any]]:
    """(outcome, value) of `target(*args)` on each rank of a `world`-rank gloo group; one process per rank."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = harness.free_port()
    processes = [
        context.Process(target=_rank_main, args=(target, rank, world, port, args, queue)) for rank in range(world)
    ]
    for process in processes:
        process.start()
    try:
        results = dict(
            (rank, (outcome, value)) for rank, outcome, value in (queue.get(timeout=timeout) for _ in processes)
        )
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    return [results[rank] for rank in range(world)]


def resume_from_own_folder(root: Path) -> tuple[str, Any]:
    """Rank r chooses a checkpoint in root/rank-r; only rank 0's folder holds one (as when a node lacks it)."""
    from paralleljob_contract.jobfile import parse_job_config
    from paralleljob_contract.layout import Layout
    from paralleljob_trainer import checkpoint

    job = parse_job_config(harness.job_document(Layout(1, 1, 2), optimizer={"type": "SGD", "params": {"lr": 0.1}}))
    try:
        chosen = checkpoint.choose(job, root / f"rank-{dist.get_rank()}", None)
        return "step", None if chosen is None else chosen.step
    except checkpoint.CheckpointError as error:
        return "error", str(error)


def average_replicated_gradients() -> dict[str, dict[str, Any]]:
    """`_average_replicated_gradients` with fp32 gradients and with the bf16 optimizer's buffers."""
    from paralleljob_trainer import tensor_parallel

    rank, world = dist.get_rank(), dist.get_world_size()
    tp = tensor_parallel.TensorParallel(rank=rank, size=world, group=dist.new_group(list(range(world))))
    return {name: _average_replicated_gradients(tp, bf16) for name, bf16 in (("fp32", False), ("bf16", True))}


def average_two_dtypes() -> dict[str, list[float]]:
    """`average_over_tensor_parallel` over float32 and float64 tensors of rank-dependent values, as mean and sum."""
    from paralleljob_trainer import tensor_parallel

    rank, world = dist.get_rank(), dist.get_world_size()
    tp = tensor_parallel.TensorParallel(rank=rank, size=world, group=dist.new_group(list(range(world))))
    found: dict[str, list[float]] = {}
    for mean in (True, False):
        tensors = [torch.full((3,), float(rank + 1)), torch.full((2,), float(rank + 1), dtype=torch.float64)]
        tensor_parallel.average_over_tensor_parallel(tensors, tp, mean=mean)
        found["mean" if mean else "sum"] = [value for tensor in tensors for value in tensor.tolist()]
    return found


def _average_replicated_gradients(tp: Any, bf16: bool) -> dict[str, Any]:
    """One replicated and one sharded parameter with rank-dependent gradients, through the ReduceGrads wrapper."""
    from deepspeed.runtime.pipe.schedule import ReduceGrads

    from paralleljob_trainer import optimization, tensor_parallel

    rank = tp.rank
    module = torch.nn.Module()
    module.replicated = tensor_parallel.mark_replicated(torch.nn.Parameter(torch.zeros(3)), tp)
    module.sharded = tensor_parallel.mark_sharded(torch.nn.Parameter(torch.zeros(2)))
    for parameter in module.parameters():
        gradient = torch.full_like(parameter, float(rank + 1))
        if bf16:
            parameter._hp_grad = gradient  # the bf16 optimizer's fp32 accumulation buffer
        else:
            parameter.grad = gradient

    class PipelineEngine:
        using_bf16_optimizer = bf16
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        reduced_after: ClassVar[list[float]] = []

        def reduce_grads(self) -> None:
            self.reduced_after.append(_gradient(module.replicated)[0])

        _INSTRUCTION_MAP: ClassVar[dict[type, Any]] = {ReduceGrads: reduce_grads}

    def _gradient(parameter: torch.Tensor) -> list[float]:
        return (parameter._hp_grad if bf16 else parameter.grad).tolist()

    engine = PipelineEngine()
    engine.module = module
    optimization.average_replicated_gradients_each_step(engine, tp)
    MethodType(engine._INSTRUCTION_MAP[ReduceGrads], engine)()  # as the pipeline engine runs an instruction
    return {
        "replicated": _gradient(module.replicated),
        "sharded": _gradient(module.sharded),
        "reduced_after": engine.reduced_after,
    }


def vocab_parallel_matches_replicated(vocab: int) -> dict[str, float]:
    """This rank's largest differences between the vocab-parallel embedding, head and loss and the replicated
    ones (plain embedding, linear and cross_entropy over the whole vocabulary), values and gradients."""
    from torch.nn import functional

    from paralleljob_trainer import weights
    from paralleljob_trainer.tensor_parallel import TensorParallel
    from paralleljob_trainer.vocab_parallel import (
        VocabParallelEmbedding,
        VocabParallelHead,
        vocab_parallel_cross_entropy,
    )

    tp = TensorParallel(rank=dist.get_rank(), size=dist.get_world_size(), group=dist.group.WORLD)
    hidden, generator = 16, torch.Generator().manual_seed(5)
    tokens = torch.randint(0, vocab, (2, 7), generator=generator)
    labels = torch.randint(0, vocab, (2, 7), generator=generator)
    embedding = VocabParallelEmbedding(vocab, hidden, tp, seed=1, layer=0, name="tokens")
    head = VocabParallelHead(vocab, hidden, tp, seed=1, layer=3, name="lm_head")
    loss = vocab_parallel_cross_entropy(head(embedding(tokens)), labels, tp, vocab)
    loss.backward()

    full_embedding = weights.normal(1, 0, "tokens", (vocab, hidden)).requires_grad_()
    full_head = weights.normal(1, 3, "lm_head", (vocab, hidden)).requires_grad_()
    logits = functional.embedding(tokens, full_embedding) @ full_head.T
    replicated = functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
    replicated.backward()

    rows = embedding.rows
    real = range(rows.start, min(rows.stop, vocab))
    assert embedding.weight.grad is not None and head.weight.grad is not None
    assert full_embedding.grad is not None and full_head.grad is not None
    return {
        "loss": abs(loss.item() - replicated.item()),
        "embedding_grad": _max_diff(embedding.weight.grad[: len(real)], full_embedding.grad[real.start : real.stop]),
        "head_grad": _max_diff(head.weight.grad[: len(real)], full_head.grad[real.start : real.stop]),
        "padding_grad": float(head.weight.grad[len(real) :].abs().max()) if len(real) < len(rows) else 0.0,
    }


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0
