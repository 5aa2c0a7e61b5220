"""Progress hooks the tests load into the trainer with PARALLELJOB_PROGRESS_HOOK (`module:factory`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Mapping
from typing import Any


class RecordingHook:
    """Appends its creation (with the rank that built it) and every call as a JSON line to $TEST_HOOK_LOG."""

    def __init__(self) -> None:
        self.path = os.environ["TEST_HOOK_LOG"]
        self._write("created", {"rank": int(os.environ["RANK"])})

    def _write(self, method: str, record: Mapping[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"method": method, **record}) + "\n")

    def on_step(self, record: Mapping[str, Any]) -> None:
        self._write("on_step", record)

    def on_checkpoint(self, record: Mapping[str, Any]) -> None:
        self._write("on_checkpoint", record)

    def on_finish(self, record: Mapping[str, Any]) -> None:
        self._write("on_finish", record)


class KillGangHook(RecordingHook):
    """SIGKILLs rank 0's process group once step $TEST_KILL_AT_STEP is logged; torchrun then stops the gang."""

    def on_step(self, record: Mapping[str, Any]) -> None:
        super().on_step(record)
        if record["step"] == int(os.environ["TEST_KILL_AT_STEP"]):
            os.killpg(os.getpgrp(), signal.SIGKILL)


class FillDiskHook(RecordingHook):
    """Fills the file system of $TEST_FILL_PATH once step $TEST_FILL_AT_STEP is logged (a disk that runs full)."""

    def on_step(self, record: Mapping[str, Any]) -> None:
        super().on_step(record)
        if record["step"] == int(os.environ["TEST_FILL_AT_STEP"]):
            with contextlib.suppress(OSError), open(os.environ["TEST_FILL_PATH"], "wb") as filler:
                while True:
                    filler.write(b"\0" * (1 << 16))
                    filler.flush()


def recording() -> RecordingHook:
    return RecordingHook()


def kill_gang() -> KillGangHook:
    return KillGangHook()


def fill_disk() -> FillDiskHook:
    return FillDiskHook()
