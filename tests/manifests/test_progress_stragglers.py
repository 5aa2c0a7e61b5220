"""status.progress.stragglers from rank 0's `stragglers` key: validated, named by the placement, bounded."""

from __future__ import annotations

import json

import pytest

from paralleljob.manifests import env, progress
from paralleljob_contract import stragglers

NODES = {0: "gpu-a", 1: "gpu-b", 2: "gpu-c", 3: "gpu-d"}
ONE = [{"nodeRank": 1, "factor": 2.57, "stage": 0, "steps": [21, 40]}]


def copied(value: object, nodes: dict[int, str] = NODES) -> object:
    data = {"step": "40", "stragglers": value if isinstance(value, str) else json.dumps(value)}
    return progress.status_of({"data": data}, 60, nodes)["progress"].get("stragglers")


@pytest.mark.parametrize(
    ("case", "value", "expected"),
    [
        ("named, with its node", ONE, [{**ONE[0], "node": "gpu-b"}]),
        ("none named", [], []),
        ("not JSON", "[{", None),
        ("not a list", {"nodeRank": 1}, None),
        ("an entry without steps", [{"nodeRank": 1, "factor": 2.0, "stage": 0}], None),
        ("a node rank outside the placement is dropped", [{**ONE[0], "nodeRank": 9}], []),
        ("the trainer's node name, matching", [{**ONE[0], "node": "gpu-b"}], [{**ONE[0], "node": "gpu-b"}]),
        ("a node rank since moved to another node is dropped", [{**ONE[0], "node": "gpu-old"}], []),
        ("a window past spec.training.steps is dropped", [{**ONE[0], "steps": [41, 100]}], []),
        ("too long to be a report", "[" + " " * 5000 + "]", None),
    ],
)
def test_stragglers_are_validated(case: str, value: object, expected: object) -> None:
    assert copied(value) == expected, case


def test_without_a_placement_the_node_rank_stays_and_no_name_is_made_up() -> None:
    assert copied(ONE, {}) == ONE


def test_the_trainer_gets_the_policy_in_its_environment() -> None:
    policy = stragglers.Policy(1.5, 10, 3)
    expected = {stragglers.THRESHOLD_ENV: "1.5", stragglers.WINDOW_ENV: "10", stragglers.WINDOWS_ENV: "3"}
    assert env.straggler_env(policy) == expected
    assert stragglers.policy_from_environ(env.straggler_env(policy)) == policy
