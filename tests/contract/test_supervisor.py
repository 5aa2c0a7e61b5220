"""The in-pod supervisor: the gang's shared state as a table, and real supervisors of small Python ranks.

The ranks here are a few lines of Python (no torch), so these run in seconds; tests/local/test_run.py runs the
supervisor with the bundled trainer.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from paralleljob_contract import launcher
from paralleljob_contract.coordinator import GangState
from paralleljob_contract.ranks import EXIT_PEER
from paralleljob_contract.supervisor import EXIT_NO_PROGRESS
from tests.contract.helpers import ROOT, free_port_pair


@pytest.mark.parametrize(
    ("reports", "generation", "failed"),
    [
        ([(0, 1, "rank 3 exited with code 1", False)], 1, None),
        # Every node whose ranks fell with the first one reports the same generation: one restart, not three.
        ([(0, 1, "killed", False), (0, 0, "exited with code 4", False), (0, 2, "exited with code 4", False)], 1, None),
        ([(0, 1, "a", False), (1, 0, "b", False)], 2, None),
        ([(0, 1, "a", False), (1, 0, "b", False), (2, 1, "c", False)], 2, "node 1: c (in-place restarts spent: 2)"),
        ([(0, 1, "rank 2 exited with code 6", True)], 0, "node 1: rank 2 exited with code 6"),
    ],
    ids=["one-failure", "stale-reports-ignored", "two-failures", "budget-spent", "permanent-failure"],
)
def test_a_failure_moves_the_gang_to_its_next_generation_until_the_budget_is_spent(
    reports: list[tuple[int, int, str, bool]], generation: int, failed: str | None
) -> None:
    state = GangState(nodes=3, in_place_restarts=2)
    for reported_generation, node, reason, permanent in reports:
        state.report_failure(reported_generation, node, reason, permanent)
    assert (state.generation, state.failed) == (generation, failed)


# A rank: records its generation and placement, then fails where FAIL_RANK says (in generations below FAIL_UNTIL),
# waits to be stopped where it is a peer of a failing rank in that generation, and succeeds otherwise.
RANK_SCRIPT = """
import os, pathlib, sys, time
rank, generation = int(os.environ["RANK"]), int(os.environ["PARALLELJOB_IN_PLACE_RESTARTS"])
out = pathlib.Path(os.environ["OUT"])
(out / f"rank{rank}-gen{generation}").write_text(f"{os.environ['LOCAL_RANK']} {os.environ['WORLD_SIZE']} {os.getppid()}")
if generation < int(os.environ["FAIL_UNTIL"]):
    if rank == int(os.environ["FAIL_RANK"]):
        time.sleep(0.5)
        sys.exit(1)
    time.sleep(60)
