"""False positives and misses of straggler naming on this machine: the quickstart, throttled and not (issue 36).

    .venv/bin/python -m bench.straggler_naming [--runs 5] [--steps 60]
    .venv/bin/python -m bench.straggler_naming --scale    # rank 0's comparison and the report at 4,096 nodes

Each run is `paralleljob run examples/quickstart.yaml --gpus-per-node 2` (PP2 x TP2 x DP2 on 4 simulated nodes
of 2 ranks, so every node has a peer doing identical work on another node); a throttled run adds
`--throttle-node 1`, a real CPU cgroup quota of a third of that node's share of the machine. Per run it prints
the nodes named in the summary, every window's slowest factor, and for a throttled run the detection delay: the
step at whose end node 1 was first named. Then the totals: false positives (a run naming any node it should not)
and misses (a throttled run not naming node 1), each out of --runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
THROTTLED = 1


def one_run(folder: Path, steps: int, throttled: bool) -> dict[str, Any]:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["training"]["steps"] = steps
    doc["spec"]["training"]["data"]["path"] = str(ROOT / "operator" / "paralleljob")
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    output = folder / "out"
    command = [sys.executable, "-m", "paralleljob", "run", str(job), "--gpus-per-node", "2", "--output", str(output)]
    command += ["--throttle-node", str(THROTTLED)] if throttled else []
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((output / "summary.json").read_text())
    windows = [
        json.loads(line)
        for line in (output / "metrics.jsonl").read_text().splitlines()
        if '"event": "stragglers"' in line
    ]
    named = {s["nodeRank"] for s in summary["stragglers"]}
    first = next((w["steps"][1] for w in windows if any(s["nodeRank"] == THROTTLED for s in w["stragglers"])), None)
    return {
        "throttled": throttled,
        "named": sorted(named),
        "factors": [s["factor"] for s in summary["stragglers"]],
        "window_slowest": [w["slowest"] for w in windows],
        # Each window's gather and comparison, outside every step's time.
        "compare_s": [round(w["compare_s"], 4) for w in windows],
        "step_s": round(median_step(output), 4),
        "false_positive": bool(named - ({THROTTLED} if throttled else set())),
        "miss": throttled and THROTTLED not in named,
        "detected_at_step": first,
        "tokens_per_s": summary["tokens_per_s"],
        "wall_s": round(time.monotonic() - started, 1),
        # The machine is shared: the 1-minute load average at the run's end says how busy it was.
        "load_1min": round(os.getloadavg()[0], 1),
    }


def median_step(output: Path) -> float:
    """The run's median step time (its step records)."""
    times = [
        json.loads(line)["step_time_s"]
        for line in (output / "metrics.jsonl").read_text().splitlines()
        if '"event": "step"' in line
    ]
    return statistics.median(times)


def scale() -> None:
    """The comparison rank 0 runs each window, and the progress channel's `stragglers` value, at 4,096 nodes of
    8 ranks (PP16 x TP8 x DP256), with one node in 97 slow and 60-character node names: the worst report."""
    from paralleljob_contract import stragglers
    from paralleljob_contract.layout import Layout

    layout = Layout(pipeline=16, tensor=8, data=256)
    compute = [1.0] * layout.world_size
    for node in range(0, 4096, 97):
        compute[node * 8 : node * 8 + 8] = [3.0] * 8
    names = [f"{'x' * 50}-node-{i:04d}" for i in range(4096)]
    started = time.perf_counter()
    named = stragglers.name_stragglers(compute, layout, 8, (999_981, 1_000_000), 1.3, names)
    seconds = time.perf_counter() - started
    print(json.dumps({
        "nodes": 4096,
        "ranks": layout.world_size,
        "named": len(named),
        "report_bytes": len(stragglers.encode(named)),
        "comparison_s": round(seconds, 3),
        "gather_bytes_per_rank": 8 * layout.world_size,
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs each way (throttled, unthrottled), alternating")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--scale", action="store_true", help="only the comparison and report at 4,096 nodes")
    arguments = parser.parse_args()
    if arguments.scale:
        scale()
        return
    results = []
    for _ in range(arguments.runs):
        for throttled in (False, True):
            with tempfile.TemporaryDirectory(prefix="straggler-bench-") as folder:
                result = one_run(Path(folder), arguments.steps, throttled)
            print(json.dumps(result), flush=True)
            results.append(result)
    print(json.dumps({
        "runs_each_way": arguments.runs,
        "steps": arguments.steps,
        "false_positives": sum(r["false_positive"] for r in results),
        "misses": sum(r["miss"] for r in results),
        "detected_at_steps": [r["detected_at_step"] for r in results if r["throttled"]],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
