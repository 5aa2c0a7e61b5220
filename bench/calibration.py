"""The planner's step-time model against published large training runs, and what `plan --auto` picks for them.

    .venv/bin/python -m bench.calibration [--runs bloom,mt-nlg,...]

For each run: the model shape, GPUs, layout, micro-batch and global batch its authors published, planned
on a synthetic cluster of 8-GPU nodes of the product they used (32 nodes per leaf switch, 16 leaves per
block); the modeled TFLOP/s per GPU counted as the authors count it (Megatron-LM, BLOOM and MT-NLG count
the recomputed forward pass, Llama 3 counts model FLOPs only), against the measured figure; then the layout
`choose_layout` picks for the same GPUs, batch and sequence on 80 GB GPUs, and how the authors' layout ranks.
Sources and the mapping of each model onto the trainer's GPT or llama are in docs/planning.md ("Calibration").
"""

from __future__ import annotations

import argparse
import dataclasses

import yaml

from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.planning import estimates, layout_search, synth


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    layers: int
    hidden: int
    heads: int
    sequence: int
    vocab: int
    ffn: int
    gpus: int
    layout: tuple[int, int, int]  # pipeline, tensor, data
    micro_batch: int
    train_batch: int
    recompute: bool
    measured_tflops: float  # per GPU, as published
    counts_recompute: bool  # whether the published figure counts the recomputed forward
    product: str
    architecture: str = "gpt"
    kv_heads: int | None = None
    sequence_parallel: bool = False


A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
RUNS = {
    # Narayanan et al. 2021 (arXiv 2104.04473), Table 1: GPT models, seq 2048, vocab 51200, full recomputation.
    "megatron-18b": Run(
        "Megatron 18.4B", 40, 6144, 48, 2048, 51200, 4 * 6144, 256, (1, 8, 32), 1, 1024, True, 135, True, A100
    ),
    "megatron-145b": Run(
        "Megatron 145.6B", 80, 12288, 96, 2048, 51200, 4 * 12288, 1536, (8, 8, 24), 1, 2304, True, 148, True, A100
    ),
    "megatron-530b": Run(
        "Megatron 529.6B", 105, 20480, 128, 2048, 51200, 4 * 20480, 2520, (35, 8, 9), 1, 2520, True, 163, True, A100
    ),
    "megatron-1t": Run(
        "Megatron 1T", 128, 25600, 160, 2048, 51200, 4 * 25600, 3072, (64, 8, 6), 1, 3072, True, 163, True, A100
    ),
    # BigScience BLOOM-176B: 384 A100-80GB, TP 4, PP 12, DP 8, micro-batch 2, global batch 2048, ~150 TFLOP/s.
    "bloom-176b": Run(
        "BLOOM 176B", 70, 14336, 112, 2048, 250880, 4 * 14336, 384, (12, 4, 8), 2, 2048, True, 150, True, A100
    ),
    # Smith et al. 2022 (arXiv 2201.11990), MT-NLG 530B on 280 DGX A100 (2240 GPUs): TP 8, PP 35, batch 1920.
    "mt-nlg-530b": Run(
        "MT-NLG 530B", 105, 20480, 128, 2048, 51200, 4 * 20480, 2240, (35, 8, 8), 1, 1920, True, 126, True, A100
    ),
    # Llama 3 (arXiv 2407.21783), Table 4: 405B, seq 8192, 16M tokens per batch, TP 8 with sequence parallelism,
    # PP 16, BF16 model-FLOPs TFLOP/s. Modeled as the trainer's llama: 8 kv heads, SwiGLU FFN 53248, untied head.
    "llama3-405b-8k": Run(
        "Llama 3 405B",
        126,
        16384,
        128,
        8192,
        128256,
        53248,
        8192,
        (16, 8, 64),
        1,
        2048,
        False,
        430,
        False,
        H100,
        architecture="llama",
        kv_heads=8,
        sequence_parallel=True,
    ),
    "llama3-405b-16k": Run(
        "Llama 3 405B",
        126,
        16384,
        128,
        8192,
        128256,
        53248,
        16384,
        (16, 8, 128),
        1,
        2048,
        False,
        400,
        False,
        H100,
        architecture="llama",
        kv_heads=8,
        sequence_parallel=True,
    ),
}


