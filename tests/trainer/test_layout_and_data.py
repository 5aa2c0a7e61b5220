"""Rank layout against the plan, the data order each DP rank reads, the LR schedule and hook loading."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from paralleljob_trainer import data
from paralleljob_trainer.config import ConfigError, DataConfig, Plan, parse_job_config
from paralleljob_trainer.hooks import load_hook
from paralleljob_trainer.optimization import warmup_cosine
from paralleljob_trainer.topology import build_topology, check_plan_matches, coords_of
from tests.trainer import harness

SGD = {"type": "SGD", "params": {"lr": 0.1}}


def _plan(layout: harness.Layout, axis_order: list[str] | None = None) -> Plan:
    document = harness.job_document(layout, optimizer=SGD)
    if axis_order:
        document["plan"]["axisOrder"] = axis_order
    return parse_job_config(document).plan


@pytest.mark.parametrize("layout", [harness.Layout(2, 2, 2), harness.Layout(4, 2, 1), harness.Layout(1, 4, 2)])
def test_default_topology_matches_row_major_plan(layout: harness.Layout) -> None:
    plan = _plan(layout)
    topology = build_topology(plan)
    check_plan_matches(topology, plan, layout.world)
    assert coords_of(topology, 1).model == (1 if layout.tensor > 1 else 0)


def test_other_axis_order_is_refused_when_plan_coords_follow_the_default() -> None:
    plan = _plan(harness.Layout(2, 2, 2), ["data", "pipe", "model"])
    with pytest.raises(ConfigError, match="rank layout mismatch: plan puts rank 2"):
        check_plan_matches(build_topology(plan), plan, 8)


def test_world_size_must_equal_the_plan() -> None:
    plan = _plan(harness.Layout(2, 2, 2))
    with pytest.raises(ConfigError, match="WORLD_SIZE is 4 but the plan has 8 ranks"):
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


def test_token_outside_the_vocabulary_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    np.full(100, 300, dtype=np.uint16).tofile(path)
    stream = data.open_stream(DataConfig("tokens", path, "uint16"), vocab_size=256, sequence_length=8, seed=1)
    with pytest.raises(ConfigError, match="token id 300 is outside"):
        stream.global_batch(1, slice(None), 2)


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor() -> None:
    ratios = [warmup_cosine(step, warmup_steps=4, total_steps=20, min_ratio=0.1) for step in range(20)]
    assert ratios[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a > b for a, b in itertools.pairwise(ratios[3:]))
    assert math.isclose(ratios[-1], 0.1)


def test_progress_hook_reference_must_name_a_factory_of_hooks() -> None:
    with pytest.raises(ConfigError, match="expected module:factory"):
        load_hook("tests.trainer.progress_hooks")
    with pytest.raises(ConfigError, match="needs on_step, on_checkpoint and on_finish"):
        load_hook("builtins:object")
