"""The fabric policy: auto-detection from nodes, the NCCL/torch environment of each fabric, the devices requested.

The expected values come from the sources in docs/operator.md's platform table, not from what the module
used to set: where NCCL or PyTorch has a default, the test asserts that the variable is left unset.
"""

from __future__ import annotations

import pytest

from paralleljob.manifests import nccl
from tests.manifests.helpers import make_node

IB = make_node("a", allocatable={"rdma/hca_shared_devices_a": "1"})
EFA = make_node("b", allocatable={"vpc.amazonaws.com/efa": "4"})
PLAIN = make_node("c")
LABELLED_ROCE = make_node("d", {"paralleljob.io/fabric": "roce"}, {"rdma/hca": "1"})
# The review's probe cases (docs/operator.md, platform table).
P5 = make_node("p5", allocatable={"vpc.amazonaws.com/efa": "32", "nvidia.com/gpu": "8", "hugepages-2Mi": "10256Mi"})
P4D = make_node("p4d", allocatable={"vpc.amazonaws.com/efa": "4", "nvidia.com/gpu": "8"})
AKS_SRIOV = make_node("nd", allocatable={"rdma/ib": "8", "nvidia.com/gpu": "8"})
HOSTDEV = make_node("hd", allocatable={"nvidia.com/hostdev": "8", "nvidia.com/gpu": "8"})
OCI_VF = make_node("oci", allocatable={"nvidia.com/rdma-vf": "16", "nvidia.com/gpu": "8"})
SHARED = make_node("sh", allocatable={"rdma/rdma_shared_device_a": "63", "nvidia.com/gpu": "8"})
COREWEAVE = make_node("cw", allocatable={"rdma/ib": "1000", "nvidia.com/gpu": "8"})
TWO_KINDS = make_node("two", allocatable={"rdma/ib": "8", "nvidia.com/rdma-vf": "16", "nvidia.com/gpu": "8"})


@pytest.mark.parametrize(
    ("nodes", "fabric"),
    [
        ([IB, IB], "infiniband"),
        ([EFA, EFA], "efa"),
        ([PLAIN], "tcp"),
        ([], "tcp"),
        ([IB, PLAIN], "tcp"),
        ([EFA, IB], "tcp"),
        ([LABELLED_ROCE, LABELLED_ROCE], "roce"),
        ([LABELLED_ROCE, IB], "infiniband"),
        ([OCI_VF, OCI_VF], "infiniband"),
    ],
    ids=[
        "rdma",
        "efa",
        "plain",
        "none",
        "mixed-rdma-plain",
        "mixed-efa-rdma",
        "label-roce",
        "label-on-some",
        # Was tcp (and NCCL_IB_DISABLE=1): nvidia.com/rdma-vf matched no prefix.
        "oci-vf-is-rdma",
    ],
)
def test_fabric_is_detected_from_what_every_node_offers(nodes, fabric):
    assert nccl.detect_fabric(nodes) == fabric


@pytest.mark.parametrize(
    ("network", "nodes", "net"),
    [
        ({"fabric": "infiniband"}, [PLAIN], "IB"),
        ({"fabric": "roce"}, [PLAIN], "IB"),
        ({"fabric": "efa"}, [PLAIN], "AWS Libfabric"),
        ({"fabric": "tcp"}, [IB], "Socket"),
        ({"fabric": "auto"}, [IB], "IB"),
        ({"fabric": "auto"}, [P5], "AWS Libfabric"),
        ({"fabric": "auto"}, [PLAIN], None),
        ({"fabric": "infiniband", "ncclEnv": {"NCCL_NET": ""}}, [PLAIN], None),
    ],
    ids=["infiniband", "roce", "efa", "declared-tcp", "detected-rdma", "detected-efa", "inferred-tcp", "opt-out"],
)
def test_nccl_net_names_the_transport_so_a_missing_one_fails_at_init(network, nodes, net):
    _, _, env = nccl.build_network(network, nodes)
    assert env.get("NCCL_NET") == net


def test_an_inferred_tcp_leaves_ib_alone_and_a_declared_one_disables_it():
    # Was NCCL_IB_DISABLE=1 for both: that forced sockets on RDMA setups the detector does not recognise.
    _, _, inferred = nccl.build_network({"fabric": "auto"}, [PLAIN])
    _, _, declared = nccl.build_network({"fabric": "tcp"}, [PLAIN])
    assert "NCCL_IB_DISABLE" not in inferred
    assert declared["NCCL_IB_DISABLE"] == "1"


