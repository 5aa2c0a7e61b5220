"""Hot spares (spec.failurePolicy.spareNodes): the planner keeps N more free nodes for a job, in the leaf of the
nodes they would replace, never on GPUs another job holds, and holds them against other jobs; a lost node rank
goes to the spare that costs least."""

from __future__ import annotations

from typing import Any

from paralleljob import planning
from paralleljob.planning import plan_text, spares
from paralleljob.planning.costmodel import Site
from tests.planning import clusters

# PP 2 x TP 8 x DP 2 on 8-GPU nodes: four nodes.
FOUR_NODES = (2, 8, 2)


def job_with_spares(count: int) -> Any:
    return clusters.small_job(*FOUR_NODES, extra=f"  failurePolicy: {{spareNodes: {count}}}")


def fabric(leaves: dict[str, tuple[str, int]]) -> list[dict[str, Any]]:
    """Nodes <leaf>-<i>: leaf name -> (spine, node count)."""
    return [
        clusters.node(f"{leaf}-{i}", leaf=leaf, spine=spine)
        for leaf, (spine, count) in leaves.items()
        for i in range(count)
    ]


def leaf_of(plan: planning.Plan, node: str) -> str:
    for entry in (*plan.nodes, *plan.spares):
        if entry.node == node:
            return entry.domains[clusters.LEAF]
    raise AssertionError(node)


def test_a_job_without_spares_plans_none() -> None:
    plan = clusters.plan(clusters.small_job(*FOUR_NODES), fabric({"a": ("s0", 6)}))
    assert plan.spares == ()
    assert "spares" in plan.to_dict() and plan.to_dict()["spares"] == []


def test_a_spare_sits_in_the_leaf_of_the_nodes_it_would_replace() -> None:
    # The job fits in leaf b (best fit: 5 nodes); leaf a under the same spine and leaf c elsewhere have room too.
    nodes = fabric({"a": ("s0", 8), "b": ("s0", 5), "c": ("s1", 8)})
    plan = clusters.plan(job_with_spares(1), nodes)
    assert {leaf_of(plan, node) for node in plan.node_names()} == {"b"}
    assert len(plan.spares) == 1
    spare = plan.spares[0]
    assert leaf_of(plan, spare.node) == "b"
    assert spare.node not in plan.node_names()
    assert spare.gpus == plan.ranks_per_node == 8


def test_spares_guard_the_job_s_leaves_in_turn_the_fullest_first() -> None:
    # Node ranks 0-2 in leaf a, 3 in leaf b: one spare guards a, two guard a and b, a third guards a again.
    sites = [Site(f"n{i}", "", ("s0", leaf)) for i, leaf in enumerate("aaab")]
    assert spares.guarded_ranks(sites, 1) == [0]
    assert spares.guarded_ranks(sites, 2) == [0, 3]
    assert spares.guarded_ranks(sites, 3) == [0, 3, 1]


def test_a_spare_goes_where_the_cost_model_prices_the_replacement_cheapest() -> None:
    # Node rank 1's leaf has no free node: of a node under the same spine and one under another, the cost
    # model prefers the same spine (a block link is faster than a top-level one).
    placed = [Site("n0", "", ("s0", "a")), Site("n1", "", ("s0", "a"))]
    near, far = (clusters.node("near", leaf="b", spine="s0"), clusters.node("far", leaf="c", spine="s1"))
    infos = {info.name: info for info in planning.build_cluster([near, far]).nodes}
    free = [(infos["far"], Site("far", "", ("s1", "c"))), (infos["near"], Site("near", "", ("s0", "b")))]
    penalty = {"a": 0.0, "b": 1.0, "c": 2.0}

    def cost(rank: int, site: Site) -> float:
        return sum(penalty[s.path[1]] for s in [*placed[:rank], site, *placed[rank + 1 :]])

    chosen = spares.choose_spares(1, placed, free, cost, same_nvlink=False)
    assert [(node.name, rank) for node, rank in chosen] == [("near", 0)]


def test_spares_never_hold_another_job_s_gpus() -> None:
    # Leaf b has room for the job and one more node, but that node runs another job's pod (4 of 8 GPUs), and
    # the next one is reserved by another ParallelJob: the spare goes to the free node in leaf a.
    nodes = fabric({"a": ("s0", 1), "b": ("s0", 6)})
    busy = [clusters.pod("other-0", "b-4", 4)]
    reserved = [planning.Reservation("b-5", 8, "research/other")]
    cluster = planning.build_cluster(nodes, busy, reserved)
    plan = planning.plan_job(job_with_spares(1), cluster)
    assert isinstance(plan, planning.Plan), plan
    assert plan.spare_names() == ["a-0"]
    assert not {"b-4", "b-5"} & {*plan.node_names(), *plan.spare_names()}


def test_spares_are_held_against_the_next_job() -> None:
    # Six free nodes: the first job takes four and two spares, so a second four-node job does not fit, and its
    # message names the first job as the holder.
    nodes = fabric({"a": ("s0", 6)})
    first = clusters.plan(job_with_spares(2), nodes)
    held = planning.reservations_of(first, "research/first")
    assert sorted(r.node for r in held) == sorted(first.node_names() + first.spare_names())
    second = planning.plan_job(clusters.small_job(*FOUR_NODES), planning.build_cluster(nodes, (), held))
    assert isinstance(second, planning.Unschedulable)
    assert "in use by ParallelJob research/first" in second.message


