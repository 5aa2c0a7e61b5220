"""spec.training: steps, learning rate and the data source, and the data rules (a path to read, token ids that
fit their dtype).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paralleljob.api.fields import api_field
from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule
from paralleljob_contract import jobfile

if TYPE_CHECKING:
    from paralleljob.api import types as t

DataSource = Literal["synthetic", "text", "tokens"]


TokenDtype = Literal["uint16", "uint32"]


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


def _data_path(spec: t.ParallelJobSpec) -> Problem | None:
    data = spec.training.data
    if data.source == "synthetic" or data.path:
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


RULES: tuple[Rule, ...] = (
    Rule(
        "data-path-required",
        ".training.data.path",
        "!has(self.training.data) || !has(self.training.data.source) "
        "|| self.training.data.source == 'synthetic' || has(self.training.data.path)",
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
)
