"""Every benchmark starts: a benchmark that cannot start fails here, not months later when someone runs it.

Measures nothing. Each bench/ script is imported and parses `--help` as its own `main`; the ones that need
nothing but this process (planning, admission in process, the supervisors' protocol, the `plan` CLI) also run
once at their smallest size. The others need what a test cannot lend them in two minutes, and are only
imported and asked for `--help`: the upstream control plane or the operator's image (upstream_*, progress_hook,
leader_failover, reservation_records), kwok (`make kwok`: upstream_scale, upstream_admission_scale,
upstream_restart_latency, spare_replacement), a GPU (gpu_mfu), or a multi-process torchrun gang of the trainer
(trainer_*, local_inplace_restart; tests/trainer runs the same harness, `testcluster.trainer_harness`).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Shared helpers, not benchmarks (bench/README.md).
HELPERS = {"__init__", "common", "kwok"}
# A benchmark is a module of bench/, or a package of it run as `python -m bench.NAME` (its `run` has `main`).
BENCHMARKS = sorted(
    [
        *(p.stem for p in (REPO / "bench").glob("*.py") if p.stem not in HELPERS),
        *(p.parent.name for p in (REPO / "bench").glob("*/__main__.py")),
    ]
)
# The benchmarks that run here, at their smallest size: the fewest nodes, rounds and repeats that still plan.
SMALLEST = {
    "admission_scale": ["--nodes", "640", "--pods-per-node", "2", "--pending", "2", "--repeat", "1"],
    "calibration": ["--runs", "megatron-18b"],
    "plan_cli": ["--nodes", "400", "--repeat", "1"],
    "planner_cost": ["--seeds", "1"],
    "planner_scale": ["--sizes", "200", "--repeat", "1"],
    "supervisor_rendezvous": ["--nodes", "2", "--ranks-per-node", "1", "--rounds", "1"],
}

pytestmark = pytest.mark.xdist_group("bench-smoke")


def test_every_benchmark_is_listed_in_the_readme() -> None:
    readme = (REPO / "bench" / "README.md").read_text()
    assert [name for name in BENCHMARKS if f"`{name}`" not in readme] == []


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_parses_its_arguments(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"bench.{name}.run" if (REPO / "bench" / name).is_dir() else f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(name: str) -> None:
    path = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer-image"), str(REPO)])
    env = {**os.environ, "PYTHONPATH": path + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *SMALLEST[name]],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()
