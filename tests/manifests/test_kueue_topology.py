"""`manifests.kueue_topology`: the topology request a queued job's Workload makes of Kueue's TAS, the
TopologyAssignment decoded into nodes, and the hard rules an assignment must keep. Plain data throughout."""

from __future__ import annotations

from typing import Any

import pytest

from paralleljob import planning
from paralleljob.manifests import kueue_topology as kt
from paralleljob.manifests import workload as wl
from paralleljob.planning.inventory import build_cluster
from tests.manifests.helpers import make_node, resolve

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", kt.HOSTNAME
LEVELS = [BLOCK, RACK, HOST]


def cluster(*blocks: tuple[int, ...]) -> list[dict[str, str]]:
    """Node labels: `blocks` gives each block's racks by their node counts, e.g. (2, 1) = a rack of 2, one of 1."""
    nodes = []
    for b, racks in enumerate(blocks):
        for r, count in enumerate(racks):
            for n in range(count):
                nodes.append({BLOCK: f"b{b}", RACK: f"b{b}-r{r}", HOST: f"b{b}-r{r}-n{n}"})
    return nodes


# Two blocks of three nodes: a rack of two and a rack of one in each.
SIX = cluster((2, 1), (2, 1))


@pytest.mark.parametrize(
    ("shape", "nodes", "expected"),
    [
        pytest.param(
            kt.Shape(nodes=4, replica_nodes=2),
            SIX,
            {"preferred": BLOCK, "podSetSliceRequiredTopology": RACK, "podSetSliceSize": 2},
            id="2x2x2-on-2-GPU-nodes-each-replica-one-rack-slice-the-gang-preferred-in-a-block-that-cannot-hold-it",
        ),
        pytest.param(
            kt.Shape(nodes=4, replica_nodes=2),
            cluster((4,), (4,)),
            {"preferred": RACK, "podSetSliceRequiredTopology": RACK, "podSetSliceSize": 2},
            id="the-gang-fits-one-rack-preferred-there",
        ),
        pytest.param(
            kt.Shape(nodes=6, replica_nodes=3),
            SIX,
            {"preferred": BLOCK, "podSetSliceRequiredTopology": BLOCK, "podSetSliceSize": 3},
            id="a-replica-of-three-nodes-fits-a-block-not-a-rack",
        ),
        pytest.param(
            kt.Shape(nodes=4, replica_nodes=4),
            SIX,
            {"required": BLOCK},
            id="one-replica-that-fits-no-block-required-at-the-coarsest-level-kueue-says-it-cannot-fit",
        ),
        pytest.param(
            kt.Shape(nodes=2, replica_nodes=2),
            SIX,
            {"required": RACK},
            id="one-replica-required-in-the-finest-level-that-holds-it",
        ),
        pytest.param(
            kt.Shape(nodes=4, replica_nodes=2, mode="Preferred"),
            SIX,
            {"preferred": BLOCK},
            id="preferred-asks-no-slices-kueue-has-no-preferred-slices",
        ),
        pytest.param(
            kt.Shape(nodes=4, replica_nodes=1),
            SIX,
            {"required": BLOCK},
            id="replicas-of-one-node-no-slices-the-gang-required-where-it-fits",
        ),
        pytest.param(
            kt.Shape(nodes=3, replica_nodes=0), SIX, {"preferred": BLOCK}, id="a-budget-layout-not-chosen-yet"
        ),
        pytest.param(
            kt.Shape(nodes=4, replica_nodes=4, tensor_nodes=2, nvlink_label=RACK),
            SIX,
            {"preferred": BLOCK, "podSetSliceRequiredTopology": RACK, "podSetSliceSize": 2},
            id="tensor-groups-of-two-nodes-one-slice-each-in-the-nvlink-level",
        ),
    ],
)
def test_the_request_asks_for_what_the_layout_needs(
    shape: kt.Shape, nodes: list[dict[str, str]], expected: dict[str, Any]
) -> None:
    assert kt.request_for(shape, LEVELS, nodes) == expected


@pytest.mark.parametrize(
    ("parallelism", "gpus_per_node", "expected"),
    [
        pytest.param({"pipeline": 2, "tensor": 2, "data": 2}, 2, kt.Shape(4, 2), id="2x2x2-on-2-GPU-nodes"),
        pytest.param({"pipeline": 2, "tensor": 2, "data": 2}, 4, kt.Shape(2, 1), id="2x2x2-on-4-GPU-nodes"),
        pytest.param({"pipeline": 1, "tensor": 2, "data": 4}, 4, kt.Shape(2, 0), id="two-replicas-share-a-node"),
    ],
)
def test_the_shape_of_a_job(parallelism: dict[str, int], gpus_per_node: int, expected: kt.Shape) -> None:
    resolved = resolve(parallelism=parallelism, gpusPerNode=gpus_per_node, deepspeed={})
    assert kt.shape_for(resolved, wl.pod_count(resolved) or 0) == expected


