"""The security context of a job's pods: non-root, no privilege escalation, every capability dropped, the
runtime's seccomp profile and a read-only root filesystem, with writable scratch space where the trainer needs it.

Pure. The defaults make a TCP job's pods pass Pod Security "restricted". An RDMA job's pods add IPC_LOCK (the
verbs library pins memory for the HCA), which no Pod Security level short of "privileged" allows; an
administrator whose container runtime already raises RLIMIT_MEMLOCK turns it off (`rdma_ipc_lock`), and RDMA
pods are "restricted" too. The operator-wide `PodSecurity` comes from `paralleljob operator` flags (chart
values `jobPods.securityContext`); a job cannot change it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The trainer image's user (trainer-image/Dockerfile: USER 10001:10001, HOME=/home/trainer).
TRAINER_UID = 10001
TRAINER_HOME = "/home/trainer"
# Writable folders on a read-only root: Python's and torch's temporary files and torch.compile's cache (/tmp),
# and HOME, where torch extensions (TORCH_EXTENSIONS_DIR), Triton's kernel cache and pip's cache go.
SCRATCH_DIRS = (("tmp", "/tmp"), ("home", TRAINER_HOME))
IPC_LOCK = "IPC_LOCK"


@dataclasses.dataclass(frozen=True)
class PodSecurity:
    """What every job's pods run as, set by the administrator."""

    run_as_user: int = TRAINER_UID
    run_as_group: int = TRAINER_UID
    # The group that owns mounted volumes, so that a root-owned PVC is writable by the trainer.
    fs_group: int = TRAINER_UID
    read_only_root_filesystem: bool = True
    # IPC_LOCK for pods that use RDMA devices. Off: RDMA relies on the runtime's RLIMIT_MEMLOCK.
    rdma_ipc_lock: bool = True


DEFAULT = PodSecurity()


def pod_security_context(security: PodSecurity) -> dict[str, Any]:
    """The pod's securityContext. fsGroupChangePolicy OnRootMismatch: a checkpoint volume of millions of files is
    chowned once, not at every pod start."""
    return {
        "runAsNonRoot": True,
        "runAsUser": security.run_as_user,
        "runAsGroup": security.run_as_group,
        "fsGroup": security.fs_group,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(security: PodSecurity, uses_rdma: bool) -> dict[str, Any]:
    """The training container's securityContext: IPC_LOCK is its only capability, and only for RDMA."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if uses_rdma and security.rdma_ipc_lock:
        capabilities["add"] = [IPC_LOCK]
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": security.read_only_root_filesystem,
        "capabilities": capabilities,
    }


def scratch_volumes(security: PodSecurity) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the writable emptyDirs a read-only root filesystem needs; none when it is writable."""
    if not security.read_only_root_filesystem:
        return [], []
    volumes = [{"name": f"scratch-{name}", "emptyDir": {}} for name, _ in SCRATCH_DIRS]
    mounts = [{"name": f"scratch-{name}", "mountPath": path} for name, path in SCRATCH_DIRS]
    return volumes, mounts
