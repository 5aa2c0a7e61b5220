"""Rank layout against the plan and launcher, the data each DP rank reads, the LR schedule, FLOPs, hook loading."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from paralleljob_contract.environment import Launch
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import DataConfig, ModelConfig, Plan, parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_contract.model import training_flops
from paralleljob_trainer import data
from paralleljob_trainer.hooks import load_hook
from paralleljob_trainer.optimization import warmup_cosine
from paralleljob_trainer.topology import build_topology, check_launch_matches, check_plan_matches, coords_of
from testcluster import trainer_harness as harness

SGD = {"type": "SGD", "params": {"lr": 0.1}}


def _plan(layout: Layout, axis_order: list[str] | None = None, ranks_per_node: int | None = None) -> Plan:
    document = harness.job_document(layout, optimizer=SGD, ranks_per_node=ranks_per_node)
    if axis_order:
        document["plan"]["axisOrder"] = axis_order
    return parse_job_config(document).plan


@pytest.mark.parametrize("layout", [Layout(2, 2, 2), Layout(4, 2, 1), Layout(1, 4, 2)])
def test_default_topology_matches_row_major_plan(layout: Layout) -> None:
    plan = _plan(layout)
    topology = build_topology(plan)
    check_plan_matches(topology, plan, layout.world_size)
    assert coords_of(topology, 1).model == (1 if layout.tensor > 1 else 0)


def test_a_topology_in_another_axis_order_than_the_plan_is_refused() -> None:
    plan = _plan(Layout(2, 2, 2), ["data", "pipe", "model"])
    default_order = build_topology(_plan(Layout(2, 2, 2)))
    with pytest.raises(ContractError, match="rank layout mismatch: the plan puts rank 2"):
        check_plan_matches(default_order, plan, 8)


def test_data_pipe_model_order_matches_a_plan_made_in_that_order() -> None:
    document = harness.job_document(Layout(2, 2, 2), optimizer=SGD, axis_order=("data", "pipe", "model"))
    plan = parse_job_config(document).plan
    topology = build_topology(plan)
    check_plan_matches(topology, plan, 8)
    # One replica's consecutive stages are neighbours: rank 2 is stage 1 of replica 0.
    assert coords_of(topology, 2) == coords_of(topology, 2).__class__(pipe=1, data=0, model=0)


LAUNCH_MISMATCHES = {
    "nproc-per-node": (
        Launch(rank=5, world_size=8, local_world_size=8),
        "LOCAL_WORLD_SIZE is 8 but plan.ranksPerNode is 4",
    ),
    "node-rank-env": (
        Launch(rank=5, world_size=8, local_world_size=4, node_rank=0),
        "PARALLELJOB_NODE_RANK is 0 but rank 5 with 4 ranks per node runs on node 1",
    ),
}


@pytest.mark.parametrize("case", list(LAUNCH_MISMATCHES))
def test_launcher_must_place_ranks_on_nodes_as_planned(case: str) -> None:
    plan = _plan(Layout(2, 2, 2), ranks_per_node=4)
    check_launch_matches(plan, Launch(rank=5, world_size=8, local_world_size=4, node_rank=1))
    launch, message = LAUNCH_MISMATCHES[case]
    with pytest.raises(ContractError, match=message):
        check_launch_matches(plan, launch)


def test_launcher_environment_must_come_from_torchrun() -> None:
    with pytest.raises(ContractError, match="LOCAL_WORLD_SIZE not set: start the trainer with torchrun"):
        Launch.from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    launch = Launch.from_environ(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "PARALLELJOB_NODE_RANK": "1"}
    )
    assert launch == Launch(rank=3, world_size=4, local_world_size=2, node_rank=1)


def test_world_size_must_equal_the_plan() -> None:
    plan = _plan(Layout(2, 2, 2))
    with pytest.raises(ContractError, match="WORLD_SIZE is 4 but the plan has 8 ranks"):
        check_plan_matches(build_topology(plan), plan, 4)


def _stream(tmp_path: Path, source: str = "synthetic") -> data.TokenStream:
    config = DataConfig(source=source, path=None, token_dtype="uint16")
    if source != "synthetic":
        corpus = tmp_path / "corpus"
        (corpus / "sub").mkdir(parents=True)
        (corpus / "a.txt").write_text("hello world " * 50)
        (corpus / "sub" / "b.py").write_text("print('hi')\n" * 50)
        config = dataclasses.replace(config, path=corpus)
    return data.open_stream(config, vocab_size=256, sequence_length=16, seed=3)


@pytest.mark.parametrize("source", ["synthetic", "text"])
def test_data_parallel_slices_tile_the_global_batch_and_repeat_exactly(tmp_path: Path, source: str) -> None:
    stream = _stream(tmp_path, source)
    whole, labels = stream.global_batch(5, slice(None), 8)
    parts = [
        torch.cat([m[0] for m in data.micro_batches(stream, 5, 8, 2, data_parallel=2, data_rank=r)]) for r in (0, 1)
    ]
    assert torch.equal(torch.cat(parts), whole)
    assert torch.equal(whole[:, 1:], labels[:, :-1])
    assert torch.equal(stream.global_batch(5, slice(None), 8)[0], whole)
    assert not torch.equal(stream.global_batch(6, slice(None), 8)[0], whole)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_files_are_memory_mapped_in_their_dtype(tmp_path: Path, dtype: str) -> None:
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=dtype).tofile(path)
    stream = data.open_stream(DataConfig("tokens", path, dtype), vocab_size=1000, sequence_length=8, seed=1)
    inputs, labels = stream.global_batch(1, slice(None), 4)
    assert torch.equal(labels, inputs + 1)


def test_token_outside_the_vocabulary_is_found_when_the_file_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One bad id at the very end, in the last of several chunks: no sampled window need ever contain it.
    monkeypatch.setattr(data, "_VOCAB_CHECK_CHUNK", 64)
    path = tmp_path / "train.bin"
    tokens = np.zeros(1000, dtype=np.uint16)
    tokens[-1] = 300
    tokens.tofile(path)
    with pytest.raises(ContractError, match=f"{path} holds token id 300, outside spec.model.vocabSize \\(256\\)"):
        data.open_stream(DataConfig("tokens", path, "uint16"), vocab_size=256, sequence_length=8, seed=1)
    # No uint16 id can reach a vocabulary above 65535: nothing to check.
    data.open_stream(DataConfig("tokens", path, "uint16"), vocab_size=70_000, sequence_length=8, seed=1)


def test_step_flops_are_six_per_weight_and_token_plus_attention_and_honour_the_ffn_width() -> None:
    def model(ffn: int) -> ModelConfig:
        document = harness.job_document(Layout(1, 1, 1), optimizer=SGD, model={"ffnHiddenSize": ffn})
        return parse_job_config(document).model

    h, s, layers, v = 64, 32, 4, 256
    tokens = 8 * s
    for ffn in (4 * h, 96):
        matmul_weights = layers * (4 * h * h + 2 * h * ffn) + h * v
        attention = 3 * tokens * layers * 4 * s * h
        assert training_flops(model(ffn).shape, tokens) == 6 * tokens * matmul_weights + attention
    # With the usual 4h FFN the blocks cost Narayanan et al.'s 72 B s l h^2 (1 + s/6h).
    narayanan_blocks = 72 * tokens * layers * h * h * (1 + s / (6 * h))
    assert training_flops(model(4 * h).shape, tokens) == pytest.approx(narayanan_blocks + 6 * tokens * h * v)


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor() -> None:
    ratios = [warmup_cosine(step, warmup_steps=4, total_steps=20, min_ratio=0.1) for step in range(20)]
    assert ratios[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a > b for a, b in itertools.pairwise(ratios[3:]))
    assert math.isclose(ratios[-1], 0.1)


def test_progress_hook_reference_must_name_a_factory_of_hooks() -> None:
    with pytest.raises(ContractError, match="expected module:factory"):
        load_hook("tests.trainer.progress_hooks")
    with pytest.raises(ContractError, match="needs on_step, on_checkpoint and on_finish"):
        load_hook("builtins:object")