def job_of(run: Run, layout: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    pipeline, tensor, data = layout
    accumulation = run.train_batch // (data * run.micro_batch)
    text = f"""
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {{name: calibration}}
spec:
  parallelism: {{pipeline: {pipeline}, tensor: {tensor}, data: {data}, sequenceParallel: {str(run.sequence_parallel).lower()}}}
  model: {{layers: {run.layers}, hiddenSize: {run.hidden}, attentionHeads: {run.heads}, sequenceLength: {run.sequence},
          vocabSize: {run.vocab}, ffnHiddenSize: {run.ffn}, activationCheckpointInterval: {1 if run.recompute else 0},
          architecture: {run.architecture}{f", kvHeads: {run.kv_heads}" if run.kv_heads else ""}}}
  deepspeed: {{train_batch_size: {run.train_batch}, train_micro_batch_size_per_gpu: {run.micro_batch},
              gradient_accumulation_steps: {accumulation}, zero_optimization: {{stage: 1}}}}
  training: {{steps: 10}}
"""
    result = validate_document(yaml.safe_load(text))
    assert result.resolved is not None, [p.render() for p in result.problems]
    return result.resolved


def cluster_of(run: Run, memory_label: bool) -> planning.Cluster:
    count = run.gpus // 8
    spec = synth.SynthSpec(
        nodes=count,
        gpus_per_node=8,
        leaves=max(1, count // 32),
        blocks=max(1, count // 512),
        gpu_product=run.product,
        seed=1,
    )
    nodes, _ = synth.synth_cluster(spec)
    if not memory_label:
        for node in nodes:
            node["metadata"]["labels"].pop("nvidia.com/gpu.memory", None)
    return planning.build_cluster(nodes)


def modeled_tflops(run: Run, plan: planning.Plan) -> float:
    e = plan.estimates
    flops = e.flops_per_step if run.counts_recompute else e.model_flops_per_step
    return flops / (e.step_seconds * plan.world_size) / 1e12


def measure(run: Run) -> str:
    authors = job_of(run, run.layout)
    plan = planning.plan_job(authors, cluster_of(run, memory_label=False))
    assert isinstance(plan, planning.Plan), plan
    modeled = modeled_tflops(run, plan)
    error = modeled / run.measured_tflops - 1
    memory = plan.estimates.memory["total"] / estimates.GIB
    choice = layout_search.choose_layout(authors, cluster_of(run, memory_label=True), layout_search.Budget(run.gpus))
    if isinstance(choice, layout_search.NoLayout):
        picked = f"none: {choice.message}"
    else:
        w = choice.winner
        same = w.variant.shape == run.layout
        ranks = [c.variant.shape for c in choice.ranked]
        place = f"authors' #{ranks.index(run.layout) + 1}" if run.layout in ranks else "authors' not in top 8"
        picked = (
            f"{'same' if same else 'other'}: {w.variant.layout} micro {w.variant.micro_batch} "
            f"{'recompute' if w.variant.recompute else 'no recompute'}, {modeled_tflops(run, w.plan):.0f} TFLOP/s "
            f"({place}, authors' modeled step {plan.estimates.step_seconds / w.step_seconds - 1:+.1%} vs winner)"
        )
    p, t, d = run.layout
    return (
        f"{run.name:<16} {run.gpus:>6} {p}x{t}x{d:<4} {run.micro_batch:>3} {run.measured_tflops:>6.0f} "
        f"{modeled:>7.0f} {error:>+7.0%} {memory:>6.1f}  {picked}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default=",".join(RUNS))
    args = parser.parse_args()
    print(
        f"{'run':<16} {'GPUs':>6} {'PPxTPxDP':<10} {'mb':>3} {'meas.':>6} {'modeled':>7} {'error':>7} {'GiB':>6}  --auto"
    )
    for key in args.runs.split(","):
        print(measure(RUNS[key]), flush=True)


if __name__ == "__main__":
    main()