def test_status_spare_nodes_reserve_for_paralleljob_plan() -> None:
    job = {
        "kind": "ParallelJob",
        "metadata": {"name": "gpt", "namespace": "research"},
        "status": {
            "phase": "Running",
            "gpusPerNode": 8,
            "placement": [{"nodeRank": 0, "node": "a-0", "pod": "gpt-0", "ranks": "0-7"}],
            "spareNodes": ["a-1"],
        },
    }
    found = planning.job_reservations([job], [clusters.pod("gpt-0", "a-0", 8)])
    assert found == [planning.Reservation("a-1", 8, "research/gpt")]


def test_fewer_free_nodes_than_spares_asked_plans_those_with_a_warning() -> None:
    plan = clusters.plan(job_with_spares(3), fabric({"a": ("s0", 5)}))
    assert len(plan.spares) == 1
    assert any("Only 1 of the 3 spare nodes" in warning for warning in plan.warnings)


def test_a_plan_with_spares_round_trips_through_its_json_form_and_names_them_in_words() -> None:
    plan = clusters.plan(job_with_spares(2), fabric({"a": ("s0", 4), "b": ("s0", 3)}))
    assert planning.Plan.from_dict(plan.to_dict()) == plan
    (line,) = [line for line in plan_text.summary_lines(plan) if line.startswith("hot spares")]
    assert all(f"{spare.node} (guards node rank {spare.guards})" in line for spare in plan.spares)


def test_a_lost_node_goes_to_the_spare_in_its_own_leaf() -> None:
    # The job takes four of leaf a's five nodes; its second spare can only be in leaf b, under another spine.
    plan = clusters.plan(job_with_spares(2), fabric({"a": ("s0", 5), "b": ("s1", 3)}))
    assert sorted(leaf_of(plan, spare.node) for spare in plan.spares) == ["a", "b"]
    for entry in plan.nodes:
        chosen = spares.cheapest_replacement(plan, entry.node_rank)
        assert chosen is not None
        assert leaf_of(plan, chosen.node) == entry.domains[clusters.LEAF]


def test_the_replacement_keeps_the_node_rank_s_ranks_and_uses_up_the_spare() -> None:
    plan = clusters.plan(job_with_spares(1), fabric({"a": ("s0", 5)}))
    spare = plan.spares[0]
    moved = plan.with_replacement(2, spare)
    assert moved.nodes[2].node == spare.node
    assert moved.nodes[2].ranks == plan.nodes[2].ranks and moved.nodes[2].coords == plan.nodes[2].coords
    assert [n.node for i, n in enumerate(moved.nodes) if i != 2] == [n.node for i, n in enumerate(plan.nodes) if i != 2]
    assert moved.spares == ()
    assert spares.cheapest_replacement(moved, 0) is None


def test_spares_stay_in_the_nvlink_domain_when_a_tensor_group_spans_nodes() -> None:
    # TP 8 over 4-GPU nodes in NVLink cliques of 3 nodes (clique c0 in leaf a, c1 and c2 in leaf b): the job
    # takes 2 nodes of clique c0; the spare must be c0's third node, never a node of another clique even in the
    # same leaf.
    clique = {"a-0": "c0", "a-1": "c0", "a-2": "c0", "b-0": "c1", "b-1": "c1", "b-2": "c2"}
    nodes = [
        clusters.node(name, gpus=4, leaf=name[0], spine="s0", labels={"nvidia.com/gpu.clique": domain})
        for name, domain in clique.items()
    ]
    extra = (
        "  topology: {nvlinkDomainLabel: nvidia.com/gpu.clique}\n"
        "  network: {imexChannelClaim: imex}\n"
        "  template: {resourceClaims: [{name: imex, resourceClaimTemplateName: cd}]}\n"
        "  failurePolicy: {spareNodes: 2}"
    )
    plan = clusters.plan(clusters.small_job(1, 8, 1, gpus_per_node=4, extra=extra), nodes)
    used = {clique[node] for node in plan.node_names()}
    assert len(used) == 1
    assert all(clique[spare.node] in used for spare in plan.spares)
    assert len(plan.spares) == 1, plan.spares  # the clique has one node left; c1 and c2 do not qualify


def test_a_placed_job_short_of_spares_gets_more_chosen_the_same_way_never_a_held_node() -> None:
    nodes = fabric({"a": ("s0", 7)})
    plan = clusters.plan(job_with_spares(1), nodes)
    cluster = planning.build_cluster(nodes, [clusters.pod("other-0", "a-6", 8)])
    more = planning.spares_for(
        job_with_spares(2), cluster, plan.node_names(), 8, plan.axis_order, 2, taken=plan.spare_names()
    )
    free = {f"a-{i}" for i in range(6)} - {*plan.node_names(), *plan.spare_names()}
    assert {spare.node for spare in more} == free  # a-6 runs another pod
    assert (
        planning.spares_for(job_with_spares(1), cluster, [*plan.node_names()[:3], "gone"], 8, plan.axis_order, 1) == ()
    )
