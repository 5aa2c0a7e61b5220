"""Shared by the trainer benchmarks: a job.json for a GPT shape and layout, a torchrun of the trainer, its metrics.

Not a benchmark itself. The job files follow docs/architecture.md, with the plan's coordinates from the
row-major rule (rank = pipe * dp * tp + data * tp + model).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def job_document(
    pp: int, tp: int, dp: int, model: dict[str, Any], *, steps: int, batch: int, micro: int, data: dict[str, Any]
) -> dict[str, Any]:
    world = pp * tp * dp
    ranks = list(range(world))
    coords = [{"pipe": r // (dp * tp), "data": (r // tp) % dp, "model": r % tp} for r in ranks]
    return {
        "apiVersion": "paralleljob.io/v1alpha1",
        "kind": "ParallelJob",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {
            "parallelism": {"pipeline": pp, "tensor": tp, "data": dp},
            "model": model,
            "training": {"steps": steps, "seed": 1, "logInterval": 1, "data": data},
            "checkpoint": {"intervalSteps": 0},
        },
        "deepspeed": {
            "train_batch_size": batch,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": batch // (micro * dp),
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
        },
        "plan": {
            "layout": {"pipeline": pp, "tensor": tp, "data": dp},
            "worldSize": world,
            "ranksPerNode": world,
            "axisOrder": ["pipe", "data", "model"],
            "nodes": [{"nodeRank": 0, "node": "local-0", "gpus": world, "ranks": ranks, "coords": coords}],
        },
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(nproc: int, module_args: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> str:
    """Run `torchrun --nproc-per-node nproc -m ...` on 127.0.0.1; returns its output, raising on failure."""
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "trainer-image"), str(REPO), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", *module_args,
    ]  # fmt: skip
    done = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def run_trainer(document: dict[str, Any], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Train `document` with the real trainer; returns its metrics.jsonl records."""
    with tempfile.TemporaryDirectory() as folder:
        job = Path(folder) / "job.json"
        job.write_text(json.dumps(document))
        world = document["plan"]["worldSize"]
        args = ["-m", "paralleljob_trainer", "--config", str(job), "--output", folder]
        torchrun(world, args, env)
        lines = (Path(folder) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def median_after_warmup(records: list[dict[str, Any]], field: str, warmup: int) -> float:
    values = [r[field] for r in records if r.get("event") == "step" and r["step"] > warmup]
    return statistics.median(values)


def stdlib_corpus() -> str:
    """The Python standard library's own sources: a real corpus every machine has."""
    import sysconfig

    return sysconfig.get_paths()["stdlib"] + "/json"
