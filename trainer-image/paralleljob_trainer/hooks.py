"""The progress-hook interface: how a launcher or the operator hears about steps, checkpoints and the end.

A hook is any object with the three methods of `ProgressHook`. Rank 0 calls them with the same JSON-ready
records it writes to metrics.jsonl, so a hook sees exactly what a reader of that file sees. A hook is named
as `module:factory` (CLI `--progress-hook` or `PARALLELJOB_PROGRESS_HOOK`); the factory is called with no
arguments and returns the hook. A hook that raises is reported on stderr and training goes on: progress
reporting must never cost a training run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from paralleljob_contract.errors import ContractError

Record = Mapping[str, Any]


@runtime_checkable
class ProgressHook(Protocol):
    """Receives progress from rank 0. Records are the metrics.jsonl lines, as dicts."""

    def on_step(self, record: Record) -> None:
        """A `{"event": "step", ...}` record, once per log interval."""

    def on_checkpoint(self, record: Record) -> None:
        """A `{"event": "checkpoint", "step": N, "path": ...}` record after a checkpoint is complete, and the
        `{"event": "resume", "step": N, "path": ..., "skipped": [...]}` record when a run starts from one."""

    def on_finish(self, record: Record) -> None:
        """The `{"event": "summary", ...}` record, once, at the end of a successful run."""


def load_hook(reference: str) -> ProgressHook:
    """Import `module:factory` and call the factory; ContractError if that fails or the result is no hook."""
    module_name, _, factory_name = reference.partition(":")
    if not module_name or not factory_name:
        raise ContractError(f"progress hook {reference!r}: expected module:factory")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
        hook = factory()
    except Exception as error:
        raise ContractError(f"progress hook {reference!r}: {type(error).__name__}: {error}") from error
    if not isinstance(hook, ProgressHook):
        raise ContractError(f"progress hook {reference!r}: needs on_step, on_checkpoint and on_finish")
    return hook


class HookCaller:
    """Calls a list of hooks, reporting (not raising) their failures."""

    def __init__(self, hooks: list[ProgressHook]) -> None:
        self._hooks = hooks

    def checkpoint_request(self) -> str | None:
        """The first pending checkpoint request of a hook that takes them (an optional `checkpoint_request()`
        method, as `k8s_status.ProgressReporter` has), or None; a hook that raises is reported."""
        for hook in self._hooks:
            ask = getattr(hook, "checkpoint_request", None)
            if ask is None:
                continue
            try:
                found = ask()
            except Exception as error:
                print(f"paralleljob-trainer: progress hook checkpoint_request failed: {error!r}", file=sys.stderr)
                continue
            if found:
                return str(found)
        return None

    def call(self, method: str, record: Record) -> None:
        for hook in self._hooks:
            try:
                getattr(hook, method)(record)
            except Exception as error:
                print(f"paralleljob-trainer: progress hook {method} failed: {error!r}", file=sys.stderr)
