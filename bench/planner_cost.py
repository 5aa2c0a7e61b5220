"""Modeled communication per step, planned vs naive (free nodes in name order), on fragmented clusters.

    .venv/bin/python -m bench.planner_cost [--seeds 5]

For each busy fraction and seed: a synthetic cluster of 256 8-GPU A100 nodes, 32 nodes per leaf and 4 leaves
per block, with that fraction of nodes busy; plans examples/gpt-13b-fragmented.yaml (16 nodes) and a 64-node
GPT-175B-shaped job (PP 8 x TP 8 x DP 8) and prints the mean planned and naive costs and their ratio.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics

import yaml

from bench import common
from paralleljob import planning
from paralleljob.api import validate_document
from paralleljob.planning import synth

EXAMPLES = pathlib.Path(__file__).parents[1] / "examples"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    example = validate_document(yaml.safe_load((EXAMPLES / "gpt-13b-fragmented.yaml").read_text())).resolved
    assert example is not None
    jobs = {
        "gpt-13b (16 nodes)": example,
        "gpt-175b 8x8x8 (64 nodes)": common.gpt_175b_job("gpt-175b-512", 8, 8, 8, micro_batches=192),
    }
    print(f"{'job':<28}{'busy':>6}{'planned s':>11}{'naive s':>10}{'naive/planned':>15}")
    for label, job in jobs.items():
        for busy in (0.0, 0.2, 0.4, 0.6):
            planned, naive = [], []
            for seed in range(args.seeds):
                spec = synth.SynthSpec(nodes=256, gpus_per_node=8, leaves=8, blocks=2, busy=busy, seed=seed)
                plan = planning.plan_job(job, planning.build_cluster(*synth.synth_cluster(spec)))
                if isinstance(plan, planning.Plan) and plan.naive_cost is not None:
                    planned.append(plan.cost.seconds)
                    naive.append(plan.naive_cost.seconds)
            if planned:
                p, n = statistics.mean(planned), statistics.mean(naive)
                print(f"{label:<28}{busy:>6.1f}{p:>11.3f}{n:>10.3f}{n / p:>15.2f}")


if __name__ == "__main__":
    main()
