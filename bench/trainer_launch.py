"""Shared by the trainer benchmarks: a job.json for a GPT shape and layout, a torchrun of the trainer, its metrics.

Not a benchmark itself. Job files, ports and torchrun gangs come from the trainer tests' harness
(`tests/trainer/harness.py`), so benchmarks and tests run the trainer the same way.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from paralleljob_contract.layout import Layout  # noqa: E402
from tests.trainer import harness  # noqa: E402

ADAMW = {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}


def job_document(
    pp: int, tp: int, dp: int, model: dict[str, Any], *, steps: int, batch: int, micro: int, data: dict[str, Any]
) -> dict[str, Any]:
    """The benchmarks' job: AdamW (lr 3e-4), clipping 1.0, seed 1, the trainer's default warmup."""
    return harness.job_document(
        Layout(pipeline=pp, tensor=tp, data=dp),
        optimizer=ADAMW,
        gradient_clipping=1.0,
        steps=steps,
        model=model,
        data=data,
        train_batch_size=batch,
        micro_batch_size=micro,
        seed=1,
        warmup_steps=None,
    )


def torchrun(nproc: int, module_args: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> str:
    """Run `torchrun --nproc-per-node nproc ...` on 127.0.0.1 (for scripts that are not the trainer)."""
    full_env = {**harness.trainer_env(Path("unused"), Path("unused"), None, {}), **(env or {})}
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={harness.free_port()}", *module_args,
    ]  # fmt: skip
    done = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def run_trainer(document: dict[str, Any], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Train `document` with the real trainer on one node; returns its metrics.jsonl records."""
    with tempfile.TemporaryDirectory() as folder:
        job = harness.write_job(Path(folder), document)
        gang = harness.Gang()
        gang.start(job, Path(folder) / "out", nproc=document["plan"]["worldSize"], extra_env=env)
        result = gang.wait(timeout=900)
        if any(result.returncodes):
            raise SystemExit(f"trainer failed ({result.returncodes}):\n{result.logs[0][-3000:]}")
        return [record for event in ("step", "summary") for record in harness.records(Path(folder) / "out", event)]


def median_after_warmup(records: list[dict[str, Any]], field: str, warmup: int) -> float:
    values = [r[field] for r in records if r.get("event") == "step" and r["step"] > warmup]
    return statistics.median(values)


def stdlib_corpus() -> str:
    """The Python standard library's own sources: a real corpus every machine has."""
    import sysconfig

    return sysconfig.get_paths()["stdlib"] + "/json"
