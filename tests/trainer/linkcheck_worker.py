"""One rank of the link check, run in a simulated node's network namespace by tests/trainer/test_linkcheck.py.

Forms a gloo group over the namespaces' addresses (MASTER_ADDR is node 0's), builds the tensor and data groups
of the layout as DeepSpeed's grid does, runs `linkcheck.run_check` and `verdict`, and rank 0 writes the
verdict as JSON to the path in argv[1]. Layout from argv[2:5] (pipeline tensor data) and ranks per node argv[5].
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from paralleljob_contract.layout import Coord, Layout
from paralleljob_trainer import linkcheck


def _groups(layout: Layout, rank: int) -> tuple[object, object]:
    """This rank's tensor and data groups; every rank creates every group, in the same order (torch's rule)."""
    mine: dict[str, object] = {}
    p, t, d = layout.pipeline, layout.tensor, layout.data
    for kind, members in [
        *[("tensor", [layout.rank(Coord(s, r, m)) for m in range(t)]) for s in range(p) for r in range(d)],
        *[("data", [layout.rank(Coord(s, r, m)) for r in range(d)]) for s in range(p) for m in range(t)],
    ]:
        group = dist.new_group(members)
        if rank in members:
            mine[kind] = group
    return mine["tensor"], mine["data"]


def main() -> None:
    out = Path(sys.argv[1])
    layout = Layout(*(int(x) for x in sys.argv[2:5]))
    ranks_per_node = int(sys.argv[5])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    tensor_group, data_group = _groups(layout, rank)
    result = linkcheck.run_check(layout, ranks_per_node, tensor_group, data_group)
    names = linkcheck.node_names(layout.world_size // ranks_per_node) if result.slow else {}
    record = linkcheck.verdict(result, names)
    if rank == 0:
        out.write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
