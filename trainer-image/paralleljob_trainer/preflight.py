"""The network preflight: what a pod must have for the planned fabric, checked before any process group forms.

`run_preflight()` is called by the CLI on every rank, after the job file is read and before torch is imported,
so long before any process group forms. It reads what the operator planned from the environment (the
contract's `PARALLELJOB_FABRIC`, `PARALLELJOB_NETWORK_VERIFY`, `PARALLELJOB_MNNVL`, and `NCCL_NET`) and looks at the host through files and the
dynamic loader only (no torch, no NCCL), so it is cheap and runs the same on CPU:

- RDMA devices and their link layer (`/sys/class/infiniband/*/ports/*/link_layer`): `NoRdmaDevice`;
- libibverbs loadable, and for EFA the NCCL net plugin (aws-ofi-nccl): `NoRdmaUserspace`;
- the memlock limit, unless CAP_IPC_LOCK is effective (it is not for a non-root user even when the pod
  adds it, kubernetes/kubernetes#56374): `MemlockTooLow`;
- `/dev/shm` large enough for NCCL's shared-memory transport (GPU runs): `ShmTooSmall`;
- the IMEX channel where multi-node NVLink is planned: `NoImexChannel`.

The first failing check decides the reason. A failure is fatal when the pod's `NCCL_NET` names an RDMA
transport (NCCL would fail at init anyway, later and less clearly), when `verify` is `fail`, or for a missing
IMEX channel; otherwise it is printed as a warning. `verify: off` skips the preflight. `report_failure()` writes the one-line reason to
the container's termination message (`paralleljob_contract.network`), which the operator turns into the
`NetworkReady` condition.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import os
import resource
from collections.abc import Callable, Mapping
from pathlib import Path

from paralleljob_contract import environment
from paralleljob_contract.network import NetworkFailure

RDMA_FABRICS = ("infiniband", "roce", "efa")
RDMA_TRANSPORTS = ("IB", "AWS Libfabric", "Libfabric", "gIB")
VERBS_LIBRARY = "libibverbs.so.1"
# NCCL loads libnccl-net.so, or libnccl-net-<NCCL_NET_PLUGIN>.so; aws-ofi-nccl installs the -ofi name.
EFA_PLUGIN_LIBRARIES = ("libnccl-net.so", "libnccl-net-ofi.so", "libnccl-net-aws-ofi.so")
# NCCL registers its buffers with the NIC; AWS and Azure document an unlimited memlock limit, and the container
# runtime default (64 KiB) fails registration. Anything under 1 GiB is not a deliberate setting.
MIN_MEMLOCK_BYTES = 1 << 30
CAP_IPC_LOCK = 14
# Docker's and containerd's 64 MiB default /dev/shm is too small for NCCL's shared-memory transport.
MIN_SHM_BYTES = 512 << 20
IMEX_CHANNEL = "dev/nvidia-caps-imex-channels/channel0"
# The condition a preflight failure sets (the operator reads it from the termination message).
CONDITION = "NetworkReady"


class NetworkNotReady(Exception):
    """The network is not what the job planned; `condition` (NetworkReady, or NetworkVerified for what NCCL
    chose) is set to False with `reason`."""

    def __init__(self, reason: str, message: str, condition: str = CONDITION) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.condition = condition


@dataclasses.dataclass(frozen=True)
class Planned:
    """What the operator planned for this pod's network, from its environment."""

    fabric: str
    verify: str = "warn"
    nccl_net: str | None = None
    mnnvl: bool = False
    gpu: bool = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str], gpu: bool) -> Planned:
        return cls(
            fabric=env.get(environment.FABRIC, "tcp"),
            verify=env.get(environment.NETWORK_VERIFY, "warn"),
            nccl_net=env.get("NCCL_NET") or None,
            mnnvl=env.get(environment.MNNVL) == "1",
            gpu=gpu,
        )

    def fatal(self, failure: NetworkNotReady) -> bool:
        """Whether a failed check stops the rank, rather than being printed. A missing IMEX channel always
        does: the planner laid tensor-parallel groups across nodes on the promise of multi-node NVLink."""
        return self.verify == "fail" or self.nccl_net in RDMA_TRANSPORTS or failure.reason == "NoImexChannel"


@dataclasses.dataclass(frozen=True)
class Host:
    """Where the checks look: `root` is / in a pod; tests point it at a folder laid out like one."""

    root: Path = Path("/")
    load_library: Callable[[str], object] = ctypes.CDLL
    memlock_limit: Callable[[], int] = lambda: resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]

    def path(self, relative: str) -> Path:
        return self.root / relative


def has_gpu_devices(root: Path = Path("/")) -> bool:
    """Whether NVIDIA GPUs are visible (/dev/nvidia0...), without importing torch."""
    return any((root / "dev").glob("nvidia[0-9]*"))


def rdma_devices(host: Host) -> dict[str, str]:
    """RDMA device -> link layer of its first port (InfiniBand, Ethernet for RoCE, Unspecified for EFA)."""
    devices: dict[str, str] = {}
    for port in sorted(host.path("sys/class/infiniband").glob("*/ports/*/link_layer")):
        device = port.parents[2].name
        if device not in devices:
            devices[device] = port.read_text().strip() or "Unspecified"
    return devices


