"""`paralleljob run`: a whole ParallelJob on this machine, with the same plan and pod environment as a cluster.

The job is validated and planned by the same code the operator uses, on a local cluster of N simulated
nodes with G slots each. Each node rank becomes one torchrun process (the contract's command line) with the
environment `manifests.env.build_node_env()` gives a pod, and the gang is supervised as the operator supervises pods:
a failed node stops every process, and the gang restarts from the latest checkpoint up to backoffLimit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from paralleljob.api.validation import ResolvedJob
from paralleljob.local import gang as gangs
from paralleljob.local import progress, report, startup, throttle
from paralleljob.local.shape import LocalShape
from paralleljob.manifests import env as node_env
from paralleljob.manifests import nccl
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests.trainer_config import build_trainer_config, contract_plan
from paralleljob.planning import Plan
from paralleljob_contract import environment, launcher, supervisor
from paralleljob_contract.network import NetworkFailure, parse_failure


@contextlib.contextmanager
def signals_stop_the_gang() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) stop the run like Ctrl-C does: every process, no orphans."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def local_nccl_env(resolved: ResolvedJob) -> dict[str, str]:
    """The job's NCCL environment on one machine: its declared fabric (auto is an inferred tcp), on the
    loopback interface, with the job's own overrides. A declared RDMA fabric keeps its fail-closed NCCL_NET,
    so the trainer's network preflight checks this machine as it would a node."""
    network = {**resolved.resolved_spec().get("network", {}), "socketInterface": "lo"}
    fabric = network.get("fabric") or "auto"
    if fabric == "auto":
        return nccl.build_nccl_env(network, "tcp", declared=False)
    return nccl.build_nccl_env(network, fabric)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_data_path(config: dict[str, Any], job_file: Path) -> None:
    """A relative data path, or pretrained folder, in a local job is relative to the job file's folder."""
    for section in (config["spec"]["training"].get("data") or {}, config["spec"]["model"].get("pretrained") or {}):
        path = section.get("path")
        if path and not Path(path).is_absolute():
            section["path"] = str((job_file.parent / path).resolve())


def supervisor_argv(
    shape: LocalShape,
    node_rank: int,
    port: int,
    command: list[str] | None,
    in_place_restarts: int,
    progress_timeout_seconds: int | None = None,
) -> list[str]:
    """The same supervisor line a pod runs, with this machine as master and this interpreter."""
    return launcher.supervisor_command(
        nodes=shape.nodes,
        node_rank=node_rank,
        ranks_per_node=shape.gpus_per_node,
        master_addr="127.0.0.1",
        master_port=port,
        in_place_restarts=in_place_restarts,
        command=command,
        python=(sys.executable,),
        progress_timeout_seconds=progress_timeout_seconds,
    )


def free_port_pair() -> int:
    """A port whose next one is free too: the supervisors' coordinator and the ranks' own store."""
    while True:
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@dataclasses.dataclass
class InPlaceRestarts:
    """The in-place restarts of one attempt, read from node rank 0's log (the supervisor's one line each), and
    the import failure that stopped it before any in-place restart could help."""

    log_path: Path
    offset: int
    seen: list[str] = dataclasses.field(default_factory=list)
    # (node rank, the log's line) of a rank that could not import its modules before the first step.
    import_error: tuple[int, str] | None = None

    def poll(self) -> list[str]:
        """Reasons of the in-place restarts logged since the last call."""
        text = startup.log_since(self.log_path, self.offset)
        found = [m[3] for m in supervisor.IN_PLACE_LINE.finditer(text)]
        new = found[len(self.seen) :]
        self.seen.extend(new)
        return new


def first_import_failure(logs: dict[int, Path], offsets: dict[int, int]) -> tuple[int, str] | None:
    """The first node whose log, in this attempt, says a rank could not import a module, with that line."""
    for node, log in sorted(logs.items()):
        found = startup.import_failure(startup.log_since(log, offsets[node]))
        if found is not None:
            return node, found
    return None


