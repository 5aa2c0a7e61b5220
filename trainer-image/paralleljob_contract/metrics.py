"""Reading rank 0's metrics.jsonl, the one reader of it: one JSON object per line, appended by the trainer
(`paralleljob_trainer.metrics`), and by every gang of a restarted job after the last, so a step trained again
appears twice and its last record counts. A reader may meet the file while a line is half written: a line that
is not a whole JSON object is left out, never an error. Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "metrics.jsonl"


def complete_records(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The records of the whole lines of `data`, and what follows its last newline (the next line's start)."""
    *lines, rest = data.split(b"\n")
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found, rest


def read_records(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    """Every whole record of the file at `path` (none while it does not exist), only `event`'s when given."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    found, last = complete_records(data)
    found += complete_records(last + b"\n")[0]  # a last line without its newline, if it is whole
    return [record for record in found if event is None or record.get("event") == event]


def last_by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Step records by step number; a step logged twice (before a restart and after) keeps the last."""
    return {int(r["step"]): r for r in records if r.get("event") == "step" and isinstance(r.get("step"), int)}
