"""The straggler comparison (paralleljob_contract.stragglers): which nodes a window of compute times names."""

from __future__ import annotations

import pytest

from paralleljob_contract import stragglers
from paralleljob_contract.errors import ContractError
from paralleljob_contract.layout import Layout

# PP2 x TP2 x DP2 on 4 nodes of 2 ranks: node 0 = stage 0 replica 0, node 1 = stage 0 replica 1,
# node 2 = stage 1 replica 0, node 3 = stage 1 replica 1. Stage 1 computes more (the head) than stage 0.
QUICKSTART = Layout(pipeline=2, tensor=2, data=2)
EVEN = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def _named(compute: list[float], layout: Layout = QUICKSTART, per_node: int = 2, threshold: float = 1.3) -> list:
    found = stragglers.name_stragglers(compute, layout, per_node, (1, 20), threshold, ["n0", "n1", "n2", "n3"])
    return [(s.node_rank, round(s.factor, 2), s.stage) for s in found]


@pytest.mark.parametrize(
    ("case", "compute", "expected"),
    [
        ("uneven stages, even replicas: none", EVEN, []),
        ("node 1 three times slower than its peer", [1.0, 1.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0], [(1, 3.0, 0)]),
        ("one slow rank is enough to name its node", [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.8], [(3, 1.4, 1)]),
        ("slow by exactly the threshold: not named", [1.0, 1.0, 1.3, 1.3, 2.0, 2.0, 2.0, 2.0], []),
        ("the whole gang slow alike: none", [x * 3 for x in EVEN], []),
        ("stage 1 slow in every replica: none", [1.0, 1.0, 1.0, 1.0, 6.0, 6.0, 6.0, 6.0], []),
        ("two slow nodes, slowest first", [1.0, 1.0, 2.0, 2.0, 6.0, 6.0, 2.0, 2.0], [(2, 3.0, 1), (1, 2.0, 0)]),
        # The ranks that wait on node 1 do not compute longer: only node 1 is named.
        ("waiting is not computing", [1.0, 1.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0], [(1, 3.0, 0)]),
    ],
)
def test_names_nodes_slower_than_their_peers(case: str, compute: list[float], expected: list) -> None:
    assert _named(compute) == expected, case


def test_a_median_of_peers_outvotes_one_fast_peer() -> None:
    # DP4, one rank per node: node 0 is fast, nodes 1-3 normal; nobody is slower than the median of its peers by 1.3.
    layout = Layout(pipeline=1, tensor=1, data=4)
    found = stragglers.name_stragglers([0.5, 1.0, 1.0, 1.1], layout, 1, (1, 20))
    assert found == []
    slow = stragglers.name_stragglers([1.0, 1.0, 1.0, 1.5], layout, 1, (21, 40))
    assert [(s.node_rank, s.factor, s.first_step, s.last_step) for s in slow] == [(3, 1.5, 21, 40)]


def test_no_peers_on_other_nodes_names_nothing() -> None:
    # One node per stage: both replicas of a stage share a node, so a slow node has no peer elsewhere.
    assert _named([1.0, 1.0, 1.0, 1.0, 9.0, 9.0, 9.0, 9.0], per_node=4) == []
    # data 1: no replicas at all.
    assert stragglers.name_stragglers([1.0, 9.0], Layout(pipeline=2, tensor=1, data=1), 1, (1, 20)) == []


def test_the_report_is_bounded_and_round_trips() -> None:
    layout = Layout(pipeline=1, tensor=1, data=64)
    compute = [1.0] * 32 + [float(2 + i) for i in range(32)]
    found = stragglers.name_stragglers(compute, layout, 1, (1, 20), node_names=[f"node-{i}" for i in range(64)])
    assert len(found) == stragglers.MAX_REPORTED
    assert found[0].node == "node-63"
    text = stragglers.encode(found)
    assert len(text) < 2048
    decoded = stragglers.decode(text)
    assert decoded[0] == {"nodeRank": 63, "factor": 33.0, "stage": 0, "steps": [1, 20], "node": "node-63"}
    assert stragglers.decode(stragglers.encode([])) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ('{"nodeRank": 1}', "expected a JSON list"),
        ('[{"nodeRank": 1, "factor": 2.0, "stage": 0}]', "stragglers[0]"),
        ('[{"nodeRank": -1, "factor": 2.0, "stage": 0, "steps": [1, 20]}]', "stragglers[0]"),
    ],
)
def test_bad_reports_are_named(text: str, message: str) -> None:
    with pytest.raises(ContractError, match=message.replace("[", r"\[").replace("]", r"\]")):
        stragglers.decode(text)


def test_wrong_rank_count_is_an_error() -> None:
    with pytest.raises(ContractError, match="layout has 8"):
        stragglers.name_stragglers([1.0], QUICKSTART, 2, (1, 20))


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (1.3, 20, 2)),
        ({stragglers.THRESHOLD_ENV: "1.5", stragglers.WINDOW_ENV: "10", stragglers.WINDOWS_ENV: "1"}, (1.5, 10, 1)),
        ({stragglers.WINDOW_ENV: "0"}, (1.3, 0, 2)),
    ],
)
def test_policy_from_environ(environ: dict[str, str], expected: tuple[float, int, int]) -> None:
    assert stragglers.policy_from_environ(environ) == expected


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({stragglers.THRESHOLD_ENV: "0.9"}, "above 1.0"),
        ({stragglers.THRESHOLD_ENV: "fast"}, "expected a number"),
        ({stragglers.WINDOW_ENV: "2.5"}, "whole number"),
        ({stragglers.WINDOW_ENV: "-1"}, "whole number"),
        ({stragglers.WINDOWS_ENV: "0"}, "WINDOWS: must be a whole number of windows, 1 or more"),
    ],
)
def test_bad_policy_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        stragglers.policy_from_environ(environ)


def slow(node_rank: int, first: int, last: int) -> stragglers.Straggler:
    return stragglers.Straggler(node_rank, 2.0, 0, first, last)


def test_a_node_is_named_after_its_windows_in_a_row_over_all_of_them() -> None:
    named, streaks = stragglers.persisting([slow(1, 1, 20), slow(2, 1, 20)], {}, 2)
    assert named == [] and streaks == {1: (1, 1), 2: (1, 1)}
    # Node 2 was fast in the second window: its run starts again; node 1's second slow window names it.
    named, streaks = stragglers.persisting([slow(1, 21, 40)], streaks, 2)
    assert named == [slow(1, 1, 40)] and streaks == {1: (2, 1)}
    named, streaks = stragglers.persisting([slow(1, 41, 60), slow(2, 41, 60)], streaks, 2)
    assert named == [slow(1, 1, 60)] and streaks == {1: (3, 1), 2: (1, 41)}


def test_one_window_names_at_once() -> None:
    assert stragglers.persisting([slow(3, 21, 40)], {}, 1) == ([slow(3, 21, 40)], {3: (1, 21)})
