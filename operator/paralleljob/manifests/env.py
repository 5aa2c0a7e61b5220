"""The environment of one node rank's trainer processes, for pods (`manifests.pods`) and local processes
(`paralleljob.local`) alike.

`build_node_env()` puts together OMP_NUM_THREADS, the NCCL/torch variables and the contract's PARALLELJOB_*
variables (`paralleljob_contract.environment`, the one writer; docs/contract.md lists them). Pure: plan in,
`dict[str, str]` out, in a stable order.
"""

from __future__ import annotations

from collections.abc import Mapping

from paralleljob_contract import stragglers as straggler_channel
from paralleljob_contract.environment import PodEnvironment
from paralleljob_contract.jobfile import Plan


def build_node_env(
    plan: Plan,
    node_rank: int,
    *,
    job_name: str,
    namespace: str,
    node_name: str,
    config_path: str,
    output_dir: str,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    progress_hook: str | None = None,
    nccl_env: Mapping[str, str] | None = None,
    stragglers: straggler_channel.Policy | None = None,
) -> dict[str, str]:
    """The environment every trainer process of node rank `node_rank` (on node `node_name`) gets.

    `nccl_env` comes from `manifests.nccl.build_nccl_env()` (with the process-group timeout); it is applied
    first, so it cannot override the identity variables.
    """
    if not 0 <= node_rank < plan.nodes:
        raise ValueError(f"node rank {node_rank} is outside the plan's {plan.nodes} nodes")
    identity = PodEnvironment(
        config_path=config_path,
        job_name=job_name,
        namespace=namespace,
        node_rank=node_rank,
        node_name=node_name,
        output_dir=output_dir,
        checkpoint_dir=checkpoint_dir,
        resume_from=resume_from,
        progress_hook=progress_hook,
    )
    policy = straggler_env(stragglers) if stragglers is not None else {}
    return {"OMP_NUM_THREADS": "1", **dict(nccl_env or {}), **policy, **identity.to_environ()}


def straggler_env(policy: straggler_channel.Policy) -> dict[str, str]:
    """spec.failurePolicy.stragglers for the trainer: its threshold, window (0: the timing is off) and windows."""
    return {
        straggler_channel.THRESHOLD_ENV: repr(float(policy.threshold)),
        straggler_channel.WINDOW_ENV: str(policy.window_steps),
        straggler_channel.WINDOWS_ENV: str(policy.windows),
    }


def as_env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    """A Kubernetes container `env` list from a mapping, order kept."""
    return [{"name": key, "value": value} for key, value in env.items()]
