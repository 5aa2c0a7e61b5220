"""The environment of one node rank's trainer processes: the contract of docs/architecture.md.

`build_node_env()` is the single producer of the PARALLELJOB_* variables, OMP_NUM_THREADS and the NCCL/torch
variables, for pods (`manifests.pods`) and for local processes (`paralleljob.local`). Pure: plan dict in,
`dict[str, str]` out, in a stable order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER_PORT = 29500


def build_node_env(
    plan: Mapping[str, Any],
    node_rank: int,
    *,
    job_name: str,
    namespace: str,
    config_path: str,
    output_dir: str,
    checkpoint_dir: str | None = None,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    progress_hook: str | None = None,
    nccl_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment every trainer process of node rank `node_rank` gets.

    `plan` is the plan object of job.json (`layout`, `axisOrder`, `ranksPerNode`, `nodes`). `master_addr` and
    `master_port` are also passed to torchrun as flags; they are exported as PARALLELJOB_MASTER_ADDR/PORT so a
    launcher or a user's script can read them before torchrun sets MASTER_ADDR. `nccl_env` comes from
    `manifests.nccl.build_nccl_env()`; it is applied last except for the identity variables, which it
    cannot override.
    """
    nnodes = len(plan["nodes"])
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} is outside the plan's {nnodes} nodes")
    layout = plan["layout"]
    env: dict[str, str] = {"OMP_NUM_THREADS": "1", **dict(nccl_env or {})}
    env.update(
        {
            "PARALLELJOB_CONFIG": config_path,
            "PARALLELJOB_OUTPUT_DIR": output_dir,
            "PARALLELJOB_JOB_NAME": job_name,
            "PARALLELJOB_NAMESPACE": namespace,
            "PARALLELJOB_PIPELINE": str(layout["pipeline"]),
            "PARALLELJOB_TENSOR": str(layout["tensor"]),
            "PARALLELJOB_DATA": str(layout["data"]),
            "PARALLELJOB_AXIS_ORDER": ",".join(plan["axisOrder"]),
            "PARALLELJOB_NODE_RANK": str(node_rank),
            "PARALLELJOB_NNODES": str(nnodes),
            "PARALLELJOB_RANKS_PER_NODE": str(plan["ranksPerNode"]),
            "PARALLELJOB_MASTER_PORT": str(master_port),
        }
    )
    optional = {
        "PARALLELJOB_MASTER_ADDR": master_addr,
        "PARALLELJOB_CHECKPOINT_DIR": checkpoint_dir,
        "PARALLELJOB_PROGRESS_HOOK": progress_hook,
    }
    env.update({key: value for key, value in optional.items() if value is not None})
    return env


def as_env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    """A Kubernetes container `env` list from a mapping, order kept."""
    return [{"name": key, "value": value} for key, value in env.items()]
