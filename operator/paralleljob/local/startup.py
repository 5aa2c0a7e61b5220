"""How a local run's node processes start: on the PATH an image would give them, and what a node's log says
when its ranks could not even start.

A pod runs its command with the image's PATH, whose `python` is the one the image installed DeepSpeed into.
`paralleljob run` gives each node the same: the bin folder of the interpreter running it first on PATH, so a
job's `command: [python, ...]` finds that interpreter's packages whether or not its venv is activated.

A rank that cannot import its modules (`ModuleNotFoundError`, `ImportError`) fails the same way on every
restart, so the runner ends the run at once with the first such line of the node's log instead of
restarting the gang (`runner.LocalRun.execute`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

# The exception line Python prints last in a traceback; torchrun may prefix a worker's lines with its rank.
IMPORT_FAILURE = re.compile(r"^(?:\[[^\]]*\]:?\s*)?((?:ModuleNotFoundError|ImportError): .+)$")


def interpreter_path(environ: Mapping[str, str], executable: str = sys.executable) -> str:
    """PATH with the bin folder of `executable` first (not resolved: a venv's python is a link into the base
    interpreter's folder, which has none of the venv's packages), each folder once."""
    first = str(Path(executable).parent)
    rest = [folder for folder in environ.get("PATH", os.defpath).split(os.pathsep) if folder and folder != first]
    return os.pathsep.join([first, *rest])


def import_failure(log: str) -> str | None:
    """The first line of a node's log that says a module could not be imported, or None."""
    for line in log.splitlines():
        found = IMPORT_FAILURE.match(line.strip())
        if found:
            return found.group(1)
    return None


def log_since(path: Path, offset: int) -> str:
    """What a node's log gained from `offset` on (a resumed run appends to the logs of the runs before it)."""
    if not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", errors="replace")


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
