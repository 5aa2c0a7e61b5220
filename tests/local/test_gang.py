"""The local gang's start: a launch cut off half-way (Ctrl-C, a node that cannot start) leaves no process of
the run behind, as a gang that started whole leaves none when it is stopped."""

from __future__ import annotations

import signal
import sys
import uuid

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


def test_a_stopped_gang_leaves_nothing_behind(tmp_path) -> None:
    marker = uuid.uuid4().hex
    gang = gangs.Gang([sleeper(tmp_path, 0), sleeper(tmp_path, 1)], marker)
    assert len(gangs.marked_processes(marker)) == 2
    gang.stop()
    assert gangs.marked_processes(marker) == []
    assert [state.exit_code for state in gang.states()] == [-signal.SIGTERM, -signal.SIGTERM]
