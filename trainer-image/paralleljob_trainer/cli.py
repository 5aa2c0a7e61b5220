"""Command line of the trainer: options (defaulting to the PARALLELJOB_* environment), errors, exit codes.

Exit codes: 0 done; 2 the job file or the rank layout is wrong; 3 the checkpoint cannot be resumed from;
4 a peer rank died or stopped answering (the failing rank's own log says why); 5 the checkpoint folder cannot
take a checkpoint (not writable, no fsync, too little free space, full or read-only during a save); 6 the
network is not what the job planned (the preflight or NCCL's own choice; the termination message says
`<Condition> <Reason>: ...`); 1 anything else (with a traceback). Expected failures print exactly one line on
stderr, on every rank.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from paralleljob_contract import environment
from paralleljob_contract.environment import PodEnvironment
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import load_job_config
from paralleljob_trainer.preflight import NetworkNotReady, has_gpu_devices, report_failure, run_preflight

DEFAULT_CONFIG = environment.DEFAULT_CONFIG_PATH
EXIT_CONFIG = 2
EXIT_CHECKPOINT = 3
EXIT_PEER = 4
EXIT_STORAGE = 5
EXIT_NETWORK = 6

# How torch reports a collective whose peer died or stopped answering (gloo raises a plain RuntimeError).
_PEER_FAILURE_MARKS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "timed out",
    "NCCL communicator",
    "ProcessGroupNCCL",
    "ProcessGroupGloo",
)

_DESCRIPTION = """\
Train the GPT described by a ParallelJob's job.json with DeepSpeed pipeline x tensor x data parallelism.
Run once per process by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set).
Every option defaults to the environment variable named in its help (docs/contract.md)."""


def build_parser(env: PodEnvironment | None = None) -> argparse.ArgumentParser:
    """The options, defaulting to `env` (the contract's reading of the PARALLELJOB_* variables)."""
    env = env or PodEnvironment()
    parser = argparse.ArgumentParser(prog="python -m paralleljob_trainer", description=_DESCRIPTION)
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(env.config_path),
        help=f"job.json: the ParallelJob spec, DeepSpeed config and plan ({environment.CONFIG}; {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=_optional_path(env.output_dir),
        help=f"folder where rank 0 appends metrics.jsonl ({environment.OUTPUT_DIR}; unset: stdout only)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=_optional_path(env.checkpoint_dir),
        help="this job's checkpoint folder, saved every spec.checkpoint.intervalSteps and at the last step, and "
        f"resumed from on start ({environment.CHECKPOINT_DIR}; unset: no checkpoints)",
    )
    parser.add_argument(
        "--resume-from",
        type=Path,
        default=_optional_path(env.resume_from),
        help="another job's checkpoint folder to start from when this job's own holds none; only read "
        f"({environment.RESUME_FROM}, from spec.checkpoint.resumeFrom; unset: none)",
    )
    parser.add_argument(
        "--progress-hook",
        default=env.progress_hook,
        metavar="MODULE:FACTORY",
        help="progress hook called by rank 0 on each step, checkpoint and at the end "
        f"({environment.PROGRESS_HOOK}; see paralleljob_trainer.hooks)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=env.peak_tflops,
        help=f"peak TFLOP/s of one device for the MFU estimate ({environment.PEAK_TFLOPS}; "
        "unset: known GPUs from their name, else mfu is null)",
    )
    return parser


def is_peer_failure(error: BaseException) -> bool:
    """Whether a collective failed because another rank died, hung or dropped its connection."""
    import torch.distributed as dist

    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    return any(mark in str(error) for mark in _PEER_FAILURE_MARKS)


def _optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _fail(message: str, code: int) -> int:
    rank = os.environ.get("RANK", "?")
    print(f"paralleljob-trainer: error (rank {rank}): {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        env = PodEnvironment.from_environ(os.environ)
    except ContractError as error:
        return _fail(str(error), EXIT_CONFIG)
    arguments = build_parser(env).parse_args(argv)
    # One thread per rank: ranks already share the cores, and more threads only contend (24x slower on CPU).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        job = load_job_config(arguments.config)
        # Before torch and DeepSpeed are even imported: a pod without its network fails in a second, not after
        # every rank has loaded a deep-learning stack, and long before any process group forms.
        warning = run_preflight(os.environ, gpu=has_gpu_devices())
        if warning:
            print(f"paralleljob-trainer: warning: {warning}", file=sys.stderr, flush=True)
        from paralleljob_trainer import training
        from paralleljob_trainer.checkpoint import CheckpointError
        from paralleljob_trainer.hooks import load_hook
        from paralleljob_trainer.storage import StorageError

        # Only rank 0 reports progress, so only rank 0 builds the hook (a status hook may open API clients).
        rank_zero = os.environ.get("RANK", "0") == "0"
        hooks = (load_hook(arguments.progress_hook),) if arguments.progress_hook and rank_zero else ()
        options = training.RunOptions(
            output_dir=arguments.output,
            checkpoint_dir=arguments.checkpoint_dir,
            resume_from=arguments.resume_from,
            hooks=hooks,
            peak_tflops=arguments.peak_tflops,
        )
        try:
            training.run(job, options, env)
        except NetworkNotReady:
            # What NCCL chose is not what the job planned (spec.network.verify: fail).
            training.abandon()
            raise
        except CheckpointError as error:
            # Tear the process group down before exiting: left to interpreter exit, gloo can abort (SIGABRT)
            # on a rank whose peers have already gone, and the launcher would see a crash, not this error.
            training.abandon()
            return _fail(str(error), EXIT_CHECKPOINT)
        except StorageError as error:
            training.abandon()
            return _fail(str(error), EXIT_STORAGE)
        except RuntimeError as error:
            if not is_peer_failure(error):
                raise
            # The rank that failed says why in its own log; here one line is enough, not a traceback.
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            _fail(f"a peer rank failed or stopped answering, so this rank stops too ({first})", EXIT_PEER)
            # Exit at once: the process group still holds the failed operation, and tearing it down at
            # interpreter exit can abort the process (SIGABRT) instead of ending it with this exit code.
            sys.stdout.flush()
            os._exit(EXIT_PEER)
    except ContractError as error:
        return _fail(str(error), EXIT_CONFIG)
    except NetworkNotReady as failure:
        report_failure(failure.condition, failure.reason, failure.message, os.environ)
        return _fail(f"{failure.condition}=False {failure}", EXIT_NETWORK)
    training.shutdown()
    return 0