def test_the_workload_carries_the_request_in_its_pod_set() -> None:
    job = {"metadata": {"name": "gpt", "namespace": "research", "uid": "u1", "labels": {wl.QUEUE_LABEL: "q"}}}
    request = {"preferred": BLOCK, "podSetSliceRequiredTopology": RACK, "podSetSliceSize": 2}
    body = wl.build_workload(job, resolve(), "q", 4, None, request)
    assert body["spec"]["podSets"][0]["topologyRequest"] == request
    assert "topologyRequest" not in wl.build_workload(job, resolve(), "q", 4, None)["spec"]["podSets"][0]
    assert kt.pod_annotation(request) == (kt.PREFERRED_ANNOTATION, BLOCK)
    assert kt.pod_annotation({"required": RACK}) == (kt.REQUIRED_ANNOTATION, RACK)


# Kueue's own examples (workload_types.go, TopologyAssignment): the same assignment in its encodings.
BLOCK_RACK_INDIVIDUAL = {
    "levels": [BLOCK, RACK],
    "slices": [
        {
            "domainCount": 2,
            "valuesPerLevel": [{"individual": {"roots": ["b0", "b0"]}}, {"individual": {"roots": ["b0-r0", "b0-r1"]}}],
            "podCounts": {"individual": [2, 1]},
        }
    ],
}
BLOCK_RACK_UNIVERSAL = {
    "levels": [BLOCK, RACK],
    "slices": [
        {
            "domainCount": 2,
            "valuesPerLevel": [{"universal": "b0"}, {"individual": {"prefix": "b0-r", "roots": ["0", "1"]}}],
            "podCounts": {"individual": [2, 1]},
        }
    ],
}
HOSTS_TWO_SLICES = {
    "levels": [HOST],
    "slices": [
        {
            "domainCount": 2,
            "valuesPerLevel": [{"individual": {"prefix": "b0-r0-n", "roots": ["0", "1"]}}],
            "podCounts": {"universal": 1},
        },
        {
            "domainCount": 1,
            "valuesPerLevel": [{"individual": {"prefix": "b0-r", "roots": ["1"], "suffix": "-n0"}}],
            "podCounts": {"universal": 1},
        },
    ],
}


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param(BLOCK_RACK_INDIVIDUAL, id="individual-values"),
        pytest.param(BLOCK_RACK_UNIVERSAL, id="universal-value-and-prefix"),
        pytest.param(HOSTS_TWO_SLICES, id="hostnames-in-two-slices-prefix-and-suffix"),
    ],
)
def test_every_encoding_of_an_assignment_names_the_same_three_nodes(encoded: dict[str, Any]) -> None:
    labels = {node[HOST]: node for node in SIX}
    assignment = kt.decode(encoded)
    assert assignment.pods == 3
    assert kt.assigned_nodes(assignment, labels) == kt.AssignedNodes(("b0-r0-n0", "b0-r0-n1", "b0-r1-n0"))


def test_the_assignment_is_read_from_the_workloads_admission() -> None:
    workload = {
        "status": {"admission": {"podSetAssignments": [{"name": "main", "topologyAssignment": HOSTS_TWO_SLICES}]}}
    }
    found = kt.assigned_domains(workload)
    assert found is not None and found.levels == (HOST,) and len(found.domains) == 3
    assert kt.assigned_domains({"status": {"admission": {"podSetAssignments": [{"name": "main"}]}}}) is None


@pytest.mark.parametrize(
    ("encoded", "broken"),
    [
        pytest.param(
            {
                "levels": [HOST],
                "slices": [
                    {"domainCount": 1, "valuesPerLevel": [{"universal": "b0-r0-n0"}], "podCounts": {"universal": 2}}
                ],
            },
            "one pod per node: Kueue assigned 2 pods to b0-r0-n0",
            id="two-pods-on-one-host",
        ),
        pytest.param(
            {
                "levels": [BLOCK, RACK],
                "slices": [
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"universal": "b0"}, {"universal": "b0-r1"}],
                        "podCounts": {"universal": 2},
                    }
                ],
            },
            f"one pod per node: 2 pods in {BLOCK}=b0, {RACK}=b0-r1, which has 1 nodes",
            id="more-pods-than-nodes-in-a-rack",
        ),
    ],
)
def test_an_assignment_that_puts_two_pods_on_a_node_breaks_one_pod_per_node(
    encoded: dict[str, Any], broken: str
) -> None:
    labels = {node[HOST]: node for node in SIX}
    assert kt.assigned_nodes(kt.decode(encoded), labels) == kt.AssignedNodes((), broken)


