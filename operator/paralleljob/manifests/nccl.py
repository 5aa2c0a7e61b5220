"""NCCL and PyTorch distributed environment, and the network devices each pod requests: one policy, one table.

Owns the fabric auto-detection rule, the fabric -> environment table and the RDMA/EFA request. Pure: node dicts
and the job's `spec.network` (camelCase, as in YAML) in, `dict[str, str]` out. Called by `manifests.children`
(pods, through `build_node_env`), by `manifests.configmap` (the env shown to people) and by the local runner.

The rule is "set what proves the transport, leave NCCL's own detection alone" (docs/operator.md has the
table with a source per row):
- `NCCL_NET` names the transport of a declared or detected RDMA fabric (and `Socket` for a declared tcp), so
  a missing transport fails at init instead of falling back to sockets at a fraction of the bandwidth. An
  inferred tcp sets nothing: NCCL still uses any RDMA device the pod turns out to have.
- NVLS, GID index, GDR level, cross-NIC, retry count and PyTorch's async error handling keep NCCL's and
  PyTorch's defaults unless a spec.network field asks for a value.
- Every NIC is requested: EFA and exclusive (SR-IOV, host-device) plugins get the node's allocatable count,
  shared plugins 1.

Auto-detection (`spec.network.fabric: auto`), applied to the nodes the job is placed on, first match wins:
1. every node carries the label `paralleljob.io/fabric` with one and the same value: that value (declared);
2. every node has allocatable `vpc.amazonaws.com/efa` > 0: `efa`;
3. every node has an allocatable RDMA resource (`is_rdma_resource`) > 0: `infiniband`
   (label the nodes `paralleljob.io/fabric=roce` for RoCE: NCCL reads the link layer itself);
4. otherwise `tcp`, inferred: NCCL picks what the pod has.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from paralleljob.planning import costmodel
from paralleljob.planning.levels import TOPOGRAPH_NVLINK
from paralleljob_contract import environment

FABRICS = ("infiniband", "roce", "efa", "tcp")
RDMA_FABRICS = ("infiniband", "roce", "efa")
FABRIC_LABEL = "paralleljob.io/fabric"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_RESOURCE = "nvidia.com/gpu"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
# EKS EFA nodes pre-allocate 5128 2 MiB pages; AWS's p5 samples request 5120Mi (docs/operator.md, EFA row).
EFA_HUGEPAGES = "5120Mi"
EFA_HUGEPAGES_MIB = 5120
CLIQUE_LABEL = "nvidia.com/gpu.clique"
# The transport name NCCL_NET selects; with it set, NCCL tries only that network (plugin/net.cc).
NCCL_NET = {"infiniband": "IB", "roce": "IB", "efa": "AWS Libfabric", "tcp": "Socket"}
VERIFY_POLICIES = ("fail", "warn", "off")
DEFAULT_VERIFY = "warn"
# spec.network.preflight's default: the link check runs at every start and reports.
DEFAULT_PREFLIGHT = "report"
DEFAULT_TIMEOUT_SECONDS = environment.DEFAULT_PG_TIMEOUT_SECONDS
# The pod's own interface: NCCL's bootstrap and socket transport stay off Multus attachments (net1..N), which
# may not route between nodes. `=` makes it an exact name, not a prefix.
DEFAULT_SOCKET_IFNAME = "=eth0"
# PyTorch's flight recorder: the last collectives of each rank, dumped when the watchdog times out, so a hang
# leaves a trace (the trainer points TORCH_FR_DUMP_TEMP_FILE into its output folder).
FLIGHT_RECORDER_ENTRIES = 2000

# The trainer's view of what the operator planned (docs/contract.md lists them).
FABRIC_ENV_NAME = environment.FABRIC
VERIFY_ENV_NAME = environment.NETWORK_VERIFY
PREFLIGHT_ENV_NAME = environment.NETWORK_PREFLIGHT
NICS_ENV_NAME = environment.EXPECTED_NICS
MNNVL_ENV_NAME = environment.MNNVL

# spec.network fields that are one NCCL variable each, written only when set.
FIELD_ENV = {
    "gidIndex": "NCCL_IB_GID_INDEX",
    "crossNic": "NCCL_CROSS_NIC",
    "trafficClass": "NCCL_IB_TC",
    "fifoTrafficClass": "NCCL_IB_FIFO_TC",
    "serviceLevel": "NCCL_IB_SL",
    "qpsPerConnection": "NCCL_IB_QPS_PER_CONNECTION",
    "addrRange": "NCCL_IB_ADDR_RANGE",
    "addrFamily": "NCCL_IB_ADDR_FAMILY",
}


@dataclasses.dataclass(frozen=True)
class RdmaRequest:
    """The network devices each pod requests, and what a person should know about the choice."""

    resources: dict[str, int | str]
    # NICs NCCL should find (EFA and exclusive plugins); None where one unit gives every NIC (shared plugins).
    nics: int | None = None
    warnings: tuple[str, ...] = ()
    # An RDMA fabric, but the nodes offer no RDMA resource and the spec names none: the pods get no device
    # from a device plugin (under spec.network.verify: fail the operator refuses the job).
    missing: bool = False


@dataclasses.dataclass(frozen=True)
class FabricFacts:
    """What the nodes of one placement say about their network."""

    fabric: str
    # Declared in spec.network.fabric (or the operator's default) or by the nodes' fabric label; not inferred.
    declared: bool = True
    # Some NVLink domain holds more than one of the placed nodes.
    nvlink_spans_nodes: bool = False
    # The pods get an IMEX channel (spec.network.imexChannelClaim), so NCCL may use multi-node NVLink.
    imex: bool = False
    rdma_resource: str | None = None

    @property
    def mnnvl(self) -> bool:
        """Whether multi-node NVLink is planned: the domain spans nodes and the pods can use it."""
        return self.nvlink_spans_nodes and self.imex


def allocatable(node: Mapping[str, Any], resource: str) -> int:
    """The node's allocatable count of an extended resource (0 when absent or unparsable)."""
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)
    try:
        return int(str(raw))
    except ValueError:
        return 0


