"""CPU step-time ratio: the 3D trainer against the same GPT as a plain DeepSpeed PipelineModule without TP.

    .venv/bin/python -m bench.trainer_overhead [--steps 30]
    .venv/bin/python -m bench.trainer_overhead --timing [--layout 1x1x2]   # the per-rank compute timing's cost

Same model (quickstart size: 4 layers, hidden 128, 4 heads, sequence 128, vocabulary 256, fp32, AdamW,
clipping 1.0), global batch 16, micro-batch 4, at PP2 x DP2. Three runs:
  plain    a PipelineModule of plain torch layers (no tensor parallelism), PP2 x DP2, 4 ranks;
  trainer  the 3D trainer at TP1, PP2 x DP2, 4 ranks: what our layers, data and metrics cost;
  trainer  the 3D trainer at TP2, PP2 x TP2 x DP2, 8 ranks: what the issue compares. On a 2-core machine its
           8 ranks share the cores that the plain run's 4 ranks share, so this ratio measures CPU
           oversubscription as much as TP; on GPUs each rank has its own device.
Prints the median step time after 5 warm-up steps of each (best of --rounds alternating rounds), and the
ratios to plain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from bench import common
from paralleljob_contract import stragglers

MODEL = {"layers": 4, "hiddenSize": 128, "attentionHeads": 4, "sequenceLength": 128, "vocabSize": 256}
BATCH, MICRO, WARMUP = 16, 4, 5


def plain_gpt(model: dict[str, int]) -> tuple[list[Any], Any]:
    """The GPT of `model` as plain torch layers (no tensor parallelism): DeepSpeed LayerSpecs and the loss."""
    import torch
    from deepspeed.pipe import LayerSpec
    from torch import nn
    from torch.nn import functional

    h, s, v, heads = model["hiddenSize"], model["sequenceLength"], model["vocabSize"], model["attentionHeads"]

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(v, h), nn.Embedding(s, h)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))

    class PlainBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, w = self.qkv(self.ln1(x)).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            context = functional.scaled_dot_product_attention(q, k, w, is_causal=True)
            x = x + self.out(context.transpose(1, 2).reshape(b, t, h))
            return x + self.down(functional.gelu(self.up(self.ln2(x))))

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln, self.lm = nn.LayerNorm(h), nn.Linear(h, v, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lm(self.ln(x))

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(logits.reshape(-1, v), labels.reshape(-1))

    return [LayerSpec(Embed), *[LayerSpec(PlainBlock) for _ in range(model["layers"])], LayerSpec(Head)], loss_fn


def plain_worker(steps: int) -> None:
    """Runs under torchrun: the baseline PipelineModule, timing train_batch on every step."""
    import deepspeed
    import numpy as np
    import torch
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    s, v = MODEL["sequenceLength"], MODEL["vocabSize"]
    layers, loss_fn = plain_gpt(MODEL)
    deepspeed.init_distributed(dist_backend="gloo")
    module = PipelineModule(
        layers,
        topology=PipeDataParallelTopology(num_pp=2, num_dp=2),
        loss_fn=loss_fn,
        partition_method="type:PlainBlock",
    )
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-4, weight_decay=0.1)
    config = {
        "train_batch_size": BATCH,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": BATCH // (MICRO * 2),
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(steps):
        tokens = torch.from_numpy(rng.integers(0, v, size=(BATCH // 2, s + 1)))
        micro = iter([(tokens[i : i + MICRO, :-1], tokens[i : i + MICRO, 1:]) for i in range(0, BATCH // 2, MICRO)])
        started = time.perf_counter()
        engine.train_batch(data_iter=micro)
        times.append(time.perf_counter() - started)
    if int(os.environ["RANK"]) == 0:
        print("PLAIN " + json.dumps({"step_time_s": statistics.median(times[WARMUP:])}), flush=True)


def plain_step_time(steps: int) -> float:
    output = common.torchrun(4, [__file__, "--plain-worker", "--steps", str(steps)])
    line = next(line for line in output.splitlines() if line.startswith("PLAIN "))
    return float(json.loads(line[len("PLAIN ") :])["step_time_s"])


def trainer_step_time(layout: tuple[int, int, int], steps: int, timing: bool = True) -> float:
    """The trainer's median step at `layout` (PP, TP, DP); `timing` False turns its per-rank compute timing off
    (straggler window 0)."""
    model = {**MODEL, "precision": "fp32"}
    document = common.job_document(*layout, model, steps=steps, batch=BATCH, micro=MICRO, data={"source": "synthetic"})
    env = None if timing else {stragglers.WINDOW_ENV: "0"}
    return common.median_after_warmup(common.run_trainer(document, env), "step_time_s", WARMUP)


def timing_overhead(steps: int, rounds: int, layout: tuple[int, int, int]) -> None:
    """--timing: the trainer with its per-rank compute timing (window 20, the default) against without it.

    Each round runs both, in alternating order (off first, then on first), so that a drift of the machine's speed
    falls on each side alike; the figure is the median of the rounds' paired ratios, with the best of each side
    beside it. The clock's own cost per step is the cost of one timed section (measured here) times the sections a
    rank times per step: per micro-batch a forward and a backward, and at TP above 1 four TP collectives per
    block of its stage; and the optimizer once."""
    pp, tp, dp = layout
    section = clock_section_seconds()
    micro_batches = BATCH // (MICRO * dp)
    sections = micro_batches * (2 + (4 * MODEL["layers"] // pp if tp > 1 else 0)) + 1
    runs = []
    for index in range(rounds):
        order = (False, True) if index % 2 == 0 else (True, False)
        measured = {timing: trainer_step_time(layout, steps, timing) for timing in order}
        runs.append((measured[False], measured[True]))
    off, on = (min(column) for column in zip(*runs, strict=True))
    print(json.dumps({
        "layout": f"PP{pp} x TP{tp} x DP{dp}",
        "timing_off_step_s": round(off, 4),
        "timing_on_step_s": round(on, 4),
        "overhead_best_of_each": round(on / off - 1, 4),
        "overhead_median_of_pairs": round(statistics.median(b / a - 1 for a, b in runs), 4),
        "rounds": [[round(a, 4), round(b, 4)] for a, b in runs],
        "clock_section_us": round(section * 1e6, 2),
        "sections_per_step": sections,
        "clock_share_of_step": round(sections * section / off, 6),
        "load_1min": round(os.getloadavg()[0], 1),
    }))  # fmt: skip


def clock_section_seconds(count: int = 100_000) -> float:
    """One timed section of the host clock (a compute section holding a blocked one, each counted), in seconds."""
    from paralleljob_trainer.compute_timing import ComputeClock

    clock = ComputeClock()
    clock.start(cuda=False)
    started = time.perf_counter()
    for _ in range(count // 2):
        with clock.compute(), clock.blocked():
            pass
    return (time.perf_counter() - started) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2, help="alternate the three runs this many times")
    parser.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timing", action="store_true", help="only the per-rank compute timing's cost (issue 36)")
    parser.add_argument(
        "--layout", default="2x2x2", help="PPxTPxDP of --timing (2x2x2; 1x1x2 gives each of 2 cores one rank)"
    )
    arguments = parser.parse_args()
    if arguments.plain_worker:
        plain_worker(arguments.steps)
        return
    if arguments.timing:
        pp, tp, dp = (int(size) for size in arguments.layout.split("x"))
        timing_overhead(arguments.steps, arguments.rounds, (pp, tp, dp))
        return
    # Alternating rounds, best of each: other load on a shared machine only ever slows a run down.
    rounds = [
        (
            plain_step_time(arguments.steps),
            trainer_step_time((2, 1, 2), arguments.steps),
            trainer_step_time((2, 2, 2), arguments.steps),
        )
        for _ in range(arguments.rounds)
    ]
    plain, tp1, tp2 = (min(column) for column in zip(*rounds, strict=True))
    print(json.dumps({
        "plain_pp2_dp2_step_s": round(plain, 4),
        "trainer_pp2_tp1_dp2_step_s": round(tp1, 4),
        "trainer_pp2_tp2_dp2_step_s": round(tp2, 4),
        "ratio_tp1_to_plain": round(tp1 / plain, 3),
        "ratio_tp2_to_plain": round(tp2 / plain, 3),
        "cpus": os.cpu_count(),
    }))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
