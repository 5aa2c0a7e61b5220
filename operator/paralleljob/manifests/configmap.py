"""The job's ConfigMap: job.json (what the trainer reads), and for people the DeepSpeed config, the full
plan with its estimates, and the NCCL environment (`kubectl describe configmap <job>-config` shows them).

Pure. The ConfigMap is the record of one attempt's decisions: the attempt (gang restart count) it was
planned for, the plan, and `network.json` (fabric, NCCL environment, network resources, IPC_LOCK,
warnings), computed once at admission. The pods are built from it and from `status.placement` (which node runs which node
rank), so a restarted operator finishes creating the pods of the plan it already made, and the pods run
exactly the `status.ncclEnv` written from the same computation. A ConfigMap holds at most 1 MiB, so nothing
here grows with the job: job.json carries the layout, never a per-node or per-rank list (a pod's node rank
and node are in its environment, its ranks and coordinates follow from the layout), and plan.json leaves the
nodes out; a 4,096-node job's ConfigMap is a few KB (tests/manifests/test_configmap_size.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.manifests import labels
from paralleljob.planning import Plan
from paralleljob_contract import environment, jobfile

JOB_FILE = jobfile.FILE_NAME
NETWORK_FILE = "network.json"
PLAN_FILE = "plan.json"
MOUNT_PATH = environment.MOUNT_PATH
CONFIG_PATH = environment.DEFAULT_CONFIG_PATH


def render_env_file(env: Mapping[str, str]) -> str:
    """KEY=VALUE lines, sorted, as `env` prints them."""
    return "".join(f"{key}={value}\n" for key, value in sorted(env.items()))


def build_config_map(
    owner: Mapping[str, Any],
    trainer_config: Mapping[str, Any],
    plan: Plan,
    network: Mapping[str, Any],
    attempt: int,
) -> dict[str, Any]:
    """The `<job>-config` ConfigMap for one attempt; `network` is `network_record()`'s."""
    job = owner["metadata"]["name"]
    metadata = labels.child_metadata(owner, labels.config_map_name(job), {labels.ATTEMPT_LABEL: str(attempt)})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {
            JOB_FILE: _compact(trainer_config),
            "deepspeed.json": json.dumps(trainer_config["deepspeed"], indent=2, sort_keys=True),
            PLAN_FILE: _compact({key: value for key, value in plan.to_dict().items() if key != "nodes"}),
            "nccl.env": render_env_file(network["ncclEnv"]),
            NETWORK_FILE: _compact(network),
        },
    }


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def plan_of(config_map: Mapping[str, Any]) -> jobfile.Plan:
    """The plan's layout a ConfigMap of ours was built with, as the trainer reads it."""
    return jobfile.parse_plan(json.loads(config_map["data"][JOB_FILE])["plan"])


def network_record(
    fabric: str,
    nccl_env: Mapping[str, str],
    resources: Mapping[str, int | str],
    ipc_lock: bool,
    *,
    warnings: Sequence[str] = (),
    rdma_missing: bool = False,
) -> dict[str, Any]:
    """What every pod of the attempt shares about the network, and what a person should know about it."""
    record: dict[str, Any] = {"fabric": fabric, "ncclEnv": dict(nccl_env), "resources": dict(resources)}
    record["ipcLock"] = ipc_lock
    if warnings:
        record["warnings"] = list(warnings)
    if rdma_missing:
        record["rdmaMissing"] = True
    return record


def network_of(config_map: Mapping[str, Any]) -> dict[str, Any]:
    """The `network_record()` a ConfigMap of ours was built with."""
    return dict(json.loads(config_map["data"][NETWORK_FILE]))


def attempt_of(config_map: Mapping[str, Any]) -> int:
    return int(config_map["metadata"]["labels"][labels.ATTEMPT_LABEL])
