"""Gang supervision of local node processes: start every node rank, and stop all of them when one fails.

Each simulated node is one `torchrun` process started in its own session, with its log in `node-R.log` and
its pid in `node-R.pid`. torchrun starts its workers in sessions of their own, so killing a node's process
group would orphan them; every process of a run therefore carries a marker variable in its environment
(`PARALLELJOB_LOCAL_RUN`), and stopping the gang kills every process that carries it. The same marker lets
tests prove that nothing is left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from paralleljob_contract import environment

RUN_MARKER = environment.LOCAL_RUN
STOP_GRACE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class NodeLaunch:
    """How to start one node rank."""

    node_rank: int
    argv: Sequence[str]
    env: dict[str, str]
    log_path: Path
    pid_path: Path


@dataclasses.dataclass(frozen=True)
class NodeState:
    """What the supervisor knows about one node at a tick."""

    node_rank: int
    pid: int
    exit_code: int | None


@dataclasses.dataclass(frozen=True)
class GangOutcome:
    """How one attempt of the gang ended."""

    succeeded: bool
    failed_node: int | None = None
    exit_code: int | None = None

    @property
    def reason(self) -> str:
        if self.succeeded:
            return "all node ranks finished"
        code = self.exit_code
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return f"node rank {self.failed_node} {how}"


def marked_processes(marker: str) -> list[int]:
    """Pids of processes whose environment carries `PARALLELJOB_LOCAL_RUN=marker` (Linux /proc)."""
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry.name}/environ", "rb") as handle:
            if needle in handle.read().split(b"\0"):
                found.append(int(entry.name))
    return found


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class Gang:
    """One attempt: the node processes of a run, started together and stopped together."""

    def __init__(self, launches: Sequence[NodeLaunch], marker: str) -> None:
        self.marker = marker
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for launch in launches:
                self._procs[launch.node_rank] = self._start(launch)
        except BaseException:  # Ctrl-C or a failed launch half-way: never leave the started nodes running
            stop_marked(marker, self._procs.values())
            raise

    def _start(self, launch: NodeLaunch) -> subprocess.Popen[bytes]:
        env = {**os.environ, **launch.env, RUN_MARKER: self.marker, "PYTHONUNBUFFERED": "1"}
        with open(launch.log_path, "ab") as log:
            proc = subprocess.Popen(
                list(launch.argv),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        launch.pid_path.write_text(f"{proc.pid}\n")
        return proc

    def states(self) -> list[NodeState]:
        return [NodeState(rank, proc.pid, proc.poll()) for rank, proc in sorted(self._procs.items())]

    def check(self) -> GangOutcome | None:
        """None while running; the outcome once a node failed or all succeeded."""
        states = self.states()
        for state in states:
            if state.exit_code not in (None, 0):
                return GangOutcome(False, state.node_rank, state.exit_code)
        if all(state.exit_code == 0 for state in states):
            return GangOutcome(True)
        return None

    def stop(self) -> None:
        """Terminate every process of the run (nodes and their workers), then kill what is left."""
        stop_marked(self.marker, self._procs.values())


def stop_marked(marker: str, procs: Iterable[subprocess.Popen[bytes]] = ()) -> None:
    """Terminate every process carrying this run marker (nodes and their workers), then kill what is left;
    `procs`, the node processes this process started, are reaped."""
    procs = list(procs)

    def alive() -> list[int]:
        # The node processes by their pids as well: a process's environment (/proc/PID/environ) reads empty
        # until its exec is complete, which is after Popen has returned, and a node may exec with another one.
        own = {proc.pid for proc in procs if proc.poll() is None}  # poll() reaps a finished node: no zombie
        return sorted(own | {pid for pid in marked_processes(marker) if not _is_zombie(pid)})

    _signal_all(alive(), signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_all(alive(), signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_SECONDS)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def supervise(gang: Gang, on_tick: Callable[[list[NodeState]], None], tick_seconds: float = 0.5) -> GangOutcome:
    """Wait for the gang to succeed or for its first failure; stop everything on failure or interrupt."""
    try:
        while (outcome := gang.check()) is None:
            on_tick(gang.states())
            time.sleep(tick_seconds)
        on_tick(gang.states())
    except BaseException:
        gang.stop()
        raise
    if not outcome.succeeded:
        gang.stop()
    return outcome
