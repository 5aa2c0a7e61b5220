"""Small hand-made clusters whose best placement is known."""

from __future__ import annotations

from paralleljob import planning
from tests.planning.clusters import node, plan, pod, small_job

CLIQUE = "nvidia.com/gpu.clique"
# The pods' IMEX channel (a ComputeDomain's claim), without which NCCL cannot use NVLink between nodes.
IMEX = (
    "  network: {imexChannelClaim: imex}\n"
    "  template: {resourceClaims: [{name: imex, resourceClaimTemplateName: gpt-domain-channel}]}\n"
)


def test_consecutive_stages_share_a_leaf_even_when_name_order_alternates_leaves() -> None:
    nodes = [node("n1", leaf="a"), node("n2", leaf="b"), node("n3", leaf="a"), node("n4", leaf="b")]
    placed = plan(small_job(pipeline=2, tensor=8, data=1), nodes)
    assert placed.node_names() in (["n1", "n3"], ["n2", "n4"])
    assert placed.cost.levels["pipeline"] == "leaf"
    assert placed.naive_cost is not None and placed.naive_cost.seconds > placed.cost.seconds


def test_a_part_used_leaf_is_taken_before_a_whole_free_one_is_broken_up() -> None:
    nodes = [node(f"free-{i}", leaf="whole") for i in range(4)]
    nodes += [node(f"part-{i}", leaf="partial") for i in range(4)]
    pods = [pod("other-0", "part-0", 8), pod("other-1", "part-1", 8)]
    placed = plan(small_job(pipeline=2, tensor=8, data=1), nodes, pods)
    assert sorted(placed.node_names()) == ["part-2", "part-3"]


def test_the_job_stays_in_one_spine_when_one_spine_holds_it() -> None:
    nodes = [node(f"x{i}", leaf=f"l{i % 2}", spine="s0") for i in range(2)]
    nodes += [node(f"y{i}", leaf=f"m{i % 4}", spine="s1") for i in range(4)]
    placed = plan(small_job(pipeline=4, tensor=8, data=1), nodes)
    assert {entry.domains["network.topology.nvidia.com/spine"] for entry in placed.nodes} == {"s1"}


def test_a_node_with_exactly_the_gpus_needed_is_preferred_over_a_whole_free_one() -> None:
    nodes = [node("big", leaf="a"), node("half-used", leaf="a")]
    placed = plan(small_job(pipeline=1, tensor=4, data=1, gpus_per_node=4), nodes, [pod("p", "half-used", 4)])
    assert placed.node_names() == ["half-used"]


def test_ranks_per_node_follows_the_nodes_when_gpus_per_node_is_absent() -> None:
    assert plan(small_job(2, 4, 2), [node(f"n{i}", gpus=8) for i in range(2)]).ranks_per_node == 8
    assert plan(small_job(2, 4, 2), [node(f"n{i}", gpus=4) for i in range(4)]).ranks_per_node == 4


def test_node_ranks_number_ranks_as_torchrun_does() -> None:
    placed = plan(small_job(2, 2, 2, gpus_per_node=4), [node("n0", gpus=4), node("n1", gpus=4)])
    assert [entry.ranks for entry in placed.nodes] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert placed.to_dict()["nodes"][0]["coords"][:3] == [
        {"pipe": 0, "data": 0, "model": 0},
        {"pipe": 0, "data": 0, "model": 1},
        {"pipe": 0, "data": 1, "model": 0},
    ]


def test_without_an_imex_channel_a_tensor_group_stays_in_one_node_and_the_plan_says_why() -> None:
    gb200 = {"nvidia.com/gpu.product": "NVIDIA-GB200", "nvidia.com/gpu.memory": "189471"}
    # Topograph's label, auto-detected: the planner used to lay TP across these nodes with MNNVL off.
    topograph = "network.topology.nvidia.com/accelerator"
    nodes = [node(f"b{i}", gpus=4, leaf="lb", labels={**gb200, topograph: "nvl72-b"}) for i in range(4)]
    refused = planning.plan_job(small_job(pipeline=2, tensor=8, data=1), planning.build_cluster(nodes, []))
    assert isinstance(refused, planning.Unschedulable)
    assert "no IMEX channel, so tensor-parallel groups stay inside one node" in refused.message
    placed = plan(small_job(pipeline=2, tensor=4, data=2), nodes)
    assert placed.nvlink_domain_label is None
    assert placed.cost.levels["tensor"] == "node"
    assert any("spec.network.imexChannelClaim" in warning for warning in placed.warnings)


def test_a_tensor_group_of_8_spans_two_4_gpu_nodes_of_one_nvl72_clique() -> None:
    # GB200 NVL72-style: 4 GPUs per Kubernetes node, racks are NVLink cliques under their own leaf. Rack a has
    # one node busy, so only rack b can give the job's 4 nodes as two pairs in one NVLink domain.
    gb200 = {"nvidia.com/gpu.product": "NVIDIA-GB200", "nvidia.com/gpu.memory": "189471"}
    nodes = [node(f"a{i}", gpus=4, leaf="la", labels={**gb200, CLIQUE: "rack-a.0"}) for i in range(4)]
    nodes += [node(f"b{i}", gpus=4, leaf="lb", labels={**gb200, CLIQUE: "rack-b.0"}) for i in range(4)]
    extra = f"  topology: {{nvlinkDomainLabel: {CLIQUE}}}\n{IMEX}"
    placed = plan(small_job(pipeline=2, tensor=8, data=1, extra=extra), nodes, [pod("other", "a1", 4)])
    assert placed.ranks_per_node == 4
    assert sorted(placed.node_names()) == ["b0", "b1", "b2", "b3"]
    by_rank = {entry.node_rank: entry for entry in placed.nodes}
    for first in (0, 2):  # node ranks 0-1 hold stage 0's tensor group, 2-3 stage 1's
        pair = [by_rank[first], by_rank[first + 1]]
        assert [c.model for entry in pair for c in entry.coords] == list(range(8))
        assert {c.pipe for entry in pair for c in entry.coords} == {first // 2}
        assert {entry.domains[CLIQUE] for entry in pair} == {"rack-b.0"}
    assert placed.cost.levels == {"tensor": "nvlink", "pipeline": "nvlink", "data": "node"}
    assert placed.gpu_product == "NVIDIA-GB200"
