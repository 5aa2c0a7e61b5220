"""Live progress of a local run: reads rank 0's metrics.jsonl as it grows and shows it with rich.

On a terminal: a progress bar (step/steps, loss, tokens/s, ETA) and one status line per node, redrawn in
place. Elsewhere (CI, pipes): one plain line per logged step, so logs stay readable.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from paralleljob.local.gang import NodeState
from paralleljob_contract import metrics


class MetricsTail:
    """Incremental reader of metrics.jsonl; a restarted gang appends, so the last line of a step wins."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.steps: dict[int, dict[str, Any]] = {}
        self.checkpoints: list[int] = []
        self.summary: dict[str, Any] | None = None
        # The trainer's `stragglers` records, one per window of compute times.
        self.stragglers: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        """New complete records since the last call."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        records, self._partial = metrics.complete_records(self._partial + chunk)
        for record in records:
            self._remember(record)
        return records

    def _remember(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "step" and isinstance(record.get("step"), int):
            self.steps[record["step"]] = record
        elif event == "checkpoint" and isinstance(record.get("step"), int):
            self.checkpoints.append(record["step"])
        elif event == "summary":
            self.summary = record
        elif event == "stragglers":
            self.stragglers.append(record)

    def latest(self) -> dict[str, Any] | None:
        return self.steps[max(self.steps)] if self.steps else None

    def loss_curve(self, key: str = "loss") -> list[tuple[int, float]]:
        """(step, value) of `key` over the logged steps: the training loss, or `validation_loss` where evaluated."""
        return [(step, rec[key]) for step, rec in sorted(self.steps.items()) if rec.get(key) is not None]


@dataclasses.dataclass
class NodeLine:
    """What the display shows for one node."""

    node_rank: int
    node: str
    ranks: str
    stages: str
    log_path: Path


def last_log_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of a node's log, for its status line."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:100] if lines else ""


class ProgressView:
    """Draws progress for a terminal, or prints plain lines for logs."""

    def __init__(self, console: Console, total_steps: int, nodes: Sequence[NodeLine]) -> None:
        self.console = console
        self.total_steps = total_steps
        self.nodes = list(nodes)
        self.attempt = 1
        self._bar = Progress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._bar.add_task("train", total=total_steps, stats="starting")
        self._live: Live | None = None
        self._started = time.monotonic()

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._live = Live(self._render([]), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, records: list[dict[str, Any]], latest: dict[str, Any] | None, states: list[NodeState]) -> None:
        if latest is not None:
            self._bar.update(self._task, completed=latest["step"], stats=_stats(latest))
        if self._live is not None:
            self._live.update(self._render(states))
            return
        for record in records:
            if record.get("event") == "step":
                self.console.print(f"step {record['step']}/{self.total_steps}  {_stats(record)}", highlight=False)
            elif record.get("event") == "checkpoint":
                self.console.print(f"checkpoint saved at step {record['step']}", highlight=False)

    def _render(self, states: list[NodeState]) -> Group:
        by_rank = {state.node_rank: state for state in states}
        table = Table(box=None, show_header=True, header_style="bold", pad_edge=False, expand=True)
        for column in ("node rank", "node", "ranks", "stages", "state"):
            table.add_column(column, no_wrap=True, min_width=len(column))
        table.add_column("last output", overflow="ellipsis", no_wrap=True, ratio=1)
        for node in self.nodes:
            state = by_rank.get(node.node_rank)
            table.add_row(
                str(node.node_rank),
                node.node,
                node.ranks,
                node.stages,
                _state_text(state),
                last_log_line(node.log_path),
            )
        header = f"attempt {self.attempt}" if self.attempt > 1 else ""
        return Group(self._bar.get_renderable(), table, header)


def _state_text(state: NodeState | None) -> str:
    if state is None:
        return "stopped"
    if state.exit_code is None:
        return f"running (pid {state.pid})"
    return "done" if state.exit_code == 0 else f"exit {state.exit_code}"


def _stats(record: dict[str, Any]) -> str:
    loss = record.get("loss")
    tps = record.get("tokens_per_s")
    parts = [f"loss {loss:.4f}" if isinstance(loss, int | float) else "loss -"]
    if isinstance(tps, int | float):
        parts.append(f"{tps:,.0f} tokens/s")
    return "  ".join(parts)
