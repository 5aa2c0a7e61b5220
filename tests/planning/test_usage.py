"""The GPU-usage index: one claim per bound, unfinished pod, totals per node, kept from watch events and
corrected by relists, with the scheduler's rules for what a pod requests."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from paralleljob import planning
from paralleljob.planning.usage import Claim, NodeUsage, UsageIndex, claim_of, milli_quantity


def pod(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


TRAINER = pod("""
metadata: {name: gpt-0, namespace: research}
spec:
  nodeName: gpu-001
  containers:
  - name: trainer
    resources: {limits: {nvidia.com/gpu: 8}, requests: {cpu: "90", memory: 900Gi}}
status: {phase: Running}
""")

CLAIMS = {
    "a bound trainer claims its GPUs, CPU and memory": (
        TRAINER,
        Claim("gpu-001", "gpt-0", 8, (("cpu", 90_000), ("memory", 900 * 2**30 * 1000))),
    ),
    "an unbound pod claims nothing": (pod("metadata: {name: p}\nspec: {containers: [{name: c}]}"), None),
    "a finished pod claims nothing": ({**TRAINER, "status": {"phase": "Succeeded"}}, None),
    "a failed pod claims nothing": ({**TRAINER, "status": {"phase": "Failed"}}, None),
    "a bound pod that requests nothing claims nothing": (
        pod("metadata: {name: p}\nspec: {nodeName: n, containers: [{name: c}]}"),
        None,
    ),
    "containers add up, a larger init container wins, overhead is added": (
        pod("""
metadata: {name: p}
spec:
  nodeName: n
  overhead: {cpu: 250m}
  initContainers: [{name: warm, resources: {requests: {cpu: "3", nvidia.com/gpu: 1}}}]
  containers:
  - {name: a, resources: {requests: {cpu: 500m}, limits: {nvidia.com/gpu: 1}}}
  - {name: b, resources: {requests: {cpu: "1"}, limits: {nvidia.com/gpu: 1}}}
"""),
        Claim("n", "p", 2, (("cpu", 3250),)),
    ),
    "a sidecar runs beside the containers and adds to them": (
        pod("""
metadata: {name: p}
spec:
  nodeName: n
  initContainers: [{name: proxy, restartPolicy: Always, resources: {requests: {cpu: "1"}}}]
  containers: [{name: a, resources: {requests: {cpu: "2"}}}]
"""),
        Claim("n", "p", 0, (("cpu", 3000),)),
    ),
}


@pytest.mark.parametrize(("pod_dict", "expected"), CLAIMS.values(), ids=CLAIMS.keys())
def test_what_a_pod_claims(pod_dict: dict[str, Any], expected: Claim | None) -> None:
    assert claim_of(pod_dict) == expected


@pytest.mark.parametrize(
    ("text", "milli"),
    [("500m", 500), ("2", 2000), ("1Ki", 1_024_000), ("1e3", 1_000_000), ("1.5", 1500), ("1n", 1), ("x", None)],
    ids=["milli", "whole", "binary-suffix", "exponent", "decimal", "nano-rounds-up", "unparsable"],
)
def test_quantities_read_as_the_api_writes_them(text: str, milli: int | None) -> None:
    assert milli_quantity(text) == milli


def on(node: str, name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "research"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase},
    }


def test_watch_events_keep_per_node_totals_and_say_when_gpus_were_released() -> None:
    index = UsageIndex()
    assert not index.observe("ADDED", on("n0", "a", 4))
    assert not index.observe("ADDED", on("n0", "b", 2))
    assert index.usage() == {"n0": NodeUsage(6, ("a", "b"))}
    assert index.observe("MODIFIED", on("n0", "a", 4, phase="Succeeded"))
    assert index.usage() == {"n0": NodeUsage(2, ("b",))}
    assert not index.observe("MODIFIED", on("n0", "b", 2))  # a status heartbeat changes nothing
    assert index.observe("DELETED", on("n0", "b", 2))
    assert index.usage() == {} and len(index) == 0


def test_a_snapshot_counts_the_changes_that_released_requests_and_only_those() -> None:
    index = UsageIndex()
    index.observe("ADDED", on("n0", "a", 4))
    index.observe("ADDED", on("n0", "b", 2))
    before = index.snapshot().released
    index.observe("ADDED", on("n1", "c", 8))  # less room: an admission that did not fit still does not
    index.observe("MODIFIED", on("n0", "b", 2))
    assert index.snapshot().released == before
    index.observe("MODIFIED", on("n0", "a", 4, phase="Succeeded"))
    index.replace([on("n1", "c", 8)])  # a relist that finds b gone
    assert index.snapshot().released == before + 2
    assert index.snapshot().without([("research", "c")]).released == before + 2


def test_a_relist_corrects_what_the_watch_missed_and_counts_the_drift() -> None:
    index = UsageIndex.of([on("n0", "a", 4), on("n1", "b", 4)])
    drift = index.replace(iter([on("n1", "b", 4), on("n2", "c", 8)]))  # a was deleted, c added, unseen
    assert drift == 2
    assert index.usage() == {"n1": NodeUsage(4, ("b",)), "n2": NodeUsage(8, ("c",))}
    assert index.bound() == {("research", "b"), ("research", "c")}


def test_a_pod_listed_twice_counts_once() -> None:
    cluster = planning.build_cluster(
        [{"metadata": {"name": "n0"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}],
        [on("n0", "a", 4), on("n0", "a", 4)],
    )
    assert cluster.nodes[0].free_gpus == 4


def test_the_cluster_builder_reuses_records_of_nodes_that_did_not_change() -> None:
    nodes = planning.inventory.sort_nodes(
        planning.inventory.node_info(
            {"metadata": {"name": f"n{i}"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
        )
        for i in range(3)
    )
    index = UsageIndex.of([on("n1", "a", 8)])
    builder = planning.inventory.ClusterBuilder()
    first = builder.build(nodes, index.usage())
    index.observe("ADDED", on("n2", "b", 8))
    second = builder.build(nodes, index.usage(), [planning.Reservation("n0", 8, "research/other")])
    assert [n.free_gpus for n in second.nodes] == [0, 0, 0]
    assert second.nodes[1] is first.nodes[1]  # unchanged usage: the same record
    assert second.nodes[2].holders == ("b",) and second.nodes[0].reserved_by == ("research/other",)


def test_a_snapshot_without_pods_the_api_no_longer_has_frees_their_gpus() -> None:
    index = UsageIndex.of([on("n0", "gpt-0", 4), on("n0", "other-0", 2), on("n1", "gpt-1", 4)])
    snapshot = index.snapshot()
    fresher = snapshot.without([("research", "gpt-0"), ("research", "gpt-1"), ("research", "never-existed")])
    assert fresher.usage == {"n0": NodeUsage(2, ("other-0",)), "n1": NodeUsage(0, ())}
    assert fresher.bound == {("research", "other-0")}
    assert snapshot.usage["n0"].gpus == 6  # the snapshot itself is left as it was
