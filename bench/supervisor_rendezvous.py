"""The in-pod supervisors' re-formation time at scale: N simulated node agents, no torch, one failed rank.

    .venv/bin/python -m bench.supervisor_rendezvous [--nodes 256] [--ranks-per-node 8] [--rounds 3]

Node rank 0's coordinator (`paralleljob_contract.coordinator.Coordinator`) serves on a loopback port, and N
supervisors (`Supervisor`, the pods' own loop, each in a thread of this process) talk to it over HTTP as pods
do. Their ranks are stand-ins that run until told to stop, so only the supervisors' protocol is measured. Each
round fails one rank of the last node and measures the wall time until every node has started its ranks of the
next generation: the failure seen (0.2 s polls), reported, every other node seeing the new generation,
stopping its ranks, reporting ready, and the barrier releasing every node. All N agents share this process's
GIL (pods each have their own core), so the figure is an upper bound; it is recorded in docs/operator.md.
"""

from __future__ import annotations

import argparse
import signal
import socket
import statistics
import threading
import time

from paralleljob_contract import coordinator, environment, ranks, supervisor


class StandInRank:
    """A rank that runs until stopped, or fails when told to."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.code: int | None = None

    def exit_code(self) -> int | None:
        return self.code

    def send(self, sig: signal.Signals) -> None:
        if sig == signal.SIGTERM and self.code is None:
            self.code = -int(sig)


class Node:
    """One simulated pod: a Supervisor whose ranks are stand-ins, with the time each generation started."""

    def __init__(self, spec: ranks.NodeSpec, port: int) -> None:
        self.started: dict[int, float] = {}
        client = coordinator.CoordinatorClient("127.0.0.1", port, spec.node_rank)
        self.supervisor = supervisor.Supervisor(spec, client, self.start_rank, {})
        self.thread = threading.Thread(target=self.supervisor.run, daemon=True)

    def start_rank(self, environ: dict[str, str]) -> ranks.Rank:
        self.started.setdefault(int(environ[environment.IN_PLACE_RESTARTS]), time.monotonic())
        return StandInRank()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(nodes: int, ranks_per_node: int, rounds: int) -> list[float]:
    port = free_port()
    state = coordinator.GangState(nodes=nodes, in_place_restarts=rounds)
    server = coordinator.Coordinator(state, "127.0.0.1", port)
    fleet = [Node(ranks.NodeSpec(nodes, rank, ranks_per_node, "127.0.0.1", port), port) for rank in range(nodes)]
    for node in fleet:
        node.thread.start()
    figures = []
    failed_at = 0.0
    try:
        for generation in range(rounds + 1):
            deadline = time.monotonic() + 300
            while any(generation not in node.started for node in fleet):
                if time.monotonic() > deadline:
                    raise SystemExit(f"generation {generation} did not form in 300 s")
                time.sleep(0.01)
            if generation:
                figures.append(max(node.started[generation] for node in fleet) - failed_at)
            if generation < rounds:
                time.sleep(0.5)
                failed_at = time.monotonic()
                failing = fleet[-1].supervisor.ranks[0]
                assert isinstance(failing, StandInRank)
                failing.code = 1
    finally:
        server.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    coordinator.log = supervisor.log = lambda node_rank, message: None  # 256 agents' lines would be the bench's cost
    figures = measure(arguments.nodes, arguments.ranks_per_node, arguments.rounds)
    print(
        f"{arguments.nodes} node agents x {arguments.ranks_per_node} stand-in ranks: a failed rank to every node's "
        f"ranks of the next generation started: median {statistics.median(figures):.2f} s, "
        f"each round {', '.join(f'{f:.2f}' for f in figures)} s"
    )


if __name__ == "__main__":
    main()