def loadable(host: Host, names: tuple[str, ...]) -> str | None:
    """The first of `names` the dynamic loader can open, or None."""
    for name in names:
        try:
            host.load_library(name)
        except OSError:
            continue
        return name
    return None


def effective_capabilities(host: Host) -> int:
    """CapEff of this process (/proc/self/status), 0 when unreadable."""
    try:
        for line in host.path("proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def shm_bytes(host: Host) -> int | None:
    """Size of /dev/shm, None when there is none."""
    try:
        stat = os.statvfs(host.path("dev/shm"))
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def _check_devices(planned: Planned, host: Host) -> None:
    if planned.fabric not in RDMA_FABRICS:
        return
    if not rdma_devices(host):
        raise NetworkNotReady(
            "NoRdmaDevice",
            f"fabric {planned.fabric} but the pod sees no RDMA device (/sys/class/infiniband is empty): request "
            "the node's RDMA resource (spec.network.rdmaResource) or declare the fabric the nodes have",
        )


def _check_userspace(planned: Planned, host: Host) -> None:
    if planned.fabric not in RDMA_FABRICS:
        return
    if loadable(host, (VERBS_LIBRARY,)) is None:
        raise NetworkNotReady(
            "NoRdmaUserspace",
            f"fabric {planned.fabric} but {VERBS_LIBRARY} cannot be loaded: use an image with libibverbs1, "
            "ibverbs-providers and librdmacm1 (the bundled trainer image has them)",
        )
    plugin = os.environ.get("NCCL_NET_PLUGIN")
    names = (f"libnccl-net-{plugin}.so", *EFA_PLUGIN_LIBRARIES) if plugin else EFA_PLUGIN_LIBRARIES
    if planned.fabric == "efa" and loadable(host, names) is None:
        raise NetworkNotReady(
            "NoRdmaUserspace",
            "fabric efa but NCCL's EFA net plugin (aws-ofi-nccl, libnccl-net*.so) cannot be loaded: set "
            "spec.template.image to an image with libfabric and aws-ofi-nccl (docs/operator.md, EFA)",
        )


def _check_memlock(planned: Planned, host: Host) -> None:
    if planned.fabric not in RDMA_FABRICS:
        return
    limit = host.memlock_limit()
    if limit == resource.RLIM_INFINITY or limit >= MIN_MEMLOCK_BYTES:
        return
    if effective_capabilities(host) & (1 << CAP_IPC_LOCK):
        return
    raise NetworkNotReady(
        "MemlockTooLow",
        f"the memlock limit is {limit // 1024} KiB and CAP_IPC_LOCK is not effective (capabilities a pod adds "
        f"do not apply to a non-root user, uid {os.getuid()}), so NCCL cannot register its buffers: set an "
        "unlimited memlock limit in the container runtime, or run the trainer as root",
    )


def _check_shm(planned: Planned, host: Host) -> None:
    if not planned.gpu:
        return
    size = shm_bytes(host)
    if size is not None and size < MIN_SHM_BYTES:
        raise NetworkNotReady(
            "ShmTooSmall",
            f"/dev/shm holds {size >> 20} MiB, too little for NCCL's shared-memory transport: mount an "
            "emptyDir with medium Memory there (the operator's pods do)",
        )


def _check_imex(planned: Planned, host: Host) -> None:
    if planned.mnnvl and not host.path(IMEX_CHANNEL).exists():
        raise NetworkNotReady(
            "NoImexChannel",
            f"multi-node NVLink is planned but /{IMEX_CHANNEL} does not exist: the claim named by "
            "spec.network.imexChannelClaim must be a ComputeDomain's channel (resource.nvidia.com)",
        )


CHECKS = (_check_devices, _check_userspace, _check_memlock, _check_shm, _check_imex)


def check(planned: Planned, host: Host) -> NetworkNotReady | None:
    """The first failing check, or None when the pod has what the planned fabric needs."""
    for each in CHECKS:
        try:
            each(planned, host)
        except NetworkNotReady as failure:
            return failure
    return None


def run_preflight(env: Mapping[str, str], gpu: bool, host: Host | None = None) -> str | None:
    """Check this pod; raise NetworkNotReady when the failure is fatal, else return a warning line (or None)."""
    planned = Planned.from_environment(env, gpu)
    if planned.verify == "off":
        return None
    failure = check(planned, host or Host())
    if failure is None:
        return None
    if planned.fatal(failure):
        raise failure
    return f"network preflight: {failure} (not fatal: NCCL_NET does not name an RDMA transport)"


def report_failure(condition: str, reason: str, message: str, env: Mapping[str, str]) -> None:
    """Write the reason to the container's termination message, first writer wins (never raises).

    Any local rank may write it: the first to fail its preflight makes torchrun stop the others, so a rule such as
    "local rank 0 writes" loses the message whenever another rank got there first (and the gang is restarted into
    the same failure). The ranks of one pod take turns on the file with flock, and only the first writes."""
    path = Path(env.get(environment.TERMINATION_LOG) or environment.DEFAULT_TERMINATION_LOG)
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            if os.fstat(out.fileno()).st_size == 0:
                out.write(NetworkFailure(condition, reason, message).line() + "\n")
