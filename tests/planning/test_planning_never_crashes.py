"""Property: every job that validation accepts is planned without raising, on any cluster: a Plan or an
Unschedulable with a reason, never ZeroDivisionError or IndexError (a 4-GPU job with gpusPerNode 8 used to
crash the planner, the operator, `paralleljob plan` and `paralleljob run`)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob import planning
from paralleljob.api import validate_document
from tests.api.jobs import DELETE, job
from tests.planning.clusters import node, pod

CLIQUE = "nvidia.com/gpu.clique"
powers = st.sampled_from([1, 2, 3, 4, 6, 8, 16])


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A job document a user could write: sizes, gpusPerNode (a multiple of tensor, or none), DP given or
    derived from the batch sizes, a clique label."""
    pipeline, tensor = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4]))
    edits: dict[str, Any] = {
        "spec.parallelism.pipeline": pipeline,
        "spec.parallelism.tensor": tensor,
        "spec.parallelism.data": draw(st.one_of(st.integers(1, 3), st.just(DELETE))),
        "spec.gpusPerNode": draw(st.one_of(st.sampled_from([1, 2, 4]).map(lambda k: k * tensor), st.just(DELETE))),
        "spec.model.layers": draw(st.integers(pipeline, 2 * pipeline + 3)),
        "spec.model.attentionHeads": tensor * draw(st.integers(1, 2)),
        # micro-batch 2 x 8 accumulation steps in the base job: a multiple of 16 derives DP, anything else
        # given with DP is checked against it.
        "spec.deepspeed.train_batch_size": draw(st.one_of(st.integers(1, 3).map(lambda k: 16 * k), st.just(DELETE))),
    }
    edits["spec.model.hiddenSize"] = edits["spec.model.attentionHeads"] * 64
    if draw(st.booleans()):
        edits["spec.topology"] = {"nvlinkDomainLabel": CLIQUE}
    return job(**{key.replace(".", "__"): value for key, value in edits.items()})


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, pods = [], []
    for index in range(draw(st.integers(0, 12))):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        labels = {CLIQUE: f"c{draw(st.integers(0, 2))}"} if draw(st.booleans()) else {}
        nodes.append(node(f"n{index}", gpus=gpus, leaf=f"l{draw(st.integers(0, 2))}", labels=labels))
        used = draw(st.integers(0, gpus))
        if used:
            pods.append(pod(f"p{index}", f"n{index}", used))
    return nodes, pods


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(), cluster=clusters())
def test_every_valid_job_is_planned_or_refused_with_a_reason(doc, cluster) -> None:
    result = validate_document(doc)
    if not result.ok:
        return
    assert result.resolved is not None
    nodes, pods = cluster
    outcome = planning.plan_job(result.resolved, planning.build_cluster(nodes, pods))
    if isinstance(outcome, planning.Unschedulable):
        assert outcome.message
    else:
        assert isinstance(outcome, planning.Plan)
        assert sum(entry.gpus for entry in outcome.nodes) == result.resolved.world_size
