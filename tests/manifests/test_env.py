"""The trainer environment of docs/contract.md, for one node rank: the contract's variables, written once."""

from __future__ import annotations

import pytest

from paralleljob.manifests import env as node_env
from paralleljob.manifests import nccl
from paralleljob.manifests.trainer_config import contract_plan
from paralleljob_contract.environment import PodEnvironment


def build(plan, node_rank=1, **overrides):
    kwargs = {
        "job_name": "gpt",
        "namespace": "research",
        "config_path": "/etc/paralleljob/job.json",
        "output_dir": "/var/run/paralleljob",
        "node_name": f"node-{node_rank}",
    }
    return node_env.build_node_env(contract_plan(plan), node_rank, **{**kwargs, **overrides})


def test_every_contract_variable_is_present(plan):
    env = build(plan, checkpoint_dir="/ckpt", progress_hook="m:f")
    assert env == {
        "OMP_NUM_THREADS": "1",
        "PARALLELJOB_CONFIG": "/etc/paralleljob/job.json",
        "PARALLELJOB_OUTPUT_DIR": "/var/run/paralleljob",
        "PARALLELJOB_JOB_NAME": "gpt",
        "PARALLELJOB_NAMESPACE": "research",
        "PARALLELJOB_NODE_RANK": "1",
        "PARALLELJOB_NODE_NAME": "node-1",
        "PARALLELJOB_CHECKPOINT_DIR": "/ckpt",
        "PARALLELJOB_PROGRESS_HOOK": "m:f",
    }


def test_the_contracts_reader_reads_back_what_the_writer_wrote(plan):
    env = PodEnvironment.from_environ(build(plan, checkpoint_dir="/ckpt", nccl_env=nccl.build_nccl_env({}, "tcp")))
    assert (env.node_rank, env.node_name, env.checkpoint_dir) == (1, "node-1", "/ckpt")
    assert env.process_group_timeout_seconds == nccl.DEFAULT_TIMEOUT_SECONDS


def test_optional_variables_are_absent_when_not_given(plan):
    env = build(plan)
    assert not {"PARALLELJOB_CHECKPOINT_DIR", "PARALLELJOB_PROGRESS_HOOK"} & env.keys()


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
