"""Network namespaces on one bridge, as a CNI plugin gives pods: each member gets its own namespace, a veth
pair whose outer end is on the bridge, and an address on a private subnet; `slow()` puts a token bucket (`tc
tbf`) on both ends of one member's veth, so its link is slow for real in both directions.

Used by the link-check test (tests/trainer/test_linkcheck.py), its benchmark (bench/linkcheck_cost.py) and the
test kubelet's pod network (testcluster/podnet.py, which adds and removes members as pods come and go). Needs
root and iproute2; every address is inside namespaces made here (10.213.0.0/16), so nothing leaves the machine.
`close()` deletes what was made; `remove_leftovers()` what a killed owner left behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from paralleljob_contract.layout import Layout

REPO = Path(__file__).resolve().parents[1]
SUBNET_PREFIX = "10.213"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> bool:
    """Whether this process may make network namespaces (root with iproute2)."""
    if os.geteuid() != 0:
        return False
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True)
        subprocess.run(["tc", "-V"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


@dataclasses.dataclass
class Bridge:
    """A bridge and `members` namespaces on it; `tag` keeps names apart (interface names are 15 bytes at most)."""

    tag: str
    members: int
    subnet: int = 1

    def __post_init__(self) -> None:
        self.bridge = f"pjbr{self.tag}"
        self.made: list[str] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(f"link:{self.bridge}")
        _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index in range(self.members):
            self._add_member(index)

    @property
    def host_address(self) -> str:
        """The machine's own address on the bridge: members reach the machine there."""
        return f"{SUBNET_PREFIX}.{self.subnet}.254"

    def namespace(self, index: int) -> str:
        return f"pj{self.tag}n{index}"

    def address(self, index: int) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{index + 1}"

    def outer(self, index: int) -> str:
        return f"pj{self.tag}v{index}"

    def add(self, index: int) -> None:
        """A new member `index` (a namespace, its veth on the bridge and its address)."""
        self._add_member(index)

    def remove(self, index: int) -> None:
        """Delete member `index`'s namespace (its veth goes with it)."""
        name = f"netns:{self.namespace(index)}"
        if name in self.made:
            subprocess.run(["ip", "netns", "delete", self.namespace(index)], capture_output=True)
            self.made.remove(name)

    def _add_member(self, index: int) -> None:
        ns, outer = self.namespace(index), self.outer(index)
        # A namespace of this name left by an owner that could not delete it (its name still mounted in a pod's
        # private mount namespace) is ours: it goes before the new one is made.
        # So is a veth of this name whose namespace lives on unnamed (held by a process that outlived its pod).
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        subprocess.run(["ip", "link", "delete", outer], capture_output=True)
        _ip("netns", "add", ns)
        self.made.append(f"netns:{ns}")
        _ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", outer, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{self.address(index)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def exec_prefix(self, index: int) -> list[str]:
        """The command prefix that runs a process in member `index`'s namespace."""
        return ["ip", "netns", "exec", self.namespace(index)]

    def slow(self, index: int, mbit: float) -> None:
        """Limit member `index`'s link to `mbit` Mbit/s both ways (tbf on the veth's two ends)."""
        shape = ["tbf", "rate", f"{mbit:.0f}mbit", "burst", "256kb", "latency", "50ms"]
        subprocess.run(["tc", "qdisc", "replace", "dev", self.outer(index), "root", *shape], check=True)
        subprocess.run(
            ["tc", "-n", self.namespace(index), "qdisc", "replace", "dev", "eth0", "root", *shape], check=True
        )

    def close(self) -> None:
        """Delete the namespaces (their veths go with them) and the bridge, newest first."""
        for item in reversed(self.made):
            kind, name = item.split(":", 1)
            args = ("netns", "delete", name) if kind == "netns" else ("link", "delete", name)
            subprocess.run(["ip", *args], capture_output=True)
        self.made.clear()


def remove_leftovers(tag: str) -> None:
    """Delete the bridge and namespaces of `tag` that a killed owner could not close."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        if line.split() and line.split()[0].startswith(f"pj{tag}n"):
            subprocess.run(["ip", "netns", "delete", line.split()[0]], capture_output=True)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"pj{tag}v"):
            subprocess.run(["ip", "link", "delete", name], capture_output=True)
    subprocess.run(["ip", "link", "delete", f"pjbr{tag}"], capture_output=True)


def free_subnet(low: int = 100, high: int = 250) -> int:
    """A third octet of 10.213.x.0/24 that no interface of this machine has an address in."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for subnet in range(low, high):
        if f" {SUBNET_PREFIX}.{subnet}." not in used:
            return subnet
    raise RuntimeError(f"no free subnet in {SUBNET_PREFIX}.{low}-{high}.0/24")


def run_linkcheck_ranks(bridge: Bridge, out: Path, layout: Layout) -> dict[str, Any]:
    """Run tests.trainer.linkcheck_worker as one rank per namespace of `bridge`; its JSON verdict."""
    env = {
        **os.environ,
        "MASTER_ADDR": bridge.address(0),
        "MASTER_PORT": "29611",
        "WORLD_SIZE": str(layout.world_size),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'trainer-image'}:{REPO}",
        "GLOO_SOCKET_IFNAME": "eth0",
    }
    procs = []
    for rank in range(layout.world_size):
        rank_env = {**env, "RANK": str(rank), "PARALLELJOB_NODE_RANK": str(rank), "PARALLELJOB_NODE_NAME": f"n{rank}"}
        argv = [sys.executable, "-m", "tests.trainer.linkcheck_worker", str(out), "2", "1", "2", "1"]
        procs.append(subprocess.Popen([*bridge.exec_prefix(rank), *argv], env=rank_env, cwd=REPO))
    codes = [proc.wait(timeout=120) for proc in procs]
    assert codes == [0] * len(procs)
    return json.loads(out.read_text())
