"""The layout search: every candidate is a valid job that uses the budget exactly, the winner is the fastest
modeled layout of all, the 3D rule's three regimes come out as the rule says, and bad budgets get one line."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob import planning
from paralleljob.api import types as api_types
from paralleljob.api import validate_document
from paralleljob.planning import layout_search
from paralleljob.planning.layout_search import Budget, LayoutChoice, NoLayout
from tests.planning.clusters import job, node, pod

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
GIB = 1024**3


def gpt(layers: int, hidden: int, heads: int, train_batch: int, extra: str = "", name: str = "gpt") -> Any:
    """A GPT job as a user writes it: the layout is a placeholder the search replaces."""
    return job(
        f"""
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {{name: {name}}}
spec:
  parallelism: {{pipeline: 1, tensor: 1, data: 1}}
  model: {{layers: {layers}, hiddenSize: {hidden}, attentionHeads: {heads}, sequenceLength: 2048, vocabSize: 51200}}
  deepspeed: {{train_batch_size: {train_batch}, train_micro_batch_size_per_gpu: 1{extra}}}
  training: {{steps: 10}}
  checkpoint: {{intervalSteps: 5, volume: {{emptyDir: {{}}}}}}
"""
    )


def a100_cluster(nodes: int, per_leaf: int = 4) -> planning.Cluster:
    return planning.build_cluster(
        node(f"gpu-{i}", gpus=8, leaf=f"leaf-{i // per_leaf}", spine="s0") for i in range(nodes)
    )


def choose(resolved: Any, cluster: planning.Cluster, gpus: int) -> LayoutChoice:
    outcome = layout_search.choose_layout(resolved, cluster, Budget(gpus))
    assert isinstance(outcome, LayoutChoice), getattr(outcome, "message", outcome)
    return outcome


# --- properties ----------------------------------------------------------------------------------------


@st.composite
def searches(draw: st.DrawFn) -> dict[str, Any]:
    """A small GPT, a budget and a cluster of 4- or 8-GPU nodes, some busy, some with little GPU memory."""
    gpus = draw(st.sampled_from([4, 8]))
    count = draw(st.integers(2, 5))
    memory = draw(st.sampled_from(["4096", "8192", "81920"]))
    nodes, pods = [], []
    for i in range(count):
        labels = {"nvidia.com/gpu.memory": memory}
        nodes.append(node(f"n{i}", gpus=gpus, leaf=f"l{draw(st.integers(0, 2))}", spine="s0", labels=labels))
        if draw(st.integers(0, 3)) == 0:
            pods.append(pod(f"p{i}", f"n{i}", gpus // 2))
    layers = draw(st.sampled_from([2, 4, 6]))
    hidden, heads = draw(st.sampled_from([(1024, 8), (2048, 16), (3072, 24)]))
    budget = draw(st.sampled_from([2, 4, 6, 8, 12]))
    resolved = job(
        f"""
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {{name: prop}}
spec:
  parallelism: {{pipeline: 1, tensor: 1, data: 1}}
  model: {{layers: {layers}, hiddenSize: {hidden}, attentionHeads: {heads}, sequenceLength: 1024, vocabSize: 8192}}
  deepspeed: {{train_batch_size: 48}}
  training: {{steps: 10}}
  checkpoint: {{intervalSteps: 5, volume: {{emptyDir: {{}}}}}}
