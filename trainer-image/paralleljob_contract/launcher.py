"""The command line of one node rank, built in one place for pods, `paralleljob run` and the tests.

One pod (or simulated node) runs one in-pod supervisor (`paralleljob_contract.supervisor`) with
`--nproc-per-node` = ranks per node; it gives its processes RANK = node_rank * nproc_per_node + LOCAL_RANK, and
restarts the whole gang in place, inside the pods it has, up to `--in-place-restarts` times; after that, or when
a pod is lost, restarts are the operator's (the whole gang, new pods, from a checkpoint).

`torchrun_command` is the plain torchrun line (no restarts of its own), which the trainer tests still use.
"""

from __future__ import annotations

from collections.abc import Sequence

TORCHRUN = ("torchrun",)
TRAINER_MODULE = "paralleljob_trainer"
SUPERVISOR_MODULE = "paralleljob_contract.supervisor"
# What a rank of the bundled trainer runs, forked from a forkserver that has imported these modules once: all a
# rank imports on its way to its first step (torch._dynamo, which the optimizer pulls in, is 880 modules and 4 s
# of CPU on its own; the distributed packages DeepSpeed's engine imports).
TRAINER_ENTRYPOINT = "paralleljob_trainer.cli:main"
TRAINER_PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "deepspeed",
    "deepspeed.module_inject",
    "paralleljob_trainer.cli",
    "paralleljob_trainer.training",
)
DEFAULT_MASTER_PORT = 29500


def torchrun_command(
    *,
    nodes: int,
    node_rank: int,
    ranks_per_node: int,
    master_addr: str,
    master_port: int = DEFAULT_MASTER_PORT,
    command: Sequence[str] | None = None,
    launcher: Sequence[str] = TORCHRUN,
) -> list[str]:
    """torchrun for this node rank, launching the bundled trainer, or `command` (spec.command) once per rank.

    `launcher` is how torchrun is started: `torchrun` in the image, `python -m torch.distributed.run` locally.
    """
    argv = [
        *launcher,
        f"--nnodes={nodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={ranks_per_node}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        "--max-restarts=0",
    ]
    if command:
        return [*argv, "--no-python", *command]
    return [*argv, "-m", TRAINER_MODULE]


def supervisor_command(
    *,
    nodes: int,
    node_rank: int,
    ranks_per_node: int,
    master_addr: str,
    in_place_restarts: int,
    master_port: int = DEFAULT_MASTER_PORT,
    command: Sequence[str] | None = None,
    python: Sequence[str] = ("python",),
    progress_timeout_seconds: float | None = None,
) -> list[str]:
    """The in-pod supervisor for this node rank, running the bundled trainer (forked from a warm forkserver) or
    `command` (spec.command) once per rank. `python` is the interpreter: `python` in the image, this one locally.
    With `progress_timeout_seconds` (spec.failurePolicy.progressTimeoutSeconds) the supervisor restarts a gang
    whose ranks stopped beating (`paralleljob_contract.heartbeat`) in place.
    """
    argv = [
        *python,
        "-m",
        SUPERVISOR_MODULE,
        f"--nnodes={nodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={ranks_per_node}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        f"--in-place-restarts={in_place_restarts}",
        *([f"--progress-timeout={progress_timeout_seconds:g}"] if progress_timeout_seconds else []),
    ]
    if command:
        return [*argv, "--", *command]
    return [*argv, f"--entrypoint={TRAINER_ENTRYPOINT}", f"--preload={','.join(TRAINER_PRELOAD)}"]
