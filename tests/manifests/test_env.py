"""The trainer environment contract of docs/architecture.md, for one node rank."""

from __future__ import annotations

import pytest

from paralleljob.manifests import env as node_env
from paralleljob.manifests import nccl


def build(plan, node_rank=1, **overrides):
    kwargs = {
        "job_name": "gpt",
        "namespace": "research",
        "config_path": "/etc/paralleljob/job.json",
        "output_dir": "/var/run/paralleljob",
    }
    return node_env.build_node_env(plan, node_rank, **{**kwargs, **overrides})


def test_every_contract_variable_is_present(plan):
    env = build(plan, checkpoint_dir="/ckpt", master_addr="gpt-0.gpt", progress_hook="m:f")
    assert env == env | {
        "PARALLELJOB_CONFIG": "/etc/paralleljob/job.json",
        "PARALLELJOB_OUTPUT_DIR": "/var/run/paralleljob",
        "PARALLELJOB_JOB_NAME": "gpt",
        "PARALLELJOB_NAMESPACE": "research",
        "PARALLELJOB_PIPELINE": "2",
        "PARALLELJOB_TENSOR": "4",
        "PARALLELJOB_DATA": "2",
        "PARALLELJOB_AXIS_ORDER": "pipe,data,model",
        "PARALLELJOB_NODE_RANK": "1",
        "PARALLELJOB_NNODES": "4",
        "PARALLELJOB_RANKS_PER_NODE": "4",
        "PARALLELJOB_CHECKPOINT_DIR": "/ckpt",
        "PARALLELJOB_PROGRESS_HOOK": "m:f",
        "PARALLELJOB_MASTER_ADDR": "gpt-0.gpt",
        "PARALLELJOB_MASTER_PORT": "29500",
        "OMP_NUM_THREADS": "1",
    }


def test_optional_variables_are_absent_when_not_given(plan):
    env = build(plan)
    assert not {"PARALLELJOB_CHECKPOINT_DIR", "PARALLELJOB_PROGRESS_HOOK", "PARALLELJOB_MASTER_ADDR"} & env.keys()


def test_nccl_env_is_included_but_cannot_override_identity(plan):
    env = build(plan, nccl_env={**nccl.build_nccl_env({}, "tcp"), "PARALLELJOB_NODE_RANK": "9"})
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["PARALLELJOB_NODE_RANK"] == "1"


@pytest.mark.parametrize("rank", [-1, 4])
def test_node_rank_outside_the_plan_is_refused(plan, rank):
    with pytest.raises(ValueError, match="outside"):
        build(plan, node_rank=rank)


def test_env_list_keeps_order():
    assert node_env.as_env_list({"B": "1", "A": "2"}) == [{"name": "B", "value": "1"}, {"name": "A", "value": "2"}]
