"""What NCCL actually chose, read from its own INIT,NET log lines, against what the job planned.

Pure (no torch): `parse()` turns the lines NCCL writes to `NCCL_DEBUG_FILE` into a `NcclChoice`, and
`classify()` compares it with the plan into a `Verdict`, the NetworkVerified condition. `training` sets
up the log (`nccl_debug_env`) before the process groups form and reads it after one warm-up collective
across every rank, since NCCL connects its channels only at the first collective (NCCL_RUNTIME_CONNECT).

The lines matched, as NCCL 2.30.7 (NVIDIA/nccl@5067397) and aws-ofi-nccl (aws/aws-ofi-nccl@2daf7d3) print
them after the `host:pid:tid [dev] NCCL INFO ` prefix:
- `Using network %s` (src/init.cc:486): the transport, IB, Socket, Libfabric, AWS Libfabric or gIB;
- `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:...` (src/transport/net_ib/init.cc:513);
- `NET/IB : No device found.` (net_ib/init.cc:470) and `Count not open libibverbs.so` (misc/ibvsymbols.cc:86);
- `Selected provider is efa, fabric is efa-direct (found 32 nics)` (aws-ofi-nccl src/nccl_ofi_net.cpp:644);
- `Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA` (src/transport/net.cc:324): GPUDirect RDMA;
- `MNNVL 1 cliqueId 7 cliqueSize 72 cliqueRank 3 nvlDomainSize 72` (src/mnnvl.cc:96);
- `NVLS multicast support is available on dev 0` (src/transport/nvls.cc:279).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from paralleljob_contract import environment

RDMA_FABRICS = ("infiniband", "roce", "efa")
SOCKET = "Socket"

_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")
_IB_USING = re.compile(r"NET/IB : Using(.*?)(?:;|$)")
_IB_DEVICE = re.compile(r"\[\d+\](\S+?)/(IB|RoCE)\b")
_IB_NONE = re.compile(r"NET/IB : No device found")
_NO_VERBS = re.compile(r"Count not open libibverbs|Failed to open libibverbs")
_EFA_NICS = re.compile(r"Selected provider is (\S+), fabric is (\S+) \(found (\d+) nics\)")
_CHANNEL_NET = re.compile(r"\] via NET/(.+?)/\d+(?:\(\d+\))?(/GDRDMA)?")
_MNNVL = re.compile(r"NCCL INFO MNNVL (\d+) cliqueId")
_NVLS = re.compile(r"NVLS multicast support is (not )?available")


@dataclasses.dataclass(frozen=True)
class NcclChoice:
    """What one rank's NCCL log says it chose; None where the log does not say."""

    network: str | None = None
    ib_devices: tuple[tuple[str, str], ...] = ()  # (device:port, IB or RoCE)
    efa_nics: int | None = None
    net_channels: int = 0
    gdr_channels: int = 0
    mnnvl: bool | None = None
    nvls: bool | None = None
    no_verbs: bool = False

    @property
    def empty(self) -> bool:
        return self.network is None and not self.ib_devices and self.net_channels == 0 and self.efa_nics is None

    def summary(self) -> str:
        """A few words for people: the network, its NICs and GPUDirect RDMA."""
        parts = [f"NCCL uses {self.network or 'an unknown network'}"]
        nics = self.efa_nics if self.efa_nics is not None else len(self.ib_devices) or None
        if nics:
            parts.append(f"over {nics} NICs")
        if self.net_channels:
            parts.append("with GPUDirect RDMA" if self.gdr_channels else "without GPUDirect RDMA")
        if self.mnnvl:
            parts.append("and multi-node NVLink")
        return " ".join(parts)


def parse(lines: Iterable[str]) -> NcclChoice:
    """The choice one rank's NCCL INIT,NET lines record (later lines of the same kind win)."""
    choice = NcclChoice()
    channel_network: str | None = None
    for line in lines:
        if match := _USING_NETWORK.search(line):
            choice = dataclasses.replace(choice, network=match[1])
        elif match := _IB_USING.search(line):
            devices = tuple((m[1], m[2]) for m in _IB_DEVICE.finditer(match[1]))
            choice = dataclasses.replace(choice, ib_devices=devices)
        elif match := _EFA_NICS.search(line):
            choice = dataclasses.replace(choice, efa_nics=int(match[3]))
        elif match := _CHANNEL_NET.search(line):
            channel_network = channel_network or match[1]
            gdr = choice.gdr_channels + bool(match[2])
            choice = dataclasses.replace(choice, net_channels=choice.net_channels + 1, gdr_channels=gdr)
        elif match := _MNNVL.search(line):
            choice = dataclasses.replace(choice, mnnvl=match[1] != "0")
        elif match := _NVLS.search(line):
            choice = dataclasses.replace(choice, nvls=match[1] is None)
        elif _NO_VERBS.search(line) or _IB_NONE.search(line):
            choice = dataclasses.replace(choice, no_verbs=True)
    if choice.network is None and channel_network is not None:
        choice = dataclasses.replace(choice, network=channel_network)
    return choice


