"""The network preflight: each planned fabric against hosts laid out as folders, one reason per missing piece.

A host is a real folder with the files a pod would show (/sys/class/infiniband, /proc/self/status,
/dev/nvidia-caps-imex-channels); only the dynamic loader and the memlock limit are given as functions, since
a test cannot install libibverbs or change its own limit.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from paralleljob_contract import network
from paralleljob_trainer import preflight

ROOT_CAPS = "000001ffffffffff"  # every capability, CAP_IPC_LOCK (bit 14) among them
NON_ROOT_CAPS = "0000000000000000"


def make_host(
    root: Path,
    devices: dict[str, str] | None = None,
    libraries: tuple[str, ...] = ("libibverbs.so.1",),
    memlock: int = resource.RLIM_INFINITY,
    caps: str = NON_ROOT_CAPS,
    imex: bool = False,
) -> preflight.Host:
    for device, link_layer in (devices or {}).items():
        port = root / "sys/class/infiniband" / device / "ports/1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(link_layer + "\n")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/status").write_text(f"Name:\tpython\nCapEff:\t{caps}\n")
    if imex:
        (root / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
        (root / "dev/nvidia-caps-imex-channels/channel0").write_text("")

    def load(name: str) -> object:
        if name not in libraries:
            raise OSError(f"{name}: cannot open shared object file")
        return name

    return preflight.Host(root, load, lambda: memlock)


MLX = {"mlx5_0": "InfiniBand", "mlx5_1": "InfiniBand"}
ROCE = {"mlx5_0": "Ethernet"}
EFA = {"rdmap16s27": "Unspecified"}
EFA_LIBS = ("libibverbs.so.1", "libnccl-net-ofi.so")


@pytest.mark.parametrize(
    ("env", "host", "reason"),
    [
        ({"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB"}, {}, "NoRdmaDevice"),
        ({"PARALLELJOB_FABRIC": "roce", "NCCL_NET": "IB"}, {}, "NoRdmaDevice"),
        ({"PARALLELJOB_FABRIC": "efa", "NCCL_NET": "AWS Libfabric"}, {}, "NoRdmaDevice"),
        ({"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB"}, {"devices": MLX, "libraries": ()}, "NoRdmaUserspace"),
        ({"PARALLELJOB_FABRIC": "efa", "NCCL_NET": "AWS Libfabric"}, {"devices": EFA}, "NoRdmaUserspace"),
        (
            {"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB"},
            {"devices": MLX, "memlock": 64 * 1024},
            "MemlockTooLow",
        ),
        (
            {"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB", "PARALLELJOB_MNNVL": "1"},
            {"devices": MLX},
            "NoImexChannel",
        ),
        ({"PARALLELJOB_FABRIC": "tcp", "NCCL_NET": "Socket", "PARALLELJOB_MNNVL": "1"}, {}, "NoImexChannel"),
    ],
    ids=[
        "infiniband-without-device",
        "roce-without-device",
        "efa-without-device",
        "infiniband-without-libibverbs",
        "efa-without-the-nccl-plugin",
        # The runtime's 64 KiB default, and IPC_LOCK not effective for the non-root trainer user.
        "memlock-64k-non-root",
        "mnnvl-without-imex-channel",
        "mnnvl-on-tcp-without-imex-channel",
    ],
)
def test_each_missing_piece_stops_the_rank_with_its_reason(tmp_path, env, host, reason):
    with pytest.raises(preflight.NetworkNotReady) as failure:
        preflight.run_preflight(env, gpu=False, host=make_host(tmp_path, **host))
    assert failure.value.reason == reason
    assert failure.value.condition == "NetworkReady"


@pytest.mark.parametrize(
    ("env", "host"),
    [
        ({"PARALLELJOB_FABRIC": "tcp", "NCCL_NET": "Socket"}, {}),
        ({"PARALLELJOB_FABRIC": "tcp"}, {}),
        ({"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB"}, {"devices": MLX}),
        ({"PARALLELJOB_FABRIC": "roce", "NCCL_NET": "IB"}, {"devices": ROCE}),
        ({"PARALLELJOB_FABRIC": "efa", "NCCL_NET": "AWS Libfabric"}, {"devices": EFA, "libraries": EFA_LIBS}),
        ({"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB"}, {"devices": MLX, "memlock": 65536, "caps": ROOT_CAPS}),
        (
            {"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB", "PARALLELJOB_MNNVL": "1"},
            {"devices": MLX, "imex": True},
        ),
        ({"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": "IB", "PARALLELJOB_NETWORK_VERIFY": "off"}, {}),
    ],
    ids=[
        "declared-tcp",
        "inferred-tcp",
        "infiniband",
        "roce",
        "efa-with-plugin",
        "low-memlock-but-ipc-lock-effective",
        "mnnvl-with-channel",
        "verify-off",
    ],
)
def test_a_pod_with_what_its_fabric_needs_passes(tmp_path, env, host):
    assert preflight.run_preflight(env, gpu=False, host=make_host(tmp_path, **host)) is None


def test_a_failure_is_only_a_warning_when_nccl_may_fall_back_and_verify_is_not_fail(tmp_path):
    opted_out = {"PARALLELJOB_FABRIC": "infiniband", "NCCL_NET": ""}
    warning = preflight.run_preflight(opted_out, gpu=False, host=make_host(tmp_path))
    assert warning is not None and "NoRdmaDevice" in warning and "not fatal" in warning
    with pytest.raises(preflight.NetworkNotReady):
        preflight.run_preflight(
            {**opted_out, "PARALLELJOB_NETWORK_VERIFY": "fail"}, gpu=False, host=make_host(tmp_path / "b")
        )


def test_this_cpu_machine_passes_a_declared_tcp_job_as_it_is():
    assert preflight.run_preflight({"PARALLELJOB_FABRIC": "tcp", "NCCL_NET": "Socket"}, gpu=False) is None


def test_the_failure_reaches_the_termination_message_as_one_line_from_the_first_rank_to_fail(tmp_path):
    log = tmp_path / "termination-log"
    env = {"PARALLELJOB_TERMINATION_LOG": str(log), "LOCAL_RANK": "1"}
    # Local rank 1 failed first (torchrun then stops rank 0 before it reports): its line is the message.
    preflight.report_failure("NetworkReady", "NoRdmaDevice", "fabric infiniband\nbut none", env)
    preflight.report_failure("NetworkReady", "NoRdmaDevice", "a later rank's words", {**env, "LOCAL_RANK": "0"})
    assert log.read_text() == "NetworkReady NoRdmaDevice: fabric infiniband but none\n"
    # What the operator and the local runner read back from it.
    assert network.parse_failure(log.read_text()) == network.NetworkFailure(
        "NetworkReady", "NoRdmaDevice", "fabric infiniband but none"
    )


@pytest.mark.parametrize(
    "message",
    ["", "Traceback (most recent call last):", "NetworkReady: no reason", "Ready NoRdmaDevice: other condition"],
    ids=["empty", "log-tail", "no-reason", "other-condition"],
)
def test_other_termination_messages_are_no_network_failure(message):
    assert network.parse_failure(message) is None
