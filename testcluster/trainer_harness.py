"""Builders and launchers for the trainer tests and benchmarks: job.json files, torchrun gangs, metrics readers.

Job files follow docs/contract.md and are written by the contract's writer: version, spec, the resolved
DeepSpeed config and the plan's layout (no per-rank list: the trainer checks the contract's row-major rule
against DeepSpeed's own ProcessTopology). The torchrun line is the contract's too. torchrun
starts each rank in a session of its own, so `Gang.stop` kills the launched processes with all their
descendants, and `Gang.wait` then fails the test if any rank of its job is still alive. It lives in `testcluster`,
outside `tests/`, because `bench/` runs the trainer through it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from paralleljob_contract import environment, jobfile, launcher, metrics
from paralleljob_contract.layout import AXES, AxisOrder, Layout

REPO = Path(__file__).resolve().parents[1]
TORCH_EXTENSIONS_CACHE = Path.home() / ".cache" / "paralleljob" / "torch_extensions"


def plan(layout: Layout, ranks_per_node: int, axis_order: AxisOrder = AXES) -> dict[str, Any]:
    """The job file's plan of `layout` in `axis_order` on nodes of `ranks_per_node` ranks."""
    return jobfile.make_plan(layout.with_order(axis_order), ranks_per_node).to_dict()


