"""The link check's own cost (spec.network.preflight): measured on four simulated nodes in network namespaces,
and modeled at 1,024 and 4,096 nodes.

    sudo .venv/bin/python -m bench.linkcheck_cost [--rounds 3]   (root: it makes network namespaces)

Measured: PP2 x DP2, one rank per node, gloo over veth pairs on one bridge (testcluster/netns.py), healthy and with
node 3's link slowed by `tc` to a tenth; prints the check's wall time on rank 0 (`costSeconds`, which includes
the buffers, the warm-ups, the barriers and the all-gather), best and worst of --rounds.

Modeled: what `linkcheck.run_check` does on 8-GPU nodes with 64 MiB per link, with the planner's H100 figures
(NVLink 900 GB/s, 50 GB/s per GPU on the network) and a per-message latency ALPHA: per repetition one TP ring
all-reduce inside the node, two pipeline phases, one DP ring all-reduce over the data-parallel size; 1 warm-up
and 3 repetitions; 3 barriers (a dissemination barrier, log2(ranks) rounds); one ring all-gather of 4 floats
per rank, whose (ranks - 1) latency steps dominate at scale.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MIB = 1 << 20
ALPHA = 10e-6  # seconds per message step on InfiniBand/RoCE
NVLINK, NETWORK = 900e9, 50e9
PASSES = 4  # one warm-up, three timed


def ring_all_reduce(ranks: int, nbytes: float, bandwidth: float) -> float:
    return 2 * (ranks - 1) * (ALPHA + nbytes / ranks / bandwidth) if ranks > 1 else 0.0


def modeled(nodes: int, pipeline: int = 8, tensor: int = 8, nbytes: float = 64 * MIB) -> dict[str, float]:
    ranks = nodes * 8
    data = ranks // (pipeline * tensor)
    per_pass = (
        ring_all_reduce(tensor, nbytes, NVLINK)
        + 2 * (ALPHA + nbytes / NETWORK)
        + ring_all_reduce(data, nbytes, NETWORK)
    )
    barriers = 3 * 2 * math.ceil(math.log2(ranks)) * ALPHA
    gather = (ranks - 1) * (ALPHA + 16 / NETWORK)
    total = PASSES * per_pass + barriers + gather
    return {
        "nodes": nodes,
        "ranks": ranks,
        "layout": f"PP{pipeline}xTP{tensor}xDP{data}",
        "links_s": PASSES * per_pass,
        "barriers_s": barriers,
        "all_gather_s": gather,
        "total_s": total,
    }


def measured(rounds: int) -> dict[str, list[float]]:
    from paralleljob_contract.layout import Layout
    from testcluster import netns

    costs: dict[str, list[float]] = {"healthy": [], "slowed": []}
    bridge = netns.Bridge("bc", 4, subnet=9)
    try:
        with tempfile.TemporaryDirectory() as folder:
            for index in range(rounds):
                record = netns.run_linkcheck_ranks(bridge, Path(folder) / f"h{index}.json", Layout(2, 1, 2))
                costs["healthy"].append(record["costSeconds"])
            bridge.slow(3, min(c["medianGBps"] for c in record["classes"].values()) * 8000 / 10)
            for index in range(rounds):
                record = netns.run_linkcheck_ranks(bridge, Path(folder) / f"s{index}.json", Layout(2, 1, 2))
                costs["slowed"].append(record["costSeconds"])
    finally:
        bridge.close()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model-only", action="store_true")
    args = parser.parse_args()
    for nodes in (1024, 4096):
        print(json.dumps({"modeled": modeled(nodes)}))
    if not args.model_only:
        for kind, costs in measured(args.rounds).items():
            print(json.dumps({"measured": kind, "nodes": 4, "best_s": min(costs), "worst_s": max(costs), "all": costs}))


if __name__ == "__main__":
    main()