def allocatable_mib(node: Mapping[str, Any], resource: str) -> int:
    """The node's allocatable quantity of a byte resource such as hugepages-2Mi, in MiB (0 when absent)."""
    raw = str(((node.get("status") or {}).get("allocatable") or {}).get(resource, "0"))
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2}
    for suffix, factor in units.items():
        if raw.endswith(suffix):
            raw, scale = raw[: -len(suffix)], factor
            break
    else:
        scale = 1 / 1024**2
    try:
        return int(float(raw) * scale)
    except ValueError:
        return 0


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def is_rdma_resource(name: str) -> bool:
    """Whether an extended resource gives RDMA devices: the RDMA shared-device and SR-IOV plugins' names
    (`rdma/*`, `nvidia.com/hostdev`, `nvidia.com/rdma-vf`, `nvidia.com/sriov_*`, `openshift.io/*rdma*`...)."""
    lowered = name.lower()
    return lowered.startswith(("rdma/", "nvidia.com/hostdev")) or "rdma" in lowered or "sriov" in lowered


def plugin_kind(name: str) -> str:
    """shared (one unit gives every NIC), exclusive (one unit is one NIC) or unknown, from the resource name."""
    lowered = name.lower()
    if "shared" in lowered:
        return "shared"
    if lowered.startswith("nvidia.com/hostdev") or "sriov" in lowered or "vf" in lowered.rsplit("/", 1)[-1]:
        return "exclusive"
    return "unknown"


def rdma_resources_of(node: Mapping[str, Any]) -> list[str]:
    """The RDMA extended resources the node offers, by name order."""
    offered = ((node.get("status") or {}).get("allocatable") or {}).keys()
    return sorted(n for n in offered if is_rdma_resource(n) and allocatable(node, n) > 0)


def rdma_resource_of(node: Mapping[str, Any]) -> str | None:
    """The first RDMA extended resource the node offers, by name order."""
    names = rdma_resources_of(node)
    return names[0] if names else None


def detect_fabric(nodes: Sequence[Mapping[str, Any]]) -> str:
    """The fabric all of these nodes share, by the rule in this module's docstring."""
    return _detect(nodes)[0]


def _detect(nodes: Sequence[Mapping[str, Any]]) -> tuple[str, bool]:
    """(fabric, declared by the nodes' label)."""
    if not nodes:
        return "tcp", False
    labelled = {_labels(n).get(FABRIC_LABEL) for n in nodes}
    if len(labelled) == 1 and (only := labelled.pop()) in FABRICS:
        return str(only), True
    if all(allocatable(n, EFA_RESOURCE) > 0 for n in nodes):
        return "efa", False
    if all(rdma_resource_of(n) for n in nodes):
        return "infiniband", False
    return "tcp", False


def nvlink_domain_spans(nodes: Sequence[Mapping[str, Any]], label: str | None) -> bool:
    """True when some value of `label` is shared by more than one of these nodes."""
    if not label:
        return False
    present = [d for d in (_labels(n).get(label) for n in nodes) if d]
    return len(present) > len(set(present))


