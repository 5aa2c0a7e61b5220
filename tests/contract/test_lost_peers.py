"""A lost peer, as the gang sees it: the coordinator names the nodes that stopped answering, as a table, and
real supervisors report a killed node through node rank 0's progress hook, but never a node that answers."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from paralleljob_contract import launcher, peers
from paralleljob_contract.errors import ContractError
from paralleljob_contract.ranks import EXIT_PEER
from tests.contract.helpers import ROOT, free_port_pair

NOW = 100.0


@pytest.mark.parametrize(
    ("last_seen", "ready", "finished", "generation", "since", "named"),
    [
        # Everyone talked within the longest long poll: nobody is named.
        ({1: NOW - 9, 2: NOW - 1}, set(), set(), 0, 0.0, {}),
        # Silent past SILENT_SECONDS: named, with how long.
        ({1: NOW - 16, 2: NOW - 1}, set(), set(), 0, 0.0, {1: 16.0}),
        # A node never heard from may still be starting.
        ({2: NOW - 1}, set(), set(), 0, 0.0, {}),
        # The generation moved on 6 s ago; node 2 alone is not ready for it and quiet for 7 s: late.
        ({1: NOW - 1, 2: NOW - 7}, {0, 1}, set(), 1, NOW - 6, {2: 7.0}),
        # The same, 3 s after it moved on: the survivors may still be stopping their ranks.
        ({1: NOW - 1, 2: NOW - 7}, {0, 1}, set(), 1, NOW - 3, {}),
        # Late for the generation but it spoke a moment ago (it is stopping its ranks): not named.
        ({1: NOW - 1, 2: NOW - 2}, {0, 1}, set(), 1, NOW - 6, {}),
        # A node whose ranks all finished stops talking by design.
        ({1: NOW - 60, 2: NOW - 1}, set(), {1}, 0, 0.0, {}),
    ],
    ids=["all-answer", "silent", "never-heard", "late-for-generation", "not-late-yet", "late-but-talking", "finished"],
)
def test_the_coordinator_names_the_nodes_that_stopped_answering(
    last_seen: dict[int, float], ready: set[int], finished: set[int], generation: int, since: float, named: dict
) -> None:
    assert peers.not_answering(3, last_seen, ready, finished, generation, since, NOW) == named


def test_a_lost_peers_report_reads_back_and_a_bad_one_is_refused_naming_the_entry() -> None:
    text = peers.encode({2: 7.04}, {2: "gpu-7"})
    assert peers.decode(text) == [{"nodeRank": 2, "node": "gpu-7", "silentSeconds": 7.0}]
    assert peers.encode({}, {}) == "[]"
    with pytest.raises(ContractError, match=r"lostPeers\[0\]: expected nodeRank"):
        peers.decode('[{"nodeRank": "two"}]')


# A rank that runs until its peer is lost (OUT/peer-lost appears), then exits as a rank whose collective
# failed on a dead peer does (EXIT_PEER); in generation 1 it waits to be stopped.
RANK_SCRIPT = f"""
import os, pathlib, sys, time
out = pathlib.Path(os.environ["OUT"])
while not (out / "peer-lost").exists() or os.environ["PARALLELJOB_IN_PLACE_RESTARTS"] != "0":
    time.sleep(0.1)
sys.exit({EXIT_PEER})
"""

HOOK = """
import os, pathlib

class Reports:
    def on_lost_peers(self, text):
        with open(pathlib.Path(os.environ["OUT"]) / "reports", "a") as out:
            out.write(text + "\\n")

def create():
    return Reports()
"""


def test_a_killed_node_is_reported_by_node_rank_0_with_its_name_and_the_survivors_are_not(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "peer_hook.py").write_text(HOOK)
    port = free_port_pair()
    procs = []
    for node in range(3):
        env = {**os.environ, "OUT": str(tmp_path), "PARALLELJOB_NODE_NAME": f"gpu-{node}"}
        if node == 0:
            env["PARALLELJOB_PROGRESS_HOOK"] = "peer_hook:create"
            env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
        command = launcher.supervisor_command(
            nodes=3,
            node_rank=node,
            ranks_per_node=1,
            master_addr="127.0.0.1",
            master_port=port,
            in_place_restarts=2,
            command=[sys.executable, "-c", RANK_SCRIPT],
            python=(sys.executable,),
        )
        procs.append(subprocess.Popen(command, env=env, cwd=ROOT, start_new_session=True))
    reports = tmp_path / "reports"
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("*")) or not reports.exists():
            assert time.monotonic() < deadline, "no first report"
            time.sleep(0.1)
        time.sleep(1.5)  # the gang has formed and runs: everyone answers
        assert reports.read_text().splitlines() == ["[]"]
        os.killpg(procs[2].pid, signal.SIGKILL)  # the node is gone: its supervisor and its ranks
        (tmp_path / "peer-lost").touch()  # the survivors' collectives fail on it
        while len(reports.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline + 30, "the killed node was not reported"
            time.sleep(0.2)
        (entry,) = json.loads(reports.read_text().splitlines()[1])
        assert (entry["nodeRank"], entry["node"]) == (2, "gpu-2")
        assert entry["silentSeconds"] >= peers.LATE_SECONDS
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
