"""Wall time of `paralleljob plan --cluster` on a 10,000-node NodeList, as JSON and as YAML, against
`paralleljob validate` of the same job; and of `paralleljob plan --auto --gpus 1024` on the JSON file.

    .venv/bin/python -m bench.plan_cli [--nodes 10000] [--repeat 3] [--pad-kb 0]

Each command's figures are the best wall time and the best CPU time (user + system) of --repeat runs of the command as a user runs it (a new Python process:
imports, reading, validating, planning, printing JSON). The cluster is `cluster synth` with 8-GPU A100 nodes,
32 per leaf, 16 leaves per block, 30% busy (a PodList follows the nodes). `--pad-kb K` adds K KB per node
of the fields a real `kubectl get nodes -o json` carries (images, nodeInfo, addresses, managedFields), whose
nodes are 5-20 KB; the planner ignores them but the reader must get through them. Goals (issue 15): plan on
JSON <= 4x validate, on YAML <= 15x; the layout search for 1,024 GPUs <= 2 s (issue 17), also printed
alone in CPU seconds of this process.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

from paralleljob.planning import synth

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "gpt-175b-64xa100.yaml"


def padding(kilobytes: int, index: int) -> dict[str, Any]:
    """Fields of a real Node status of about `kilobytes` KB: container images, node info, addresses."""
    images = [
        {
            "names": [f"registry.example.com/team-{index % 97}/image-{i}@sha256:{'%064x' % (index * 1000 + i)}"],
            "sizeBytes": 1_000_000_000 + i,
        }
        for i in range(max(0, kilobytes * 1000 // 130))
    ]
    return {
        "images": images,
        "nodeInfo": {
            "kubeletVersion": "v1.31.4",
            "containerRuntimeVersion": "containerd://1.7.23",
            "kernelVersion": "6.8.0-1015-nvidia",
            "osImage": "Ubuntu 22.04.5 LTS",
            "architecture": "amd64",
        },
        "addresses": [{"type": "InternalIP", "address": f"10.{index // 65536}.{index // 256 % 256}.{index % 256}"}],
    }


def write_cluster(directory: pathlib.Path, nodes: int, pad_kb: int) -> tuple[pathlib.Path, pathlib.Path]:
    spec = synth.SynthSpec(
        nodes=nodes, gpus_per_node=8, leaves=max(1, nodes // 32), blocks=max(1, nodes // 512), busy=0.3, seed=1
    )
    node_dicts, pod_dicts = synth.synth_cluster(spec)
    if pad_kb:
        for index, node in enumerate(node_dicts):
            node["status"].update(padding(pad_kb, index))
    listing = {"apiVersion": "v1", "kind": "List", "items": [*node_dicts, *pod_dicts]}
    as_json, as_yaml = directory / "cluster.json", directory / "cluster.yaml"
    as_json.write_text(json.dumps(listing))
    as_yaml.write_text(yaml.dump(listing, Dumper=yaml.CSafeDumper))
    return as_json, as_yaml


def search_cpu_seconds(cluster_json: pathlib.Path, repeat: int) -> float:
    """CPU seconds of choose_layout alone (cluster already built) for 1,024 GPUs, best of `repeat`."""
    from paralleljob import planning
    from paralleljob.api import validate_document
    from paralleljob.planning import inventory, layout_search

    job = validate_document(yaml.safe_load(JOB.read_text())).resolved
    found = inventory.split_objects([json.loads(cluster_json.read_text())])
    cluster = planning.build_cluster(found.nodes, found.pods)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        layout_search.choose_layout(job, cluster, layout_search.Budget(1024))
        best = min(best, time.process_time() - start)
    return best


def best_of(repeat: int, command: list[str]) -> tuple[float, float]:
    """Best wall seconds and best CPU seconds (user + system of the child) of `repeat` runs."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = min(wall, time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = min(cpu, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            sys.exit(f"{' '.join(command)} exited {done.returncode}: {done.stdout[-500:]}{done.stderr[-500:]}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pad-kb", type=int, default=0)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "paralleljob"]
    with tempfile.TemporaryDirectory() as folder:
        as_json, as_yaml = write_cluster(pathlib.Path(folder), args.nodes, args.pad_kb)
        sizes = f"JSON {as_json.stat().st_size / 1e6:.0f} MB, YAML {as_yaml.stat().st_size / 1e6:.0f} MB"
        print(f"{args.nodes} nodes, 30% busy ({sizes}); best of {args.repeat} runs")
        commands = {
            "paralleljob validate": ["validate", str(JOB)],
            "plan --cluster JSON": ["plan", str(JOB), "--cluster", str(as_json), "-o", "json"],
            "plan --cluster YAML": ["plan", str(JOB), "--cluster", str(as_yaml), "-o", "json"],
            "plan --auto --gpus 1024 JSON": [
                *("plan", str(JOB), "--auto", "--gpus", "1024", "--cluster", str(as_json), "-o", "json")
            ],
        }
        rows = {name: best_of(args.repeat, [*cli, *words]) for name, words in commands.items()}
        wall0, cpu0 = rows["paralleljob validate"]
        print(f"{'command':<30} {'wall s':>8} {'x validate':>11} {'CPU s':>8} {'x validate':>11}")
        for name, (wall, cpu) in rows.items():
            print(f"{name:<30} {wall:>8.2f} {wall / wall0:>11.1f} {cpu:>8.2f} {cpu / cpu0:>11.1f}")
        search = search_cpu_seconds(as_json, args.repeat)
        print(f"choose_layout alone, 1,024 GPUs: {search:.2f} CPU s (cluster built, best of {args.repeat})")


if __name__ == "__main__":
    main()
