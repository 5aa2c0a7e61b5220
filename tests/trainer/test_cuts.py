"""The one table of TP cuts (`paralleljob_trainer.cuts`), against the model's own layers: the slice `split`
gives each TP rank is exactly what that rank's layer holds, and `merge` gives back the whole tensor."""

from __future__ import annotations

import pytest
import torch

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_contract.layout import Layout
from paralleljob_trainer import cuts, model, weights
from paralleljob_trainer.tensor_parallel import TensorParallel
from testcluster import trainer_harness as harness

SEED = 7


def _gpt(tensor: int, rank: int) -> dict[str, torch.Tensor]:
    """The state dict of GPT block 1 and of the embedding as TP rank `rank` of `tensor` builds them."""
    job = parse_job_config(harness.job_document(Layout(1, tensor, 1), optimizer={"type": "SGD", "params": {}}))
    tp = TensorParallel(rank=rank, size=tensor)
    block = model.TransformerBlock(job.model, SEED, 1, tp).state_dict()
    return block | {"tokens.weight": model.Embedding(job.model, SEED, tp).state_dict()["tokens.weight"]}


@pytest.mark.parametrize("tensor", [2, 4])
@pytest.mark.parametrize("key", ["qkv.weight", "attn_out.weight", "mlp_up.weight", "mlp_down.weight", "tokens.weight"])
def test_merging_the_slices_of_one_tp_and_cutting_them_for_another_gives_that_tps_slices(tensor: int, key: str) -> None:
    shape = {"vocab_size": 256, "attention_heads": 4}
    saved = [_gpt(2, rank)[key] for rank in range(2)]
    whole = cuts.merge(cuts.cut_of(shape, key, 2), saved, 256)
    assert torch.equal(whole, _gpt(1, 0)[key]), "the merge is the one-process tensor"
    for rank in range(tensor):
        assert torch.equal(cuts.split(cuts.cut_of(shape, key, tensor), whole, tensor, rank), _gpt(tensor, rank)[key])


def test_the_vocabulary_is_unpadded_on_merge_and_padded_with_zero_rows_on_split() -> None:
    whole = weights.normal(SEED, 0, "tokens", (300, 8))
    parts = [cuts.split(cuts.Cut.VOCAB, whole, 4, rank) for rank in range(4)]
    assert [part.shape[0] for part in parts] == [128] * 4  # 300 padded to 512
    assert not torch.cat(parts)[300:].any(), "padding rows are zero"
    assert torch.equal(cuts.merge(cuts.Cut.VOCAB, parts, 300), whole)


@pytest.mark.parametrize(
    ("kv_heads", "tensor", "cut"), [(2, 2, cuts.Cut.ROWS), (2, 4, cuts.Cut.WHOLE), (None, 4, cuts.Cut.ROWS)]
)
def test_llama_keys_and_values_are_cut_by_rows_only_when_tp_divides_the_kv_heads(
    kv_heads: int | None, tensor: int, cut: cuts.Cut
) -> None:
    assert cuts.cut_of({"attention_heads": 4, "kv_heads": kv_heads}, "k.weight", tensor) is cut


def test_a_tensor_without_a_known_cut_is_named() -> None:
    with pytest.raises(cuts.CutError, match=r"'rotary\.inv_freq' has no known tensor-parallel cut"):
        cuts.cut_of({"attention_heads": 4}, "rotary.inv_freq", 2)