def detect_facts(
    network: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], nvlink_domain_label: str | None = None
) -> FabricFacts:
    """The fabric (spec.network.fabric, or detected when auto) and NVLink facts of a placement.

    `nvlink_domain_label` is the label the planner used (the plan's `nvlinkDomainLabel`), not only the spec's.
    Without one, the well-known clique labels still tell whether NCCL must be kept off multi-node NVLink.
    """
    fabric, declared = network.get("fabric") or "auto", True
    if fabric == "auto":
        fabric, declared = _detect(nodes)
    labels = [nvlink_domain_label] if nvlink_domain_label else [TOPOGRAPH_NVLINK, CLIQUE_LABEL]
    spans = any(nvlink_domain_spans(nodes, label) for label in labels)
    rdma = next((r for r in (rdma_resource_of(n) for n in nodes) if r), None)
    return FabricFacts(fabric, declared, spans, bool(network.get("imexChannelClaim")), rdma)


def _rdma_fields(network: Mapping[str, Any]) -> dict[str, str]:
    env = {name: str(network[field]) for field, name in FIELD_ENV.items() if network.get(field) is not None}
    hcas = network.get("ibHCAs")
    if hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
    return env


def _infiniband(network: Mapping[str, Any]) -> dict[str, str]:
    # 22 (about 2 minutes per retry on IB) rides out a link flap that the default 20 (about 30 s) would turn
    # into a job failure; OCI's manifests use it too.
    return {"NCCL_IB_TIMEOUT": "22", **_rdma_fields(network)}


def _efa(network: Mapping[str, Any]) -> dict[str, str]:
    # aws-ofi-nccl >= 1.7 sets its provider, fork safety and per-instance tuning itself; FI_EFA_USE_DEVICE_RDMA=1
    # aborts on EFA types without RDMA, so none of the old trio is set.
    crossing = {"NCCL_CROSS_NIC": str(network["crossNic"])} if network.get("crossNic") is not None else {}
    return crossing


def _tcp(network: Mapping[str, Any]) -> dict[str, str]:
    return {"NCCL_IB_DISABLE": "1"}


FABRIC_ENV = {"infiniband": _infiniband, "roce": _infiniband, "efa": _efa, "tcp": _tcp}


def timeout_env(timeout_seconds: int) -> dict[str, str]:
    """The process-group timeout, for our trainer (seconds) and for DeepSpeed's default (minutes)."""
    return {
        environment.PG_TIMEOUT_SECONDS: str(timeout_seconds),
        "DEEPSPEED_TIMEOUT": str(max(1, math.ceil(timeout_seconds / 60))),
    }


def verify_policy(network: Mapping[str, Any]) -> str:
    return str(network.get("verify") or DEFAULT_VERIFY)


def build_nccl_env(
    network: Mapping[str, Any],
    fabric: str,
    *,
    declared: bool = True,
    nvlink_spans_nodes: bool = False,
    mnnvl: bool = False,
    nics: int | None = None,
) -> dict[str, str]:
    """The NCCL and torch environment for `fabric`; `network` is spec.network (camelCase) and may be empty.

    `declared` is False for a fabric the detector only inferred: an inferred tcp then sets no transport.
    `nvlink_spans_nodes` without `mnnvl` (no IMEX channel) turns multi-node NVLink off; with it, NCCL's
    automatic choice stays. `network["ncclEnv"]` overrides everything derived here; `NCCL_NET: ""` there
    removes the fail-closed transport choice.
    """
    if fabric not in FABRIC_ENV:
        raise ValueError(f"unknown fabric {fabric!r}; expected one of {', '.join(FABRICS)}")
    env = {
        **timeout_env(int(network.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)),
        "NCCL_DEBUG": "WARN",
        "NCCL_SOCKET_IFNAME": network.get("socketInterface") or DEFAULT_SOCKET_IFNAME,
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        FABRIC_ENV_NAME: fabric,
        VERIFY_ENV_NAME: verify_policy(network),
        PREFLIGHT_ENV_NAME: str(network.get("preflight") or DEFAULT_PREFLIGHT),
    }
    if declared or fabric != "tcp":
        env.update({"NCCL_NET": NCCL_NET[fabric], **FABRIC_ENV[fabric](network)})
    if nics:
        env[NICS_ENV_NAME] = str(nics)
    if mnnvl:
        env[MNNVL_ENV_NAME] = "1"
    elif nvlink_spans_nodes:
        # Without an IMEX channel NCCL would fail at init trying to map memory across the domain.
        env["NCCL_MNNVL_ENABLE"] = "0"
    env.update({str(k): str(v) for k, v in (network.get("ncclEnv") or {}).items()})
    return {key: value for key, value in env.items() if not (key == "NCCL_NET" and value == "")}


def gpus_of(node: Mapping[str, Any]) -> int:
    return allocatable(node, GPU_RESOURCE)