# NCCL's and PyTorch's own defaults (NCCL 2.30 source and env docs; PyTorch env docs), which the module used to
# override with guesses: NVLS from a GPU-name list, GID 3, GDR level PHB, retry count 7, cross-NIC 0, the EFA
# trio (FI_EFA_USE_DEVICE_RDMA=1 aborts on EFA without RDMA) and TORCH_NCCL_ASYNC_ERROR_HANDLING=1.
LEFT_TO_DEFAULTS = (
    "NCCL_NVLS_ENABLE",
    "NCCL_IB_GID_INDEX",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_IB_RETRY_CNT",
    "NCCL_CROSS_NIC",
    "FI_PROVIDER",
    "FI_EFA_USE_DEVICE_RDMA",
    "FI_EFA_FORK_SAFE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_MNNVL_ENABLE",
)


@pytest.mark.parametrize("fabric", nccl.FABRICS)
def test_each_fabric_leaves_nccl_and_pytorch_defaults_alone(fabric):
    env = nccl.build_nccl_env({"timeoutSeconds": 600}, fabric)
    assert not set(LEFT_TO_DEFAULTS) & set(env)
    assert (env["PARALLELJOB_PG_TIMEOUT_SECONDS"], env["DEEPSPEED_TIMEOUT"]) == ("600", "10")
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0


B300 = {"nvidia.com/gpu.product": "NVIDIA-B300-SXM6-AC"}
UNLABELLED = {}


@pytest.mark.parametrize("labels", [B300, UNLABELLED], ids=["b300", "no-gpu-feature-discovery"])
def test_nvls_is_left_to_nccls_own_multicast_probe(labels):
    # Was NCCL_NVLS_ENABLE=0 for both: B300 was missing from a product list, and unlabelled nodes got 0.
    _, _, env = nccl.build_network({"fabric": "infiniband"}, [make_node("x", labels), make_node("y", labels)])
    assert "NCCL_NVLS_ENABLE" not in env


def test_hca_names_are_exact_so_mlx5_1_does_not_match_mlx5_10():
    env = nccl.build_nccl_env({"ibHCAs": ["mlx5_0", "mlx5_1"]}, "infiniband")
    assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"


@pytest.mark.parametrize(
    ("network", "key", "value"),
    [
        ({"gidIndex": 3}, "NCCL_IB_GID_INDEX", "3"),
        ({"crossNic": 0}, "NCCL_CROSS_NIC", "0"),
        ({"trafficClass": 41}, "NCCL_IB_TC", "41"),
        ({"fifoTrafficClass": 84}, "NCCL_IB_FIFO_TC", "84"),
        ({"serviceLevel": 0}, "NCCL_IB_SL", "0"),
        ({"qpsPerConnection": 4}, "NCCL_IB_QPS_PER_CONNECTION", "4"),
        ({"addrRange": "10.0.0.0/8"}, "NCCL_IB_ADDR_RANGE", "10.0.0.0/8"),
        ({"addrFamily": "AF_INET6"}, "NCCL_IB_ADDR_FAMILY", "AF_INET6"),
        ({"socketInterface": "ib0"}, "NCCL_SOCKET_IFNAME", "ib0"),
        ({"verify": "fail"}, "PARALLELJOB_NETWORK_VERIFY", "fail"),
        ({"preflight": "fail"}, "PARALLELJOB_NETWORK_PREFLIGHT", "fail"),
        ({}, "PARALLELJOB_NETWORK_PREFLIGHT", "report"),
        ({"ncclEnv": {"NCCL_IB_GID_INDEX": "5"}}, "NCCL_IB_GID_INDEX", "5"),
        ({"ncclEnv": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}}, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ({"ncclEnv": {"NCCL_DEBUG": "INFO"}}, "NCCL_DEBUG", "INFO"),
    ],
    ids=[
        "gid-index",
        "cross-nic",
        "traffic-class",
        "fifo-traffic-class",
        "service-level",
        "qps",
        "addr-range",
        "addr-family",
        "socket-interface",
        "verify",
        "preflight",
        "preflight-default",
        "override-derived",
        "override-default",
        "override-new",
    ],
)
def test_spec_network_fields_and_overrides_set_their_variable(network, key, value):
    assert nccl.build_nccl_env(network, "roce")[key] == value


CLIQUE_NODES = [
    make_node("x", {"nvidia.com/gpu.clique": "c.1"}),
    make_node("y", {"nvidia.com/gpu.clique": "c.1"}),
]
TOPOGRAPH_NODES = [
    make_node("x", {"network.topology.nvidia.com/accelerator": "nvl72-a"}),
    make_node("y", {"network.topology.nvidia.com/accelerator": "nvl72-a"}),
]


