"""`paralleljob cluster synth`: print a synthetic GPU cluster (a NodeList, and bound Pods with --busy).

For examples, tests and benchmarks of the planner; `paralleljob plan --cluster FILE` reads the output.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from paralleljob.planning import synth


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "cluster",
        help="synthetic clusters for planning",
        description="Tools for cluster files that `paralleljob plan --cluster` reads.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    synth_parser = actions.add_parser(
        "synth",
        help="print a synthetic NodeList (and bound Pods with --busy)",
        description="Print a realistic NodeList: GPU product, memory and network-level labels, allocatable "
        "nvidia.com/gpu. With --busy a second YAML document follows: a List of bound Pods holding half or all "
        "of the GPUs of that fraction of the nodes.",
    )
    synth_parser.add_argument("--nodes", type=_positive, required=True, metavar="N")
    synth_parser.add_argument("--gpus-per-node", type=_positive, required=True, metavar="G")
    synth_parser.add_argument("--leaves", type=_positive, default=1, metavar="L", help="leaf switches (default 1)")
    synth_parser.add_argument("--blocks", type=_positive, default=1, metavar="B", help="blocks of leaves (default 1)")
    synth_parser.add_argument("--gpu-product", default=synth.DEFAULT_PRODUCT, metavar="P")
    synth_parser.add_argument("--busy", type=_fraction, default=0.0, metavar="FRACTION")
    synth_parser.add_argument("--seed", type=int, default=0, metavar="S")
    synth_parser.add_argument(
        "--labels", choices=sorted(synth.LABEL_FAMILIES), default="nvidia", help="network label family"
    )
    synth_parser.set_defaults(run=run_synth)


def run_synth(args: argparse.Namespace) -> int:
    if args.leaves > args.nodes or args.blocks > args.leaves:
        print("paralleljob cluster synth: need nodes >= leaves >= blocks", file=sys.stderr)
        return 2
    spec = synth.SynthSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        leaves=args.leaves,
        blocks=args.blocks,
        gpu_product=args.gpu_product,
        busy=args.busy,
        seed=args.seed,
        family=args.labels,
    )
    nodes, pods = synth.synth_cluster(spec)
    documents = [synth.node_list(nodes)] + ([synth.pod_list(pods)] if args.busy else [])
    yaml.safe_dump_all(documents, sys.stdout, sort_keys=False, width=120)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value