@dataclasses.dataclass(frozen=True)
class Expected:
    """What the operator planned, from the pod's environment."""

    fabric: str
    nics: int | None = None
    mnnvl: bool = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Expected:
        nics = env.get(environment.EXPECTED_NICS)
        return cls(
            fabric=env.get(environment.FABRIC, "tcp"),
            nics=int(nics) if nics and nics.isdigit() else None,
            mnnvl=env.get(environment.MNNVL) == "1",
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The NetworkVerified condition of one rank: status True, False or Unknown, with its reason."""

    status: str
    reason: str
    message: str

    def to_record(self) -> dict[str, str]:
        return {"verified": self.status, "reason": self.reason, "message": self.message}


def classify(choice: NcclChoice, expected: Expected) -> Verdict:
    """SocketFallback, FewerNICs, NoGPUDirectRDMA or MNNVLOff when NCCL chose less than planned, in that
    order of cost; True (AsPlanned) otherwise; Unknown when the log says nothing (gloo, or one rank only)."""
    if choice.empty:
        return Verdict("Unknown", "NoNcclLog", "NCCL logged no network choice (CPU run, or no collective ran)")
    summary = choice.summary()
    rdma = expected.fabric in RDMA_FABRICS
    if rdma and choice.network == SOCKET:
        why = " (libibverbs or the RDMA device is missing)" if choice.no_verbs else ""
        return Verdict("False", "SocketFallback", f"{summary} on fabric {expected.fabric}{why}")
    found = choice.efa_nics if expected.fabric == "efa" else len(choice.ib_devices) or None
    if rdma and expected.nics and found is not None and found < expected.nics:
        return Verdict("False", "FewerNICs", f"{summary}: {found} of the {expected.nics} NICs requested")
    if rdma and choice.net_channels and not choice.gdr_channels:
        return Verdict("False", "NoGPUDirectRDMA", f"{summary}: GPU memory is staged through host memory")
    if expected.mnnvl and not choice.mnnvl:
        return Verdict("False", "MNNVLOff", f"{summary}, but not multi-node NVLink although it was planned")
    return Verdict("True", "AsPlanned", summary)


def read_log(path: Path) -> list[str]:
    """The lines of one rank's NCCL log; none when NCCL wrote none."""
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def nccl_debug_env(env: Mapping[str, str], log_path: Path) -> dict[str, str]:
    """The variables that make NCCL log its INIT,NET choices to `log_path`, leaving what the user set.

    NCCL_DEBUG=WARN (the operator's default) becomes INFO for these two subsystems only; every WARN line goes
    to the same file, since NCCL_DEBUG_FILE takes all of NCCL's output.
    """
    wanted = {"NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(log_path)}
    changes = {key: value for key, value in wanted.items() if key not in env}
    if env.get("NCCL_DEBUG", "WARN").upper() == "WARN":
        changes["NCCL_DEBUG"] = "INFO"
    return changes


# Verdict reasons by cost, least first: the job's verdict is the worst any rank found (`worst`).
SEVERITY = ("NoNcclLog", "AsPlanned", "MNNVLOff", "NoGPUDirectRDMA", "FewerNICs", "SocketFallback")


def severity(verdict: Verdict) -> int:
    return SEVERITY.index(verdict.reason) if verdict.reason in SEVERITY else 0


def worst(mine: Verdict, worst_severity: int) -> Verdict:
    """The job's verdict, from this rank's and the worst severity over every rank (an all-reduce MAX)."""
    if worst_severity <= severity(mine):
        return mine
    reason = SEVERITY[worst_severity]
    status = "True" if reason == "AsPlanned" else "False"
    return Verdict(status, reason, f"another rank found {reason}; this rank: {mine.message} (see its NCCL log)")
