"""`make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`, and tests/lanes.py (the hook
tests/conftest.py registers) puts every training run (marked `slow`) in one group, so that two gangs never share the
two cores. A pytest or xdist release that stops honouring the group (as pytest 9.2 did with xdist 3.8,
pytest-xdist#1386) would run gangs side by side and only show up as timeouts: this runs a small suite through the
same hook and checks where each test ran."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.lanes import pytest_collection_modifyitems  # the suite's own hook, as make test runs it
"""

# Each test records the worker it ran on; the slow ones take long enough that both workers get work.
TESTS = """
import json, os, pathlib, time
import pytest

def record(name):
    with open(pathlib.Path(os.environ["LANES_LOG"]), "a") as log:
        log.write(json.dumps({{"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"]}}) + "\\n")

@pytest.mark.slow
@pytest.mark.parametrize("i", range(3))
def test_training_{n}(i):
    time.sleep(0.3)
    record(f"training_{n}_{{i}}")

@pytest.mark.parametrize("i", range(3))
def test_fast_{n}(i):
    time.sleep(0.3)
    record(f"fast_{n}_{{i}}")
"""


def test_training_runs_share_one_worker_and_the_rest_run_beside_them(tmp_path: pathlib.Path) -> None:
    for n in (1, 2):
        (tmp_path / f"test_lane_{n}.py").write_text(TESTS.format(n=n))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: a training run\n")
    log = tmp_path / "lanes.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q", "."],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "LANES_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(ran) == 12
    training = {r["worker"] for r in ran if r["test"].startswith("training")}
    everything = {r["worker"] for r in ran}
    assert len(training) == 1, f"the training runs were spread over workers {sorted(training)}"
    assert everything == {"gw0", "gw1"}, "both workers ran tests"