@pytest.mark.parametrize(
    ("nodes", "nvlink", "broken"),
    [
        pytest.param(["b0-r0-n0", "b0-r0-n1"], RACK, None, id="a-tensor-group-in-one-rack-domain"),
        pytest.param(["b0-r0-n0", "b0-r1-n0"], RACK, "b0-r0, b0-r1", id="split-across-two-domains"),
        pytest.param(["b0-r0-n0", "b0-r0-n1"], None, "spans nodes of 4 GPUs", id="no-nvlink-label-at-all"),
    ],
)
def test_a_tensor_group_wider_than_a_node_needs_its_nodes_in_one_nvlink_domain(
    nodes: list[str], nvlink: str | None, broken: str | None
) -> None:
    labels = {node[HOST]: node for node in SIX}
    found = kt.broken_rule(nodes, labels, tensor=8, gpus_per_node=4, nvlink=nvlink)
    assert (found is None) if broken is None else (broken in (found or "") and "tensor group" in (found or ""))
    assert kt.broken_rule(nodes, labels, tensor=4, gpus_per_node=4, nvlink=None) is None


def test_the_finest_level_holding_counts_nodes_of_one_domain_and_skips_the_hostname_for_more_than_one() -> None:
    assert kt.finest_level_holding(LEVELS, SIX, 1) == HOST
    assert kt.finest_level_holding(LEVELS, SIX, 2) == RACK
    assert kt.finest_level_holding(LEVELS, SIX, 3) == BLOCK
    assert kt.finest_level_holding(LEVELS, SIX, 4) is None
    topology = {"spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]}}
    assert kt.levels_of(topology) == LEVELS


@pytest.mark.parametrize(
    ("status", "known", "not_ready", "expected"),
    [
        pytest.param({}, {"a", "b"}, set(), [], id="all-assigned-nodes-ready"),
        pytest.param({}, {"a"}, set(), ["b"], id="an-assigned-node-deleted"),
        pytest.param({}, {"a", "b"}, {"a"}, ["a"], id="an-assigned-node-not-ready"),
        pytest.param({"unhealthyNodes": [{"name": "b"}]}, {"a", "b"}, set(), ["b"], id="kueue-marked-it-unhealthy"),
    ],
)
def test_the_gang_waits_for_kueue_to_replace_an_assigned_node_that_is_lost(
    status: dict[str, Any], known: set[str], not_ready: set[str], expected: list[str]
) -> None:
    found = kt.awaiting_replacement(["a", "b"], {"status": status}, frozenset(known), frozenset(not_ready))
    assert found == expected


def test_the_planner_places_each_pipeline_replica_inside_one_rack_of_the_nodes_kueue_assigned() -> None:
    """Kueue's slices say how many pods go to a rack, not which rank each pod runs: on the four assigned nodes
    (two racks of two, out of six), the cost model keeps each replica's two stages in one rack."""
    nodes = [make_node(labels[HOST], labels, {"nvidia.com/gpu": "2"}) for labels in SIX]
    assignment = kt.decode(
        {
            "levels": [HOST],
            "slices": [
                {
                    "domainCount": 4,
                    "valuesPerLevel": [{"individual": {"roots": ["b0-r0-n0", "b1-r0-n0", "b0-r0-n1", "b1-r0-n1"]}}],
                    "podCounts": {"universal": 1},
                }
            ],
        }
    )
    assigned = kt.assigned_nodes(assignment, {labels[HOST]: labels for labels in SIX})
    inside = [node for node in nodes if node["metadata"]["name"] in assigned.nodes]
    resolved = resolve(
        parallelism={"pipeline": 2, "tensor": 2, "data": 2},
        gpusPerNode=2,
        topology={"levels": [BLOCK, RACK]},
        model={"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "sequenceLength": 64, "vocabSize": 256},
    )
    plan = planning.plan_job(resolved, build_cluster(inside))
    assert isinstance(plan, planning.Plan), plan
    assert {entry.node for entry in plan.nodes} == set(assigned.nodes)
    replicas: dict[int, set[str]] = {}
    for entry in plan.nodes:
        for coord in entry.coords:
            replicas.setdefault(coord.data, set()).add(entry.node.rsplit("-", 1)[0])  # the node's rack
    assert sorted(map(len, replicas.values())) == [1, 1], replicas