"""
    )
    return {"job": resolved, "cluster": planning.build_cluster(nodes, pods), "budget": budget}


def every_placed_variant(case: dict[str, Any]) -> list[tuple[float, float]]:
    """(planned step time, search bound) of every valid variant that fits and places: exhaustive, no pruning."""
    resolved, cluster, budget = case["job"], case["cluster"], Budget(case["budget"])
    found = []
    for shape in layout_search.shapes(budget):
        for variant in layout_search.variants(resolved, shape):
            candidate, _ = layout_search.variant_job(resolved, variant)
            if candidate is None:
                continue
            plan = planning.plan_job(candidate, cluster)
            if isinstance(plan, planning.Unschedulable):
                continue
            memory, gpu_memory = plan.estimates.memory["total"], plan.estimates.gpu_memory
            if gpu_memory is None or memory <= gpu_memory * (1 - layout_search.MEMORY_MARGIN):
                found.append((plan.estimates.step_seconds, variant))
    return found


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(searches())
def test_the_winner_is_the_fastest_placed_variant_and_every_candidate_is_a_valid_job_of_the_budget(
    case: dict[str, Any],
) -> None:
    outcome = layout_search.choose_layout(case["job"], case["cluster"], Budget(case["budget"]))
    exhaustive = every_placed_variant(case)
    if isinstance(outcome, NoLayout):
        assert not exhaustive, f"the search found nothing but {exhaustive[0]} places"
        assert "\n" not in outcome.message
        return
    assert outcome.winner.step_seconds <= min(step for step, _ in exhaustive) * (1 + 1e-9)
    for candidate in outcome.ranked:
        assert candidate.bound <= candidate.step_seconds * (1 + 1e-9)
        assert candidate.plan.world_size == case["budget"] == sum(entry.gpus for entry in candidate.plan.nodes)
        as_yaml = {"apiVersion": api_types.API_VERSION, "kind": api_types.KIND, "metadata": {"name": "prop"}}
        assert validate_document({**as_yaml, "spec": candidate.job.resolved_spec()}).ok
    steps = [candidate.step_seconds for candidate in outcome.ranked]
    assert steps == sorted(steps)


@pytest.mark.parametrize("gpus", [1, 12, 64, 96], ids=lambda g: f"{g}-gpus")
def test_the_search_space_is_every_factorisation_of_the_budget(gpus: int) -> None:
    expected = {(p, t, d) for p, t, d in itertools.product(range(1, gpus + 1), repeat=3) if p * t * d == gpus}
    assert set(layout_search.shapes(Budget(gpus))) == expected


def test_fixed_sizes_are_kept() -> None:
    assert {shape[1] for shape in layout_search.shapes(Budget(64, {"tensor": 4}))} == {4}
    assert set(layout_search.shapes(Budget(64, {"tensor": 4, "pipeline": 8}))) == {(8, 4, 2)}


# --- the three regimes of the rule ---------------------------------------------------------------------

REGIMES = {
    "350M-fits-one-gpu": (gpt(24, 1024, 16, 512), 2, 16),
    "30B-fits-one-node": (gpt(48, 7168, 56, 512), 4, 32),
    "175B-needs-pipeline": (gpt(96, 12288, 96, 1536), 8, 64),
}


@pytest.mark.parametrize(("resolved", "nodes", "gpus"), REGIMES.values(), ids=REGIMES.keys())
def test_the_3d_rule_holds_in_each_regime(request: pytest.FixtureRequest, resolved: Any, nodes: int, gpus: int) -> None:
    winner = choose(resolved, a100_cluster(nodes), gpus).winner
    pipeline, tensor, data = winner.variant.shape
    regime = request.node.callspec.id
    if regime == "350M-fits-one-gpu":
        assert (pipeline, tensor, data) == (1, 1, gpus)
    elif regime == "30B-fits-one-node":
        assert pipeline == 1 and 1 < tensor <= 8
    else:
        assert pipeline > 1 and tensor <= 8
        assert winner.plan.ranks_per_node % tensor == 0  # every TP group inside one node


def test_the_explanation_follows_the_rule_in_order() -> None:
    small = choose(gpt(24, 1024, 16, 512), a100_cluster(2), 16).explanation
    assert small[0].startswith("1. the model fits one GPU")
    node_sized = choose(gpt(48, 7168, 56, 512), a100_cluster(4), 32).explanation
    assert "2. TP 2 inside one NVLink domain fits" in node_sized[0]
    assert node_sized[2].startswith("the runner-up ") and "slower" in node_sized[2]


# --- the seed's case -----------------------------------------------------------------------------------


def test_gpt_175b_on_64_a100_picks_pp8_tp4_dp2() -> None:
    resolved = validate_document(yaml.safe_load((EXAMPLES / "gpt-175b-64xa100.yaml").read_text())).resolved
    cluster_docs = yaml.safe_load_all((EXAMPLES / "cluster-8x8-a100.yaml").read_text())
    cluster = planning.build_cluster(planning.inventory.split_objects(cluster_docs).nodes)
    choice = choose(resolved, cluster, 64)
    assert choice.winner.variant.shape == (8, 4, 2)
    assert (choice.winner.variant.micro_batch, choice.winner.variant.recompute) == (1, True)
    assert "3. so it needs PP across nodes: PP 8 x TP 4" in choice.explanation[0]


# --- errors --------------------------------------------------------------------------------------------


def test_a_budget_no_layout_can_use_names_why_and_the_nearest_budgets() -> None:
    four_layers = gpt(4, 1024, 16, 512)
    outcome = layout_search.choose_layout(four_layers, a100_cluster(2), Budget(7))
    assert isinstance(outcome, NoLayout)
    assert outcome.message.startswith("no valid layout uses exactly 7 GPUs (e.g. ")
    assert outcome.message.endswith("; try 6 or 8 GPUs")


def test_a_model_that_fits_nowhere_names_the_closest_candidate_and_the_budget_that_fits() -> None:
    outcome = layout_search.choose_layout(REGIMES["175B-needs-pipeline"][0], a100_cluster(8), Budget(8))
    assert isinstance(outcome, NoLayout)
    assert outcome.message.startswith("no layout of 8 GPUs fits in memory: the closest, ")
    assert "GiB per GPU of 72 GiB usable" in outcome.message
    assert "micro-batch 1" in outcome.message and "recomputation" in outcome.message
    assert "use 48 GPUs" in outcome.message


def test_a_pinned_zero_0_is_kept_and_the_error_says_to_allow_zero_1() -> None:
    pinned = gpt(24, 2048, 16, 64, ", zero_optimization: {stage: 0}")
    tiny = planning.build_cluster([node("n0", gpus=8, labels={"nvidia.com/gpu.memory": "24576"})])
    outcome = layout_search.choose_layout(pinned, tiny, Budget(1))
    assert isinstance(outcome, NoLayout)
    assert "allow ZeRO-1" in outcome.message
    choice = choose(pinned, a100_cluster(1), 8)
    assert {candidate.variant.zero_stage for candidate in choice.ranked} == {0}


def test_a_budget_larger_than_the_free_gpus_says_what_the_best_layout_needs() -> None:
    outcome = layout_search.choose_layout(REGIMES["175B-needs-pipeline"][0], a100_cluster(8), Budget(128))
    assert isinstance(outcome, NoLayout)
    assert "no candidate layout places on the cluster now" in outcome.message
    assert "needs 16 nodes with 8 free nvidia.com/gpu" in outcome.message


def test_a_budget_that_pods_of_gpus_per_node_cannot_split_is_one_line() -> None:
    four_per_pod = job(
        """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: budget}
