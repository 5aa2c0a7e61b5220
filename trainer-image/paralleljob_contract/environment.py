"""The environment of a trainer process: the PARALLELJOB_* names, one writer (`PodEnvironment.to_environ`)
and one reader (`PodEnvironment.from_environ`), and the reader of torchrun's own variables (`Launch`).

The operator writes the same variables into every pod and the local runner into every simulated node; the
bundled trainer and users' own scripts read them here. Only a pod's own facts travel in the environment
(its node rank and node, where the job file is, where to write); the layout is in the job file, and ranks,
coordinates and groups follow from it. docs/contract.md lists every variable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeVar

from paralleljob_contract.errors import ContractError

PREFIX = "PARALLELJOB_"
CONFIG = "PARALLELJOB_CONFIG"
JOB_NAME = "PARALLELJOB_JOB_NAME"
NAMESPACE = "PARALLELJOB_NAMESPACE"
NODE_RANK = "PARALLELJOB_NODE_RANK"
NODE_NAME = "PARALLELJOB_NODE_NAME"
OUTPUT_DIR = "PARALLELJOB_OUTPUT_DIR"
CHECKPOINT_DIR = "PARALLELJOB_CHECKPOINT_DIR"
# spec.checkpoint.resumeFrom's folder: another job's checkpoints, only read (pods mount it read-only).
RESUME_FROM = "PARALLELJOB_RESUME_FROM"
PROGRESS_HOOK = "PARALLELJOB_PROGRESS_HOOK"
PG_TIMEOUT_SECONDS = "PARALLELJOB_PG_TIMEOUT_SECONDS"
# "1" on a job queued through Kueue: every step, rank 0 tells the other ranks whether the operator asked for a
# checkpoint (the progress channel's CHECKPOINT_REQUEST), and all of them save it at that step.
CHECKPOINT_REQUESTS = "PARALLELJOB_CHECKPOINT_REQUESTS"
# Knobs a user may set in spec.template.env; the operator never writes them.
PEAK_TFLOPS = "PARALLELJOB_PEAK_TFLOPS"
STATUS_API = "PARALLELJOB_STATUS_API"
STATUS_INTERVAL = "PARALLELJOB_STATUS_INTERVAL"
USER_SETTABLE = frozenset({PEAK_TFLOPS, STATUS_API, STATUS_INTERVAL})
# The in-pod supervisor's generation, set in every rank it starts: 0 at the pod's start, +1 for each in-place
# restart of the gang (paralleljob_contract.supervisor); rank 0 reports it in its progress.
IN_PLACE_RESTARTS = "PARALLELJOB_IN_PLACE_RESTARTS"
# `paralleljob run` marks every process of one local run with this, to stop them all (never set in pods).
LOCAL_RUN = "PARALLELJOB_LOCAL_RUN"
# The network the operator planned, written with the NCCL variables (manifests.nccl) and read by the bundled
# trainer's preflight and NCCL-log check: the fabric, spec.network.verify, the NICs NCCL should find (EFA and
# exclusive RDMA plugins only) and "1" when multi-node NVLink is planned.
FABRIC = "PARALLELJOB_FABRIC"
NETWORK_VERIFY = "PARALLELJOB_NETWORK_VERIFY"
EXPECTED_NICS = "PARALLELJOB_EXPECTED_NICS"
MNNVL = "PARALLELJOB_MNNVL"
# spec.network.preflight (off | report | fail): the trainer's link check at each start, and what a slow link does.
NETWORK_PREFLIGHT = "PARALLELJOB_NETWORK_PREFLIGHT"
# The planner's bandwidth per link class in GB/s, e.g. `tensor=900,pipeline=50,data=50`, which the link check
# reports beside what it measured; and the bytes it moves per link (default 4 MiB on CPU, 64 MiB on GPU).
PLANNED_GBPS = "PARALLELJOB_PLANNED_GBPS"
NETWORK_CHECK_BYTES = "PARALLELJOB_NETWORK_CHECK_BYTES"
# Where a rank writes the one line saying why the network is not what the job planned (`network_failure_line`);
# pods leave it unset (/dev/termination-log, the container's termination message), `paralleljob run` sets one
# file per node.
TERMINATION_LOG = "PARALLELJOB_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# Where pods mount job.json, and where the trainer looks when PARALLELJOB_CONFIG is unset.
MOUNT_PATH = "/etc/paralleljob"
DEFAULT_CONFIG_PATH = f"{MOUNT_PATH}/job.json"
# The process-group (collective) timeout: spec.network.timeoutSeconds' default, and the reader's.
DEFAULT_PG_TIMEOUT_SECONDS = 1800
DEFAULT_STATUS_INTERVAL_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class PodEnvironment:
    """The PARALLELJOB_* variables of one node rank's processes."""

    config_path: str = DEFAULT_CONFIG_PATH
    job_name: str | None = None
    namespace: str | None = None
    node_rank: int | None = None
    node_name: str | None = None
    output_dir: str | None = None
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    progress_hook: str | None = None
    # Written by the operator with the NCCL variables (manifests.nccl), from spec.network.timeoutSeconds.
    pg_timeout_seconds: int | None = None
    peak_tflops: float | None = None
    status_api: str | None = None
    status_interval_seconds: float = DEFAULT_STATUS_INTERVAL_SECONDS

    @property
    def process_group_timeout_seconds(self) -> int:
        return self.pg_timeout_seconds or DEFAULT_PG_TIMEOUT_SECONDS

    def to_environ(self) -> dict[str, str]:
        """The variables, in a stable order; unset optional ones are left out."""
        values: dict[str, object | None] = {
            CONFIG: self.config_path,
            OUTPUT_DIR: self.output_dir,
            JOB_NAME: self.job_name,
            NAMESPACE: self.namespace,
            NODE_RANK: self.node_rank,
            NODE_NAME: self.node_name,
            CHECKPOINT_DIR: self.checkpoint_dir,
            RESUME_FROM: self.resume_from,
            PROGRESS_HOOK: self.progress_hook,
            PG_TIMEOUT_SECONDS: self.pg_timeout_seconds,
            PEAK_TFLOPS: self.peak_tflops,
            STATUS_API: self.status_api,
        }
        if self.status_interval_seconds != DEFAULT_STATUS_INTERVAL_SECONDS:
            values[STATUS_INTERVAL] = self.status_interval_seconds
        return {name: str(value) for name, value in values.items() if value is not None}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], required: tuple[str, ...] = ()) -> PodEnvironment:
        """Read the variables; ContractError naming each variable of `required` that is unset, or the one
        that is malformed."""
        text = {name: environ.get(name) or None for name in _ALL}
        missing = [name for name in required if not environ.get(name)]
        if missing:
            raise ContractError(f"{', '.join(missing)} not set: the operator and `paralleljob run` set it")
        return cls(
            config_path=text[CONFIG] or DEFAULT_CONFIG_PATH,
            job_name=text[JOB_NAME],
            namespace=text[NAMESPACE],
            node_rank=_number(text, NODE_RANK, int, minimum=0),
            node_name=text[NODE_NAME],
            output_dir=text[OUTPUT_DIR],
            checkpoint_dir=text[CHECKPOINT_DIR],
            resume_from=text[RESUME_FROM],
            progress_hook=text[PROGRESS_HOOK],
            pg_timeout_seconds=_number(text, PG_TIMEOUT_SECONDS, int, minimum=1),
            peak_tflops=_number(text, PEAK_TFLOPS, float, minimum=0) or None,
            status_api=text[STATUS_API],
            status_interval_seconds=_number(text, STATUS_INTERVAL, float, minimum=0) or DEFAULT_STATUS_INTERVAL_SECONDS,
        )


