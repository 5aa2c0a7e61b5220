"""NCCL and PyTorch distributed environment derived from the inter-node fabric: one policy, one table.

Owns the fabric auto-detection rule and the fabric -> environment table. Pure: node dicts and the job's
`spec.network` (camelCase, as in YAML) in, `dict[str, str]` out. Called by `manifests.env` (pods and the local
runner through `build_node_env`), by `manifests.configmap` (the env shown to people) and by the operator.

Auto-detection (`spec.network.fabric: auto`), applied to the nodes the job is placed on, first match wins:
1. every node carries the label `paralleljob.io/fabric` with one and the same value: that value;
2. every node has allocatable `vpc.amazonaws.com/efa` > 0: `efa`;
3. every node has an allocatable RDMA resource (`rdma/*` or `nvidia.com/hostdev`) > 0: `infiniband`
   (label the nodes `paralleljob.io/fabric=roce` for RoCE, which looks the same from the API);
4. otherwise `tcp`: the lowest common denominator always works.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob_contract import environment

FABRICS = ("infiniband", "roce", "efa", "tcp")
FABRIC_LABEL = "paralleljob.io/fabric"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
RDMA_RESOURCE_PREFIXES = ("rdma/", "nvidia.com/hostdev")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# GPU products that sit on third-generation (or later) NVSwitch, where NVLink SHARP (NVLS) is available.
NVSWITCH_PRODUCT_MARKERS = ("H100-SXM", "H100-80GB-HBM3", "H200", "H800", "H20", "B200", "B100", "GB200", "GB300")
DEFAULT_TIMEOUT_SECONDS = environment.DEFAULT_PG_TIMEOUT_SECONDS
# Exclude loopback and docker bridges; a pod's own interface is eth0.
DEFAULT_SOCKET_IFNAME = "^lo,docker"


@dataclasses.dataclass(frozen=True)
class FabricFacts:
    """What the nodes of one placement say about their network."""

    fabric: str
    nvswitch: bool = False
    mnnvl: bool = False
    rdma_resource: str | None = None


def allocatable(node: Mapping[str, Any], resource: str) -> int:
    """The node's allocatable count of an extended resource (0 when absent or unparsable)."""
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)
    try:
        return int(str(raw))
    except ValueError:
        return 0


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def rdma_resource_of(node: Mapping[str, Any]) -> str | None:
    """The first RDMA extended resource the node offers, by name order."""
    offered = ((node.get("status") or {}).get("allocatable") or {}).keys()
    names = sorted(n for n in offered if n.startswith(RDMA_RESOURCE_PREFIXES) and allocatable(node, n) > 0)
    return names[0] if names else None


def detect_fabric(nodes: Sequence[Mapping[str, Any]]) -> str:
    """The fabric all of these nodes share, by the rule in this module's docstring."""
    if not nodes:
        return "tcp"
    labelled = {_labels(n).get(FABRIC_LABEL) for n in nodes}
    if len(labelled) == 1 and (only := labelled.pop()) in FABRICS:
        return str(only)
    if all(allocatable(n, EFA_RESOURCE) > 0 for n in nodes):
        return "efa"
    if all(rdma_resource_of(n) for n in nodes):
        return "infiniband"
    return "tcp"


def detect_nvswitch(nodes: Sequence[Mapping[str, Any]]) -> bool:
    """True when every node's GPU product is an NVSwitch (NVLS-capable) system."""
    products = [_labels(n).get(GPU_PRODUCT_LABEL, "") for n in nodes]
    return bool(products) and all(any(m in p for m in NVSWITCH_PRODUCT_MARKERS) for p in products)


def detect_mnnvl(nodes: Sequence[Mapping[str, Any]], nvlink_domain_label: str | None) -> bool:
    """True when the job names an NVLink domain label and some domain holds more than one of these nodes."""
    if not nvlink_domain_label:
        return False
    domains = [_labels(n).get(nvlink_domain_label) for n in nodes]
    present = [d for d in domains if d]
    return len(present) > len(set(present))