spec:
  parallelism: {gpus: 7}
  gpusPerNode: 4
  model: {layers: 8, hiddenSize: 256, attentionHeads: 8, sequenceLength: 128, vocabSize: 512}
  deepspeed: {train_batch_size: 32}
  training: {steps: 10}
  checkpoint: {intervalSteps: 5, volume: {emptyDir: {}}}
"""
    )
    budget = layout_search.budget_of(four_per_pod)
    assert budget == Budget(7)
    outcome = layout_search.choose_layout(four_per_pod, a100_cluster(2), budget)
    assert isinstance(outcome, NoLayout)
    assert outcome.message.startswith("no valid layout uses exactly 7 GPUs")
    assert outcome.message.endswith("(e.g. 7 GPUs: do not split into pods of spec.gpusPerNode 4); try 4 or 8 GPUs")


def test_sequence_parallelism_stays_and_rules_out_layouts_without_tensor_parallelism() -> None:
    resolved = job(
        """
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {name: llama}
spec:
  parallelism: {pipeline: 1, tensor: 2, data: 1, sequenceParallel: true}
  model: {architecture: llama, layers: 16, hiddenSize: 2048, attentionHeads: 16, kvHeads: 4, sequenceLength: 2048,
          vocabSize: 32000}
  deepspeed: {train_batch_size: 64, train_micro_batch_size_per_gpu: 1}
  training: {steps: 10}
"""
    )
    choice = choose(resolved, a100_cluster(2), 16)
    assert choice.ranked and all(candidate.variant.tensor > 1 for candidate in choice.ranked)
    assert all(candidate.job.spec.parallelism.sequence_parallel for candidate in choice.ranked)
