"""A rank ends without the interpreter's teardown of torch, and still as the interpreter would end it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from testcluster import trainer_harness as harness

# A rank's last moments: output still in stdout's buffer (a pipe, so block-buffered), an atexit handler,
# a non-daemon thread that is still writing.
ENDING_RANK = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path
    from paralleljob_contract.ranks import exit_without_teardown

    folder = Path(sys.argv[1])
    atexit.register(lambda: (folder / "atexit").write_text("ran"))
    def write_late():
        time.sleep(0.2)
        (folder / "thread").write_text("joined")
    threading.Thread(target=write_late).start()
    sys.stdout.write("last words")
    exit_without_teardown(int(sys.argv[2]))
    """
)


def _end_a_rank(folder: Path, code: int) -> subprocess.CompletedProcess[str]:
    env = harness.trainer_env(folder / "job.json", folder, None, {})
    env.pop("PYTHONUNBUFFERED")
    return subprocess.run(
        [sys.executable, "-c", ENDING_RANK, str(folder), str(code)], env=env, capture_output=True, text=True
    )


def test_a_rank_ends_with_its_code_its_output_its_exit_handlers_and_its_threads(tmp_path: Path) -> None:
    ended = _end_a_rank(tmp_path, 3)
    assert (ended.returncode, ended.stdout, ended.stderr) == (3, "last words", "")
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"
