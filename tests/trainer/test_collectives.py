"""Collective code paths on a real two-rank gloo group, without a model: resume agreement and TP gradient sync."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import manifest, storage
from testcluster import trainer_harness as harness
from tests.trainer.collective_workers import (
    average_replicated_gradients,
    average_two_dtypes,
    resume_from_own_folder,
    run_on_ranks,
)


@pytest.mark.slow  # a gang of processes: the training runs' lane, and not `make check`
def test_ranks_resume_from_the_checkpoint_rank_0_lists_even_when_their_folder_differs(tmp_path: Path) -> None:
    folder = tmp_path / "rank-0" / "global_step6"
    folder.mkdir(parents=True)
    torch.save({"step": 6}, folder / "mp_rank_00_model_states.pt")
    job = parse_job_config(harness.job_document(Layout(1, 1, 2), optimizer={"type": "SGD", "params": {"lr": 0.1}}))
    states = folder / "mp_rank_00_model_states.pt"
    files = [storage.WrittenFile(str(states), states.stat().st_size, storage.sha256_of(states))]
    manifest.write(folder, manifest.build(job, 6, folder, files))
    (tmp_path / "rank-1").mkdir()

    results = run_on_ranks(resume_from_own_folder, 2, tmp_path)

    # Rank 1 must not start from scratch while rank 0 waits for it: both stop on the same agreed problem.
    assert [outcome for outcome, _ in results] == ["ok", "ok"], results
    (kind0, message0), (kind1, message1) = (value for _, value in results)
    assert kind0 == kind1 == "error", results
    for message in (message0, message1):
        assert "global_step6" in message and "manifest.json differs or is missing on rank 1" in message


@pytest.mark.slow
def test_replicated_gradients_are_averaged_over_tensor_parallel_before_the_data_parallel_reduction() -> None:
    results = run_on_ranks(average_replicated_gradients, 2)

    assert [outcome for outcome, _ in results] == ["ok", "ok"], results
    for rank, (_, by_precision) in enumerate(results):
        for precision, value in by_precision.items():
            where = f"rank {rank}, {precision}"
            assert value["replicated"] == [1.5] * 3, where
            assert value["sharded"] == [float(rank + 1)] * 2, f"{where}: a sharded gradient must stay local"
            assert value["reduced_after"] == [1.5], f"{where}: DeepSpeed's reduction must run after averaging"


@pytest.mark.slow
def test_tensors_of_two_dtypes_are_each_averaged_or_summed_as_asked() -> None:
    # The loop over one dtype's tensors once reused the name of the `mean` flag, so the next dtype read a tensor
    # as the flag (mypy --strict found it): an error for a tensor of several values, a wrong answer for one.
    results = run_on_ranks(average_two_dtypes, 2)

    assert [outcome for outcome, _ in results] == ["ok", "ok"], results
    for _, found in results:
        assert found == {"mean": [1.5] * 5, "sum": [3.0] * 5}
