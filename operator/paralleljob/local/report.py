"""The end of a local run: the summary a person reads, `summary.json`, and the loss-curve picture.

`summary.json` is reserved when the run starts (`reserve_summary`: a placeholder of a fixed size) and
overwritten in place at the end, so a run whose output disk fills up still says how it ended. The picture
is optional: a disk too full for it leaves `loss_curve` null. matplotlib is loaded while the gang trains
(`load_plotting_in_background`), so that the picture, not the library's import, is all a finished run waits for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What a finished (or failed) local run achieved."""

    job: str
    layout: str
    succeeded: bool
    reason: str
    restarts: int
    wall_seconds: float
    steps_done: int
    total_steps: int
    first_loss: float | None
    last_loss: float | None
    tokens_per_s: float | None
    last_checkpoint_step: int | None
    output_dir: str
    loss_curve: str | None
    # Efficiency beside the loss (the trainer's summary line, else its last step line): achieved model TFLOP/s
    # per GPU, MFU (null where the device's peak is unknown, as on CPU), the measured median and the planner's
    # modeled step time.
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_seconds: float | None = None
    modeled_step_seconds: float | None = None
    # Nodes named slower than their peers in any window: node, nodeRank, factor (the largest), stage,
    # steps ([first, last] step of the windows that named it), windows (how many named it, of how many).
    stragglers: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_efficiency(self, final: dict[str, Any], latest: dict[str, Any]) -> RunSummary:
        """This summary with the efficiency of the trainer's summary record, or else of its last step record."""
        source = final if any(final.get(field) is not None for field in EFFICIENCY_FIELDS) else latest
        tflops, mfu, step, modeled = (_number(source.get(field)) for field in EFFICIENCY_FIELDS)
        return dataclasses.replace(
            self, tflops_per_gpu=tflops, mfu=mfu, step_seconds=step, modeled_step_seconds=modeled
        )


EFFICIENCY_FIELDS = ("tflops_per_gpu", "mfu", "step_seconds", "modeled_step_seconds")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# Bytes held for summary.json from the start of a run; a summary is about 1 KiB.
SUMMARY_RESERVED_BYTES = 64 * 1024


def reserve_summary(path: Path) -> None:
    """A placeholder summary.json (valid JSON, padded with spaces) whose blocks the final summary reuses."""
    placeholder = json.dumps({"running": True}) + "\n"
    with path.open("w", encoding="utf-8") as handle:
        handle.write(placeholder.ljust(SUMMARY_RESERVED_BYTES))
        handle.flush()
        os.fsync(handle.fileno())


def load_plotting_in_background() -> threading.Thread:
    """Import matplotlib (Agg) on a daemon thread; `write_loss_curve` then finds it loaded, or waits on the
    import lock for the rest of it. About a second of a run's end on a quiet machine, more on a busy one."""
    thread = threading.Thread(target=_load_plotting, name="paralleljob-load-matplotlib", daemon=True)
    thread.start()
    return thread


def _load_plotting() -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file
    from matplotlib import pyplot  # noqa: F401


def write_loss_curve(
    curve: list[tuple[int, float]], path: Path, title: str, validation: list[tuple[int, float]] | None = None
) -> Path | None:
    """Plot loss against step to a PNG, with the validation loss beside the training loss when the run evaluated;
    None when there is nothing to plot or no room to write it."""
    if len(curve) < 2:
        return None
    try:
        return _plot(curve, path, title, validation or [])
    except OSError:
        path.unlink(missing_ok=True)
        return None


def _plot(curve: list[tuple[int, float]], path: Path, title: str, validation: list[tuple[int, float]]) -> Path:
    _load_plotting()
    from matplotlib import pyplot

    steps, losses = zip(*curve, strict=True)
    figure, axes = pyplot.subplots(figsize=(6.4, 3.6), dpi=110)
    axes.plot(steps, losses, marker="o", markersize=3, linewidth=1.5, color="#3b6fb6", label="training")
    if validation:
        held_steps, held_losses = zip(*validation, strict=True)
        axes.plot(held_steps, held_losses, marker="s", markersize=4, linewidth=1.5, color="#d0694a", label="validation")
        axes.legend()
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return path


