"""A newcomer's `paralleljob run`: the job's `command: [python, ...]` finds the interpreter that runs
`paralleljob` (its bin folder first on PATH, as an image's PATH would), whether or not its venv is activated,
and a rank that cannot import its modules ends the run at once with its first error line, not after a gang
restart per backoffLimit."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from paralleljob.local import startup
from tests.local.terminal import run_without_the_venv

ROOT = pathlib.Path(__file__).resolve().parents[2]
OWN_SCRIPT = ROOT / "examples" / "own-script" / "job.yaml"


@pytest.mark.parametrize(
    ("path", "executable", "expected"),
    [
        ("/usr/bin:/bin", "/repo/.venv/bin/python", "/repo/.venv/bin:/usr/bin:/bin"),
        ("/usr/bin:/repo/.venv/bin", "/repo/.venv/bin/python", "/repo/.venv/bin:/usr/bin"),
        ("", "/opt/py/bin/python3", "/opt/py/bin"),
    ],
    ids=["prepended", "moved-first-once", "empty-path"],
)
def test_a_jobs_command_runs_with_the_interpreters_bin_first_on_path(path, executable, expected):
    assert startup.interpreter_path({"PATH": path}, executable) == expected


@pytest.mark.parametrize(
    ("log", "first"),
    [
        (
            'Traceback (most recent call last):\n  File "train.py", line 3\nModuleNotFoundError: No module named '
            "'deepspeed'\nModuleNotFoundError: No module named 'deepspeed'\n",
            "ModuleNotFoundError: No module named 'deepspeed'",
        ),
        ("[rank1]: ImportError: cannot import name 'x' from 'y'\n", "ImportError: cannot import name 'x' from 'y'"),
        ("Traceback (most recent call last):\nFileNotFoundError: missing-corpus\n", None),
        ("step 3 loss 2.1\n", None),
    ],
    ids=["module-not-found", "import-error-with-rank-prefix", "another-error", "no-error"],
)
def test_the_first_import_failure_of_a_node_log_is_found(log, first):
    assert startup.import_failure(log) == first


@pytest.mark.slow
def test_a_rank_that_cannot_import_its_modules_ends_the_run_at_once_with_the_error(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import module_this_test_never_installed\n")
    doc = yaml.safe_load(OWN_SCRIPT.read_text())
    doc["spec"]["command"] = ["python", str(script)]
    doc["spec"].setdefault("failurePolicy", {})["backoffLimit"] = 3
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    output = tmp_path / "out"
    completed = run_without_the_venv(job, output)
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["restarts"] == 0
    assert "ModuleNotFoundError: No module named 'module_this_test_never_installed'" in summary["reason"]
    assert "not restarted" in summary["reason"]
    assert "gang restart 1/3" not in completed.stdout  # the runner's restart line
