"""An SVG picture of a Plan: the cluster's network domains as nested frames, each node of the job coloured
by the pipeline stage it holds and labelled with its node rank and ranks; other nodes in the same leaves are
drawn grey, so fragmentation shows. `paralleljob plan -o svg` writes it. Pure: a string out, no files.
"""

from __future__ import annotations

import dataclasses
from html import escape

from paralleljob.planning.inventory import Cluster, NodeInfo
from paralleljob.planning.levels import path_of
from paralleljob.planning.plan import NodePlan, Plan

# Tableau-like qualitative palette: neighbouring stages get clearly different hues.
STAGE_COLOURS = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#8cd17d",
)  # fmt: skip
NODE_W, NODE_H, GAP, PAD, COLUMNS = 150, 62, 10, 14, 4
MAX_OTHERS_PER_LEAF = 8
FONT = "font-family='Inter,Helvetica,Arial,sans-serif'"


@dataclasses.dataclass(frozen=True)
class _Box:
    x: float
    y: float
    w: float
    h: float

    @property
    def centre(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h / 2


def render_svg(plan: Plan, cluster: Cluster | None = None, title: str = "") -> str:
    """The picture as SVG text."""
    leaves = _leaves(plan, cluster)
    frames: list[str] = []
    body: list[str] = []
    centres: dict[int, tuple[float, float]] = {}
    y, width = 96.0, 720.0
    for parent, members in _by_parent(leaves):
        frame_y, x, row_h = y, PAD * 2.0, 0.0
        y += 30 if parent else 0
        for path, (planned, others) in members:
            w, h = _leaf_size(
                len(planned) + min(len(others), MAX_OTHERS_PER_LEAF) + (len(others) > MAX_OTHERS_PER_LEAF)
            )
            if x + w > 1400 and x > PAD * 2:
                x, y, row_h = PAD * 2.0, y + row_h + GAP * 2, 0.0
            box = _Box(x, y, w, h)
            frames += _frame(box, path[-1] if path else "all nodes (flat network)", "#f8f9fb", stroke="#c5ccd6")
            body += _leaf(planned, others, box, plan, centres)
            x, row_h, width = x + w + GAP * 2, max(row_h, h), max(width, x + w + PAD * 2)
        y += row_h + GAP * 2
        if parent:
            frames[0:0] = _frame(_Box(PAD, frame_y, width - PAD * 2, y - frame_y), " / ".join(parent), "#eef1f5")
        y += GAP * 2
    height = y + 40
    lines = _pipeline_path(plan, centres)
    header = _header(plan, title)
    legend = _legend(plan, height - 30)
    return "\n".join(
        [
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
            f"viewBox='0 0 {width:.0f} {height:.0f}' {FONT}>",
            f"<rect width='{width:.0f}' height='{height:.0f}' fill='#ffffff'/>",
            *header,
            *frames,
            *lines,  # under the nodes: the route shows in the gaps between them
            *body,
            *legend,
            "</svg>",
        ]
    )


def _leaves(plan: Plan, cluster: Cluster | None) -> dict[tuple[str, ...], tuple[list[NodePlan], list[NodeInfo]]]:
    """Leaf path -> (the job's nodes in it, the cluster's other nodes in it)."""
    infos = cluster.by_name() if cluster else {}
    levels = plan.levels
    leaves: dict[tuple[str, ...], tuple[list[NodePlan], list[NodeInfo]]] = {}
    for entry in plan.nodes:
        path = tuple(entry.domains.get(level, "") for level in levels)
        leaves.setdefault(path, ([], []))[0].append(entry)
    planned = {entry.node for entry in plan.nodes}
    for info in infos.values():
        path = path_of(info, levels)
        if path in leaves and info.name not in planned:
            leaves[path][1].append(info)
    return dict(sorted(leaves.items()))


def _by_parent(
    leaves: dict[tuple[str, ...], tuple[list[NodePlan], list[NodeInfo]]],
) -> list[tuple[tuple[str, ...], list[tuple[tuple[str, ...], tuple[list[NodePlan], list[NodeInfo]]]]]]:
    groups: dict[tuple[str, ...], list[tuple[tuple[str, ...], tuple[list[NodePlan], list[NodeInfo]]]]] = {}
    for path, members in leaves.items():
        groups.setdefault(path[:-1], []).append((path, members))
    return list(groups.items())


def _leaf_size(count: int) -> tuple[float, float]:
    columns = max(1, min(COLUMNS, count))
    rows = -(-count // columns)
    return columns * (NODE_W + GAP) - GAP + PAD * 2, rows * (NODE_H + GAP) - GAP + PAD * 2 + 22


def _leaf(
    planned: list[NodePlan],
    others: list[NodeInfo],
    box: _Box,
    plan: Plan,
    centres: dict[int, tuple[float, float]],
) -> list[str]:
    out: list[str] = []
    shown: list[NodePlan | NodeInfo | str] = [*planned, *others[:MAX_OTHERS_PER_LEAF]]
    if len(others) > MAX_OTHERS_PER_LEAF:
        shown.append(f"+{len(others) - MAX_OTHERS_PER_LEAF} more")
    for i, item in enumerate(shown):
        row, column = divmod(i, COLUMNS)
        cell = _Box(box.x + PAD + column * (NODE_W + GAP), box.y + PAD + 22 + row * (NODE_H + GAP), NODE_W, NODE_H)
        if isinstance(item, NodePlan):
            out += _planned_node(item, cell, plan)
            centres[item.node_rank] = cell.centre
        elif isinstance(item, NodeInfo):
            out += _other_node(item, cell)
        else:
            out.append(_text(cell.x + 8, cell.y + NODE_H / 2 + 4, item, 12, "#6b7380"))
    return out


def _planned_node(entry: NodePlan, box: _Box, plan: Plan) -> list[str]:
    stages = entry.stages
    out: list[str] = [f"<g><title>{escape(_tooltip(entry))}</title>"]
    stripe = box.w / len(stages)
    out.append(
        f"<clipPath id='n{entry.node_rank}'><rect x='{box.x}' y='{box.y}' width='{box.w}' height='{box.h}' rx='7'/></clipPath>"
    )
    for i, stage in enumerate(stages):
        colour = STAGE_COLOURS[stage % len(STAGE_COLOURS)]
        out.append(
            f"<rect x='{box.x + i * stripe:.1f}' y='{box.y}' width='{stripe:.1f}' height='{box.h}' "
            f"fill='{colour}' clip-path='url(#n{entry.node_rank})'/>"
        )
    label = f"stage {stages[0]}" if len(stages) == 1 else f"stages {stages[0]}-{stages[-1]}"
    out += [
        _text(box.x + 8, box.y + 17, f"#{entry.node_rank} {_short(entry.node)}", 12, "#ffffff", bold=True),
        _text(box.x + 8, box.y + 35, f"ranks {entry.rank_range}", 12, "#ffffff"),
        _text(box.x + 8, box.y + 52, label, 11, "#ffffff"),
        "</g>",
    ]
    return out


def _other_node(info: NodeInfo, box: _Box) -> list[str]:
    state = "cordoned" if info.unschedulable else "not ready" if not info.ready else f"{info.free_gpus} free"
    return [
        f"<rect x='{box.x}' y='{box.y}' width='{box.w}' height='{box.h}' rx='7' fill='#e3e6eb' stroke='#cfd4dc'/>",
        _text(box.x + 8, box.y + 17, _short(info.name), 12, "#59606b"),
        _text(box.x + 8, box.y + 35, f"{info.allocatable_gpus} GPUs, {state}", 11, "#59606b"),
        _text(box.x + 8, box.y + 52, "other work" if info.used_gpus else "not used", 11, "#8a919c"),
    ]


def _pipeline_path(plan: Plan, centres: dict[int, tuple[float, float]]) -> list[str]:
    """A dashed line through the nodes of replica 0's stages, in stage order: the pipeline's route."""
    route: list[tuple[float, float]] = []
    for stage in range(plan.layout.pipeline):
        holder = next((n for n in plan.nodes if any(c.pipe == stage and c.data == 0 for c in n.coords)), None)
        if holder is not None and holder.node_rank in centres:
            point = centres[holder.node_rank]
            if not route or route[-1] != point:
                route.append(point)
    if len(route) < 2:
        return []
    points = " ".join(f"{x:.0f},{y:.0f}" for x, y in route)
    return [
        f"<polyline points='{points}' fill='none' stroke='#1f2430' stroke-width='3' stroke-dasharray='6 4' "
        "stroke-opacity='0.6'/>"
    ]


def _header(plan: Plan, title: str) -> list[str]:
    layout = plan.layout
    naive = plan.naive_cost
    cost = f"modeled communication {plan.cost.seconds:.2f} s/step"
    if naive is not None:
        cost += f" (naive placement {naive.seconds:.2f} s)"
    subtitle = (
        f"{layout.pipeline} x {layout.tensor} x {layout.data} (PP x TP x DP) on {len(plan.nodes)} nodes x "
        f"{plan.ranks_per_node} GPUs {plan.gpu_product}  ·  axis order {','.join(plan.axis_order)}  ·  {cost}"
    )
    return [
        _text(PAD, 34, title or "ParallelJob placement", 20, "#1f2430", bold=True),
        _text(PAD, 58, subtitle, 13, "#4a5260"),
        _text(PAD, 78, "dashed line: replica 0's pipeline, stage by stage", 11, "#8a919c"),
    ]


def _legend(plan: Plan, y: float) -> list[str]:
    out = [_text(PAD, y + 12, "stage", 12, "#4a5260")]
    for stage in range(min(plan.layout.pipeline, 24)):
        x = PAD + 48 + stage * 40
        out.append(f"<rect x='{x}' y='{y}' width='34' height='16' rx='3' fill='{STAGE_COLOURS[stage % 12]}'/>")
        out.append(_text(x + 12, y + 12, str(stage), 11, "#ffffff", bold=True))
    return out


def _frame(box: _Box, label: str, fill: str, stroke: str = "#d5dbe3") -> list[str]:
    return [
        f"<rect x='{box.x}' y='{box.y}' width='{box.w}' height='{box.h}' rx='10' fill='{fill}' stroke='{stroke}'/>",
        _text(box.x + 10, box.y + 18, label, 12, "#4a5260", bold=True),
    ]


def _text(x: float, y: float, text: str, size: int, colour: str, bold: bool = False) -> str:
    weight = " font-weight='600'" if bold else ""
    return f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' fill='{colour}'{weight}>{escape(text)}</text>"


def _short(name: str, limit: int = 14) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _tooltip(entry: NodePlan) -> str:
    domains = ", ".join(f"{k}={v}" for k, v in entry.domains.items())
    return f"node rank {entry.node_rank}: {entry.node}, ranks {entry.rank_range}, stages {list(entry.stages)} {domains}"