@pytest.mark.parametrize(
    ("nodes", "planned_label", "network", "mnnvl_env", "planned"),
    [
        (TOPOGRAPH_NODES, "network.topology.nvidia.com/accelerator", {"imexChannelClaim": "imex"}, None, "1"),
        (CLIQUE_NODES, "nvidia.com/gpu.clique", {"imexChannelClaim": "imex"}, None, "1"),
        (TOPOGRAPH_NODES, None, {}, "0", None),
        (CLIQUE_NODES, None, {}, "0", None),
        ([PLAIN, PLAIN], None, {"imexChannelClaim": "imex"}, None, None),
    ],
    ids=[
        # Was MNNVL 0: only the spec's label counted, not the Topograph label the planner used.
        "planned-topograph-label-with-imex",
        "planned-clique-label-with-imex",
        "domain-without-imex-turns-mnnvl-off",
        "clique-without-imex-turns-mnnvl-off",
        "no-domain",
    ],
)
def test_mnnvl_follows_the_planned_label_and_the_imex_channel(nodes, planned_label, network, mnnvl_env, planned):
    facts, _, env = nccl.build_network({"fabric": "infiniband", **network}, nodes, planned_label)
    assert env.get("NCCL_MNNVL_ENABLE") == mnnvl_env
    assert env.get("PARALLELJOB_MNNVL") == planned
    assert facts.mnnvl == (planned == "1")


@pytest.mark.parametrize(
    ("network", "nodes", "wanted", "nics"),
    [
        ({"fabric": "auto"}, [P5, P5], {"vpc.amazonaws.com/efa": 32, "hugepages-2Mi": "5120Mi"}, 32),
        ({"fabric": "efa"}, [P4D], {"vpc.amazonaws.com/efa": 4}, 4),
        ({"fabric": "infiniband"}, [AKS_SRIOV], {"rdma/ib": 8}, 8),
        ({"fabric": "infiniband"}, [HOSTDEV], {"nvidia.com/hostdev": 8}, 8),
        ({"fabric": "roce"}, [OCI_VF], {"nvidia.com/rdma-vf": 16}, 16),
        ({"fabric": "auto"}, [SHARED], {"rdma/rdma_shared_device_a": 1}, None),
        ({"fabric": "auto"}, [IB], {"rdma/hca_shared_devices_a": 1}, None),
        (
            {"fabric": "infiniband", "rdmaResource": {"name": "nvidia.com/hostdev", "count": 4}},
            [HOSTDEV],
            {"nvidia.com/hostdev": 4},
            4,
        ),
        ({"fabric": "infiniband", "rdmaResource": {"name": "rdma/ib"}}, [AKS_SRIOV], {"rdma/ib": 8}, 8),
        ({"fabric": "tcp"}, [IB], {}, None),
    ],
    ids=[
        # Was 1 EFA of p5's 32 and no hugepages.
        "p5-every-efa-and-hugepages",
        "p4d-without-hugepages-on-the-node",
        # Was rdma/ib: 1, one NIC in 8 with the SR-IOV plugin.
        "aks-sriov",
        "host-device",
        "oci-vf",
        "shared",
        "shared-by-name",
        "configured-count",
        "configured-name-count-from-node",
        "tcp-none",
    ],
)
def test_every_nic_is_requested(network, nodes, wanted, nics):
    _, request, env = nccl.build_network(network, nodes)
    assert request.resources == wanted
    assert request.nics == nics
    assert env.get("PARALLELJOB_EXPECTED_NICS") == (str(nics) if nics else None)


@pytest.mark.parametrize(
    ("network", "nodes", "requested", "warning"),
    [
        # Was {} without a word: the pods got no HCA and ran on sockets.
        ({"fabric": "infiniband"}, [PLAIN], {}, "offer no RDMA resource"),
        ({"fabric": "efa"}, [PLAIN], {}, "offer no vpc.amazonaws.com/efa"),
        ({"fabric": "infiniband"}, [COREWEAVE], {"rdma/ib": 1}, "rdmaResource.count"),
        ({"fabric": "infiniband"}, [TWO_KINDS], {"nvidia.com/rdma-vf": 16}, "also offer rdma/ib"),
    ],
    ids=["rdma-fabric-without-resource", "efa-without-resource", "plugin-kind-unknown", "unrequested-rdma"],
)
def test_what_the_request_cannot_know_is_a_warning(network, nodes, requested, warning):
    _, request, _ = nccl.build_network(network, nodes)
    assert request.resources == requested
    assert any(warning in note for note in request.warnings), request.warnings
    # Only a fabric whose nodes offer no RDMA resource at all is "missing" (refused under verify: fail).
    assert request.missing == (requested == {})


def test_unknown_fabric_is_an_error():
    with pytest.raises(ValueError, match="unknown fabric"):
        nccl.build_nccl_env({}, "carrier-pigeon")


def test_the_planned_bandwidths_are_the_cost_models_at_each_groups_level() -> None:
    levels = {"tensor": "node", "pipeline": "leaf", "data": "top"}
    assert nccl.planned_gbps(levels, "NVIDIA-H100-80GB-HBM3") == "data=12.5,pipeline=50,tensor=900"
    assert nccl.planned_gbps({"data": "leaf"}, "NVIDIA-A100-SXM4-80GB") == "data=25"