def detect_facts(
    network: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], nvlink_domain_label: str | None = None
) -> FabricFacts:
    """The fabric (spec.network.fabric, or detected when auto) and NVLink facts of a placement."""
    fabric = network.get("fabric") or "auto"
    if fabric == "auto":
        fabric = detect_fabric(nodes)
    rdma = next((r for r in (rdma_resource_of(n) for n in nodes) if r), None)
    return FabricFacts(fabric, detect_nvswitch(nodes), detect_mnnvl(nodes, nvlink_domain_label), rdma)


def _infiniband(network: Mapping[str, Any]) -> dict[str, str]:
    env = {
        "NCCL_IB_DISABLE": "0",
        "NCCL_IB_TIMEOUT": "22",
        "NCCL_IB_RETRY_CNT": "7",
        # Rail-optimised fabrics (one leaf per NIC index) want rings that never cross rails.
        "NCCL_CROSS_NIC": "0",
        "NCCL_NET_GDR_LEVEL": "PHB",
    }
    hcas = network.get("ibHCAs")
    if hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
    return env


def _roce(network: Mapping[str, Any]) -> dict[str, str]:
    gid = network.get("gidIndex")
    return {**_infiniband(network), "NCCL_IB_GID_INDEX": str(3 if gid is None else gid)}


def _efa(network: Mapping[str, Any]) -> dict[str, str]:
    return {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1", "NCCL_CROSS_NIC": "0"}


def _tcp(network: Mapping[str, Any]) -> dict[str, str]:
    return {"NCCL_IB_DISABLE": "1"}


FABRIC_ENV = {"infiniband": _infiniband, "roce": _roce, "efa": _efa, "tcp": _tcp}


def timeout_env(timeout_seconds: int) -> dict[str, str]:
    """The process-group timeout, for our trainer (seconds) and for DeepSpeed's default (minutes)."""
    return {
        environment.PG_TIMEOUT_SECONDS: str(timeout_seconds),
        "DEEPSPEED_TIMEOUT": str(max(1, math.ceil(timeout_seconds / 60))),
    }


def build_nccl_env(
    network: Mapping[str, Any], fabric: str, *, nvswitch: bool = False, mnnvl: bool = False
) -> dict[str, str]:
    """The NCCL and torch environment for `fabric`; `network` is spec.network (camelCase) and may be empty.

    `network["ncclEnv"]` overrides everything derived here.
    """
    if fabric not in FABRIC_ENV:
        raise ValueError(f"unknown fabric {fabric!r}; expected one of {', '.join(FABRICS)}")
    env = {
        # Abort the communicator and end the process when a collective fails or times out, so the pod fails
        # and the operator restarts the gang instead of the job hanging.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        **timeout_env(int(network.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)),
        "NCCL_DEBUG": "WARN",
        "NCCL_SOCKET_IFNAME": network.get("socketInterface") or DEFAULT_SOCKET_IFNAME,
        **FABRIC_ENV[fabric](network),
        "NCCL_NVLS_ENABLE": "1" if nvswitch else "0",
        "NCCL_MNNVL_ENABLE": "1" if mnnvl else "0",
    }
    env.update({str(k): str(v) for k, v in (network.get("ncclEnv") or {}).items()})
    return env


def rdma_request(network: Mapping[str, Any], facts: FabricFacts) -> dict[str, int]:
    """The extended resources each pod requests for the network (empty on tcp)."""
    configured = network.get("rdmaResource")
    if facts.fabric == "efa":
        name, count = (configured["name"], configured.get("count", 1)) if configured else (EFA_RESOURCE, 1)
        return {name: int(count)}
    if facts.fabric in ("infiniband", "roce"):
        if configured:
            return {configured["name"]: int(configured.get("count", 1))}
        return {facts.rdma_resource: 1} if facts.rdma_resource else {}
    return {}


def uses_rdma(facts: FabricFacts) -> bool:
    """Whether pods register memory with an RDMA device (and so need IPC_LOCK)."""
    return facts.fabric in ("infiniband", "roce", "efa")