_ALL = (
    CONFIG,
    JOB_NAME,
    NAMESPACE,
    NODE_RANK,
    NODE_NAME,
    OUTPUT_DIR,
    CHECKPOINT_DIR,
    RESUME_FROM,
    PROGRESS_HOOK,
    PG_TIMEOUT_SECONDS,
    PEAK_TFLOPS,
    STATUS_API,
    STATUS_INTERVAL,
)
Number = TypeVar("Number", int, float)


def _number(text: Mapping[str, str | None], name: str, kind: type[Number], *, minimum: Number) -> Number | None:
    raw = text[name]
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ContractError(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None
    if value < minimum:
        raise ContractError(f"{name}={raw!r} must be at least {minimum}")
    return value


@dataclasses.dataclass(frozen=True)
class Launch:
    """What torchrun told this process about its place (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), with the node
    rank the operator gave its pod (PARALLELJOB_NODE_RANK; None when absent)."""

    rank: int
    world_size: int
    local_world_size: int
    node_rank: int | None = None

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_world_size

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Launch:
        """This process's Launch; ContractError when torchrun's variables are missing or not integers."""
        names = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
        missing = [name for name in names if not environ.get(name)]
        if missing:
            raise ContractError(f"{', '.join(missing)} not set: start the trainer with torchrun")
        text = {name: environ.get(name) or None for name in (*names, NODE_RANK)}
        rank, world_size, local_world_size = (_number(text, name, int, minimum=0) or 0 for name in names)
        if local_world_size < 1 or world_size < 1:
            raise ContractError("WORLD_SIZE and LOCAL_WORLD_SIZE must be positive: start the trainer with torchrun")
        return cls(rank, world_size, local_world_size, _number(text, NODE_RANK, int, minimum=0))
