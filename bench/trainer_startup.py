"""Start-up and exit of the 3D trainer against a plain DeepSpeed PipelineModule on the same layout, per phase.

    .venv/bin/python -m bench.trainer_startup [--steps 12] [--rounds 1]

Both run 8 ranks under one torchrun at pipeline 2 x tensor 2 x data 2 with the quickstart's GPT (4 layers,
hidden 64, 4 heads, sequence 64, vocabulary 256, fp32), micro-batch 4, 4 micro-batches per step, AdamW:
  plain    DeepSpeed's PipelineModule of plain torch layers over PipeModelDataParallelTopology(2, 2, 2) (the
           same process groups; the layers are replicated over the model axis), ended as a script ends;
  trainer  `python -m paralleljob_trainer` on a job.json, timed by wrapping its phases from outside;
  trainer-teardown  (--with-teardown) the same, ended by the interpreter's teardown instead of
           `exit_without_teardown`: how the trainer ended before it skipped the teardown.
Each prints wall seconds from `torchrun` being started: until the interpreter runs, imports (torch and
DeepSpeed), process groups (init_distributed, which waits for the slowest rank), engine (model, optimizer,
deepspeed.initialize; `optimizer` is the part spent building the torch optimizer, which imports torch._dynamo),
first step, the other steps, and after the last step until torchrun has exited. Rank 0's clock; the machine's
other load only ever adds, so each figure is the best of --rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.time()
MODEL = {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "sequenceLength": 64, "vocabSize": 256}
PP, TP, DP, MICRO, GAS = 2, 2, 2, 4, 4
BATCH = MICRO * GAS * DP


class Marks:
    """Wall-clock marks of one rank, printed by rank 0 as one `MARKS {...}` line."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {"python": STARTED}

    def mark(self, name: str) -> None:
        self.times[name] = time.time()

    def add(self, name: str, seconds: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + seconds

    def print(self) -> None:
        if os.environ.get("RANK") == "0":
            print("MARKS " + json.dumps(self.times), flush=True)


def plain_worker(steps: int) -> None:
    """Runs under torchrun: what a user of plain DeepSpeed writes for this layout."""
    marks = Marks()
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    marks.mark("imported")
    from trainer_overhead import plain_gpt

    deepspeed.init_distributed(dist_backend="gloo")
    marks.mark("process_groups")
    layers, loss_fn = plain_gpt(MODEL)
    topology = PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=DP)
    module = PipelineModule(layers, topology=topology, loss_fn=loss_fn, partition_method="type:PlainBlock")
    began = time.time()
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3, weight_decay=0.01)
    marks.add("optimizer", time.time() - began)
    config = {
        "train_batch_size": BATCH,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    marks.mark("engine")
    generator = torch.Generator().manual_seed(0)
    s, v = MODEL["sequenceLength"], MODEL["vocabSize"]
    for step in range(1, steps + 1):
        tokens = torch.randint(0, v, (GAS * MICRO, s + 1), generator=generator)
        micro = iter([(tokens[i : i + MICRO, :-1], tokens[i : i + MICRO, 1:]) for i in range(0, GAS * MICRO, MICRO)])
        engine.train_batch(data_iter=micro)
        marks.mark("first_step" if step == 1 else "last_step")
    dist.barrier()
    dist.destroy_process_group()
    marks.print()


def trainer_worker(teardown: bool) -> None:
    """Runs under torchrun: the trainer's own entry point, its phases wrapped to be timed."""
    marks = Marks()
    from paralleljob_contract import ranks
    from paralleljob_trainer import cli, optimization, training

    marks.mark("imported")
    _time_calls(training, "init_distributed", lambda: marks.mark("process_groups"))
    _time_calls(training, "build_engine", lambda: marks.mark("engine"))
    build_optimizer = optimization.build_optimizer

    def timed_build_optimizer(*args: Any, **kwargs: Any) -> Any:
        began = time.time()
        try:
            return build_optimizer(*args, **kwargs)
        finally:
            marks.add("optimizer", time.time() - began)

    optimization.build_optimizer = timed_build_optimizer
    _time_calls(
        training, "_train_one_step", lambda: marks.mark("last_step" if "first_step" in marks.times else "first_step")
    )
    _time_calls(training, "shutdown", marks.print)
    code = cli.main([])
    if teardown:
        sys.exit(code)
    ranks.exit_without_teardown(code)


def _time_calls(module: Any, name: str, after: Any) -> None:
    original = getattr(module, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        after()
        return result

    setattr(module, name, timed)


def phases(marks: dict[str, float], launched: float, ended: float) -> dict[str, float]:
    """Seconds per phase from one run's marks, launch and torchrun's end."""
    last = marks.get("last_step", marks["first_step"])
    return {
        "interpreter": marks["python"] - launched,
        "imports": marks["imported"] - marks["python"],
        "process_groups": marks["process_groups"] - marks["imported"],
        "engine": marks["engine"] - marks["process_groups"],
        "optimizer": marks["optimizer"],
        "first_step": marks["first_step"] - marks["engine"],
        "other_steps": last - marks["first_step"],
        "after_last_step": ended - last,
        "time_to_first_step": marks["engine"] - launched,
        "total": ended - launched,
    }


def run_one(kind: str, steps: int) -> dict[str, float]:
    from bench import common  # here, not at the top: the workers this file also runs as need none of it
    from testcluster import trainer_harness as harness

    with tempfile.TemporaryDirectory() as folder:
        document = common.job_document(
            PP, TP, DP, {**MODEL, "precision": "fp32"}, steps=steps, batch=BATCH, micro=MICRO,
            data={"source": "synthetic"},
        )  # fmt: skip
        job = harness.write_job(Path(folder), document)
        env = harness.trainer_env(job, Path(folder) / "out", None, {})
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={PP * TP * DP}",
            "--master-addr=127.0.0.1", f"--master-port={harness.free_port()}", "--max-restarts=0",
            __file__, f"--{kind}-worker", "--steps", str(steps),
        ]  # fmt: skip
        launched = time.time()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        ended = time.time()
    if done.returncode:
        raise SystemExit(f"{kind} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("MARKS "))
    return phases(json.loads(line[len("MARKS ") :]), launched, ended)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the two runs this many times")
    parser.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer-teardown-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-teardown", action="store_true", help="also time the trainer ended by teardown")
    arguments = parser.parse_args()
    if arguments.plain_worker:
        plain_worker(arguments.steps)
        return
    if arguments.trainer_worker or arguments.trainer_teardown_worker:
        trainer_worker(teardown=arguments.trainer_teardown_worker)
        return
    kinds = ["plain", "trainer"] + (["trainer-teardown"] if arguments.with_teardown else [])
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(arguments.rounds):
        for kind, results in runs.items():
            results.append(run_one(kind, arguments.steps))
    best = {kind: {key: min(r[key] for r in results) for key in results[0]} for kind, results in runs.items()}
    for kind, figures in best.items():
        print(kind.ljust(17) + "  ".join(f"{key} {value:.1f}" for key, value in figures.items()), flush=True)
    print(json.dumps({kind: {k: round(v, 2) for k, v in figures.items()} for kind, figures in best.items()}))


if __name__ == "__main__":
    sys.exit(main())
