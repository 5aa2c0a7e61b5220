"""The lost-peer policy as a table: a node breaks its gang on its gang's report and its stale Lease together,
never on one of them (`handlers.lost_peers.decide`)."""

from __future__ import annotations

import pytest

from paralleljob.handlers import lost_peers
from paralleljob.manifests import progress

THRESHOLD = 20.0


@pytest.mark.parametrize(
    ("reported", "lease_age", "lost", "recheck_in"),
    [
        # Both signals: lost at once, saying both.
        ({"gpu-3": 7.0}, {"gpu-3": 21.0}, {"gpu-3"}, None),
        # The gang's word alone (its Lease is fresh): a blip, but looked at again when the Lease would be stale.
        ({"gpu-3": 7.0}, {"gpu-3": 4.0}, set(), 16.5),
        # A stale Lease the gang does not report: never looked at, nothing happens.
        ({}, {"gpu-3": 60.0}, set(), None),
        # No Lease at all is no signal: the node is judged as before (NotReady, deleted).
        ({"gpu-3": 7.0}, {"gpu-3": None}, set(), None),
        # Two reported, one stale: only that one; the other due when its Lease would be.
        ({"gpu-3": 7.0, "gpu-5": 6.0}, {"gpu-3": 25.0, "gpu-5": 18.0}, {"gpu-3"}, 2.5),
    ],
    ids=["both-signals", "gang-only", "lease-only", "no-lease", "one-of-two"],
)
def test_a_node_is_lost_only_on_its_gang_s_report_and_its_stale_lease_together(
    reported: dict[str, float], lease_age: dict[str, float | None], lost: set[str], recheck_in: float | None
) -> None:
    found = lost_peers.decide(reported, lease_age, THRESHOLD)
    assert (set(found.lost), found.recheck_in) == (lost, recheck_in)


def test_the_reason_names_both_signals_and_the_threshold() -> None:
    found = lost_peers.decide({"gpu-3": 7.2}, {"gpu-3": 21.4}, THRESHOLD)
    assert found.lost == {
        "gpu-3": "stopped answering its gang (7s) and its Lease was last renewed 21s ago (threshold 20s)"
    }


def test_a_zero_threshold_turns_the_gang_s_report_off() -> None:
    assert lost_peers.decide({"gpu-3": 60.0}, {"gpu-3": 600.0}, 0.0) == lost_peers.Evidence()


@pytest.mark.parametrize(
    ("data", "reported"),
    [
        ({"lostPeers": '[{"nodeRank":2,"node":"gpu-3","silentSeconds":7.5}]'}, {"gpu-3": 7.5}),
        ({"lostPeers": "[]"}, {}),
        ({}, {}),
        # Whatever a pod's token writes that is not a well-formed report moves nothing.
        ({"lostPeers": "gpu-3"}, {}),
        ({"lostPeers": '[{"nodeRank":2,"node":"gpu-3","silentSeconds":"long"}]'}, {}),
        ({"lostPeers": '[{"nodeRank":2,"node":"","silentSeconds":7}]'}, {}),
    ],
    ids=["one-node", "none", "absent", "not-json", "bad-entry", "no-name"],
)
def test_the_gang_s_report_is_read_from_the_progress_channel_only_when_well_formed(data: dict, reported: dict) -> None:
    assert progress.lost_peers_of({"data": data}) == reported