def job_document(
    layout: Layout,
    *,
    optimizer: dict[str, Any],
    gradient_clipping: float = 0.0,
    steps: int = 10,
    model: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    checkpoint_interval: int = 0,
    train_batch_size: int = 8,
    micro_batch_size: int = 2,
    ranks_per_node: int | None = None,
    axis_order: AxisOrder = AXES,
    seed: int = 7,
    warmup_steps: int | None = 2,
    deepspeed_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A job.json for a tiny fp32 GPT (4 layers, hidden 64, 4 heads, sequence 32, byte vocabulary) by default.

    `warmup_steps=None` leaves the trainer's default; `deepspeed_extra` adds DeepSpeed config sections.
    """
    model_spec = {
        "layers": 4,
        "hiddenSize": 64,
        "attentionHeads": 4,
        "sequenceLength": 32,
        "vocabSize": 256,
        "precision": "fp32",
        **(model or {}),
    }
    deepspeed: dict[str, Any] = {
        "train_batch_size": train_batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": train_batch_size // (micro_batch_size * layout.data),
        "optimizer": optimizer,
        # Always explicit: DeepSpeed clips at 1.0 when the key is absent.
        "gradient_clipping": gradient_clipping,
        **(deepspeed_extra or {}),
    }
    training: dict[str, Any] = {"steps": steps, "seed": seed, "logInterval": 1, "data": data or {"source": "synthetic"}}
    if warmup_steps is not None:
        training["warmupSteps"] = warmup_steps
    return {
        "version": jobfile.VERSION,
        "metadata": {"name": "trainer-test", "namespace": "default"},
        "spec": {
            "parallelism": {"pipeline": layout.pipeline, "tensor": layout.tensor, "data": layout.data},
            "model": model_spec,
            "training": training,
            "checkpoint": {"intervalSteps": checkpoint_interval},
        },
        "deepspeed": deepspeed,
        "plan": plan(layout, ranks_per_node or layout.world_size, axis_order),
    }


def text_corpus() -> Path:
    """A small deterministic English-like corpus (a file the tests own), so that the loss visibly falls."""
    path = Path(tempfile.gettempdir()) / "paralleljob-trainer-tests" / "corpus.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "home"]
        lines = (" ".join(words[(i * k) % len(words)] for k in range(1, 9)) + "." for i in range(4000))
        path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_job(folder: Path, document: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.json"
    path.write_text(json.dumps(document, indent=1))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def trainer_env(job: Path, output: Path, checkpoint_dir: Path | None, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            environment.CONFIG: str(job),
            environment.OUTPUT_DIR: str(output),
            environment.PG_TIMEOUT_SECONDS: "60",
            "OMP_NUM_THREADS": "1",
            "TORCH_EXTENSIONS_DIR": env.get("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_CACHE)),
            "PYTHONPATH": os.pathsep.join([str(REPO / "trainer-image"), str(REPO), env.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop(environment.CHECKPOINT_DIR, None)
    env.pop(environment.PROGRESS_HOOK, None)
    if checkpoint_dir is not None:
        env[environment.CHECKPOINT_DIR] = str(checkpoint_dir)
    env.update(extra)
    return env


@dataclasses.dataclass
class Result:
    returncodes: list[int]
    logs: list[str]


class Gang:
    """One or more torchrun processes (one per simulated node), each in its own process group."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []
        self.log_paths: list[Path] = []
        self.jobs: list[str] = []

    def start(
        self,
        job: Path,
        output: Path,
        *,
        nproc: int,
        nnodes: int = 1,
        checkpoint_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        port = free_port()
        output.mkdir(parents=True, exist_ok=True)
        self.jobs.append(str(job))
        env = trainer_env(job, output, checkpoint_dir, extra_env or {})
        for node_rank in range(nnodes):
            env = {**env, environment.NODE_RANK: str(node_rank)}
            command = launcher.torchrun_command(
                nodes=nnodes,
                node_rank=node_rank,
                ranks_per_node=nproc,
                master_addr="127.0.0.1",
                master_port=port,
                launcher=(sys.executable, "-m", "torch.distributed.run"),
            )
            log_path = output / f"node-{node_rank}.log"
            log = log_path.open("w")
            self.processes.append(
                subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
                )
            )
            self.log_paths.append(log_path)

    def start_ranks(
        self,
        job: Path,
        output: Path,
        *,
        world: int,
        checkpoint_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        """Start every rank directly, with the environment torchrun would give it, to watch each one exit.

        `prefix` goes before each rank's command (e.g. `PrivateTmpfs.enter`, to run it in a mount namespace)."""
        port = free_port()
        output.mkdir(parents=True, exist_ok=True)
        self.jobs.append(str(job))
        for rank in range(world):
            env = trainer_env(job, output, checkpoint_dir, extra_env or {})
            env.update(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    **(extra_env or {}),
                }
            )
            log_path = output / f"rank-{rank}.log"
            self.processes.append(
                subprocess.Popen(
                    [*prefix, sys.executable, "-m", "paralleljob_trainer"],
                    env=env,
                    stdout=log_path.open("w"),
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
            self.log_paths.append(log_path)

    def wait(self, timeout: float) -> Result:
        """Wait for every process, then make sure none of this gang's ranks outlived it."""
        deadline = time.monotonic() + timeout
        try:
            codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.processes]
        finally:
            self.stop()
        leaked = self.leftover_ranks()
        self._kill(leaked)
        assert not leaked, f"ranks outlived their gang: {[p.pid for p in leaked]}"
        return Result(returncodes=codes, logs=[path.read_text() for path in self.log_paths])

    def stop(self) -> None:
        """Kill the launched processes and all their descendants (torchrun starts ranks in new sessions)."""
        family: list[psutil.Process] = []
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(process.pid)
                family += [parent, *parent.children(recursive=True)]
        self._kill(family)
        for process in self.processes:
            process.wait(timeout=30)

    def leftover_ranks(self) -> list[psutil.Process]:
        """Trainer processes still running with one of this gang's job files (orphans of a dead launcher)."""
        jobs = set(self.jobs)
        found = []
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                ours = "paralleljob_trainer" in (process.info["cmdline"] or [])
                if ours and process.environ().get(environment.CONFIG) in jobs:
                    found.append(process)
        return found

    @staticmethod
    def _kill(processes: list[psutil.Process]) -> None:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(processes, timeout=30)


class PrivateTmpfs:
    """A tmpfs of `size` at `mountpoint`, visible only to processes started with `enter` (a mount namespace of
    its own, held by a sleeping process: the machine's mounts are never touched). Needs root, as in CI."""

    def __init__(self, mountpoint: Path, size: str, *, read_only: bool = False) -> None:
        mountpoint.mkdir(parents=True, exist_ok=True)
        options = f"size={size}" + (",ro" if read_only else "")
        script = f"mount -t tmpfs -o {options} paralleljob-test {mountpoint} && echo mounted && exec sleep 3600"
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE, text=True
        )
        assert self.holder.stdout is not None and self.holder.stdout.readline().strip() == "mounted"

    @property
    def enter(self) -> tuple[str, ...]:
        return ("nsenter", f"--target={self.holder.pid}", "--mount", "--")

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait(timeout=30)

    def __enter__(self) -> PrivateTmpfs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def records(output: Path, event: str) -> list[dict[str, Any]]:
    return metrics.read_records(output / metrics.FILE, event)


def steps_by_number(output: Path) -> dict[int, dict[str, Any]]:
    """Step records by step; a step logged twice (before a kill and after the restart) keeps the last."""
    return {record["step"]: record for record in records(output, "step")}
