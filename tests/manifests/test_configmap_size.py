"""The ConfigMap and the pods do not grow with the job: a 4,096-node x 8-GPU job's ConfigMap is a few KB, far
under the 1 MiB a ConfigMap may hold, and each pod carries only its own facts (node rank, node)."""

from __future__ import annotations

import json

import pytest

from paralleljob.manifests import children
from paralleljob.planning import Plan
from tests.manifests.helpers import make_plan, resolve

OWNER = {"metadata": {"name": "gpt", "namespace": "research", "uid": "u-1"}}
# 4,096 nodes x 8 GPUs: PP 16 x TP 8 x DP 256 = 32,768 ranks.
LARGE = {"nodes": 4096, "gpus": 8, "layout": (16, 8, 256)}
SMALL = {"nodes": 4, "gpus": 4, "layout": (2, 4, 2)}


def planned(nodes: int, gpus: int, layout: tuple[int, int, int]) -> Plan:
    names = [f"gpu-node-{rank:05d}.rack-{rank // 18:03d}.example.com" for rank in range(nodes)]
    return make_plan(nodes=nodes, gpus=gpus, layout=layout, names=names)


def built_for(nodes: int, gpus: int, layout: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    pipeline, tensor, data = layout
    resolved = resolve(
        parallelism={"pipeline": pipeline, "tensor": tensor, "data": data},
        gpusPerNode=gpus,
        model={"layers": 2 * pipeline, "hiddenSize": 256, "attentionHeads": 8, "sequenceLength": 128, "vocabSize": 512},
        deepspeed={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4},
    )
    plan = planned(nodes, gpus, layout)
    attempt = children.build_attempt(OWNER, resolved, plan, [], attempt=0)
    return attempt.config_map, resolved, plan


def size(obj: object) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def test_a_4096_node_config_map_is_as_small_as_a_4_node_one() -> None:
    large, _, _ = built_for(**LARGE)
    small, _, _ = built_for(**SMALL)
    assert size(large) < 16 * 1024, "the ConfigMap must hold no per-node or per-rank list"
    # Only the digits of the sizes differ.
    assert abs(size(large) - size(small)) < 64


@pytest.fixture(scope="module")
def large_pods() -> tuple[list[str], list[dict]]:
    config_map, resolved, plan = built_for(**LARGE)
    names = plan.node_names()
    return names, children.build_children(OWNER, resolved, config_map, names, image="trainer:1").pods


@pytest.mark.parametrize("node_rank", [0, 4095], ids=["first-node", "last-node"])
def test_a_pod_of_a_4096_node_job_carries_only_its_own_facts(large_pods, node_rank: int) -> None:  # type: ignore[no-untyped-def]
    names, pods = large_pods
    pod = pods[node_rank]
    assert size(pod) < 8 * 1024
    env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}
    assert (env["PARALLELJOB_NODE_RANK"], env["PARALLELJOB_NODE_NAME"]) == (str(node_rank), names[node_rank])
