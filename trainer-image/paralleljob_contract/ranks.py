"""A node's ranks, as the in-pod supervisor (`paralleljob_contract.supervisor`) starts, watches and stops them.

`NodeSpec` gives each rank the environment torchrun gave it, its rank fixed by placement; `Heartbeats` are the
files a rank touches after each step, read to find a hung one; `rank_starter` starts a rank forked from a warm
forkserver (`--entrypoint`) or as a command of its own (spec.command); `stop_ranks` ends them all, and
`first_failure` names the rank that failed first. Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

from paralleljob_contract.environment import IN_PLACE_RESTARTS
from paralleljob_contract.heartbeat import HEARTBEAT_FILE, last_beat

# A node's exit code when the gang gave up because of another node's rank (the trainer's "a peer died").
EXIT_PEER = 4
# How long a rank has to end after SIGTERM before it gets SIGKILL.
STOP_GRACE_SECONDS = 5.0


class Rank(Protocol):
    """A started rank: its pid (for the log), its exit code once it has ended, and how to signal it."""

    pid: int | None

    def exit_code(self) -> int | None: ...

    def send(self, sig: signal.Signals) -> None: ...


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """This node's place in the gang and what each of its ranks runs."""

    nodes: int
    node_rank: int
    ranks_per_node: int
    master_addr: str
    master_port: int

    def rank_environ(
        self, base: Mapping[str, str], local_rank: int, generation: int, heartbeat_file: str | None = None
    ) -> dict[str, str]:
        """The variables torchrun gave a rank, with its rank fixed by placement, the generation, and its
        heartbeat file when the supervisor watches one."""
        return {
            **base,
            "RANK": str(self.node_rank * self.ranks_per_node + local_rank),
            "LOCAL_RANK": str(local_rank),
            "GROUP_RANK": str(self.node_rank),
            "WORLD_SIZE": str(self.nodes * self.ranks_per_node),
            "LOCAL_WORLD_SIZE": str(self.ranks_per_node),
            "MASTER_ADDR": self.master_addr,
            # The coordinator holds the rendezvous port; the ranks' own store (rank 0's) is on the next one.
            "MASTER_PORT": str(self.master_port + 1),
            "TORCHELASTIC_RESTART_COUNT": str(generation),
            IN_PLACE_RESTARTS: str(generation),
            **({HEARTBEAT_FILE: heartbeat_file} if heartbeat_file else {}),
        }


@dataclasses.dataclass(frozen=True)
class Heartbeats:
    """This node's ranks' heartbeat files, one per local rank in `folder`, and how long a rank may go quiet."""

    folder: str
    timeout: float

    def path(self, local_rank: int) -> str:
        return os.path.join(self.folder, f"rank{local_rank}")

    def clear(self, count: int) -> None:
        """Forget the last generation's beats: a new generation's ranks are judged from their own start."""
        for local_rank in range(count):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(local_rank))

    def stalled(self, running: Sequence[int], since: float, now: float) -> tuple[int, float] | None:
        """(local rank, seconds quiet) of the quietest `running` rank once it has been quiet for the timeout,
        or None. A rank is quiet since the later of its last beat and `since`, its generation's start
        (time.time()); a rank that has finished beats no more and is not judged."""
        quiet = [(now - max(since, last_beat(self.path(i)) or since), i) for i in running]
        longest, local_rank = max(quiet, default=(0.0, -1))
        return (local_rank, longest) if longest >= self.timeout else None


def run_entrypoint(entrypoint: str, environ: dict[str, str]) -> None:
    """A forked rank: take its environment and run `module:function`, whose return value is the exit code."""
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = [entrypoint]
    module, _, function = entrypoint.partition(":")
    exit_without_teardown(int(getattr(importlib.import_module(module), function)() or 0))


def exit_without_teardown(code: int) -> NoReturn:
    """End this process (a rank) with `code` as the interpreter would, less its teardown of every module and object.

    A rank holds torch, DeepSpeed and torch._dynamo (the optimizers import it): tearing that down costs about
    2 s of CPU per rank, paid by all ranks at once after the last step. Everything with an observable effect
    still happens, in the interpreter's order: non-daemon threads are joined, atexit handlers run (logging's
    flush among them), stdout and stderr are flushed. The process groups are already gone (`shutdown`).
    multiprocessing ends its children the same way.
    """
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ForkedRank:
    """A rank forked from the warm forkserver."""

    def __init__(self, context: Any, entrypoint: str, environ: dict[str, str]) -> None:
        self.process = context.Process(target=run_entrypoint, args=(entrypoint, environ), daemon=False)
        self.process.start()
        self.pid: int | None = self.process.pid

    def exit_code(self) -> int | None:
        code = self.process.exitcode
        return None if code is None else int(code)

    def send(self, sig: signal.Signals) -> None:
        signal_pid(self.pid, sig)


class CommandRank:
    """A rank of spec.command: a process of its own."""

    def __init__(self, command: Sequence[str], environ: dict[str, str]) -> None:
        self.process = subprocess.Popen(list(command), env=environ, stdin=subprocess.DEVNULL)
        self.pid: int | None = self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def send(self, sig: signal.Signals) -> None:
        signal_pid(self.pid, sig)


def stop_ranks(ranks: Sequence[Rank]) -> None:
    """SIGTERM (and SIGCONT, for a rank someone stopped), a grace period, then SIGKILL; waits for all."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        signal_ranks(ranks, sig)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while any(rank.exit_code() is None for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_ranks([rank for rank in ranks if rank.exit_code() is None], signal.SIGKILL)
    while any(rank.exit_code() is None for rank in ranks):
        time.sleep(0.05)


def signal_ranks(ranks: Sequence[Rank], sig: signal.Signals) -> None:
    for rank in ranks:
        rank.send(sig)


def signal_pid(pid: int | None, sig: signal.Signals) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def first_failure(ranks: Sequence[Rank]) -> tuple[int, int] | None:
    """(local rank, exit code) of a rank that exited non-zero, or None: one that failed on its own before one
    that only saw a peer fail (EXIT_PEER), so that the gang's restart names the cause."""
    failed = [(i, code) for i, rank in enumerate(ranks) if (code := rank.exit_code()) not in (None, 0)]
    failed.sort(key=lambda found: found[1] == EXIT_PEER)
    return failed[0] if failed else None


def describe_exit(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


def rank_starter(entrypoint: str | None, preload: str, command: Sequence[str]) -> Callable[[dict[str, str]], Rank]:
    """How this node starts a rank: forked from the warm forkserver (entrypoint), or `command` as it is."""
    if entrypoint is None:
        return lambda environ: CommandRank(command, environ)
    # torch.cuda.is_available() (DeepSpeed asks at import) then asks NVML, not the CUDA driver: a process that
    # has initialised CUDA cannot fork ranks that use it.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([name for name in preload.split(",") if name])
    # Start the forkserver and its imports now, before the gang's first generation: its ranks are timed from
    # their start (the progress timeout) and only then forked, in a fraction of a second each.
    warm = context.Process(target=ready, daemon=True)
    warm.start()
    warm.join()
    return lambda environ: ForkedRank(context, entrypoint, environ)


def ready() -> None:
    """What the forkserver's first child runs: nothing (the forkserver is up and has imported the preload)."""
