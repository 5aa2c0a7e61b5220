"""The contract's own promises: layouts refuse bad sizes with the field named, groups are DeepSpeed's, the
environment reader names a malformed variable, and the one "TP fits a domain" rule."""

from __future__ import annotations

import itertools

import pytest

from paralleljob_contract.environment import NODE_RANK, Launch, PodEnvironment
from paralleljob_contract.errors import ContractError
from paralleljob_contract.layout import AXES, DATA_PIPE_MODEL, PIPE_DATA_MODEL, Layout, tensor_fits

topology = pytest.importorskip("deepspeed.runtime.pipe.topology")

LAYOUTS = [(2, 2, 2), (4, 2, 1), (1, 4, 2), (2, 1, 3), (3, 2, 2)]


@pytest.mark.parametrize(
    ("sizes", "order"),
    list(itertools.product(LAYOUTS, [PIPE_DATA_MODEL, DATA_PIPE_MODEL])),
    ids=lambda value: "x".join(map(str, value)) if isinstance(value[0], int) else ",".join(value),
)
def test_groups_and_coordinates_are_deepspeeds_process_topology(sizes: tuple[int, int, int], order) -> None:  # type: ignore[no-untyped-def]
    layout = Layout(*sizes, order)
    deepspeed = topology.ProcessTopology(axes=list(order), dims=[layout.size_of(axis) for axis in order])
    for axis in AXES:
        assert layout.groups(axis) == deepspeed.get_axis_comm_lists(axis)
    for rank in range(layout.world_size):
        assert layout.coord(rank)._asdict() == deepspeed.get_coord(rank)._asdict()
        assert layout.rank(layout.coord(rank)) == rank


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Layout(0, 1, 1), "parallelism.pipeline: must be a positive integer, got 0"),
        (lambda: Layout(1, True, 1), "parallelism.tensor: must be a positive integer, got True"),
        (lambda: Layout(1, 1, 1, ("pipe", "pipe", "model")), "axisOrder: must name pipe, data and model once each"),
        (lambda: Layout(2, 1, 1).coord(2), "rank 2 is outside PP2xTP1xDP1"),
    ],
    ids=["zero-pipeline", "bool-tensor", "repeated-axis", "rank-outside"],
)
def test_a_bad_layout_is_refused_with_the_field_named(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractError, match=message):
        make()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({NODE_RANK: "one"}, "PARALLELJOB_NODE_RANK='one' is not an integer"),
        ({NODE_RANK: "-1"}, "PARALLELJOB_NODE_RANK='-1' must be at least 0"),
        ({"PARALLELJOB_PG_TIMEOUT_SECONDS": "soon"}, "PARALLELJOB_PG_TIMEOUT_SECONDS='soon' is not an integer"),
    ],
    ids=["node-rank-word", "node-rank-negative", "timeout-word"],
)
def test_a_malformed_variable_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        PodEnvironment.from_environ(environ)


def test_a_missing_required_variable_is_named() -> None:
    with pytest.raises(ContractError, match="PARALLELJOB_JOB_NAME not set"):
        PodEnvironment.from_environ({}, required=("PARALLELJOB_JOB_NAME",))
    with pytest.raises(ContractError, match="RANK, WORLD_SIZE, LOCAL_WORLD_SIZE not set"):
        Launch.from_environ({})


def test_the_reader_reads_what_the_writer_writes() -> None:
    written = PodEnvironment(job_name="gpt", namespace="research", node_rank=3, node_name="n3", checkpoint_dir="/c")
    assert PodEnvironment.from_environ(written.to_environ()) == written


@pytest.mark.parametrize(
    ("tensor", "ranks_per_node", "multi_node_domain", "fits"),
    [(4, 8, False, True), (8, 8, False, True), (8, 4, False, False), (8, 4, True, True), (6, 4, True, False)],
    ids=["inside-a-node", "a-whole-node", "across-nodes", "across-an-nvl-domain", "misaligned-in-a-domain"],
)
def test_tensor_parallel_fits_one_nvlink_domain(
    tensor: int, ranks_per_node: int, multi_node_domain: bool, fits: bool
) -> None:
    assert tensor_fits(tensor, ranks_per_node, multi_node_domain) is fits
