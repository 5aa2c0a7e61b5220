"""spec.topology and spec.network: the fabric, NCCL settings, RDMA resources and the NVLink domain, and
whether tensor-parallel groups may span nodes (a multi-node NVLink domain with an IMEX channel).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paralleljob.api.fields import api_field
from paralleljob_contract import environment

if TYPE_CHECKING:
    from paralleljob.api import types as t

Fabric = Literal["auto", "infiniband", "roce", "efa", "tcp"]


VerifyPolicy = Literal["fail", "warn", "off"]


PreflightPolicy = Literal["off", "report", "fail"]


AddrFamily = Literal["AF_INET", "AF_INET6"]


AxisOrder = Literal["auto", "pipe,data,model", "data,pipe,model"]


KueueTopology = Literal["Required", "Preferred"]


@dataclasses.dataclass(frozen=True)
class Topology:
    """How the cluster's network is described by node labels."""

    levels: list[str] | None = api_field(
        "Node label keys that name the network domains, coarse to fine (e.g. a block, then a leaf switch). "
        "Default: recognised from the label families present on the nodes (GKE gce-topology-block/-subblock, "
        "EKS network-node-layer-1..3, network.topology.nvidia.com/*, topology.kubernetes.io/zone).",
        default=None,
    )
    nvlink_domain_label: str | None = api_field(
        "Node label whose value names a multi-node NVLink domain, usually nvidia.com/gpu.clique. "
        "Absent: each node is its own NVLink domain.",
        default=None,
        json_name="nvlinkDomainLabel",
    )
    axis_order: AxisOrder = api_field(
        "Order of the rank axes, slowest first. pipe,data,model is DeepSpeed's default; data,pipe,model puts "
        "consecutive pipeline stages of one replica on neighbouring ranks. auto lets the planner choose the "
        "one its cost model prefers.",
        default="auto",
    )
    kueue_topology: KueueTopology = api_field(
        "Under Kueue, when the admitted ResourceFlavor has a topologyName: whether each pipeline replica's nodes "
        "must (Required) or should (Preferred) share the finest domain of the Kueue Topology that holds them. "
        "Required asks Kueue for one slice per pipeline replica (podSetSliceRequiredTopology and "
        "podSetSliceSize), so a replica never spans two domains of that level; Preferred only asks Kueue to "
        "pack the gang (preferred topology).",
        default="Required",
        json_name="kueueTopology",
    )
    allow_mixed_gpu_products: bool = api_field(
        "Allow nodes with different nvidia.com/gpu.product labels in one job. Off by default: the slowest "
        "GPU would pace every step.",
        default=False,
        json_name="allowMixedGPUProducts",
    )


@dataclasses.dataclass(frozen=True)
class RdmaResource:
    """An extended resource that gives a pod RDMA devices."""

    name: str = api_field("Resource name, e.g. rdma/hca_shared_devices_a, rdma/ib or nvidia.com/hostdev.")
    count: int | None = api_field(
        "How many to request per pod. Default: the node's allocatable count for exclusive (SR-IOV, host-device) "
        "plugins and for any plugin offering at most 2 per GPU, 1 for shared plugins (names with 'shared'); "
        "where the kind cannot be told, 1 with a warning.",
        default=None,
        minimum=1,
    )


