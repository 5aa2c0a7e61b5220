"""How `paralleljob run` sizes its simulated nodes and shares this machine's GPUs among them."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.local import shape as local_shape
from paralleljob.local.shape import plan_locally

ROOT = pathlib.Path(__file__).resolve().parents[2]


def quickstart():
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    resolved = validate_document(doc).resolved
    assert resolved is not None
    return resolved


def test_the_quickstart_becomes_two_nodes_of_four() -> None:
    assert local_shape.choose_shape(quickstart(), None, None) == local_shape.LocalShape(2, 4)


def test_without_gpus_per_node_each_node_holds_one_pipeline_stage() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    del doc["spec"]["gpusPerNode"]
    resolved = validate_document(doc).resolved
    assert resolved is not None
    assert local_shape.choose_shape(resolved, None, None) == local_shape.LocalShape(2, 4)
    assert local_shape.choose_shape(resolved, 1, None) == local_shape.LocalShape(1, 8)


@pytest.mark.parametrize(
    ("nodes", "gpus", "phrase"),
    [(None, 3, "does not divide the job's 8 ranks"), (None, 1, "not a multiple of tensor 2"), (3, 4, "use --nodes 2")],
    ids=["not-a-divisor", "splits-tensor-group", "wrong-node-count"],
)
def test_shapes_that_cannot_hold_the_job_say_what_to_use(nodes, gpus, phrase) -> None:
    with pytest.raises(local_shape.LocalShapeError, match=phrase):
        local_shape.choose_shape(quickstart(), nodes, gpus)


def test_on_a_gpu_machine_each_simulated_node_sees_its_own_gpus() -> None:
    assert local_shape.gpu_slices(local_shape.LocalShape(2, 4), 8) == ["0,1,2,3", "4,5,6,7"]
    assert local_shape.gpu_slices(local_shape.LocalShape(2, 4), 0) is None


def test_too_few_gpus_is_refused_with_the_cpu_fallback_named() -> None:
    with pytest.raises(local_shape.LocalShapeError, match="CUDA_VISIBLE_DEVICES="):
        local_shape.gpu_slices(local_shape.LocalShape(2, 4), 1)


def test_cuda_visible_devices_decides_how_many_gpus_are_visible(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_shape.visible_gpus() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert local_shape.visible_gpus() == 3


@pytest.mark.parametrize(("nodes", "per_node"), [(None, None), (2, 4)], ids=["one-node-of-8", "two-nodes-of-4"])
def test_a_budget_job_gets_its_layout_chosen_on_the_local_shape(nodes: int | None, per_node: int | None) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["parallelism"] = {"gpus": 8}
    doc["spec"].pop("gpusPerNode", None)
    doc["spec"]["deepspeed"] = {"train_batch_size": 16}
    template = validate_document(doc).resolved
    assert template is not None and template.needs_layout
    chosen = local_shape.choose_locally(template, nodes, per_node)
    assert not isinstance(chosen, str), chosen
    choice, count, slots = chosen
    assert (count, slots) == ((nodes, per_node) if nodes else (1, 8))
    job = choice.winner.job
    assert not job.needs_layout and job.world_size == 8
    assert local_shape.choose_shape(job, count, slots) == local_shape.LocalShape(count, slots)


def test_the_simulated_nodes_offer_what_each_pod_requests() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["template"] = {"resources": {"requests": {"cpu": "8", "rdma/ib": "1"}, "limits": {"rdma/ib": "1"}}}
    resolved = validate_document(doc).resolved
    assert resolved is not None
    plan = plan_locally(resolved, local_shape.choose_shape(resolved, None, None))
    assert isinstance(plan, planning.Plan), plan


def test_the_local_plan_puts_a_slot_count_on_each_node_without_editing_the_spec() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"].pop("gpusPerNode", None)
    resolved = validate_document(doc).resolved
    assert resolved is not None and resolved.spec.gpus_per_node is None
    plan = plan_locally(resolved, local_shape.LocalShape(4, 2))
    assert isinstance(plan, planning.Plan), plan
    assert (plan.ranks_per_node, len(plan.nodes)) == (2, 4)
    assert resolved.spec.gpus_per_node is None


def test_a_fixed_slot_count_is_a_planning_option_the_nodes_do_not_decide() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"].pop("gpusPerNode", None)
    resolved = validate_document(doc).resolved
    assert resolved is not None
    cluster = planning.build_cluster(planning.local_cluster_nodes(4, 8))
    free = planning.plan_job(resolved, cluster)
    fixed = planning.plan_job(resolved, cluster, planning.PlanningOptions(ranks_per_node=2))
    assert isinstance(free, planning.Plan) and isinstance(fixed, planning.Plan)
    assert (free.ranks_per_node, fixed.ranks_per_node, len(fixed.nodes)) == (8, 2, 4)
