"""The local gang's start: a launch cut off half-way (Ctrl-C, a node that cannot start) leaves no process of
the run behind, as a gang that started whole leaves none when it is stopped."""

from __future__ import annotations

import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from paralleljob.local import gang as gangs


def sleeper(tmp_path, rank: int) -> gangs.NodeLaunch:
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    return gangs.NodeLaunch(rank, argv, {}, tmp_path / f"node-{rank}.log", tmp_path / f"node-{rank}.pid")


def test_a_launch_that_fails_half_way_stops_the_nodes_already_started(tmp_path) -> None:
    marker = uuid.uuid4().hex
    unwritable = tmp_path / "a-directory"
    unwritable.mkdir()
    broken = gangs.NodeLaunch(1, ["true"], {}, unwritable, tmp_path / "node-1.pid")  # its log cannot be opened
    try:
        with pytest.raises(IsADirectoryError):
            gangs.Gang([sleeper(tmp_path, 0), broken], marker)
        assert gangs.marked_processes(marker) == [], "node 0 was left running"
    finally:
        gangs._signal_all(gangs.marked_processes(marker), signal.SIGKILL)


def wait_until(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_stopped_gang_leaves_nothing_behind(tmp_path) -> None:
    marker = uuid.uuid4().hex
    gang = gangs.Gang([sleeper(tmp_path, 0), sleeper(tmp_path, 1)], marker)
    # A process's environment reads empty in /proc until its exec is complete, a moment after Popen returns.
    wait_until(lambda: len(gangs.marked_processes(marker)) == 2)
    gang.stop()
    assert gangs.marked_processes(marker) == []
    assert [state.exit_code for state in gang.states()] == [-signal.SIGTERM, -signal.SIGTERM]


def test_a_node_process_the_marker_does_not_find_is_stopped_by_its_pid(tmp_path) -> None:
    """A node whose environment does not carry the run marker (it execs with another one here; the same holds
    for any process until its exec is complete) is still stopped, not left running."""
    marker = uuid.uuid4().hex
    argv = ["env", "-i", sys.executable, "-c", "import time; time.sleep(120)"]
    launch = gangs.NodeLaunch(0, argv, {}, tmp_path / "node-0.log", tmp_path / "node-0.pid")
    gang = gangs.Gang([launch], marker)
    pid = gang.states()[0].pid
    try:
        python = sys.executable.encode()
        # Once `env` has exec'd python with an empty environment, the marker scan no longer finds the node.
        wait_until(
            lambda: (
                Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == python
                and gangs.marked_processes(marker) == []
            )
        )
        gang.stop()
        assert [state.exit_code for state in gang.states()] == [-signal.SIGTERM]
    finally:
        gangs._signal_all([pid], signal.SIGKILL)
