"""spec.training: steps, learning rate and the data source, and the data rules (a path to read, token ids that
fit their dtype).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paralleljob.api.fields import api_field
from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule
from paralleljob_contract import jobfile, training_data

if TYPE_CHECKING:
    from paralleljob.api import types as t

DataSource = Literal["synthetic", "text", "tokens"]


TokenDtype = Literal["uint16", "uint32"]


@dataclasses.dataclass(frozen=True)
class WeightedSource:
    """One prepared folder of a blend, and its share of the rows."""

    path: str = api_field("A folder made by `paralleljob data prepare`, as seen inside the pod.")
    weight: float = api_field(
        "This folder's share of each batch's rows, relative to the other sources' weights.", default=1.0, minimum=0
    )


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Held-out evaluation: the validation loss, from a held-out folder or documents kept out of training."""

    path: str | None = api_field(
        "A held-out folder made by `paralleljob data prepare`, as seen inside the pod. Set this or heldOutFraction.",
        default=None,
    )
    held_out_fraction: float | None = api_field(
        "Fraction of each training folder's documents (its last ones) kept out of training and evaluated on.",
        default=None,
        minimum=0,
        maximum=1,
    )
    interval_steps: int = api_field(
        "Evaluate every this many steps, and at the last step.", default=training_data.DEFAULT_EVAL_INTERVAL, minimum=1
    )
    batches: int = api_field(
        "Global batches per evaluation (the same ones each time).",
        default=training_data.DEFAULT_EVAL_BATCHES,
        minimum=1,
    )


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """Where the training tokens come from."""

    source: DataSource = api_field(
        "synthetic: deterministic random tokens; text: a UTF-8 file or a folder read as bytes with a "
        "256-token byte-level vocabulary; tokens: a folder made by `paralleljob data prepare` (its metadata gives "
        "the dtype and vocabulary), or a flat binary file of token ids (nanoGPT style), memory-mapped.",
        default=jobfile.DEFAULT_DATA_SOURCE,
    )
    path: str | None = api_field(
        "File or folder to read, as seen inside the pod (mount it with spec.template.volumes). "
        "Required for text and tokens.",
        default=None,
    )
    token_dtype: TokenDtype = api_field(
        "Integer type of the ids in a flat tokens file: uint16 (vocabularies up to 65536) or uint32. A prepared "
        "folder records its own.",
        default=jobfile.DEFAULT_TOKEN_DTYPE,
    )
    sources: list[WeightedSource] | None = api_field(
        "A blend of prepared folders, each row of a batch drawn from one of them in proportion to its weight "
        "(a pure function of seed and step). Replaces path; source is tokens.",
        default=None,
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
    eval: Evaluation | None = api_field(
        "Held-out evaluation: its loss goes to metrics.jsonl, status.progress.validationLoss and loss.png.",
        default=None,
    )
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


def _data_path(spec: t.ParallelJobSpec) -> Problem | None:
    data = spec.training.data
    if data.source == "synthetic" or data.path or data.sources:
        return None
    return error(
        "spec.training.data.path",
        f"is required for source {data.source}; set it to the file or folder to read inside the pod.",
    )


def _uint16_vocab(spec: t.ParallelJobSpec) -> Problem | None:
    data = spec.training.data
    if data.source != "tokens" or data.token_dtype != "uint16" or spec.model.vocab_size <= 65536:
        return None
    return error(
        "spec.training.data.tokenDtype",
        f"uint16 holds ids below 65536 but vocabSize is {spec.model.vocab_size}; use tokenDtype uint32.",
    )


def _eval_source(spec: t.ParallelJobSpec) -> Problem | None:
    evaluation = spec.training.eval
    if evaluation is None or (evaluation.path is None) != (evaluation.held_out_fraction is None):
        return None
    return error("spec.training.eval", "set exactly one of path (a held-out folder) and heldOutFraction.")


RULES: tuple[Rule, ...] = (
    Rule(
        "data-path-required",
        ".training.data.path",
        "!has(self.training.data) || !has(self.training.data.source) "
        "|| self.training.data.source == 'synthetic' || has(self.training.data.path) "
        "|| has(self.training.data.sources)",
        "training.data.path is required for sources text and tokens",
        _data_path,
    ),
    Rule(
        "uint16-vocab",
        ".training.data.tokenDtype",
        "!has(self.training.data) || !has(self.training.data.source) || self.training.data.source != 'tokens' "
        "|| (has(self.training.data.tokenDtype) && self.training.data.tokenDtype == 'uint32') "
        "|| self.model.vocabSize <= 65536",
        "uint16 token files hold ids below 65536; use tokenDtype uint32 for larger vocabularies",
        _uint16_vocab,
    ),
    Rule(
        "eval-one-source",
        ".training.eval",
        "!has(self.training.eval) || (has(self.training.eval.path) != has(self.training.eval.heldOutFraction))",
        "training.eval needs exactly one of path and heldOutFraction",
        _eval_source,
    ),
)
