"""The in-pod supervisor: one per node, it starts the node's ranks and restarts the whole gang in place.

`python -m paralleljob_contract.supervisor` is what a pod (and each simulated node of `paralleljob run`) runs;
`launcher.supervisor_command` builds its command line. It does what torchrun's agent did for us, with the
node rank fixed by placement (global rank = node_rank * ranks_per_node + local_rank), and adds one thing:
when a rank fails, every node stops its ranks and starts them again, inside the pods the gang has, up to
`--in-place-restarts` times; then, or when a node itself is lost, the pod fails and the operator's full gang
restart takes over, as before.

The nodes agree through a coordinator that node rank 0's supervisor serves on the job's rendezvous port
(`paralleljob_contract.coordinator`: the generation, which nodes are ready for it, which have finished). A rank's
failure moves the generation on; every supervisor that sees a newer generation stops its ranks, reports ready
for it, and starts them again once every node is ready, so no rank of an old generation meets one of the new
in a process group. The ranks' own rendezvous (torch's env://, rank 0 hosting the store) is on the next port.

A warm standby: with `--entrypoint MODULE:FUNCTION`, ranks are forked from a multiprocessing forkserver that
has already imported `--preload` (torch, DeepSpeed, the trainer), so a restart pays for none of those imports;
a `--` command (spec.command) is started as a process of its own each time. Each rank sees IN_PLACE_RESTARTS,
the generation, so rank 0 can report it in its progress.

A hung gang: with `--progress-timeout` (spec.failurePolicy.progressTimeoutSeconds), each rank gets a heartbeat
file (`paralleljob_contract.heartbeat`) that it touches after every step; a rank quiet for the timeout is
stopped and the gang restarts in place, as for a failed rank, before the operator's watchdog (its backstop)
would restart it with new pods. Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import importlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from paralleljob_contract.coordinator import (
    MAX_WAIT_SECONDS,
    POLL_SECONDS,
    Coordinator,
    CoordinatorClient,
    GangState,
    log,
)
from paralleljob_contract.environment import NODE_NAME, PROGRESS_HOOK
from paralleljob_contract.ranks import (
    EXIT_PEER,
    Heartbeats,
    NodeSpec,
    Rank,
    describe_exit,
    first_failure,
    rank_starter,
    stop_ranks,
)

DEFAULT_IN_PLACE_RESTARTS = 3
# Exit codes of the bundled trainer that a restart in the same pods would meet again (a bad job file, a
# checkpoint that cannot be resumed from or saved, the network not as planned): the pod fails with the code
# at once, and the operator decides as it did before in-place restarts existed.
NOT_RESTARTED_IN_PLACE = frozenset({2, 3, 5, 6})
# A node's exit code when the gang gave up after one of its ranks made no progress (timeout(1)'s).
EXIT_NO_PROGRESS = 124
# Node rank 0's log line for each in-place restart: generation, budget, and which rank failed how.
IN_PLACE_LINE = re.compile(r"in-place restart (\d+)/(\d+): (.*)")
# How long a node whose ranks only saw a peer fail waits for the failed rank's node to report first.
PEER_GRACE_SECONDS = 2.0


class GangFollower:
    """A thread that long-polls the coordinator for the gang's state while this node's ranks run, so the node
    learns of a new generation as soon as it is made; `latest` is the last answer (None before the first)."""

    def __init__(self, client: CoordinatorClient, generation: int) -> None:
        # A client of its own: the supervisor's keeps its last answer for the supervisor's thread.
        self.client = CoordinatorClient(client.host, client.port, client.node_rank, client.node_name)
        self.generation = generation
        self.latest: dict[str, Any] | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.follow, name="gang-follower", daemon=True)
        self.thread.start()

    def follow(self) -> None:
        while not self.stopped.is_set():
            try:
                self.latest = self.client.post("/state", self.generation, wait=MAX_WAIT_SECONDS)
            except OSError:
                # A missed answer; a lost coordinator shows when this node next reports to it.
                self.stopped.wait(POLL_SECONDS)
                continue
            if self.latest["failed"] is not None or self.latest["generation"] != self.generation:
                return

    def stop(self) -> None:
        self.stopped.set()


# ---- the supervisor's loop -------------------------------------------------------------------------------


@dataclasses.dataclass
class Supervisor:
    """One node's supervisor: start the ranks of each generation, and follow the gang's generation."""

    spec: NodeSpec
    client: CoordinatorClient
    start_rank: Callable[[dict[str, str]], Rank]
    base_environ: Mapping[str, str]
    generation: int = 0
    # The ranks of the generation running now (stopped ones stay listed until the next starts).
    ranks: list[Rank] = dataclasses.field(default_factory=list)
    heartbeats: Heartbeats | None = None
    # When this generation's ranks were started (time.time(), the clock of the heartbeat files).
    started_at: float = 0.0

    def run(self) -> int:
        """The pod's exit code: 0 when every rank finished, the failing rank's code when the gang gave up
        here, EXIT_PEER when it gave up because of another node."""
        while True:
            state = self.wait_until_all_ready()
            if state["failed"] is not None:
                return EXIT_PEER
            ranks = self.start_generation()
            outcome = self.watch(ranks)
            if outcome is not None:
                return outcome

    def wait_until_all_ready(self) -> dict[str, Any]:
        """Report ready for this generation and wait for every node (or a newer generation, or the end)."""
        while True:
            state = self.client.post_patiently("/ready", self.generation, wait=MAX_WAIT_SECONDS)
            if state["failed"] is not None:
                return state
            if state["generation"] > self.generation:
                self.generation = state["generation"]
                continue
            if state["ready"] >= state["nodes"]:
                return state

    def start_generation(self) -> list[Rank]:
        if self.generation:
            log(self.spec.node_rank, f"in-place restart {self.generation}: starting ranks again")
        ranks = []
        beats = self.heartbeats
        if beats is not None:
            beats.clear(self.spec.ranks_per_node)
        self.started_at = time.time()
        for local_rank in range(self.spec.ranks_per_node):
            heartbeat_file = beats.path(local_rank) if beats is not None else None
            environ = self.spec.rank_environ(self.base_environ, local_rank, self.generation, heartbeat_file)
            ranks.append(self.start_rank(environ))
            self.ranks = ranks
        pids = " ".join(f"{self.spec.node_rank * self.spec.ranks_per_node + i}={r.pid}" for i, r in enumerate(ranks))
        log(self.spec.node_rank, f"generation {self.generation} ranks started (rank=pid): {pids}")
        return ranks

    def watch(self, ranks: list[Rank]) -> int | None:
        """Until this generation ends: None to start the next one, else the pod's exit code."""
        follower = GangFollower(self.client, self.generation)
        try:
            return self.watch_with(ranks, follower)
        finally:
            follower.stop()

    def watch_with(self, ranks: list[Rank], follower: GangFollower) -> int | None:
        while True:
            failure = first_failure(ranks)
            if failure is not None:
                return self.after_failure(ranks, *failure)
            if all(rank.exit_code() == 0 for rank in ranks):
                return self.after_success()
            state = follower.latest
            if state is not None and state["failed"] is not None:
                stop_ranks(ranks)
                log(self.spec.node_rank, f"the gang gave up: {state['failed']}")
                return EXIT_PEER
            if state is not None and state["generation"] > self.generation:
                log(self.spec.node_rank, f"stopping ranks for in-place restart: {state['reasons'][-1]}")
                stop_ranks(ranks)
                self.generation = state["generation"]
                return None
            running = [i for i, rank in enumerate(ranks) if rank.exit_code() is None]
            hung = self.heartbeats.stalled(running, self.started_at, time.time()) if self.heartbeats else None
            if hung is not None:
                return self.after_hang(ranks, *hung)
            time.sleep(POLL_SECONDS)

    def after_failure(self, ranks: list[Rank], local_rank: int, code: int) -> int | None:
        if code == EXIT_PEER and self.cause_reported_elsewhere():
            log(self.spec.node_rank, f"stopping ranks for in-place restart: {self.client.last['reasons'][-1]}")
            stop_ranks(ranks)
            return None
        local_rank, code = first_failure(ranks) or (local_rank, code)
        rank = self.spec.node_rank * self.spec.ranks_per_node + local_rank
        reason = f"rank {rank} {describe_exit(code)}"
        log(self.spec.node_rank, reason)
        stop_ranks(ranks)
        return self.restart_or_give_up(reason, code if code > 0 else 128 - code, code in NOT_RESTARTED_IN_PLACE)

    def after_hang(self, ranks: list[Rank], local_rank: int, quiet: float) -> int | None:
        """A rank here made no progress for the timeout: stop this node's ranks and restart the gang in place."""
        assert self.heartbeats is not None
        rank = self.spec.node_rank * self.spec.ranks_per_node + local_rank
        reason = f"rank {rank} made no progress for {quiet:.0f}s (progress timeout {self.heartbeats.timeout:g}s)"
        log(self.spec.node_rank, reason)
        stop_ranks(ranks)
        return self.restart_or_give_up(reason, EXIT_NO_PROGRESS, permanent=False)

    def restart_or_give_up(self, reason: str, exit_code: int, permanent: bool) -> int | None:
        """Report a failure of this node's ranks (already stopped): None to start the next generation, or the
        pod's exit code when the gang gave up (the budget spent, a permanent failure, the coordinator gone)."""
        try:
            state = self.client.post_patiently("/fail", self.generation, reason=reason, permanent=permanent)
        except OSError:
            log(self.spec.node_rank, "the coordinator (node rank 0) is gone: the pod fails for a gang restart")
            return exit_code
        if state["failed"] is not None:
            log(self.spec.node_rank, f"not restarted in place: {state['failed']}")
            return exit_code
        self.generation = max(self.generation + 1, state["generation"])
        return None

    def cause_reported_elsewhere(self) -> bool:
        """A rank here only saw a peer fail: give the node whose rank failed first PEER_GRACE_SECONDS to say
        so (its report names the cause); True, and this node follows, once the generation has moved on."""
        deadline = time.monotonic() + PEER_GRACE_SECONDS
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                state = self.client.post("/state", self.generation)
                if state["failed"] is None and state["generation"] > self.generation:
                    self.generation = state["generation"]
                    return True
            time.sleep(POLL_SECONDS)
        return False

    def after_success(self) -> int:
        """Every rank of this node finished; node rank 0 keeps the coordinator up until every node has."""
        state = self.client.post_patiently("/finished", self.generation)
        while self.spec.node_rank == 0 and state["finished"] < state["nodes"] and state["failed"] is None:
            state = self.client.post_patiently("/state", self.generation, wait=MAX_WAIT_SECONDS)
        return 0