@dataclasses.dataclass(frozen=True)
class Network:
    """The fabric between nodes, the NCCL settings derived from it, and how the network is proven at start."""

    fabric: Fabric = api_field(
        "Inter-node fabric: infiniband, roce, efa or tcp. auto detects it from node labels and allocatable "
        "resources (see docs/operator.md). A declared or detected RDMA fabric sets NCCL_NET, so a missing "
        "transport fails at init instead of falling back to TCP sockets; only a declared tcp disables IB.",
        default="auto",
    )
    nccl_env: dict[str, str] | None = api_field(
        "NCCL or PyTorch environment variables that override the derived ones, e.g. {NCCL_DEBUG: INFO}. "
        "{NCCL_NET: ''} removes the fail-closed transport choice.",
        default=None,
        json_name="ncclEnv",
    )
    rdma_resource: RdmaResource | None = api_field(
        "RDMA resource requested by every pod. Default: vpc.amazonaws.com/efa (all of the node's) for efa, "
        "the RDMA resource the nodes offer for infiniband and roce.",
        default=None,
    )
    ib_hcas: list[str] | None = api_field(
        "InfiniBand/RoCE adapters NCCL may use, e.g. [mlx5_0, mlx5_1]; written as NCCL_IB_HCA with '=' so "
        "mlx5_1 does not also match mlx5_10.",
        default=None,
        json_name="ibHCAs",
    )
    gid_index: int | None = api_field(
        "RoCE GID index (NCCL_IB_GID_INDEX). Default: NCCL's automatic choice (steered by addrFamily and "
        "addrRange); force it only where the platform documents one, e.g. 3 on OCI bare metal.",
        default=None,
        minimum=-1,
    )
    addr_family: AddrFamily | None = api_field(
        "Address family of the GID NCCL chooses automatically (NCCL_IB_ADDR_FAMILY). Default: NCCL's (AF_INET).",
        default=None,
    )
    addr_range: str | None = api_field(
        "CIDR the automatically chosen GID must fall in (NCCL_IB_ADDR_RANGE), e.g. 10.0.0.0/8.",
        default=None,
        pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$",
    )
    cross_nic: int | None = api_field(
        "NCCL_CROSS_NIC: 0 keeps rings on one rail (rail-optimised fabrics), 1 lets them cross (fat trees). "
        "Default: NCCL's 2, same NIC preferred.",
        default=None,
        minimum=0,
        maximum=2,
    )
    traffic_class: int | None = api_field(
        "RoCE/IB traffic class of the data (NCCL_IB_TC), the lossless class of your switches, e.g. 41 on OCI.",
        default=None,
        minimum=0,
        maximum=255,
    )
    fifo_traffic_class: int | None = api_field(
        "Traffic class of NCCL's control messages (NCCL_IB_FIFO_TC), e.g. 84 on GKE A3 Ultra.",
        default=None,
        minimum=0,
        maximum=255,
    )
    service_level: int | None = api_field(
        "InfiniBand service level (NCCL_IB_SL). Default: NCCL's 0.", default=None, minimum=0, maximum=15
    )
    qps_per_connection: int | None = api_field(
        "Queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION); multi-level RoCE/ECMP fabrics want 4 for "
        "routing entropy. Default: NCCL's 1.",
        default=None,
        minimum=1,
        maximum=128,
    )
    socket_interface: str | None = api_field(
        "Network interface for NCCL's bootstrap and TCP transport (NCCL_SOCKET_IFNAME). Default: =eth0, the "
        "pod's own interface.",
        default=None,
    )
    imex_channel_claim: str | None = api_field(
        "Name of the spec.template.resourceClaims entry that gives each pod an IMEX channel (a ComputeDomain's "
        "channel claim on GB200/GB300 NVL72). With it, tensor-parallel groups may span the nodes of one "
        "NVLink domain and NCCL uses multi-node NVLink; without it the planner keeps them inside a node.",
        default=None,
    )
    verify: VerifyPolicy = api_field(
        "Network proof at start. The trainer's preflight (RDMA devices, libibverbs, EFA plugin, memlock, IMEX "
        "channel) runs before the process groups form and a failure sets NetworkReady=False; then NCCL's own "
        "INIT,NET lines and a warm-up collective are classified into NetworkVerified. fail: a degraded network "
        "(socket fallback, fewer NICs, no GPUDirect RDMA, no MNNVL) fails the job; warn: it is reported; off: "
        "neither check runs.",
        default="warn",
    )
    preflight: PreflightPolicy = api_field(
        "Link check at every start, after the process groups form and before step 1: the all-reduce of every "
        "tensor-parallel group, send/recv between neighbouring pipeline stages and the data-parallel "
        "all-reduce are timed, each link against the others of its class (slow: under half their median) and "
        "beside the planner's bandwidth. The slowest links, by node pair, and the check's cost go into "
        "NetworkVerified and status.network. report: reported only; fail: a slow link stops the start, its node "
        "goes into status.excludedNodes and the restart is planned without it; off: not run.",
        default="report",
    )
    timeout_seconds: int = api_field(
        "Collective timeout: a rank waiting longer for a dead peer fails instead of hanging, which triggers "
        "a gang restart.",
        default=environment.DEFAULT_PG_TIMEOUT_SECONDS,
        minimum=10,
    )


def multi_node_nvlink(spec: t.ParallelJobSpec) -> bool:
    """Whether tensor-parallel groups may span nodes: an NVLink domain label and an IMEX channel for the pods.
    Without the channel NCCL cannot map GPU memory across nodes, and the all-reduces would go over the NIC."""
    return spec.topology.nvlink_domain_label is not None and spec.network.imex_channel_claim is not None


MNNVL_CEL = (
    "has(self.topology) && has(self.topology.nvlinkDomainLabel) && has(self.network) "
    "&& has(self.network.imexChannelClaim)"
)
