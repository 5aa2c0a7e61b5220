"""Estimates follow the bundled trainer's model: its parameter count, its FLOPs, and the memory of its end stages.

The formulas live once, in the contract (`paralleljob_contract.model`); these tests pin the planner's
`Workload` and the trainer's `ModelConfig` (what its MFU reads) to the same numbers over a grid of shapes, so
neither side can feed the formula a different shape.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from paralleljob.planning import estimates
from paralleljob.planning.estimates import Workload
from paralleljob_contract import jobfile
from paralleljob_contract import model as model_math
from paralleljob_contract.layout import Layout

SHAPES = [
    pytest.param(layers, hidden, heads, seq, vocab, ffn, id=f"l{layers}-h{hidden}-s{seq}-V{vocab}-ffn{ffn}")
    for (layers, hidden, heads), seq, vocab, ffn_factor in itertools.product(
        [(2, 64, 4), (24, 2048, 16), (96, 12288, 96)], [128, 2048], [256, 51200], [4, 3.5, 8]
    )
    for ffn in [int(hidden * ffn_factor)]
]


def trainer_model(layers: int, hidden: int, heads: int, seq: int, vocab: int, ffn: int, interval: int = 0):  # type: ignore[no-untyped-def]
    return jobfile.ModelConfig(layers, hidden, heads, seq, vocab, ffn, "bf16", interval)


def workload(**changes: object) -> Workload:
    """GPT-3 175B as examples/gpt-175b-64xa100.yaml runs it: PP 8 x TP 4 x DP 2, ZeRO-1, full recomputation."""
    base = Workload(
        layers=96,
        hidden=12288,
        heads=96,
        sequence=2048,
        vocab=51200,
        ffn=4 * 12288,
        micro_batch=1,
        micro_batches=768,
        layout=Layout(8, 4, 2),
        zero_stage=1,
        recompute=True,
    )
    # Sizes are given by name, as a job gives them; the workload holds them as the contract's Layout.
    sizes = {axis: changes.pop(axis, getattr(base, axis)) for axis in ("pipeline", "tensor", "data")}
    return dataclasses.replace(base.with_sizes(**sizes), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("layers", "hidden", "heads", "seq", "vocab", "ffn"), SHAPES)
def test_the_parameter_count_is_the_trainers(
    layers: int, hidden: int, heads: int, seq: int, vocab: int, ffn: int
) -> None:
    model = trainer_model(layers, hidden, heads, seq, vocab, ffn)
    work = workload(layers=layers, hidden=hidden, heads=heads, sequence=seq, vocab=vocab, ffn=ffn)
    assert work.parameters == model_math.parameter_count(model.shape)


def test_gpt3_175b_counts_the_untied_lm_head() -> None:
    # Megatron's 174.6e9 (tied embeddings) plus the trainer's untied head V*h = 0.63e9 and final LayerNorm.
    assert round(workload().parameters / 1e9, 2) == 175.24


def test_the_trainers_mfu_counts_the_planners_model_flops() -> None:
    differ = []
    for shape in SHAPES:
        layers, hidden, heads, seq, vocab, ffn = shape.values
        for interval in (0, 1):
            model = trainer_model(layers, hidden, heads, seq, vocab, ffn, interval)
            work = workload(layers=layers, hidden=hidden, heads=heads, sequence=seq, vocab=vocab, ffn=ffn)
            work = dataclasses.replace(work, recompute=interval > 0)
            trainers = model_math.training_flops(model.shape, work.train_batch * seq)
            if trainers != pytest.approx(estimates.model_flops_per_step(work), rel=1e-12):
                differ.append(f"{shape.id} interval {interval}")
    assert differ == []


def test_flops_with_ffn_4h_and_recomputation_are_megatrons_formula_exactly() -> None:
    work = workload()
    b, s, layers, h, v = work.train_batch, work.sequence, work.layers, work.hidden, work.vocab
    megatron = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert estimates.flops_per_step(work) == pytest.approx(megatron, rel=1e-12)


def test_model_flops_count_the_lm_head_once_and_no_recomputation() -> None:
    work = workload()
    b, s, layers, h, v = work.train_batch, work.sequence, work.layers, work.hidden, work.vocab
    expected = 72 * b * s * layers * h * h * (1 + s / (6 * h)) + 6 * b * s * h * v
    assert estimates.model_flops_per_step(work) == pytest.approx(expected, rel=1e-12)


def test_flops_grow_with_the_ffn_hidden_size() -> None:
    narrow, wide = workload(ffn=2 * 12288), workload(ffn=8 * 12288)
    tokens = narrow.train_batch * narrow.sequence
    # Each extra ffn unit costs 4h FLOPs forward per token and layer, times 3 for forward + backward (x4 recompute).
    extra = 4 * tokens * narrow.layers * 4 * narrow.hidden * (6 * 12288)
    assert estimates.flops_per_step(wide) - estimates.flops_per_step(narrow) == pytest.approx(extra, rel=1e-12)


def test_the_first_stage_holds_a_tensor_share_of_the_token_embedding_and_the_whole_positions() -> None:
    work = workload()  # TP 4: 51,200 tokens (a multiple of 4 x 128, no padding) split four ways
    blocks_only = estimates.stage_parameters(dataclasses.replace(work, vocab=0, sequence=0), "first")
    assert estimates.stage_parameters(work, "first") - blocks_only == pytest.approx((51200 / 4 + 2048) * 12288)


def test_the_175b_example_is_bounded_by_its_first_stage() -> None:
    memory = estimates.memory_per_gpu(workload())
    assert memory.stage == "first"
    assert round(memory.total / estimates.GIB, 1) == 59.2
    assert memory.total > estimates.stage_memory(workload(), "last").total


def test_a_large_vocabulary_makes_the_last_stage_the_fuller_one() -> None:
    # Few layers, a 256k vocabulary, no micro-batches piling up on the first stage: head + fp32 logits win,
    # even split over TP 4 (vocab-parallel: each rank holds a quarter of the head and of the logits).
    work = workload(layers=8, hidden=4096, heads=32, ffn=4 * 4096, vocab=256_000, micro_batches=1, recompute=False)
    memory = estimates.memory_per_gpu(work)
    assert memory.stage == "last"
    last = estimates.stage_memory(work, "last")
    assert last.activations >= 4 * 1 * 2048 * 256_000 / 4  # this rank's fp32 logits of one micro-batch
    assert memory == last


def test_one_stage_holds_embeddings_head_and_logits() -> None:
    work = workload(pipeline=1, layers=2, hidden=1024, heads=16, ffn=4096, vocab=50_000)
    assert estimates.memory_per_gpu(work).stage == "only"
    h, s = 1024, 2048
    blocks = 2 * ((4 * h * h + 2 * h * 4096 + 3 * h + 4096) / 4 + 6 * h)
    padded = 50_176  # 50,000 up to a multiple of TP 4 x 128, split four ways for the embedding and for the head
    assert estimates.stage_parameters(work, "only") == pytest.approx(
        blocks + (padded / 4 + s) * h + padded / 4 * h + 2 * h
    )


def test_activations_grow_linearly_with_the_sequence_as_fused_attention_stores_no_scores() -> None:
    """The trainer's scaled_dot_product_attention runs FlashAttention on GPUs: no a*s^2 scores are kept."""
    short = dataclasses.replace(workload(), sequence=4096, recompute=False, vocab=0)
    long = dataclasses.replace(short, sequence=8192)
    assert estimates.activation_bytes(long, "first") == pytest.approx(2 * estimates.activation_bytes(short, "first"))
