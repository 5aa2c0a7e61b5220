"""The operator's Straggler condition and SlowNode Event from status.progress.stragglers (pure, a table)."""

from __future__ import annotations

import pytest

from paralleljob.handlers import stragglers

SLOW = {"nodeRank": 1, "node": "gpu-b", "factor": 2.57, "stage": 0, "steps": [21, 40]}
MESSAGE = "gpu-b (node rank 1, stage 0) computed 2.57x its peers' median over steps 21-40"


@pytest.mark.parametrize(
    ("named", "expected"),
    [
        (None, None),
        ([], ("False", "NoSlowNode", "no node computed slower than its peers by more than 1.3x")),
        ([SLOW], ("True", "SlowNode", MESSAGE)),
        ([{**SLOW, "node": None}], ("True", "SlowNode", MESSAGE.replace("gpu-b", "node rank 1", 1))),
    ],
)
def test_the_condition(named: list | None, expected: tuple | None) -> None:
    found = stragglers.verdict(named, 1.3)
    assert (found and (found.status, found.reason, found.message)) == expected


@pytest.mark.parametrize(
    ("before", "named", "due"),
    [
        (None, [SLOW], True),
        ({"status": "False", "message": "x"}, [SLOW], True),
        ({"status": "True", "message": MESSAGE}, [SLOW], False),  # the same window again: no second Event
        ({"status": "True", "message": MESSAGE}, [{**SLOW, "steps": [41, 60]}], True),  # named again, next window
        ({"status": "True", "message": MESSAGE}, [], False),
        (None, None, False),
    ],
)
def test_when_a_slow_node_event_is_due(before: dict | None, named: list | None, due: bool) -> None:
    assert stragglers.event_due(before, stragglers.verdict(named, 1.3)) is due


@pytest.mark.parametrize(
    ("named", "action", "excluded", "expected"),
    [
        ([SLOW], "Report", [], {}),
        ([SLOW], "Replace", [], {"gpu-b": "is slower than its peers (2.57x, stage 0)"}),
        ([SLOW], "Replace", ["gpu-b"], {}),  # already excluded (replaced): not again
        ([{**SLOW, "node": "gpu-gone"}], "Replace", [], {}),  # no longer in the gang
        ([{**SLOW, "node": None}], "Replace", [], {}),  # unnamed: never acted on
        ([], "Replace", [], {}),
        (None, "Replace", [], {}),
    ],
)
def test_which_nodes_replace_takes_out(named: list | None, action: str, excluded: list, expected: dict) -> None:
    assert stragglers.to_replace(named, ["gpu-a", "gpu-b"], excluded, action) == expected


@pytest.mark.parametrize(
    ("named", "labels", "key", "expected"),
    [
        ([SLOW], {"gpu-b": {}}, "paralleljob.io/slow-node", ["gpu-b"]),
        # Labelled once: a node that carries the label already is not patched again.
        ([SLOW], {"gpu-b": {"paralleljob.io/slow-node": "true"}}, "paralleljob.io/slow-node", []),
        # The chart's slowNodeLabel off: no label at all.
        ([SLOW], {"gpu-b": {}}, "", []),
        # A node that is gone, or an entry without a node, is not labelled.
        ([SLOW, {**SLOW, "node": None}], {}, "paralleljob.io/slow-node", []),
        (None, {"gpu-b": {}}, "paralleljob.io/slow-node", []),
    ],
    ids=["named", "already-labelled", "off", "gone", "none-named"],
)
def test_the_nodes_labelled_for_administrators(named: list | None, labels: dict, key: str, expected: list) -> None:
    assert stragglers.to_label(named, labels, key) == expected
