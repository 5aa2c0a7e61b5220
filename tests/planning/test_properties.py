"""Properties over random clusters and layouts: hard rules always hold, clusters that surely fit are placed,
unschedulable messages account for every node, pipelines stay compact, and ranks match DeepSpeed's topology."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob import planning
from paralleljob_contract.layout import DATA_PIPE_MODEL, PIPE_DATA_MODEL, Layout
from tests.planning.clusters import LEAF, node, pod, small_job

CLIQUE = "nvidia.com/gpu.clique"


@pytest.fixture(scope="module")
def process_topology() -> type:
    topology = pytest.importorskip("deepspeed.runtime.pipe.topology")
    return topology.ProcessTopology  # type: ignore[no-any-return]


@st.composite
def clusters_and_jobs(draw: st.DrawFn, busy: bool = True) -> dict[str, Any]:
    gpus = draw(st.sampled_from([4, 8]))
    tensor = draw(st.sampled_from([1, 2, 4, 8]))
    pipeline = draw(st.sampled_from([1, 2, 4, 8]))
    data = draw(st.integers(1, 4))
    use_clique = tensor > gpus or draw(st.booleans())
    count = draw(st.integers(1, 24))
    nodes, pods = [], []
    for i in range(count):
        labels = {CLIQUE: f"c{draw(st.integers(0, 3))}"} if use_clique else {}
        leaf, spine = f"l{draw(st.integers(0, 3))}", f"s{draw(st.integers(0, 1))}"
        nodes.append(node(f"n{i}", gpus=gpus, leaf=leaf, spine=spine, labels=labels))
        used = draw(st.integers(0, gpus)) if busy and draw(st.booleans()) else 0
        if used:
            pods.append(pod(f"p{i}", f"n{i}", used))
    imex = "  network: {imexChannelClaim: imex}\n  template: {resourceClaims: [{name: imex, resourceClaimName: cd}]}\n"
    extra = f"  topology: {{nvlinkDomainLabel: {CLIQUE}}}\n{imex}" if use_clique else ""
    job = small_job(pipeline, tensor, data, extra=extra)
    return {"job": job, "nodes": nodes, "pods": pods, "gpus": gpus, "clique": use_clique}


def first_ranks_per_node(case: dict[str, Any]) -> int:
    """The ranks per node the planner tries first (docs/planning.md, "Rank layout")."""
    job, gpus = case["job"], case["gpus"]
    world, tp = job.world_size, job.tensor
    fits = [
        g
        for g in range(min(gpus, world), 0, -1)
        if world % g == 0 and (g % tp == 0 or (case["clique"] and tp % g == 0))
    ]
    return fits[0]


def surely_fits(case: dict[str, Any], cluster: planning.Cluster) -> bool:
    """Enough whole NVLink units of nodes with the first ranks-per-node size free, counted per domain."""
    job, g = case["job"], first_ranks_per_node(case)
    unit = job.tensor // g if job.tensor > g else 1
    per_domain: dict[str, int] = {}
    for info in cluster.nodes:
        if info.free_gpus >= g:
            domain = info.labels.get(CLIQUE, info.name) if unit > 1 else info.name
            per_domain[domain] = per_domain.get(domain, 0) + 1
    return sum(count // unit for count in per_domain.values()) >= job.world_size // g // unit


def check_hard_rules(outcome: planning.Plan, cluster: planning.Cluster, process_topology: type) -> None:
    infos = cluster.by_name()
    ranks = [rank for entry in outcome.nodes for rank in entry.ranks]
    assert sorted(ranks) == list(range(outcome.world_size))
    assert len({entry.node for entry in outcome.nodes}) == len(outcome.nodes)
    for entry in outcome.nodes:
        assert entry.gpus <= infos[entry.node].free_gpus
    layout = outcome.layout
    sizes = {"pipe": layout.pipeline, "data": layout.data, "model": layout.tensor}
    reference = process_topology(axes=list(layout.axis_order), dims=[sizes[axis] for axis in layout.axis_order])
    domains_of_tensor_group: dict[tuple[int, int], set[str]] = {}
    for entry in outcome.nodes:
        domain = infos[entry.node].labels.get(CLIQUE, entry.node) if outcome.nvlink_domain_label else entry.node
        for rank, coord in zip(entry.ranks, entry.coords, strict=True):
            expected = reference.get_coord(rank)
            assert (coord.pipe, coord.data, coord.model) == (expected.pipe, expected.data, expected.model)
            domains_of_tensor_group.setdefault((coord.pipe, coord.data), set()).add(domain)
    assert all(len(domains) == 1 for domains in domains_of_tensor_group.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters_and_jobs())
def test_tensor_groups_stay_in_one_nvlink_domain_no_gpu_is_oversubscribed_and_every_rank_is_placed_once(
    process_topology: type, case: dict[str, Any]
) -> None:
    cluster = planning.build_cluster(case["nodes"], case["pods"])
    outcome = planning.plan_job(case["job"], cluster)
    if surely_fits(case, cluster):
        assert isinstance(outcome, planning.Plan), outcome
    if isinstance(outcome, planning.Plan):
        check_hard_rules(outcome, cluster, process_topology)
        return
    # The message names the shortfall: fewer qualify than needed, and every other node is given a reason.
    assert outcome.qualifying < outcome.nodes_needed
    assert outcome.message.startswith(f"needs {outcome.nodes_needed} nodes with {outcome.gpus_per_node} free ")
    assert f"; {outcome.qualifying} qualif" in outcome.message
    assert outcome.qualifying + sum(s.count for s in outcome.shortfalls) == len(cluster)
    assert all(s.render() in outcome.message for s in outcome.shortfalls)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters_and_jobs(busy=False))
def test_a_job_that_one_leaf_can_hold_keeps_every_pipeline_in_that_leaf(case: dict[str, Any]) -> None:
    cluster = planning.build_cluster(case["nodes"], case["pods"])
    outcome = planning.plan_job(case["job"], cluster)
    if not isinstance(outcome, planning.Plan):
        return
    per_leaf: dict[tuple[str, str], int] = {}
    for info in cluster.nodes:
        if info.free_gpus >= outcome.ranks_per_node:
            key = (info.labels["network.topology.nvidia.com/spine"], info.labels[LEAF])
            per_leaf[key] = per_leaf.get(key, 0) + 1
    if outcome.nvlink_domain_label is None and max(per_leaf.values()) >= len(outcome.nodes):
        assert len({(e.domains["network.topology.nvidia.com/spine"], e.domains[LEAF]) for e in outcome.nodes}) == 1
        assert outcome.cost.levels["pipeline"] in ("node", "leaf")


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
