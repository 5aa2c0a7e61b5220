"""Network levels and NVLink domains read from node labels (docs/planning.md, "Network levels")."""

from __future__ import annotations

from paralleljob import planning
from paralleljob.planning import levels
from tests.planning.clusters import LEAF, node, plan, small_job

ACCELERATOR = "network.topology.nvidia.com/accelerator"
# The pods' IMEX channel: multi-node NVLink needs it, so every NVLink-domain test gives the pods one.
IMEX = "  network: {imexChannelClaim: imex}\n  template: {resourceClaims: [{name: imex, resourceClaimName: cd}]}\n"


def test_topographs_accelerator_label_is_not_a_network_level() -> None:
    cluster = planning.build_cluster([node("n0", leaf="a", labels={ACCELERATOR: "rack-0"})])
    present = levels.label_keys(cluster.nodes)
    assert levels.detect_levels(present) == (LEAF,)
    assert levels.detect_nvlink_label(present) == ACCELERATOR


def test_topographs_accelerator_label_is_the_nvlink_domain_when_the_spec_names_none() -> None:
    # Four 4-GPU nodes per rack: a TP group of 8 needs two nodes of one rack's NVLink domain.
    nodes = [node(f"n{i}", gpus=4, leaf="a", labels={ACCELERATOR: f"rack-{i % 2}"}) for i in range(8)]
    placed = plan(small_job(pipeline=2, tensor=8, data=1, extra=IMEX), nodes)
    assert placed.nvlink_domain_label == ACCELERATOR
    assert placed.ranks_per_node == 4
    racks = {entry.node_rank: entry.domains[ACCELERATOR] for entry in placed.nodes}
    assert racks[0] == racks[1] and racks[2] == racks[3]
    assert placed.cost.levels["tensor"] == "nvlink"
    assert ACCELERATOR not in placed.levels


def test_the_spec_label_wins_over_topographs() -> None:
    extra = "  topology: {nvlinkDomainLabel: nvidia.com/gpu.clique}\n" + IMEX
    labels = {ACCELERATOR: "rack-0", "nvidia.com/gpu.clique": "c0"}
    placed = plan(
        small_job(pipeline=1, tensor=8, data=1, extra=extra), [node(f"n{i}", gpus=4, labels=labels) for i in range(2)]
    )
    assert placed.nvlink_domain_label == "nvidia.com/gpu.clique"


def test_nodes_without_a_level_label_do_not_share_a_fake_domain() -> None:
    nodes = [node("u1"), node("u2"), node("l1", leaf="a"), node("l2", leaf="a")]
    placed = plan(small_job(pipeline=2, tensor=8, data=1), nodes)
    assert sorted(placed.node_names()) == ["l1", "l2"]
    assert placed.cost.levels["pipeline"] == "leaf"


def test_an_unlabelled_node_is_a_domain_of_its_own() -> None:
    cluster = planning.build_cluster([node("u1"), node("u2")])
    paths = {levels.path_of(info, (LEAF,)) for info in cluster.nodes}
    assert len(paths) == 2
