"""Held-out evaluation (spec.training.eval): the validation loss every `intervalSteps` steps and at the last.

Evaluation batch j is the held-out stream's global batch j (`data.open_eval_stream`), the same at every
evaluation, so the validation curve compares like with like. Every rank runs the pipeline's forward passes
without gradients (DeepSpeed's `eval_batch`, which averages over micro-batches and data-parallel ranks and
broadcasts the result along the pipeline); nothing is stepped, and the training draws are a function of
(seed, step) alone, so evaluating never moves the training curve.
"""

from __future__ import annotations

import time
from typing import Any

from paralleljob_contract.jobfile import JobConfig
from paralleljob_contract.layout import Coord
from paralleljob_trainer import data


def is_evaluation_step(job: JobConfig, step: int) -> bool:
    """Every spec.training.eval.intervalSteps, and the last step, when evaluation is configured."""
    evaluation = job.training.evaluation
    if evaluation is None:
        return False
    return step == job.training.steps or step % evaluation.interval_steps == 0


def evaluate(job: JobConfig, engine: Any, stream: data.TokenStream, coords: Coord) -> dict[str, Any]:
    """The mean loss over the evaluation's batches, and what it cost: fields of the step's record."""
    assert job.training.evaluation is not None
    batches = job.training.evaluation.batches
    started = time.perf_counter()
    total = 0.0
    for index in range(batches):
        micro = data.micro_batches(
            stream, index, job.train_batch_size, job.micro_batch_size, job.plan.layout.data, coords.data
        )
        total += float(engine.eval_batch(data_iter=micro))
    return {"validation_loss": total / batches, "eval_s": time.perf_counter() - started, "eval_batches": batches}