# ---- the command line ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m paralleljob_contract.supervisor", description=__doc__)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--in-place-restarts", type=int, default=DEFAULT_IN_PLACE_RESTARTS)
    parser.add_argument(
        "--progress-timeout",
        type=float,
        default=0.0,
        help="seconds a rank may go without a heartbeat (paralleljob_contract.heartbeat) before the gang "
        "restarts in place; 0: not watched",
    )
    parser.add_argument("--entrypoint", help="MODULE:FUNCTION each rank runs, forked from the warm forkserver")
    parser.add_argument("--preload", default="", help="comma-separated modules the forkserver imports once")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...: each rank runs it instead")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if (arguments.entrypoint is None) == (not command):
        build_parser().error("give either --entrypoint MODULE:FUNCTION or -- COMMAND...")
    spec = NodeSpec(
        nodes=arguments.nnodes,
        node_rank=arguments.node_rank,
        ranks_per_node=arguments.nproc_per_node,
        master_addr=arguments.master_addr,
        master_port=arguments.master_port,
    )
    coordinator = None
    if spec.node_rank == 0:
        state = GangState(nodes=spec.nodes, in_place_restarts=arguments.in_place_restarts)
        coordinator = Coordinator(state, "", spec.master_port, peer_reporter(os.environ))
    client = CoordinatorClient(spec.master_addr, spec.master_port, spec.node_rank, os.environ.get(NODE_NAME, ""))
    starter = rank_starter(arguments.entrypoint, arguments.preload, command)
    supervisor = Supervisor(spec, client, starter, dict(os.environ))
    if arguments.progress_timeout > 0:
        folder = tempfile.mkdtemp(prefix="paralleljob-heartbeats-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        supervisor.heartbeats = Heartbeats(folder, arguments.progress_timeout)
    try:
        with signals_end_the_node():
            return supervisor.run()
    except OSError as error:
        log(spec.node_rank, f"the coordinator (node rank 0) cannot be reached: {error}; the pod fails")
        return EXIT_PEER
    finally:
        # A pod being deleted (SIGTERM) or a failure of the supervisor itself: no rank outlives its node.
        stop_ranks(supervisor.ranks)
        if coordinator is not None:
            coordinator.close()


def peer_reporter(environ: Mapping[str, str]) -> Callable[[str], None] | None:
    """Node rank 0's way to report the peers not answering (`paralleljob_contract.peers`): the progress hook the
    pod names (PARALLELJOB_PROGRESS_HOOK, as rank 0's trainer loads it), when it has `on_lost_peers(text)`;
    None without one (a local run, a hook that cannot be loaded: the gang goes on as before)."""
    reference = environ.get(PROGRESS_HOOK, "")
    module_name, _, factory_name = reference.partition(":")
    if not module_name or not factory_name:
        return None
    try:
        hook = getattr(importlib.import_module(module_name), factory_name)()
    except Exception as error:
        log(0, f"progress hook {reference!r} not loaded ({type(error).__name__}: {error}); lost peers unreported")
        return None
    report = getattr(hook, "on_lost_peers", None)
    return report if callable(report) else None


@contextlib.contextmanager
def signals_end_the_node() -> Iterator[None]:
    """SIGTERM (a pod deleted, a local run stopped) ends the supervisor through its cleanup: the ranks stop."""

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
