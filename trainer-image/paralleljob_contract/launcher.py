"""The torchrun command line of one node rank, built in one place for pods, `paralleljob run` and the tests.

One pod (or simulated node) runs one torchrun with `--nproc-per-node` = ranks per node; torchrun gives its
processes RANK = node_rank * nproc_per_node + LOCAL_RANK. Restarts are the operator's (the whole gang, from a
checkpoint), never torchrun's alone, hence `--max-restarts=0`.
"""

from __future__ import annotations

from collections.abc import Sequence

TORCHRUN = ("torchrun",)
TRAINER_MODULE = "paralleljob_trainer"
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