@dataclasses.dataclass
class LocalRun:
    """A prepared run: where it writes and what each node rank starts with."""

    resolved: ResolvedJob
    shape: LocalShape
    plan: Plan
    output: Path
    console: Console
    # CUDA_VISIBLE_DEVICES per node rank (see gpu_slices); None runs on the CPU.
    devices: list[str] | None = None
    # A node held to a fraction of its CPU share (tests of straggler naming), see local.throttle.
    throttled: throttle.Throttle | None = None

    @property
    def checkpoint_dir(self) -> Path | None:
        return self.output / "checkpoints" if self.resolved.spec.checkpoint is not None else None

    @property
    def resume_from_dir(self) -> Path | None:
        """spec.checkpoint.resumeFrom on this machine: a job name is that job's run next to this one
        (`<runs>/<name>/checkpoints`), a folder is relative to the folder that holds the runs."""
        checkpoint = self.resolved.spec.checkpoint
        if checkpoint is None or not checkpoint.resume_from:
            return None
        source = checkpoint.resume_from.strip("/")
        return self.output.parent / source if "/" in source else self.output.parent / source / "checkpoints"

    def prepare(self, job_file: Path, resume: bool) -> None:
        """Reserve summary.json and write job.json; a fresh run clears the previous run's checkpoints and
        metrics. OSError when the output folder cannot be written."""
        self.output.mkdir(parents=True, exist_ok=True)
        report.reserve_summary(self.output / "summary.json")
        if not resume:
            shutil.rmtree(self.output / "checkpoints", ignore_errors=True)
            for stale in self.output.glob("node-*.log"):
                stale.unlink()
            (self.output / "metrics.jsonl").unlink(missing_ok=True)
        config = build_trainer_config(self.resolved, self.plan)
        resolve_data_path(config, job_file)
        (self.output / "job.json").write_text(json.dumps(config, indent=2) + "\n")

    def launches(self, port: int, in_place_restarts: int, devices: list[str] | None = None) -> list[gangs.NodeLaunch]:
        env_nccl = local_nccl_env(self.resolved)
        launches = []
        plan = contract_plan(self.plan)
        for node in self.plan.nodes:
            rank = node.node_rank
            self.termination_log(rank).unlink(missing_ok=True)
            env = node_env.build_node_env(
                plan,
                rank,
                job_name=self.resolved.name,
                namespace=self.resolved.namespace,
                node_name=node.node,
                config_path=str(self.output / "job.json"),
                output_dir=str(self.output),
                checkpoint_dir=str(self.checkpoint_dir) if self.checkpoint_dir else None,
                resume_from=str(self.resume_from_dir) if self.resume_from_dir else None,
                nccl_env=env_nccl,
                stragglers=pod_manifests.straggler_policy(self.resolved),
            )
            # gloo's own interface variable: the loopback device for a single machine.
            env["GLOO_SOCKET_IFNAME"] = "lo"
            # A pod's PATH is its image's: `python` is the interpreter that has the job's packages.
            env["PATH"] = startup.interpreter_path(os.environ)
            # A pod's /dev/termination-log: where a rank says why the network is not ready.
            env[environment.TERMINATION_LOG] = str(self.termination_log(rank))
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices[rank]
            argv = supervisor_argv(
                self.shape,
                rank,
                port,
                self.resolved.spec.command,
                in_place_restarts,
                self.resolved.spec.failure_policy.progress_timeout_seconds,
            )
            if self.throttled is not None and self.throttled.node_rank == rank:
                argv = self.throttled.wrap(argv)
            launches.append(
                gangs.NodeLaunch(
                    rank,
                    argv,
                    env,
                    self.node_log(rank),
                    self.output / f"node-{rank}.pid",
                )
            )
        return launches

    def node_log(self, node_rank: int) -> Path:
        return self.output / f"node-{node_rank}.log"

    def termination_log(self, node_rank: int) -> Path:
        return self.output / f"node-{node_rank}.termination-log"

    def network_failure(self, outcome: gangs.GangOutcome) -> tuple[int, NetworkFailure] | None:
        """The node whose termination message reports a network fault, and the fault: the failed node's message
        first, then the others'. The node that failed first need not be the one whose preflight found the fault
        (its ranks may have lost the race to exit); once the gang has stopped, every node that failed its
        preflight has written why."""
        if outcome.failed_node is None:
            return None
        others = [n.node_rank for n in self.plan.nodes if n.node_rank != outcome.failed_node]
        for node in [outcome.failed_node, *others]:
            path = self.termination_log(node)
            found = parse_failure(path.read_text() if path.exists() else None)
            if found is not None:
                return node, found
        return None

    def import_failure(self, outcome: gangs.GangOutcome, logs: dict[int, Path], offsets: dict[int, int]) -> str | None:
        """The first import error the failed node logged in this attempt, if its ranks could not start."""
        if outcome.failed_node is None:
            return None
        node = outcome.failed_node
        return startup.import_failure(startup.log_since(logs[node], offsets[node]))

    def node_lines(self) -> list[progress.NodeLine]:
        lines = []
        for node in self.plan.nodes:
            ranks = node.ranks
            lines.append(
                progress.NodeLine(
                    node.node_rank,
                    node.node,
                    f"{ranks[0]}-{ranks[-1]}",
                    ",".join(str(s) for s in node.stages),
                    self.output / f"node-{node.node_rank}.log",
                )
            )
        return lines

    def execute(self) -> report.RunSummary:
        """Run the gang, restarting it from the latest checkpoint after a failure, up to backoffLimit: in place
        (the supervisors restart their ranks) while spec.failurePolicy.inPlaceRestarts allows, else every node."""
        backoff = self.resolved.spec.failure_policy.backoff_limit
        in_place_budget = self.resolved.spec.failure_policy.in_place_restarts
        tail = progress.MetricsTail(self.output / "metrics.jsonl")
        restarts, started = 0, time.monotonic()
        view = progress.ProgressView(self.console, self.resolved.spec.training.steps, self.node_lines())
        report.load_plotting_in_background()
        with signals_stop_the_gang(), view:
            while True:
                view.attempt = restarts + 1
                marker = uuid.uuid4().hex
                logs = {node.node_rank: self.node_log(node.node_rank) for node in self.plan.nodes}
                offsets = {rank: startup.log_size(path) for rank, path in logs.items()}
                in_place = InPlaceRestarts(logs[0], offsets[0])
                budget = min(in_place_budget, backoff - restarts)
                tick = functools.partial(self.tick, tail, view, in_place, restarts, backoff, (marker, logs, offsets))
                try:
                    gang = gangs.Gang(self.launches(free_port_pair(), budget, self.devices), marker=marker)
                    outcome = gangs.supervise(gang, tick)
                except BaseException:  # also a Ctrl-C between the gang's start and its supervision
                    gangs.stop_marked(marker)
                    raise
                tick(gang.states())
                restarts += 0 if in_place.import_error else len(in_place.seen)
                network = None if outcome.succeeded else self.network_failure(outcome)
                if in_place.import_error is not None:
                    outcome = dataclasses.replace(outcome, failed_node=in_place.import_error[0])
                missing = None if outcome.succeeded or network else self.import_failure(outcome, logs, offsets)
                if network is not None:
                    # Permanent until the job or the machine changes: a restart would fail the same way.
                    self.console.print(f"[red]{network[1].render()}[/] (node rank {network[0]}; not restarted)")
                    break
                if missing is not None:
                    # The job's environment lacks a module: every restart would fail the same way.
                    self.console.print(f"[red]{missing}[/] (node rank {outcome.failed_node}; not restarted)")
                    break
                if outcome.succeeded or restarts >= backoff:
                    break
                restarts += 1
                resume_at = tail.checkpoints[-1] if tail.checkpoints else 0
                self.console.print(
                    f"[yellow]gang restart {restarts}/{backoff}[/]: {outcome.reason}; every node stopped, "
                    f"resuming from {'step ' + str(resume_at) if resume_at else 'the start'}",
                    soft_wrap=True,
                )
        return self.summarise(outcome, restarts, time.monotonic() - started, tail, network, missing)

    def tick(
        self,
        tail: progress.MetricsTail,
        view: progress.ProgressView,
        in_place: InPlaceRestarts,
        restarts_before: int,
        backoff: int,
        attempt: tuple[str, dict[int, Path], dict[int, int]],
        states: list[gangs.NodeState],
    ) -> None:
        """One look at the attempt: new metrics, new in-place restarts (announced), the nodes' states. Until the
        first step, a rank that cannot import its modules stops the attempt: every restart, in place or not,
        would fail the same way."""
        records = tail.poll()
        marker, logs, offsets = attempt
        if tail.latest() is None and in_place.import_error is None:
            in_place.import_error = first_import_failure(logs, offsets)
            if in_place.import_error is not None:
                gangs.stop_marked(marker)
        if in_place.import_error is not None:
            return
        for reason in in_place.poll():
            view.attempt += 1
            self.announce_in_place(restarts_before + len(in_place.seen), backoff, reason, tail)
        view.update(records, tail.latest(), states)

    def announce_in_place(self, number: int, backoff: int, reason: str, tail: progress.MetricsTail) -> None:
        resume_at = tail.checkpoints[-1] if tail.checkpoints else 0
        self.console.print(
            f"[yellow]in-place restart {number}/{backoff}[/]: {reason}; every node restarts its ranks in place, "
            f"resuming from {'step ' + str(resume_at) if resume_at else 'the start'}",
            soft_wrap=True,  # one line however narrow the terminal: it is read back (tests, people's greps)
        )

    def summarise(
        self,
        outcome: gangs.GangOutcome,
        restarts: int,
        wall: float,
        tail: progress.MetricsTail,
        network: tuple[int, NetworkFailure] | None = None,
        missing: str | None = None,
    ) -> report.RunSummary:
        curve, title = tail.loss_curve(), f"{self.resolved.name} {self.resolved.layout}"
        picture = report.write_loss_curve(curve, self.output / "loss.png", title, tail.loss_curve("validation_loss"))
        final = tail.summary or {}
        latest = tail.latest() or {}
        reason = outcome.reason
        if network is not None:
            node, failure = network
            reason += f": {failure.render()}; not restarted, since a restart would fail the same way"
            reason += f"; see {self.output}/node-{node}.log"
        elif missing is not None:
            reason += f": {missing}; not restarted, since the job's command cannot start in this environment "
            reason += f"({sys.executable}); see {self.output}/node-{outcome.failed_node}.log"
        elif not outcome.succeeded:
            reason += (
                f"; gave up after {restarts} restarts (backoffLimit {self.resolved.spec.failure_policy.backoff_limit})"
            )
            reason += f"; see {self.output}/node-{outcome.failed_node}.log"
        return report.RunSummary(
            job=self.resolved.name,
            layout=f"{self.resolved.layout} (PP x TP x DP)",
            succeeded=outcome.succeeded,
            reason=reason,
            restarts=restarts,
            wall_seconds=round(wall, 2),
            steps_done=int(final.get("step", latest.get("step", 0)) or 0),
            total_steps=self.resolved.spec.training.steps,
            first_loss=curve[0][1] if curve else None,
            last_loss=curve[-1][1] if curve else None,
            tokens_per_s=final.get("tokens_per_s", latest.get("tokens_per_s")),
            last_checkpoint_step=tail.checkpoints[-1] if tail.checkpoints else None,
            output_dir=str(self.output),
            loss_curve=str(picture) if picture else None,
            stragglers=report.straggler_summary(tail.stragglers, [n.node for n in self.plan.nodes]),
        ).with_efficiency(final, latest)