def _efa_request(nodes: Sequence[Mapping[str, Any]]) -> RdmaRequest:
    count = min((allocatable(n, EFA_RESOURCE) for n in nodes), default=0)
    if count == 0:
        note = f"fabric efa but the nodes offer no {EFA_RESOURCE}: the pods get no EFA device"
        return RdmaRequest({}, None, (note,), missing=True)
    resources: dict[str, int | str] = {EFA_RESOURCE: count}
    if nodes and all(allocatable_mib(n, HUGEPAGES_RESOURCE) >= EFA_HUGEPAGES_MIB for n in nodes):
        resources[HUGEPAGES_RESOURCE] = EFA_HUGEPAGES
    return RdmaRequest(resources, count)


def _rdma_count(name: str, nodes: Sequence[Mapping[str, Any]]) -> tuple[int, int | None, tuple[str, ...]]:
    """(units to request, NICs expected, warnings) for an RDMA resource whose count the spec leaves open."""
    units = min((allocatable(n, name) for n in nodes), default=0)
    gpus = min((gpus_of(n) for n in nodes), default=0)
    kind = plugin_kind(name)
    if kind == "shared":
        return 1, None, ()
    if kind == "exclusive" or (units and gpus and units <= 2 * gpus):
        # One pod per node: taking every unit is right for exclusive plugins and harmless for a small shared one.
        return max(units, 1), max(units, 1), ()
    note = (
        f"cannot tell whether {name} is a shared or an exclusive (SR-IOV) device plugin; requested 1. "
        f"Set spec.network.rdmaResource.count to the node's NIC count if one unit is one NIC"
    )
    return 1, None, (note,)


def rdma_request(
    network: Mapping[str, Any], facts: FabricFacts, nodes: Sequence[Mapping[str, Any]] = ()
) -> RdmaRequest:
    """The extended resources each pod requests for the network, from the planned nodes' allocatable."""
    if facts.fabric not in RDMA_FABRICS:
        return RdmaRequest({})
    configured = network.get("rdmaResource")
    if configured and configured.get("count"):
        count = int(configured["count"])
        return RdmaRequest({configured["name"]: count}, None if plugin_kind(configured["name"]) == "shared" else count)
    if configured:
        units, nics, notes = _rdma_count(configured["name"], nodes)
        return RdmaRequest({configured["name"]: units}, nics, notes + _unrequested(nodes, configured["name"]))
    if facts.fabric == "efa":
        return _efa_request(nodes)
    if facts.rdma_resource is None:
        why = f"fabric {facts.fabric} but the nodes offer no RDMA resource (rdma/*, nvidia.com/hostdev, *sriov*)"
        fix = "set spec.network.rdmaResource, or the pods get no RDMA device and fail the network preflight"
        return RdmaRequest({}, None, (f"{why}: {fix}",), missing=True)
    units, nics, notes = _rdma_count(facts.rdma_resource, nodes)
    return RdmaRequest({facts.rdma_resource: units}, nics, notes + _unrequested(nodes, facts.rdma_resource))


def _unrequested(nodes: Sequence[Mapping[str, Any]], requested: str) -> tuple[str, ...]:
    others = sorted({name for n in nodes for name in rdma_resources_of(n)} - {requested})
    if not others:
        return ()
    return (f"the nodes also offer {', '.join(others)}, not requested; set spec.network.rdmaResource to choose",)


def uses_rdma(facts: FabricFacts) -> bool:
    """Whether pods register memory with an RDMA device (and so need IPC_LOCK)."""
    return facts.fabric in RDMA_FABRICS


def build_network(
    network: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], nvlink_domain_label: str | None = None
) -> tuple[FabricFacts, RdmaRequest, dict[str, str]]:
    """Facts, device request and environment of one placement, each derived once from the same nodes."""
    facts = detect_facts(network, nodes, nvlink_domain_label)
    request = rdma_request(network, facts, nodes)
    env = build_nccl_env(
        network,
        facts.fabric,
        declared=facts.declared,
        nvlink_spans_nodes=facts.nvlink_spans_nodes,
        mnnvl=facts.mnnvl,
        nics=request.nics,
    )
    return facts, request, env


def planned_gbps(levels: Mapping[str, str], gpu_product: str) -> str:
    """PARALLELJOB_PLANNED_GBPS: the cost model's GB/s per GPU at the link level each kind of group reaches in
    this plan (`tensor=600,pipeline=25,data=25`), which the trainer's link check reports beside what it measured."""
    bandwidths = costmodel.CostModel().link_bandwidths(gpu_product)
    figures = {kind: bandwidths[costmodel.LEVEL_NAMES[level]] / costmodel.GB for kind, level in levels.items()}
    return ",".join(f"{kind}={value:g}" for kind, value in sorted(figures.items()))
