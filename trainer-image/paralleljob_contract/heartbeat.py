"""A rank's heartbeat: a file it touches after every training step, which its node's supervisor watches.

With `spec.failurePolicy.progressTimeoutSeconds`, the in-pod supervisor (`paralleljob_contract.supervisor
--progress-timeout`) gives each rank it starts PARALLELJOB_HEARTBEAT_FILE, a file of its own in a fresh folder.
The bundled trainer calls `beat()` once its process groups form, its engine is built and a checkpoint is
loaded, then after each step and each checkpoint save; a user's own script (spec.command) calls it the same way. A rank that has not touched its file for the timeout, counted
from the later of its last touch and the start of its generation (so the first step gets the whole timeout,
as the operator's watchdog gives it), is hung: a collective that never returns, a deadlock, a stopped process.
The supervisor then restarts the gang in place, as for a rank that failed, long before the process-group
timeout (30 minutes by default) would end the collective, and before the operator's own watchdog, its
backstop, restarts the gang with new pods.

Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Set by the supervisor in every rank it starts, only when the job has a progress timeout.
HEARTBEAT_FILE = "PARALLELJOB_HEARTBEAT_FILE"


def beat(environ: Mapping[str, str] = os.environ) -> None:
    """Touch this rank's heartbeat file; nothing when the supervisor watches no heartbeat (one syscall)."""
    path = environ.get(HEARTBEAT_FILE)
    if not path:
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        with open(path, "a"):
            pass


def last_beat(path: str) -> float | None:
    """When the rank last touched `path` (seconds since the epoch, the clock `time.time()` reads), or None."""
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None
