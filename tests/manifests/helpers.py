"""What the tests of tests/manifests share besides their fixtures (those stay in conftest.py): import these from here,
never from a conftest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from paralleljob.api import ResolvedJob, validate_document
from paralleljob.planning import Estimates, NodePlan, PlacementCost, Plan
from paralleljob_contract.layout import Layout
from testcluster.admin import JOB_YAML


def resolve(text: str = JOB_YAML, **spec_patch: Any) -> ResolvedJob:
    """Validate a job document (optionally with top-level spec keys replaced) and return it resolved."""
    doc = yaml.safe_load(text)
    doc["spec"].update(spec_patch)
    result = validate_document(doc)
    assert result.resolved is not None, [p.render() for p in result.problems]
    return result.resolved


def make_plan(
    nodes: int = 4, gpus: int = 4, layout: tuple[int, int, int] = (2, 4, 2), names: Sequence[str] = ()
) -> Plan:
    """A planner's Plan, node rank r on `names[r]` (default `node-r`), pipe,data,model order, no estimates."""
    sizes = Layout(*layout)
    entries = []
    for rank in range(nodes):
        ranks = tuple(range(rank * gpus, (rank + 1) * gpus))
        name = names[rank] if names else f"node-{rank}"
        entries.append(NodePlan(rank, name, gpus, ranks, tuple(sizes.coord(r) for r in ranks)))
    nothing = Estimates(0.0, {}, None, 0.1, {}, 0.0, 0.0, 0.0, {})
    return Plan(sizes, gpus, tuple(entries), nothing, PlacementCost(0.0, {}, {}), None)


def make_node(
    name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Node dict with labels and allocatable resources."""
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"allocatable": allocatable or {}}}
