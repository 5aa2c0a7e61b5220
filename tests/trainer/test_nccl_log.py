"""NCCL's INIT,NET lines against the plan: one table per fabric and failure mode.

Each line is what NCCL 2.30.7 or aws-ofi-nccl prints (their format strings, cited in
`paralleljob_trainer.nccl_log`, filled in), behind NCCL's own `host:pid:tid [dev] NCCL INFO ` prefix.
"""

from __future__ import annotations

import pytest

from paralleljob_trainer import nccl_log


def info(message: str) -> str:
    return f"node-0:4711:4790 [0] NCCL INFO {message}"


def ib_using(count: int, link: str = "IB") -> str:
    devices = "".join(f" [{d}]mlx5_{d}:1/{link}" for d in range(count))
    return info(f"NET/IB : Using{devices} [RO]; OOB eth0:10.0.0.5<0>")


SEND_GDR = info("Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA")
RECV_GDR = info("Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0(1)/GDRDMA")
SEND_NO_GDR = info("Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0")
IB_HEALTHY = [ib_using(8), info("Using network IB"), SEND_GDR, RECV_GDR]
SOCKET_FALLBACK = [
    info("Count not open libibverbs.so.1"),
    info("NET/Socket : Using [0]eth0:10.0.0.5<0>"),
    info("Using network Socket"),
    info("Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0"),
]
EFA = [
    info("NET/OFI Selected provider is efa, fabric is efa-direct (found {n} nics)"),
    info("Using network AWS Libfabric"),
    info("Channel 00/0 : 7[7] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA"),
]
MNNVL_ON = info("MNNVL 1 cliqueId 7 cliqueSize 72 cliqueRank 3 nvlDomainSize 72")
NVLS_ON = info("NVLS multicast support is available on dev 0")


def efa(nics: int) -> list[str]:
    return [line.replace("{n}", str(nics)) for line in EFA]


@pytest.mark.parametrize(
    ("lines", "expected", "verdict"),
    [
        (IB_HEALTHY, nccl_log.Expected("infiniband", nics=8), ("True", "AsPlanned")),
        ([ib_using(8, "RoCE"), info("Using network IB"), SEND_GDR], nccl_log.Expected("roce"), ("True", "AsPlanned")),
        (efa(32), nccl_log.Expected("efa", nics=32), ("True", "AsPlanned")),
        (SOCKET_FALLBACK, nccl_log.Expected("tcp"), ("True", "AsPlanned")),
        ([*IB_HEALTHY, MNNVL_ON, NVLS_ON], nccl_log.Expected("infiniband", mnnvl=True), ("True", "AsPlanned")),
        (SOCKET_FALLBACK, nccl_log.Expected("infiniband"), ("False", "SocketFallback")),
        (SOCKET_FALLBACK, nccl_log.Expected("efa", nics=32), ("False", "SocketFallback")),
        (efa(1), nccl_log.Expected("efa", nics=32), ("False", "FewerNICs")),
        ([ib_using(1), info("Using network IB"), SEND_GDR], nccl_log.Expected("infiniband", 8), ("False", "FewerNICs")),
        (
            [ib_using(8), info("Using network IB"), SEND_NO_GDR],
            nccl_log.Expected("infiniband"),
            ("False", "NoGPUDirectRDMA"),
        ),
        (IB_HEALTHY, nccl_log.Expected("infiniband", mnnvl=True), ("False", "MNNVLOff")),
        ([], nccl_log.Expected("infiniband"), ("Unknown", "NoNcclLog")),
    ],
    ids=[
        "infiniband-8-nics-gdr",
        "roce",
        "p5-32-efas",
        "declared-tcp-on-sockets",
        "gb200-mnnvl",
        "infiniband-fell-back-to-sockets",
        "efa-fell-back-to-sockets",
        "p5-found-1-of-32-efas",
        "sriov-1-of-8-nics",
        "no-gpudirect-rdma",
        "mnnvl-planned-but-off",
        "no-nccl-log",
    ],
)
def test_what_nccl_chose_is_classified_against_the_plan(lines, expected, verdict):
    result = nccl_log.classify(nccl_log.parse(lines), expected)
    assert (result.status, result.reason) == verdict, result.message


def test_the_parsed_choice_names_network_nics_gdr_mnnvl_and_nvls():
    choice = nccl_log.parse([*IB_HEALTHY, MNNVL_ON, NVLS_ON])
    assert choice.network == "IB"
    assert [link for _, link in choice.ib_devices] == ["IB"] * 8
    assert (choice.net_channels, choice.gdr_channels, choice.mnnvl, choice.nvls) == (2, 2, True, True)
    assert choice.summary() == "NCCL uses IB over 8 NICs with GPUDirect RDMA and multi-node NVLink"


def test_the_socket_fallback_message_says_libibverbs_is_missing():
    verdict = nccl_log.classify(nccl_log.parse(SOCKET_FALLBACK), nccl_log.Expected("infiniband"))
    assert "libibverbs or the RDMA device is missing" in verdict.message


@pytest.mark.parametrize(
    ("env", "changes"),
    [
        (
            {"NCCL_DEBUG": "WARN"},
            {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "/o/r.log"},
        ),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}, {"NCCL_DEBUG_FILE": "/o/r.log"}),
    ],
    ids=["operator-default", "user-choice-kept"],
)
def test_the_nccl_log_is_set_up_without_overriding_the_users_choice(env, changes):
    from pathlib import Path

    assert nccl_log.nccl_debug_env(env, Path("/o/r.log")) == changes
