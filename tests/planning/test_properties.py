"""Properties over random clusters and layouts: hard rules always hold, and ranks match DeepSpeed's topology."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob import planning
from paralleljob.planning.layout import DATA_PIPE_MODEL, PIPE_DATA_MODEL, Layout
from tests.planning.clusters import node, pod, small_job

CLIQUE = "nvidia.com/gpu.clique"


@st.composite
def clusters_and_jobs(draw: st.DrawFn) -> tuple[object, list[dict[str, object]], list[dict[str, object]]]:
    gpus = draw(st.sampled_from([4, 8]))
    tensor = draw(st.sampled_from([1, 2, 4, 8]))
    pipeline = draw(st.sampled_from([1, 2, 4, 8]))
    data = draw(st.integers(1, 4))
    use_clique = tensor > gpus or draw(st.booleans())
    count = draw(st.integers(1, 24))
    nodes, pods = [], []
    for i in range(count):
        labels = {CLIQUE: f"c{draw(st.integers(0, 3))}"} if use_clique else {}
        nodes.append(
            node(
                f"n{i}",
                gpus=gpus,
                leaf=f"l{draw(st.integers(0, 3))}",
                spine=f"s{draw(st.integers(0, 1))}",
                labels=labels,
            )
        )
        used = draw(st.integers(0, gpus))
        if used:
            pods.append(pod(f"p{i}", f"n{i}", used))
    extra = f"  topology: {{nvlinkDomainLabel: {CLIQUE}}}\n" if use_clique else ""
    heads_ok = 8 % tensor == 0
    assert heads_ok
    return small_job(pipeline, tensor, data, extra=extra), nodes, pods


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters_and_jobs())
def test_tensor_groups_stay_in_one_nvlink_domain_no_gpu_is_oversubscribed_and_every_rank_is_placed_once(case) -> None:  # type: ignore[no-untyped-def]
    job, nodes, pods = case
    cluster = planning.build_cluster(nodes, pods)
    outcome = planning.plan_job(job, cluster)  # type: ignore[arg-type]
    if isinstance(outcome, planning.Unschedulable):
        assert outcome.message.startswith("needs ")
        return
    infos = cluster.by_name()
    ranks = [rank for entry in outcome.nodes for rank in entry.ranks]
    assert sorted(ranks) == list(range(outcome.world_size))
    assert len({entry.node for entry in outcome.nodes}) == len(outcome.nodes)
    for entry in outcome.nodes:
        assert entry.gpus <= infos[entry.node].free_gpus
    domain_of = {}
    for entry in outcome.nodes:
        for rank, coord in zip(entry.ranks, entry.coords, strict=True):
            domain = infos[entry.node].labels.get(CLIQUE) or entry.node
            domain_of.setdefault((coord.pipe, coord.data), set()).add(
                domain if outcome.nvlink_domain_label else entry.node
            )
            assert outcome.layout.coord(rank) == coord
    assert all(len(domains) == 1 for domains in domain_of.values())


@pytest.fixture(scope="module")
def process_topology() -> type:
    topology = pytest.importorskip("deepspeed.runtime.pipe.topology")
    return topology.ProcessTopology  # type: ignore[no-any-return]


@settings(max_examples=200, deadline=None)
@given(
    pipeline=st.integers(1, 6),
    tensor=st.integers(1, 6),
    data=st.integers(1, 6),
    order=st.sampled_from([PIPE_DATA_MODEL, DATA_PIPE_MODEL]),
)
def test_rank_to_coordinates_equals_deepspeeds_process_topology(
    process_topology: type, pipeline: int, tensor: int, data: int, order: tuple[str, str, str]
) -> None:
    layout = Layout(pipeline, tensor, data, order)  # type: ignore[arg-type]
    sizes = {"pipe": pipeline, "data": data, "model": tensor}
    reference = process_topology(axes=list(order), dims=[sizes[axis] for axis in order])
    for rank in range(layout.world_size):
        expected = reference.get_coord(rank)
        assert layout.coord(rank) == (expected.pipe, expected.data, expected.model)
        assert layout.rank(layout.coord(rank)) == rank
