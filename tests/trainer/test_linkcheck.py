"""The link check (paralleljob_trainer.linkcheck): which links a layout has, how they are judged, and, on four
simulated nodes in their own network namespaces, that a link slowed with `tc` to a tenth is named and that
the same nodes unslowed pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paralleljob_contract.layout import Layout
from paralleljob_contract.network import SLOW_LINK, NetworkFailure, slow_nodes
from paralleljob_trainer import linkcheck
from testcluster import netns

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def test_links_follow_the_layout() -> None:
    # PP2 x TP2 x DP2, two ranks per node: ranks 0-1 node 0 (stage 0, replica 0), 2-3 node 1, 4-5 node 2, 6-7 node 3.
    links = linkcheck.links_of(Layout(2, 2, 2), ranks_per_node=2)
    by_kind = {kind: [link.ranks for link in links if link.kind == kind] for kind in linkcheck.KINDS}
    assert by_kind["tensor"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert by_kind["pipeline"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert by_kind["data"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert [link.nodes for link in links if link.kind == "pipeline"] == [(0, 2), (0, 2), (1, 3), (1, 3)]
    assert not any(link.between_nodes for link in links if link.kind == "tensor")


def test_no_data_or_tensor_links_without_those_axes() -> None:
    kinds = {link.kind for link in linkcheck.links_of(Layout(3, 1, 1), ranks_per_node=1)}
    assert kinds == {"pipeline"}


def _timed(layout: Layout, slow_node: int | None, per_node: int = 1) -> list[tuple[linkcheck.Link, float]]:
    # 1 s per link; 10 s for every link that touches the slow node.
    return [
        (link, 10.0 if slow_node in link.nodes and link.between_nodes else 1.0)
        for link in linkcheck.links_of(layout, per_node)
    ]


@pytest.mark.parametrize(
    ("layout", "slow_node", "named"),
    [
        (Layout(2, 1, 2), None, ()),
        (Layout(2, 1, 2), 3, (3,)),
        (Layout(2, 1, 2), 0, (0,)),
        (Layout(2, 2, 4), 5, (5,)),
        (Layout(4, 1, 2), 2, (2,)),
    ],
)
def test_the_node_all_of_whose_links_are_slow_is_named(layout: Layout, slow_node: int | None, named: tuple) -> None:
    result = linkcheck.judge(_timed(layout, slow_node), 4 * MIB)
    assert result.named == named
    assert all(slow_node in m.link.nodes for m in result.slow)


def test_a_single_slow_pair_names_both_of_its_nodes() -> None:
    # PP3 x DP2: only the pipeline pair between nodes 3 and 5 is slow; each of them has fast links too.
    links = linkcheck.links_of(Layout(3, 1, 2), 1)
    timed = [(link, 10.0 if link.nodes == (3, 5) else 1.0) for link in links]
    assert linkcheck.judge(timed, 4 * MIB).named == (3, 5)


def test_a_slow_link_inside_a_node_names_that_node() -> None:
    timed = [(link, 10.0 if link.ranks == (2, 3) else 1.0) for link in linkcheck.links_of(Layout(2, 2, 2), 2)]
    assert linkcheck.judge(timed, 4 * MIB).named == (1,)


def test_bandwidths_are_bus_bandwidths_and_the_plan_is_reported() -> None:
    links = linkcheck.links_of(Layout(2, 1, 2), 1)
    result = linkcheck.judge([(link, 0.01) for link in links], 10**7, {"data": 50.0})
    classes = result.class_summary()
    assert classes["pipeline"]["medianGBps"] == pytest.approx(1.0)  # 10 MB in 10 ms
    assert classes["data"]["medianGBps"] == pytest.approx(1.0)  # 2(n-1)/n = 1 for n = 2
    assert classes["data"]["plannedGBps"] == 50.0
    assert "plannedGBps" not in classes["pipeline"]


def test_planned_bandwidths_come_from_the_environment() -> None:
    env = {"PARALLELJOB_PLANNED_GBPS": "tensor=900, data=50,pipeline=x,bogus=3"}
    assert linkcheck.planned_from_env(env) == {"tensor": 900.0, "data": 50.0}


def test_the_verdict_names_the_nodes_so_the_operator_can_exclude_them() -> None:
    result = linkcheck.judge(_timed(Layout(2, 1, 2), 3), 4 * MIB)
    record = linkcheck.verdict(result, {0: "a", 1: "b", 2: "c", 3: "d"})
    assert (record["verified"], record["reason"], record["slowNodes"]) == ("False", SLOW_LINK, ["d"])
    failure = NetworkFailure("NetworkVerified", record["reason"], record["message"])
    assert slow_nodes(failure) == ["d"]
    assert "pipeline b-d" in record["message"] or "data c-d" in record["message"]
    assert slow_nodes(NetworkFailure("NetworkVerified", "SocketFallback", "slow node x: y")) == []


@pytest.mark.slow
@pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces, tc)")
def test_a_link_slowed_to_a_tenth_is_named_and_none_without_it(tmp_path: Path) -> None:
    # Four simulated nodes (PP2 x DP2, one rank each), each in its own namespace on one bridge.
    bridge = netns.Bridge("lc", 4, subnet=7)
    try:
        healthy = netns.run_linkcheck_ranks(bridge, tmp_path / "healthy.json", Layout(2, 1, 2))
        assert (healthy["verified"], healthy["slowNodes"]) == ("True", [])
        measured_mbit = min(c["medianGBps"] for c in healthy["classes"].values()) * 8000
        bridge.slow(3, measured_mbit / 10)
        slowed = netns.run_linkcheck_ranks(bridge, tmp_path / "slowed.json", Layout(2, 1, 2))
    finally:
        bridge.close()
    print(json.dumps({"healthy": healthy, "slowed": slowed}, indent=1))
    assert (slowed["verified"], slowed["reason"], slowed["slowNodes"]) == ("False", SLOW_LINK, ["n3"])
    assert slowed["message"].startswith("slow node n3: ")
