"""An unschedulable job is told what it needs and why each node falls short, in one sentence."""

from __future__ import annotations

import pytest

from paralleljob import planning
from tests.planning.clusters import A100, job, node, plan, pod, small_job, unschedulable


def test_the_message_counts_what_qualifies_and_why_the_rest_do_not() -> None:
    nodes = [node(f"ok-{i}") for i in range(3)]
    nodes += [node("cordoned-0", unschedulable=True), node("cordoned-1", unschedulable=True)]
    nodes += [node("busy-0"), node("busy-1"), node("down", ready=False)]
    pods = [pod("a", "busy-0", 4), pod("b", "busy-1", 2)]
    message = unschedulable(small_job(pipeline=4, tensor=8, data=2), nodes, pods)
    assert message == (
        f"needs 8 nodes with 8 free nvidia.com/gpu of {A100}; 3 qualify: 2 cordoned, "
        "2 have GPUs in use by pods a/b, 1 is not Ready"
    )


def test_taints_selectors_and_other_products_are_named() -> None:
    taint = [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
    nodes = [
        node("tainted", taints=taint),
        node("h100", labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        node("small", gpus=4),
    ]
    message = unschedulable(small_job(pipeline=1, tensor=8, data=2), nodes)
    assert message == (
        "needs 2 nodes with 8 free nvidia.com/gpu of NVIDIA-H100-80GB-HBM3; 1 qualifies: "
        "1 has taint dedicated=infer:NoSchedule not tolerated, 1 has another GPU product (NVIDIA-A100-SXM4-80GB)"
    )


def test_a_tolerated_taint_and_a_matching_selector_do_not_reject_a_node() -> None:
    taint = [{"key": "dedicated", "value": "train", "effect": "NoSchedule"}]
    extra = """  template:
    nodeSelector: {pool: train}
    tolerations: [{key: dedicated, operator: Equal, value: train, effect: NoSchedule}]
"""
    nodes = [node("n0", taints=taint, labels={"pool": "train"}), node("n1", labels={"pool": "infer"})]
    message = unschedulable(small_job(pipeline=1, tensor=8, data=2, extra=extra), nodes)
    assert message.endswith("; 1 qualifies: 1 lacks nodeSelector pool=train")


def test_a_model_too_large_for_the_gpus_is_unschedulable_with_the_estimate() -> None:
    big = job(
        """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: big}
spec:
  parallelism: {pipeline: 1, tensor: 1, data: 1}
  model: {layers: 40, hiddenSize: 5120, attentionHeads: 40, sequenceLength: 2048, vocabSize: 51200}
  deepspeed: {train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: 1}
  training: {steps: 10}
  checkpoint: {intervalSteps: 5, volume: {persistentVolumeClaim: {claimName: checkpoints}}}
"""
    )
    message = unschedulable(big, [node("n0", labels={"nvidia.com/gpu.memory": "40960"})])
    assert "1 has too little GPU memory (40960 MiB < " in message
    assert "MiB estimated per GPU)" in message


def test_reservations_of_other_parallel_jobs_count_as_used() -> None:
    cluster = planning.build_cluster([node("n0")], [], [planning.Reservation("n0", 8, "gpt-7b")])
    outcome = planning.plan_job(small_job(pipeline=1, tensor=8, data=1), cluster)
    assert isinstance(outcome, planning.Unschedulable)
    assert outcome.message.endswith("0 qualify: 1 has GPUs in use by ParallelJob gpt-7b")


RESOURCES = """  template:
    resources:
      requests: {cpu: "8", memory: 64Gi, rdma/ib: "1"}
"""


@pytest.mark.parametrize(
    ("allocatable", "requests", "said"),
    [
        ({"cpu": "12", "memory": "1Ti", "rdma/ib": "1"}, {"cpu": "8"}, "too little cpu (4 free, 8 requested)"),
        ({"cpu": "96", "memory": "80Gi", "rdma/ib": "1"}, {"memory": "32Gi"}, "too little memory (48Gi free, 64Gi"),
        ({"cpu": "96", "memory": "1Ti"}, {}, "too little rdma/ib (0 free, 1 requested)"),
    ],
    ids=["cpu-taken-by-another-pod", "memory-taken-by-another-pod", "no-rdma-device"],
)
def test_a_node_without_room_for_the_pods_requests_is_named_with_the_resource(allocatable, requests, said) -> None:
    nodes = [node("taken", allocatable=allocatable), node("free", allocatable={"cpu": "96", "memory": "1Ti"})]
    nodes[1]["status"]["allocatable"]["rdma/ib"] = "1"
    pods = [pod("other", "taken", 0, requests={k: v for k, v in requests.items()})] if requests else []
    job_ = small_job(pipeline=1, tensor=8, data=2, extra=RESOURCES)
    message = unschedulable(job_, nodes, pods)
    assert message.startswith("needs 2 nodes with 8 free nvidia.com/gpu")
    assert f"1 qualifies: 1 has {said}" in message


def test_the_free_node_is_chosen_over_the_one_whose_cpu_another_pod_takes() -> None:
    nodes = [node(name, allocatable={"cpu": "12", "memory": "1Ti", "rdma/ib": "1"}) for name in ("n0", "n1", "n2")]
    placed = plan(
        small_job(pipeline=1, tensor=8, data=2, extra=RESOURCES), nodes, [pod("other", "n0", 0, requests={"cpu": "8"})]
    )
    assert sorted(entry.node for entry in placed.nodes) == ["n1", "n2"]


def test_a_cluster_file_without_cpu_or_memory_is_not_checked_for_them() -> None:
    nodes = [node("n0"), node("n1")]
    for each in nodes:
        each["status"]["allocatable"]["rdma/ib"] = "1"
    assert len(plan(small_job(pipeline=1, tensor=8, data=2, extra=RESOURCES), nodes).nodes) == 2
