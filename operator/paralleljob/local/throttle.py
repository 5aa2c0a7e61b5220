"""A slow simulated node for tests: one node's processes held to a fraction of their CPU share by a cgroup quota.

`paralleljob run --throttle-node R` makes a CPU cgroup for the run (cgroup v2's `cpu.max` where the unified
hierarchy has the cpu controller, else v1's `cpu.cfs_quota_us`), sized to `--throttle-share` (a third by default)
of the node's fair share of this machine (its cores over the simulated nodes). The node's supervisor joins it
before it execs (`wrap`), so every rank it starts inherits it: a real slow node, as a throttled GPU would be,
not a faked timer. Needs root (the runners and CI are root); the cgroup is removed when the run ends.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# A 10 ms period (the kernel default is 100 ms): a step of tens of milliseconds is held back in every period it
# spans, so every step is slow, as on a slow device. With 100 ms a step could finish inside one period's quota at
# full speed, and the trainer's lower-quartile step (its fastest steps) hid the throttle: factors of 1.26 and
# 1.43 for a node held to a sixth of a core.
PERIOD_US = 10_000


class ThrottleError(RuntimeError):
    """The cgroup cannot be made here; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Throttle:
    """One node rank held to `cores` CPUs by the cgroup at `path`."""

    node_rank: int
    cores: float
    path: Path

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """argv started by a shell that first moves itself into the cgroup, then execs argv (same pid)."""
        join = f'echo $$ > {shlex.quote(str(self.path / "cgroup.procs"))} && exec "$@"'
        return ["/bin/sh", "-c", join, "throttled-node", *argv]

    def remove(self, wait_seconds: float = 10.0) -> None:
        """Remove the cgroup once the run's last processes have left it (exiting ones linger a moment)."""
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # a leftover empty cgroup is harmless; say nothing rather than fail a finished run
                time.sleep(0.2)


def quota_cores(share: float, nodes: int, cpus: int) -> float:
    """The throttled node's cores: `share` of its fair part of this machine's CPUs."""
    return share * cpus / nodes


def make(node_rank: int, share: float, nodes: int, run_id: str, root: Path = CGROUP_ROOT) -> Throttle:
    """A CPU cgroup for node `node_rank` with its quota set; ThrottleError when cgroups cannot be used."""
    if not 0 < share <= 1:
        raise ThrottleError(f"--throttle-share must be in (0, 1], got {share}")
    if not 0 <= node_rank < nodes:
        raise ThrottleError(f"--throttle-node {node_rank}: the run has node ranks 0-{nodes - 1}")
    cores = quota_cores(share, nodes, os.cpu_count() or 1)
    quota = max(1000, int(cores * PERIOD_US))
    unified = root / "cgroup.controllers"
    try:
        if unified.exists() and "cpu" in unified.read_text().split():
            path = root / f"paralleljob-{run_id}-node{node_rank}"
            path.mkdir(exist_ok=True)
            (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        else:
            path = root / "cpu" / f"paralleljob-{run_id}-node{node_rank}"
            path.mkdir(exist_ok=True)
            (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    except OSError as error:
        raise ThrottleError(
            f"--throttle-node needs a writable CPU cgroup under {root} (root, cgroup v1 cpu or v2 with cpu "
            f"delegated): {error.strerror or error}"
        ) from None
    return Throttle(node_rank, cores, path)
