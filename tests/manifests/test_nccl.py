"""The fabric policy: auto-detection from nodes, and the NCCL/torch environment of each fabric."""

from __future__ import annotations

import pytest

from paralleljob.manifests import nccl
from tests.manifests.conftest import make_node

IB = make_node("a", allocatable={"rdma/hca_shared_devices_a": "1"})
EFA = make_node("b", allocatable={"vpc.amazonaws.com/efa": "4"})
PLAIN = make_node("c")
LABELLED_ROCE = make_node("d", {"paralleljob.io/fabric": "roce"}, {"rdma/hca": "1"})


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
    ],
    ids=["rdma", "efa", "plain", "none", "mixed-rdma-plain", "mixed-efa-rdma", "label-roce", "label-on-some"],
)
def test_fabric_is_detected_from_what_every_node_offers(nodes, fabric):
    assert nccl.detect_fabric(nodes) == fabric


EXPECTED = {
    "infiniband": {"NCCL_IB_DISABLE": "0", "NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "7", "NCCL_CROSS_NIC": "0"},
    "roce": {"NCCL_IB_DISABLE": "0", "NCCL_IB_GID_INDEX": "3", "NCCL_NET_GDR_LEVEL": "PHB"},
    "efa": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"},
    "tcp": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo,docker"},
}


@pytest.mark.parametrize("fabric", sorted(EXPECTED))
def test_each_fabric_gets_its_settings_and_the_always_on_ones(fabric):
    env = nccl.build_nccl_env({"timeoutSeconds": 600}, fabric)
    assert EXPECTED[fabric].items() <= env.items()
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["PARALLELJOB_PG_TIMEOUT_SECONDS"] == "600"
    assert env["DEEPSPEED_TIMEOUT"] == "10"


def test_hca_names_are_exact_so_mlx5_1_does_not_match_mlx5_10():
    env = nccl.build_nccl_env({"ibHCAs": ["mlx5_0", "mlx5_1"]}, "infiniband")
    assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"


@pytest.mark.parametrize(
    ("network", "key", "value"),
    [
        ({"gidIndex": -1}, "NCCL_IB_GID_INDEX", "-1"),
        ({"socketInterface": "ib0"}, "NCCL_SOCKET_IFNAME", "ib0"),
        ({"ncclEnv": {"NCCL_IB_GID_INDEX": "5"}}, "NCCL_IB_GID_INDEX", "5"),
        ({"ncclEnv": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}}, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
        ({"ncclEnv": {"NCCL_DEBUG": "INFO"}}, "NCCL_DEBUG", "INFO"),
    ],
    ids=["gid-index", "socket-interface", "override-derived", "override-always-on", "override-new"],
)
def test_spec_network_settings_and_overrides_win(network, key, value):
    assert nccl.build_nccl_env(network, "roce")[key] == value


@pytest.mark.parametrize(
    ("nvswitch", "mnnvl", "nvls_env", "mnnvl_env"),
    [(False, False, "0", "0"), (True, False, "1", "0"), (True, True, "1", "1")],
    ids=["pcie", "nvswitch", "mnnvl-clique"],
)
def test_nvlink_switches(nvswitch, mnnvl, nvls_env, mnnvl_env):
    env = nccl.build_nccl_env({}, "infiniband", nvswitch=nvswitch, mnnvl=mnnvl)
    assert (env["NCCL_NVLS_ENABLE"], env["NCCL_MNNVL_ENABLE"]) == (nvls_env, mnnvl_env)


def test_nvswitch_and_clique_are_detected_from_labels():
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.clique": "c.1"}
    a10 = {"nvidia.com/gpu.product": "NVIDIA-A10G"}
    assert nccl.detect_nvswitch([make_node("x", h100)])
    assert not nccl.detect_nvswitch([make_node("x", h100), make_node("y", a10)])
    pair = [make_node("x", h100), make_node("y", h100)]
    assert nccl.detect_mnnvl(pair, "nvidia.com/gpu.clique")
    assert not nccl.detect_mnnvl(pair, None)


@pytest.mark.parametrize(
    ("network", "nodes", "wanted"),
    [
        ({"fabric": "efa"}, [PLAIN], {"vpc.amazonaws.com/efa": 1}),
        ({"fabric": "auto"}, [IB], {"rdma/hca_shared_devices_a": 1}),
        (
            {"fabric": "infiniband", "rdmaResource": {"name": "nvidia.com/hostdev", "count": 8}},
            [IB],
            {"nvidia.com/hostdev": 8},
        ),
        ({"fabric": "tcp"}, [IB], {}),
        ({"fabric": "roce"}, [PLAIN], {}),
    ],
    ids=["efa-default", "detected-rdma", "configured", "tcp-none", "roce-unknown"],
)
def test_network_resources_requested_per_pod(network, nodes, wanted):
    facts = nccl.detect_facts(network, nodes)
    assert nccl.rdma_request(network, facts) == wanted


def test_unknown_fabric_is_an_error():
    with pytest.raises(ValueError, match="unknown fabric"):
        nccl.build_nccl_env({}, "carrier-pigeon")
