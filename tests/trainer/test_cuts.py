"""The TP cuts (`paralleljob_trainer.cuts`, looked up in `hf_layout`'s one table), against the model's own layers:
re-cutting one TP size's slices for another gives exactly what that TP's layer holds, reading only the saved
slices that overlap, and `merge` gives back the whole tensor."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import cuts, hf_layout, llama, model, weights
from paralleljob_trainer.tensor_parallel import TensorParallel
from testcluster import trainer_harness as harness

SEED = 7
# A llama with two KV heads (K and V cut by rows at TP 2, whole at TP 4) and a 300-token vocabulary, padded to
# 512 rows at TP 2 and 4 (TP 4's last rank holds padding rows only).
LLAMA = {"architecture": "llama", "kvHeads": 2, "vocabSize": 300, "ropeTheta": 500000.0}
GPT_KEYS = ["qkv.weight", "qkv.bias", "attn_out.weight", "mlp_up.weight", "mlp_down.weight", "ln1.weight"]
GPT_KEYS += ["positions.weight", "tokens.weight"]
LLAMA_KEYS = ["q.weight", "k.weight", "v.weight", "o.weight", "gate.weight", "down.weight", "tokens.weight"]


def _job(architecture: str, tensor: int) -> Any:
    spec = LLAMA if architecture == "llama" else None
    return parse_job_config(
        harness.job_document(Layout(1, tensor, 1), optimizer={"type": "SGD", "params": {}}, model=spec)
    )


def _config(architecture: str) -> dict[str, Any]:
    """The model section a checkpoint's manifest records."""
    return dataclasses.asdict(_job(architecture, 1).model)


def _layers(architecture: str, tensor: int, rank: int) -> dict[str, torch.Tensor]:
    """The state dict of block 1 and of the embedding as TP rank `rank` of `tensor` builds them."""
    job, tp = _job(architecture, tensor), TensorParallel(rank=rank, size=tensor)
    if architecture == "llama":
        block, embedding = llama.LlamaBlock(job.model, SEED, 1, tp), llama.LlamaEmbedding(job.model, SEED, tp)
    else:
        block, embedding = model.TransformerBlock(job.model, SEED, 1, tp), model.Embedding(job.model, SEED, tp)
    return block.state_dict() | embedding.state_dict()


def _recut(architecture: str, key: str, saved_tp: int, new: TensorParallel) -> tuple[torch.Tensor, set[int]]:
    """New rank `new`'s slice of `key` from the slices saved at `saved_tp`, and the saved ranks it read."""
    shape = _job(architecture, 1).model
    config = dataclasses.asdict(shape)
    saved = [_layers(architecture, saved_tp, rank)[key] for rank in range(saved_tp)]
    old_cut, new_cut = hf_layout.cut_of(config, key, saved_tp), hf_layout.cut_of(config, key, new.size)
    target = _layers(architecture, new.size, new.rank)[key]
    axis = cuts.shared_axis(old_cut, new_cut)
    length = new_cut.whole_length(target.shape[axis], new.size, shape.vocab_size)
    plan = cuts.recut_plan(old_cut, new_cut, length, saved_tp, new)
    read: set[int] = set()

    def slice_of(rank: int) -> torch.Tensor:
        read.add(rank)
        return saved[rank]

    return cuts.assemble(plan, target.shape, slice_of, target.dtype), read


@pytest.mark.parametrize(("saved_tp", "new_tp"), [(2, 4), (4, 2), (2, 1), (1, 4)], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize(
    ("architecture", "key"), [("gpt", key) for key in GPT_KEYS] + [("llama", key) for key in LLAMA_KEYS]
)
def test_slices_saved_at_one_tp_re_cut_for_another_are_that_tps_slices(
    architecture: str, key: str, saved_tp: int, new_tp: int
) -> None:
    for rank in range(new_tp):
        recut, _ = _recut(architecture, key, saved_tp, TensorParallel(rank=rank, size=new_tp))
        assert torch.equal(recut, _layers(architecture, new_tp, rank)[key])


@pytest.mark.parametrize(
    ("key", "rank", "read"),
    [
        ("q.weight", 1, {0}),  # TP 4's rows 1/4..2/4 lie in saved rank 0's half
        ("q.weight", 2, {1}),
        ("o.weight", 3, {1}),  # columns, the same
        ("attn_norm.weight", 3, {1}),  # replicated: from the saved rank the other tensors come from
        ("k.weight", 2, {0, 1}),  # whole at TP 4 (2 KV heads): both saved halves
        ("tokens.weight", 1, {0}),  # vocabulary rows 128..255 of 300, padded to 512 at either TP
        ("tokens.weight", 2, {1}),
        ("tokens.weight", 3, set()),  # padding rows only: nothing read, zero
    ],
)
def test_a_re_cut_rank_reads_only_the_saved_slices_that_overlap_its_own(key: str, rank: int, read: set[int]) -> None:
    recut, sources = _recut("llama", key, 2, TensorParallel(rank=rank, size=4))
    assert sources == read
    if not read:
        assert not recut.any(), "a slice of padding rows is zero"


@pytest.mark.parametrize("rank", [2, 3], ids=["real-and-padding-rows", "padding-rows-only"])
def test_a_re_cut_into_a_used_buffer_sets_the_vocabulary_padding_to_zero(rank: int) -> None:
    """A re-cut writes each element once, into the buffer it lives in (ZeRO 1's flat partition), never zeroing it
    first: the rows no saved slice covers are set to zero, whatever the buffer held."""
    config, new = _config("llama"), TensorParallel(rank=rank, size=4)
    old_cut, new_cut = hf_layout.cut_of(config, "tokens.weight", 2), hf_layout.cut_of(config, "tokens.weight", 4)
    plan = cuts.recut_plan(old_cut, new_cut, 300, 2, new)
    saved = [_layers("llama", 2, saved_rank)["tokens.weight"] for saved_rank in range(2)]
    target = _layers("llama", 4, rank)["tokens.weight"]
    used = torch.full_like(target, float("nan"))
    assert torch.equal(cuts.assemble_into(plan, used, saved.__getitem__), target)


@pytest.mark.parametrize("key", GPT_KEYS)
def test_merging_every_rank_s_slice_gives_the_one_process_tensor(key: str) -> None:
    config = _config("gpt")
    cut = hf_layout.cut_of(config, key, 2)
    whole = cut.merge([_layers("gpt", 2, rank)[key] for rank in range(2)], 256)
    assert torch.equal(whole.T if cut.transposed else whole, _layers("gpt", 1, 0)[key])


def test_the_vocabulary_is_unpadded_on_merge() -> None:
    whole = weights.normal(SEED, 0, "tokens", (300, 8))
    parts = [torch.cat([whole, whole.new_zeros(212, 8)]).chunk(4)[rank] for rank in range(4)]
    assert torch.equal(hf_layout.VOCAB.merge(parts, 300), whole)


@pytest.mark.parametrize(("kv_heads", "tensor", "kind"), [(2, 2, "rows"), (2, 4, "whole"), (None, 4, "rows")])
def test_llama_keys_and_values_are_cut_by_rows_only_when_tp_divides_the_kv_heads(
    kv_heads: int | None, tensor: int, kind: str
) -> None:
    config = {**_config("llama"), "kv_heads": kv_heads}
    assert hf_layout.cut_of(config, "k.weight", tensor).kind == kind


def test_a_tensor_without_a_known_cut_is_named() -> None:
    with pytest.raises(cuts.CutError, match=r"'rotary\.inv_freq' has no known tensor-parallel cut"):
        hf_layout.cut_of(_config("llama"), "rotary.inv_freq", 2)
