"""Each rank's compute time per step, apart from the time it is blocked in communication.

DeepSpeed's pipeline engine runs a step as a schedule of instructions; `attach` times the compute ones on this
engine (forward pass, backward pass, optimizer step) and leaves out the communicating ones (pipeline send and
receive, the data-parallel gradient all-reduce, the tied-gradient all-reduce), which block while a slower
peer catches up. The tensor-parallel collectives run inside forward and backward; `tensor_parallel` wraps each
in `CLOCK.blocked()`, which takes its time back out, and `attach` wraps DeepSpeed's own collectives
(`deepspeed.comm`) the same way: the optimizer step's gradient-norm all-reduce spans the pipeline stages of a
replica, so a rank whose stage-mate is slow waits there, and that wait must not make it look slow itself. On CPU (gloo, where collectives block the host) the host
clock measures; on GPU, CUDA events on the current stream, read once per window so no step synchronises.

Each rank keeps its compute seconds of every step; every `window` steps each rank's lower-quartile step is
gathered (one float per rank) and rank 0 compares them with `paralleljob_contract.stragglers.name_stragglers`.
The lower quartile, not the sum or the median: noise on a shared host only ever adds time, to some steps (a rank
descheduled), so a rank's faster steps say how fast it is; a slow device is slow in every step, so its quartile
is slow too. On the 2-core test machine under a load of 15, the median still let two of three unthrottled runs
name a node at 1.30 to 1.37 (docs/local.md).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import MethodType
from typing import Any

import torch
import torch.distributed as dist
from deepspeed import comm as deepspeed_comm
from deepspeed.runtime.pipe import schedule

from paralleljob_contract import environment, stragglers
from paralleljob_contract.jobfile import Plan

# The instructions that compute; the others send, receive or all-reduce.
COMPUTE_INSTRUCTIONS = (schedule.ForwardPass, schedule.BackwardPass, schedule.OptimizerStep)


class ComputeClock:
    """Compute seconds since the last `take()`: compute sections add, blocked sections inside them subtract."""

    def __init__(self) -> None:
        self.enabled = False
        self._cuda = False
        self._seconds = 0.0
        self._depth = 0
        # On GPU: (start event, end event, +1 compute / -1 blocked), summed at take().
        self._events: list[tuple[Any, Any, int]] = []

    def start(self, cuda: bool) -> None:
        self.enabled, self._cuda, self._seconds, self._events = True, cuda, 0.0, []

    @contextmanager
    def compute(self) -> Iterator[None]:
        with self._section(+1):
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1

    @contextmanager
    def blocked(self) -> Iterator[None]:
        """A collective inside a compute section: its time is not compute."""
        if not self.enabled or self._depth == 0:
            yield
            return
        with self._section(-1):
            yield

    @contextmanager
    def _section(self, sign: int) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self._cuda:
            # torch leaves Event's constructor untyped.
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((begin, end, sign))
            return
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds += sign * (time.perf_counter() - started)

    def take(self) -> float:
        """The compute seconds measured since the last take, and start again. Taken after a step, whose loss
        the host has already read (so the GPU is done with the step's events and waiting on them is free)."""
        seconds = self._seconds
        if self._events:
            self._events[-1][1].synchronize()
            seconds += sum(sign * begin.elapsed_time(end) / 1000.0 for begin, end, sign in self._events)
        self._seconds, self._events = 0.0, []
        return max(seconds, 0.0)


# The process's clock: tensor_parallel's collectives report to it, the engine's compute instructions add to it.
CLOCK = ComputeClock()


# DeepSpeed's collectives that can run inside a compute instruction (clipping's norm, overflow checks, the
# pipeline's partitioned-activation gathers): blocked time when they do.
DEEPSPEED_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter_tensor")


def attach(engine: Any, clock: ComputeClock = CLOCK) -> None:
    """Time this engine's compute instructions (an instance-level copy of DeepSpeed's instruction map), with
    DeepSpeed's collectives counted as blocked."""
    block_collectives(deepspeed_comm, clock)
    timed = dict(engine._INSTRUCTION_MAP)
    for kind in COMPUTE_INSTRUCTIONS:
        timed[kind] = _timed(timed[kind], clock)
    engine._INSTRUCTION_MAP = timed
    clock.start(cuda=torch.cuda.is_available())


def block_collectives(module: Any, clock: ComputeClock = CLOCK, names: tuple[str, ...] = DEEPSPEED_COLLECTIVES) -> None:
    """Wrap `module`'s collective functions in `clock.blocked()` (once; a no-op outside a compute section)."""
    for name in names:
        function = getattr(module, name, None)
        if function is not None and not getattr(function, "_paralleljob_blocked", False):
            setattr(module, name, blocking(function, clock))


def blocking(function: Callable[..., Any], clock: ComputeClock = CLOCK) -> Callable[..., Any]:
    """`function` with its time counted as blocked when it runs inside a compute section."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with clock.blocked():
            return function(*args, **kwargs)

    run._paralleljob_blocked = True  # type: ignore[attr-defined]
    return run


def _timed(method: Callable[..., Any], clock: ComputeClock) -> Callable[..., Any]:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with clock.compute():
            return MethodType(method, self)(*args, **kwargs)

    return run


def lower_quartile(values: list[float]) -> float:
    """The value a quarter of the way up the sorted values (the 5th fastest of 20 steps)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


def gather(seconds: float, device: Any) -> list[float]:
    """Every rank's figure, in rank order (one small all-gather over the whole gang, once per window)."""
    mine = torch.tensor([seconds], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [float(t.item()) for t in every]


@dataclasses.dataclass
class StragglerWindow:
    """Counts steps; at the end of each window gathers every rank's compute seconds and, on rank 0, names the
    nodes slower than their peers (the `stragglers` record of metrics.jsonl)."""

    plan: Plan
    threshold: float
    steps: int
    device: Any
    first_step: int = 1
    # Consecutive windows a node must be slower in before it is named (spec.failurePolicy.stragglers.windows).
    windows: int = stragglers.DEFAULT_WINDOWS
    clock: ComputeClock = dataclasses.field(default_factory=lambda: CLOCK)
    # Rank 0's unbroken runs of windows per node rank (stragglers.persisting).
    streaks: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # This rank's compute seconds of each step of the current window.
    per_step: list[float] = dataclasses.field(default_factory=list)
    # Each node rank's node (PARALLELJOB_NODE_NAME), gathered once: a report names the nodes this gang ran on,
    # so the operator can tell it from a report about the same node rank on another node.
    node_names: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        names: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(names, os.environ.get(environment.NODE_NAME, ""))
        per_node = self.plan.ranks_per_node
        self.node_names = [str(names[rank] or "") for rank in range(0, len(names), per_node)]

    def after_step(self, step: int) -> dict[str, Any] | None:
        """At a window's last step: the record rank 0 writes (None on the other ranks and between windows)."""
        self.per_step.append(self.clock.take())
        if (step - self.first_step + 1) % self.steps:
            return None
        window = (step - self.steps + 1, step)
        started = time.perf_counter()
        every = gather(lower_quartile(self.per_step), self.device)
        self.per_step = []
        if dist.get_rank() != 0:
            return None
        layout, per_node = self.plan.layout, self.plan.ranks_per_node
        factors = stragglers.node_factors(every, layout, per_node)
        slower = stragglers.name_stragglers(every, layout, per_node, window, self.threshold, self.node_names)
        named, self.streaks = stragglers.persisting(slower, self.streaks, self.windows)
        slowest = max(factors.items(), key=lambda item: item[1][0], default=None)
        return {
            "event": "stragglers",
            "steps": list(window),
            "stragglers": [s.to_dict() for s in named],
            # The largest factor of any node, named or not: how close the others came to the threshold.
            "slowest": None if slowest is None else {"nodeRank": slowest[0], "factor": round(slowest[1][0], 3)},
            # Over the ranks, of each rank's lower-quartile compute seconds per step.
            "step_compute_s": {"min": min(every), "median": statistics.median(every), "max": max(every)},
            # What the gather and the comparison cost, once per window, outside any step's step_time_s.
            "compare_s": time.perf_counter() - started,
        }