"""


def run_gang(
    tmp_path: pathlib.Path,
    budget: int,
    fail_until: int,
    script: str = RANK_SCRIPT,
    progress_timeouts: tuple[float | None, float | None] = (None, None),
    beats: int = 30,
) -> tuple[list[int], list[subprocess.CompletedProcess[str]]]:
    """Two nodes of two ranks, each node's supervisor a process of its own, as two pods; `progress_timeouts` are
    node 0's and node 1's."""
    port = free_port_pair()
    env = {**os.environ, "OUT": str(tmp_path), "FAIL_RANK": "3", "FAIL_UNTIL": str(fail_until), "BEATS": str(beats)}
    procs = [
        subprocess.Popen(
            launcher.supervisor_command(
                nodes=2,
                node_rank=node,
                ranks_per_node=2,
                master_addr="127.0.0.1",
                master_port=port,
                in_place_restarts=budget,
                command=[sys.executable, "-c", script],
                python=(sys.executable,),
                progress_timeout_seconds=progress_timeouts[node],
            ),
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(2)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return [proc.pid for proc in procs], results


def test_a_failed_rank_restarts_every_node_s_ranks_in_place_with_their_ranks_fixed_by_placement(
    tmp_path: pathlib.Path,
) -> None:
    supervisors, results = run_gang(tmp_path, budget=2, fail_until=1)
    assert [r.returncode for r in results] == [0, 0], "\n".join(r.stdout for r in results)
    # Generation 1 ran every rank again, under the same two supervisors (the pods), each rank where placement
    # put it: global rank = node rank * 2 + local rank.
    for rank in range(4):
        for generation in (0, 1):
            local, world, parent = (tmp_path / f"rank{rank}-gen{generation}").read_text().split()
            assert (int(local), int(world), int(parent)) == (rank % 2, 4, supervisors[rank // 2])
    assert not list(tmp_path.glob("rank*-gen2"))
    assert "in-place restart 1/2: node 1: rank 3 exited with code 1" in results[0].stdout


def test_a_gang_that_spent_its_in_place_budget_fails_its_pods_for_a_gang_restart(tmp_path: pathlib.Path) -> None:
    _, results = run_gang(tmp_path, budget=1, fail_until=99)
    # The failing rank's node exits with its rank's code; the other with the trainer's "a peer failed".
    assert [r.returncode for r in results] == [EXIT_PEER, 1], "\n".join(r.stdout for r in results)
    assert sorted(p.name for p in tmp_path.glob("rank3-gen*")) == ["rank3-gen0", "rank3-gen1"]
    assert "in-place restarts spent: 1" in results[1].stdout


# A rank that beats every 0.1 s BEATS times (3 s by default) and finishes (rank 0 at once: a finished rank beats no
# more and is not hung), except rank 3 in generations below FAIL_UNTIL: it beats five times and then hangs (as in a
# collective that never returns), neither failing nor beating.
BEATING_RANK_SCRIPT = """
import os, pathlib, time
from paralleljob_contract import heartbeat
rank, generation = int(os.environ["RANK"]), int(os.environ["PARALLELJOB_IN_PLACE_RESTARTS"])
(pathlib.Path(os.environ["OUT"]) / f"rank{rank}-gen{generation}").write_text("started")
hangs = generation < int(os.environ["FAIL_UNTIL"]) and rank == int(os.environ["FAIL_RANK"])
for beat in range(0 if rank == 0 else int(os.environ.get("BEATS", "30"))):
    if hangs and beat == 5:
        time.sleep(600)
    heartbeat.beat()
    time.sleep(0.1)
"""


def test_a_rank_that_stops_beating_restarts_the_gang_in_place_and_beating_ranks_are_left_alone(
    tmp_path: pathlib.Path,
) -> None:
    # Every rank runs 6 s, twice node 1's timeout: only the one that went quiet is judged hung. Node 0 allows its
    # ranks 30 s, so that a rank of it slow to start on a loaded machine (seconds of silence before its first beat)
    # cannot be judged hung in rank 3's stead; node 1's 3 s leave its ranks of generation 1 that much to start.
    _, results = run_gang(
        tmp_path, budget=2, fail_until=1, script=BEATING_RANK_SCRIPT, progress_timeouts=(30.0, 3.0), beats=60
    )
    output = "\n".join(r.stdout for r in results)
    assert [r.returncode for r in results] == [0, 0], output
    assert re.search(r"in-place restart 1/2: node 1: rank 3 made no progress for \d+s \(progress timeout 3s\)", output)
    assert sorted(p.name for p in tmp_path.glob("rank*-gen1")) == [f"rank{r}-gen1" for r in range(4)]
    assert not list(tmp_path.glob("rank*-gen2"))


def test_a_gang_that_hangs_past_its_in_place_budget_fails_its_pods_for_a_gang_restart(tmp_path: pathlib.Path) -> None:
    # Node 0 allows 30 s (see above): on a loaded machine a 1 s timeout there judged one of its own healthy ranks
    # hung before node 1's report arrived, and both pods exited 124. Its ranks beat for 20 s, so that they are
    # still running when the gang gives up, however slowly node 1 notices rank 3 (they are stopped then).
    _, results = run_gang(
        tmp_path, budget=1, fail_until=99, script=BEATING_RANK_SCRIPT, progress_timeouts=(30.0, 1.0), beats=200
    )
    assert [r.returncode for r in results] == [EXIT_PEER, EXIT_NO_PROGRESS], "\n".join(r.stdout for r in results)
    assert "in-place restarts spent: 1" in results[1].stdout
