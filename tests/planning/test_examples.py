"""The 175B example on synthetic 64 x A100 clusters, and a fragmented cluster where the plan beats naive."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.planning import synth

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def example(name: str) -> planning.Plan | planning.Unschedulable:
    resolved = validate_document(yaml.safe_load((EXAMPLES / name).read_text())).resolved
    assert resolved is not None
    return resolved  # type: ignore[return-value]


def cluster_file(name: str) -> planning.Cluster:
    nodes, pods, _ = planning.inventory.split_objects(yaml.safe_load_all((EXAMPLES / name).read_text()))
    return planning.build_cluster(nodes, pods)


@pytest.mark.parametrize(("nodes", "gpus"), [(16, 4), (8, 8)], ids=["16x4", "8x8"])
def test_gpt_175b_keeps_each_tensor_group_of_4_in_one_node_and_runs_8_stages_across_nodes(
    nodes: int, gpus: int
) -> None:
    job = example("gpt-175b-64xa100.yaml")
    node_dicts, _ = synth.synth_cluster(synth.SynthSpec(nodes=nodes, gpus_per_node=gpus, leaves=2))
    plan = planning.plan_job(job, planning.build_cluster(node_dicts))  # type: ignore[arg-type]
    assert isinstance(plan, planning.Plan)
    assert (plan.ranks_per_node, len(plan.nodes)) == (gpus, nodes)
    for entry in plan.nodes:
        for first in range(0, gpus, 4):
            group = entry.coords[first : first + 4]
            assert [c.model for c in group] == [0, 1, 2, 3]
            assert len({(c.pipe, c.data) for c in group}) == 1
    stage_nodes = {stage: {e.node for e in plan.nodes if stage in e.stages} for stage in range(8)}
    assert all(len(stage_nodes[s] & stage_nodes[s + 1]) == 0 for s in range(7))
    assert plan.estimates.fits is True
    assert plan.cost.levels["tensor"] == "node"


def test_the_fragmented_example_plans_cheaper_than_free_nodes_in_name_order() -> None:
    plan = planning.plan_job(example("gpt-13b-fragmented.yaml"), cluster_file("cluster-fragmented.yaml"))  # type: ignore[arg-type]
    assert isinstance(plan, planning.Plan)
    assert plan.naive_cost is not None
    assert plan.cost.seconds < 0.8 * plan.naive_cost.seconds
