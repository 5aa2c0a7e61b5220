"""What the tests of tests/manifests share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import yaml

from paralleljob import planning
from paralleljob.api import ResolvedJob, validate_document
from paralleljob.manifests import children, security
from paralleljob.planning import Estimates, NodePlan, PlacementCost, Plan, synth
from paralleljob.planning.inventory import build_cluster
from paralleljob_contract.layout import Layout
from testcluster.admin import JOB_YAML


def resolve(text: str = JOB_YAML, **spec_patch: Any) -> ResolvedJob:
    """Validate a job document (optionally with top-level spec keys replaced) and return it resolved."""
    doc = yaml.safe_load(text)
    doc["spec"].update(spec_patch)
    result = validate_document(doc)
    assert result.resolved is not None, [p.render() for p in result.problems]
    return result.resolved


def make_plan(
    nodes: int = 4, gpus: int = 4, layout: tuple[int, int, int] = (2, 4, 2), names: Sequence[str] = ()
) -> Plan:
    """A planner's Plan, node rank r on `names[r]` (default `node-r`), pipe,data,model order, no estimates."""
    sizes = Layout(*layout)
    entries = []
    for rank in range(nodes):
        ranks = tuple(range(rank * gpus, (rank + 1) * gpus))
        name = names[rank] if names else f"node-{rank}"
        entries.append(NodePlan(rank, name, gpus, ranks, tuple(sizes.coord(r) for r in ranks)))
    nothing = Estimates(0.0, {}, None, 0.1, {}, 0.0, 0.0, 0.0, {})
    return Plan(sizes, gpus, tuple(entries), nothing, PlacementCost(0.0, {}, {}), None)


def make_node(
    name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Node dict with labels and allocatable resources."""
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"allocatable": allocatable or {}}}


EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
# Every example job but deepspeed-zero2-pipeline.yaml, the example of a job the API refuses (ZeRO 2 with a
# pipeline), and gpt-175b-budget.yaml, gpt-175b-64xa100.yaml with its layout left to the search: the same pods.
JOB_EXAMPLES = [
    "quickstart.yaml",
    "quickstart-prepared.yaml",
    "quickstart-on-a-cluster.yaml",
    "gpt-small-8gpu.yaml",
    "gpt-13b-fragmented.yaml",
    "gpt-175b-64xa100.yaml",
    "llama-8b-64xh100.yaml",
    "llama-tiny.yaml",
    "llama-tiny-pretrained.yaml",
]
RDMA = {"fabric": "infiniband", "rdmaResource": {"name": "rdma/ib"}}


def example_pods(
    name: str, network: dict[str, Any] | None = None, pod_security: security.PodSecurity = security.DEFAULT
) -> list[dict[str, Any]]:
    """The pods the operator makes for an example job, planned on 16 synthetic 8-GPU H100 nodes (with an RDMA
    device each when `network` is RDMA)."""
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["metadata"].setdefault("namespace", "research")
    doc["metadata"]["uid"] = "u-1"
    if network is not None:
        doc["spec"]["network"] = network
    resolved = validate_document(doc).resolved
    assert resolved is not None
    nodes, _ = synth.synth_cluster(synth.SynthSpec(nodes=16, gpus_per_node=8, gpu_product="NVIDIA-H100-80GB-HBM3"))
    for node in nodes if network == RDMA else ():
        node["status"]["allocatable"]["rdma/ib"] = "1"
    plan = planning.plan_job(resolved, build_cluster(nodes, []))
    assert isinstance(plan, planning.Plan)
    planned = [n for n in nodes if n["metadata"]["name"] in {e.node for e in plan.nodes}]
    attempt = children.build_attempt(doc, resolved, plan, planned, attempt=0)
    placed = [entry.node for entry in plan.nodes]
    built = children.build_children(doc, resolved, attempt.config_map, placed, image="t:1", pod_security=pod_security)
    return list(built.pods)