def straggler_summary(windows: list[dict[str, Any]], node_names: list[str]) -> list[dict[str, Any]]:
    """One entry per node any window of the trainer named (metrics.jsonl's `stragglers` records). A report spans
    the node's run of slow windows (spec.failurePolicy.stragglers.windows), so `windows` counts the windows its
    reports cover, of all the run's windows."""
    nodes: dict[int, dict[str, Any]] = {}
    slow_windows: dict[int, set[int]] = {}
    ends = [int(window["steps"][1]) for window in windows]
    for window in windows:
        for named in window.get("stragglers") or []:
            rank = int(named["nodeRank"])
            first, last = named["steps"]
            entry = nodes.setdefault(rank, {"node": _node_name(node_names, rank), "nodeRank": rank, "factor": 0.0})
            entry["factor"] = max(entry["factor"], float(named["factor"]))
            entry["stage"] = named["stage"]
            entry["steps"] = [min(first, entry.get("steps", [first])[0]), last]
            slow_windows.setdefault(rank, set()).update(end for end in ends if first <= end <= last)
    for rank, entry in nodes.items():
        entry["windows"] = f"{len(slow_windows[rank])}/{len(windows)}"
    return sorted(nodes.values(), key=lambda entry: entry["nodeRank"])


def _node_name(node_names: list[str], rank: int) -> str:
    return node_names[rank] if 0 <= rank < len(node_names) else f"node-{rank}"


def print_summary(console: Console, summary: RunSummary) -> None:
    status = "[green]succeeded[/]" if summary.succeeded else f"[red]failed[/]: {summary.reason}"
    console.print(f"\n[bold]{summary.job}[/] ({summary.layout}) {status}")
    if summary.first_loss is not None and summary.last_loss is not None:
        console.print(f"  loss        {summary.first_loss:.4f} -> {summary.last_loss:.4f}", highlight=False)
    console.print(f"  steps       {summary.steps_done}/{summary.total_steps}", highlight=False)
    if summary.tokens_per_s is not None:
        console.print(f"  tokens/s    {summary.tokens_per_s:,.0f}", highlight=False)
    if summary.tflops_per_gpu is not None:
        mfu = f", MFU {summary.mfu:.1%}" if summary.mfu is not None else " (MFU: peak unknown on this device)"
        console.print(f"  TFLOP/s     {summary.tflops_per_gpu:.4g} per GPU{mfu}", highlight=False)
    if summary.step_seconds is not None:
        modeled = summary.modeled_step_seconds
        against = f" (modeled {modeled:.4g} s, x{summary.step_seconds / modeled:.3g})" if modeled else ""
        console.print(f"  step time   {summary.step_seconds:.4g} s{against}", highlight=False)
    console.print(f"  wall time   {summary.wall_seconds:.1f} s", highlight=False)
    console.print(f"  restarts    {summary.restarts}", highlight=False)
    if summary.last_checkpoint_step is not None:
        console.print(f"  checkpoint  step {summary.last_checkpoint_step}", highlight=False)
    for slow in summary.stragglers:
        console.print(
            f"  straggler   {slow['node']} (node rank {slow['nodeRank']}, stage {slow['stage']}): "
            f"{slow['factor']:.2f}x its peers' compute, steps {slow['steps'][0]}-{slow['steps'][1]} "
            f"({slow['windows']} windows)",
            highlight=False,
        )
    if summary.loss_curve:
        console.print(f"  loss curve  {summary.loss_curve}", highlight=False)
    console.print(f"  output      {summary.output_dir} (node-R.log, metrics.jsonl, summary.json)", highlight=False)


def write_summary(summary: RunSummary, path: Path) -> None:
    """Write summary.json over its reserved placeholder (in place: no new blocks needed on a full disk)."""
    text = json.dumps(summary.to_dict(), indent=2) + "\n"
    with path.open("r+" if path.exists() else "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.truncate()
