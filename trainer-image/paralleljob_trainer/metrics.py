"""Rank 0's metrics: one JSON line per log interval, per checkpoint and at the end, to stdout and a file.

Line kinds (the `event` field): `step` (step, loss, lr, grad_norm, tokens_per_s, step_time_s, samples, mfu,
tflops_per_gpu, step_seconds, modeled_step_seconds),
`checkpoint` (step, path) and `summary`. The local runner and the operator read these lines; their fields
are documented in docs/trainer.md and must only ever grow.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from paralleljob_trainer.hooks import HookCaller, Record


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity; a diverged loss is written as null rather than breaking readers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Writes records on rank 0 (a no-op elsewhere) and forwards them to the progress hooks."""

    def __init__(self, output_dir: Path | None, enabled: bool, hooks: HookCaller) -> None:
        self._enabled = enabled
        self._hooks = hooks
        self._file = None
        if enabled and output_dir is not None:
            output_dir.mkdir(parents=True, exist_ok=True)
            # Append: a restarted gang continues the same file, and readers take the last line per step.
            self._file = (output_dir / "metrics.jsonl").open("a", encoding="utf-8")

    def write(self, record: Record, hook_method: str | None = None) -> None:
        if not self._enabled:
            return
        line = json.dumps({key: _clean(value) for key, value in record.items()})
        print(line, flush=True)
        if self._file is not None:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as error:
                # A full output disk must not cost the training: the line is on stdout, the file stops here.
                log_to_stderr(f"metrics.jsonl is no longer written ({error.strerror or error}); lines go to stdout")
                self._close_quietly()
        if hook_method:
            self._hooks.call(hook_method, record)

    def close(self) -> None:
        if self._file is not None:
            self._close_quietly()

    def _close_quietly(self) -> None:
        try:
            if self._file is not None:
                self._file.close()
        except OSError:
            pass
        self._file = None


def log_to_stderr(message: str) -> None:
    print(f"paralleljob-trainer: {message}", file=sys.stderr, flush=True)
