"""`plan_job()`: place a validated ParallelJob on a cluster, or say why it cannot be placed.

The steps, each in its own module: filter the nodes (`eligibility`), recognise the network levels
(`levels`), estimate memory and traffic (`estimates`), pick the nodes best-fit in the domain tree
(`placement`), number them in the order and axis order the cost model prices cheapest (`costmodel`), and
return a `Plan` or an `Unschedulable` (`plan`). The operator, the local runner and `paralleljob plan` call it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from paralleljob.api.validation import ResolvedJob
from paralleljob.planning import eligibility, estimates, placement, spares, usage
from paralleljob.planning.costmodel import CommCost, CostModel, Site, price, rank_groups
from paralleljob.planning.eligibility import MIB, Tally
from paralleljob.planning.estimates import GIB, Workload
from paralleljob.planning.inventory import GPU_RESOURCE, Cluster, NodeInfo
from paralleljob.planning.levels import LinkLevel, detect_levels, detect_nvlink_label, label_keys, path_of
from paralleljob.planning.plan import Estimates, NodePlan, PlacementCost, Plan, SpareNode, Unschedulable
from paralleljob_contract.layout import AXIS_ORDERS, PIPE_DATA_MODEL, AxisOrder, Layout, node_ranks, tensor_fits


@dataclasses.dataclass(frozen=True)
class PlanningOptions:
    """Knobs of the planner; the defaults are what the operator and the CLI use."""

    cost_model: CostModel = dataclasses.field(default_factory=CostModel)
    ranks_per_node: int | None = None  # the pods' GPUs, fixed over spec.gpusPerNode (`paralleljob run`'s slots)


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every placement attempt of one job shares."""

    job: ResolvedJob
    work: Workload
    levels: tuple[str, ...]
    nvlink_label: str | None
    axis_orders: tuple[AxisOrder, ...]
    options: PlanningOptions
    nvlink_note: str | None = None  # why an NVLink domain label of the nodes or spec is unused (no IMEX channel)


@dataclasses.dataclass(frozen=True)
class _Miss:
    """One failed attempt (a GPU product and ranks per node) and why."""

    nodes_needed: int
    gpus: int
    product: str
    qualifying: int
    tally: Tally


def plan_job(job: ResolvedJob, cluster: Cluster, options: PlanningOptions | None = None) -> Plan | Unschedulable:
    """Place `job` on `cluster`: a Plan, or an Unschedulable that says what is missing."""
    ctx = _context(job, cluster, options or PlanningOptions())
    spec = job.spec
    screened, tally = eligibility.screen(cluster.nodes, spec.template.node_selector, spec.template.tolerations)
    screened, short = eligibility.with_resources(screened, pod_requests(job))
    tally = tally.merged(short)
    groups = eligibility.by_product(screened, spec.topology.allow_mixed_gpu_products)
    candidates = ranks_per_node_candidates(job, cluster.nodes, ctx.nvlink_label, ctx.options.ranks_per_node)
    memory = estimates.memory_per_gpu(ctx.work)
    plans: list[Plan] = []
    misses: list[_Miss] = []
    for product, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        fitting, memory_tally = eligibility.with_memory(members, memory.total, memory.stage)
        rejected = tally.merged(memory_tally).merged(eligibility.other_products(groups, product))
        outcome = _first_fit(ctx, product, fitting, candidates, rejected)
        if isinstance(outcome, Plan):
            plans.append(outcome)
        else:
            misses.extend(outcome)
    if plans:
        return min(plans, key=lambda plan: (plan.estimates.step_seconds, plan.gpu_product))
    if not misses:
        misses = [_Miss(job.world_size // candidates[0], candidates[0], "", 0, tally)]
    return _unschedulable(ctx, misses)


def spares_for(
    job: ResolvedJob,
    cluster: Cluster,
    nodes: Sequence[str],
    ranks_per_node: int,
    axis_order: AxisOrder,
    count: int,
    options: PlanningOptions | None = None,
    taken: Collection[str] = (),
) -> tuple[SpareNode, ...]:
    """Up to `count` more hot spares, chosen as at planning, for a job on `nodes` (node rank order) whose spare
    was used or lost; `taken`: its spares. None while one of `nodes` is missing (its replacement comes first)."""
    ctx = _context(job, cluster, options or PlanningOptions())
    by_name = {node.name: node for node in cluster.nodes}
    placed = [by_name[name] for name in nodes if name in by_name]
    if count <= 0 or not placed or len(placed) < len(nodes):
        return ()
    template = job.spec.template
    screened, _ = eligibility.screen(cluster.nodes, template.node_selector, template.tolerations)
    screened, _ = eligibility.with_resources(screened, pod_requests(job))
    if not job.spec.topology.allow_mixed_gpu_products:  # the products the job runs on
        screened = [node for node in screened if node.product in {placed_node.product for placed_node in placed}]
    memory = estimates.memory_per_gpu(ctx.work)
    screened, _ = eligibility.with_memory(screened, memory.total, memory.stage)
    qualifying, _ = eligibility.with_free_gpus(screened, ranks_per_node)
    held = {*nodes, *taken}
    free = [(node, _site(node, ctx)) for node in qualifying if node.name not in held]
    layout = Layout(job.pipeline, job.tensor, job.data, axis_order)
    sites = [_site(node, ctx) for node in placed]
    product = _slowest_product(placed, ctx.options.cost_model)
    volume, bandwidth = estimates.comm_bytes(ctx.work), ctx.options.cost_model.link_bandwidths(product)
    cost_of = spares.ReplacementPrice(ranks_per_node, sites, rank_groups(layout, ranks_per_node), volume, bandwidth)
    same_nvlink = bool(ctx.nvlink_label) and job.tensor > ranks_per_node
    chosen = spares.choose_spares(count, sites, free, cost_of, same_nvlink=same_nvlink)
    return tuple(SpareNode(node.name, ranks_per_node, rank, _domains(node, ctx)) for node, rank in chosen)


def pod_requests(job: ResolvedJob) -> dict[str, int]:
    """What each pod of the job requests besides its GPUs (`spec.template.resources`), in milli-units."""
    found = usage.requests_of(job.spec.template.resources)
    found.pop(GPU_RESOURCE, None)
    return found


def ranks_per_node_candidates(
    job: ResolvedJob, nodes: Sequence[NodeInfo], nvlink_label: str | None = None, fixed: int | None = None
) -> list[int]:
    """`fixed`, else spec.gpusPerNode, else each size that divides the world, fits a node and suits TP, largest first.

    With the NVLink domain label the planner uses (the spec's, or Topograph's found on the nodes; only when
    the pods get an IMEX channel, see `_context`) a size may divide TP too.
    """
    if given := fixed or job.spec.gpus_per_node:
        return [given]
    largest = max((node.allocatable_gpus for node in nodes), default=0)
    clique = nvlink_label is not None
    world, tp = job.world_size, job.tensor
    fits = [
        g for g in range(min(largest, world), 0, -1) if world % g == 0 and tensor_fits(tp, g, multi_node_domain=clique)
    ]
    return fits or [tp if world % tp == 0 else world]


def _context(job: ResolvedJob, cluster: Cluster, options: PlanningOptions) -> _Context:
    topology = job.spec.topology
    present = label_keys(cluster.nodes) if not (topology.levels and topology.nvlink_domain_label) else set()
    levels = tuple(topology.levels) if topology.levels else detect_levels(present)
    orders = tuple(AXIS_ORDERS.values()) if topology.axis_order == "auto" else (AXIS_ORDERS[topology.axis_order],)
    work = Workload.from_job(job)
    nvlink_label = topology.nvlink_domain_label or detect_nvlink_label(present)
    if nvlink_label is None or job.spec.network.imex_channel_claim is not None:
        return _Context(job, work, levels, nvlink_label, orders, options)
    # Without an IMEX channel NCCL cannot use NVLink between nodes: each node is its own NVLink domain.
    note = (
        f"the NVLink domain label {nvlink_label} is not used: the pods get no IMEX channel, so tensor-parallel "
        "groups stay inside one node and NCCL_MNNVL_ENABLE=0; set spec.network.imexChannelClaim to a "
        "ComputeDomain's channel claim in spec.template.resourceClaims to use multi-node NVLink"
    )
    return _Context(job, work, levels, None, orders, options, note)


def _first_fit(
    ctx: _Context, product: str, nodes: list[NodeInfo], candidates: list[int], rejected: Tally
) -> Plan | list[_Miss]:
    misses: list[_Miss] = []
    for gpus in candidates:
        outcome = _place(ctx, product, nodes, gpus, rejected)
        if isinstance(outcome, Plan):
            return outcome
        misses.append(outcome)
    return misses


def _place(ctx: _Context, product: str, nodes: list[NodeInfo], gpus: int, rejected: Tally) -> Plan | _Miss:
    world = ctx.job.world_size
    qualifying, busy = eligibility.with_free_gpus(nodes, gpus)
    unit = ctx.job.tensor // gpus if ctx.nvlink_label and ctx.job.tensor > gpus else 1
    units, left_over = placement.make_units(qualifying, ctx.levels, gpus, unit, ctx.nvlink_label)
    need = world // gpus // unit
    chosen = placement.select_units(units, need, len(ctx.levels))
    if chosen is None:
        tally = rejected.merged(busy)
        if left_over:
            phrase = f"in NVLink domains ({ctx.nvlink_label}) with fewer than {unit} qualifying nodes"
            tally.add(f"is left over {phrase}", f"are left over {phrase}", left_over)
        return _Miss(world // gpus, gpus, product, len(qualifying) - left_over, tally)
    return _best_plan(ctx, product, gpus, chosen, qualifying, units)


def _best_plan(
    ctx: _Context,
    product: str,
    gpus: int,
    chosen: list[placement.Member],
    qualifying: list[NodeInfo],
    units: Sequence[placement.Member] = (),
) -> Plan:
    bandwidth = ctx.options.cost_model.link_bandwidths(product)
    volume = estimates.comm_bytes(ctx.work)
    base = Layout(ctx.job.pipeline, ctx.job.tensor, ctx.job.data)
    layouts = {order: base.with_order(order) for order in (*ctx.axis_orders, PIPE_DATA_MODEL)}
    groups = {order: rank_groups(layout, gpus) for order, layout in layouts.items()}
    best: tuple[tuple[float, float, int], list[NodeInfo], Layout, CommCost] | None = None
    for index, order in enumerate(placement.orderings(chosen)):
        nodes = [node for member in order for node in member.nodes]
        sites = [_site(node, ctx) for node in nodes]
        for axis_order in ctx.axis_orders:
            layout = layouts[axis_order]
            cost = price(layout, gpus, sites, volume, bandwidth, groups[axis_order])
            key = (round(cost.total, 12), round(cost.spread, 12), index)
            if best is None or key < best[0]:
                best = (key, nodes, layout, cost)
    assert best is not None
    _, nodes, layout, cost = best
    naive = _naive_cost(ctx, gpus, qualifying, volume, bandwidth, groups)
    plan = _build_plan(ctx, product, gpus, nodes, layout, cost, naive)
    count = ctx.job.spec.failure_policy.spare_nodes
    if not count:
        return plan
    placed = [_site(node, ctx) for node in nodes]
    cost_of = spares.ReplacementPrice(gpus, placed, groups[layout.axis_order], volume, bandwidth)
    return _with_spares(ctx, plan, placed, _free_sites(ctx, nodes, units, qualifying), count, cost_of)


def _free_sites(
    ctx: _Context, nodes: list[NodeInfo], units: Sequence[placement.Member], qualifying: list[NodeInfo]
) -> list[tuple[NodeInfo, Site]]:
    """The qualifying nodes the plan left free, with their sites; single-node units carry their paths already."""
    taken = {node.name for node in nodes}
    if all(len(unit.nodes) == 1 for unit in units):
        return [
            (unit.nodes[0], Site(unit.nodes[0].name, _nvlink_of(unit.nodes[0], ctx), unit.path))
            for unit in units
            if unit.nodes[0].name not in taken
        ]
    return [(node, _site(node, ctx)) for node in qualifying if node.name not in taken]


def _with_spares(
    ctx: _Context,
    plan: Plan,
    placed: list[Site],
    free: list[tuple[NodeInfo, Site]],
    count: int,
    cost_of: spares.Price,
) -> Plan:
    """The plan with up to `count` hot spares from the qualifying nodes it left free; a warning when fewer."""
    same_nvlink = bool(ctx.nvlink_label) and ctx.job.tensor > plan.ranks_per_node
    chosen = spares.choose_spares(count, placed, free, cost_of, same_nvlink=same_nvlink)
    found = tuple(SpareNode(node.name, plan.ranks_per_node, rank, _domains(node, ctx)) for node, rank in chosen)
    warnings = plan.warnings
    if len(found) < count:
        where = f"with {plan.ranks_per_node} free GPUs{' in the NVLink domains of the job' if same_nvlink else ''}"
        asked = f"spare nodes asked for (spec.failurePolicy.spareNodes) {'are' if found else 'is'} free {where}"
        warnings += (
            f"Only {len(found)} of the {count} {asked}; the job holds those, and the operator holds more as nodes "
            "free up."
            if found
            else f"None of the {count} {asked}; the job runs without spares until nodes free up.",
        )
    return dataclasses.replace(plan, spares=found, warnings=warnings)


def _naive_cost(
    ctx: _Context,
    gpus: int,
    qualifying: list[NodeInfo],
    volume: estimates.CommBytes,
    bandwidth: Mapping[LinkLevel, float],
    groups: Mapping[AxisOrder, Mapping[str, list[list[int]]]],
) -> CommCost | None:
    """A topology-oblivious scheduler's placement: the first free nodes by name, the default axis order."""
    count = ctx.job.world_size // gpus
    if len(qualifying) < count:
        return None
    order = ctx.axis_orders[0] if len(ctx.axis_orders) == 1 else PIPE_DATA_MODEL
    layout = Layout(ctx.job.pipeline, ctx.job.tensor, ctx.job.data, order)
    sites = [_site(node, ctx) for node in qualifying[:count]]  # qualifying nodes keep the cluster's name order
    return price(layout, gpus, sites, volume, bandwidth, groups[order])


def _site(node: NodeInfo, ctx: _Context) -> Site:
    return Site(node.name, _nvlink_of(node, ctx), path_of(node, ctx.levels))


def _nvlink_of(node: NodeInfo, ctx: _Context) -> str:
    return node.labels.get(ctx.nvlink_label, "") if ctx.nvlink_label else ""


def _build_plan(
    ctx: _Context,
    product: str,
    gpus: int,
    nodes: list[NodeInfo],
    layout: Layout,
    cost: CommCost,
    naive: CommCost | None,
) -> Plan:
    entries = tuple(_node_plan(rank, node, gpus, layout, ctx) for rank, node in enumerate(nodes))
    product = product or _slowest_product(nodes, ctx.options.cost_model)
    memory = [node.gpu_memory_mib for node in nodes if node.gpu_memory_mib is not None]
    gpu_memory = min(memory) * MIB if memory else None
    figures = _estimates(ctx, product, cost, gpu_memory)
    return Plan(
        layout=layout,
        ranks_per_node=gpus,
        nodes=entries,
        estimates=figures,
        cost=_placement_cost(cost),
        naive_cost=None if naive is None else _placement_cost(naive),
        gpu_product=product,
        levels=ctx.levels,
        nvlink_domain_label=ctx.nvlink_label,
        warnings=tuple(_warnings(ctx, figures)),
    )


def _node_plan(node_rank: int, node: NodeInfo, gpus: int, layout: Layout, ctx: _Context) -> NodePlan:
    ranks = tuple(node_ranks(node_rank, gpus))
    return NodePlan(node_rank, node.name, gpus, ranks, tuple(layout.coord(r) for r in ranks), _domains(node, ctx))


def _domains(node: NodeInfo, ctx: _Context) -> dict[str, str]:
    """The node's value of each network level and of the NVLink label it has."""
    domains = {level: node.labels[level] for level in ctx.levels if node.labels.get(level)}
    if ctx.nvlink_label and node.labels.get(ctx.nvlink_label):
        domains[ctx.nvlink_label] = node.labels[ctx.nvlink_label]
    return domains


def _slowest_product(nodes: list[NodeInfo], model: CostModel) -> str:
    return min({node.product for node in nodes}, key=lambda p: (model.profile(p).peak_tflops, p))


def _placement_cost(cost: CommCost) -> PlacementCost:
    return PlacementCost(
        cost.total,
        {"tensor": cost.tensor, "pipeline": cost.pipeline, "data": cost.data},
        {
            "tensor": cost.tensor_level.name.lower(),
            "pipeline": cost.pipeline_level.name.lower(),
            "data": cost.data_level.name.lower(),
        },
    )


def _estimates(ctx: _Context, product: str, cost: CommCost, gpu_memory: float | None) -> Estimates:
    work, model = ctx.work, ctx.options.cost_model
    memory = estimates.memory_per_gpu(work)
    by_stage: dict[str, float] = {
        stage: estimates.stage_memory(work, stage).total for stage in estimates.end_stages(work)
    }
    volume = estimates.comm_bytes(work)
    flops = estimates.flops_per_step(work)
    model_flops = estimates.model_flops_per_step(work)
    peak = model.peak_flops(product)
    step = estimates.step_time(work, peak, model.kernel_efficiency, cost.tensor, cost.pipeline, cost.data).total
    bandwidths = {level.name.lower(): bps / 1e9 for level, bps in model.link_bandwidths(product).items()}
    return Estimates(
        parameters=work.parameters,
        memory={
            "weights": memory.weights,
            "gradients": memory.gradients,
            "optimizer": memory.optimizer,
            "activations": memory.activations,
            "reserve": memory.reserve,
            "total": memory.total,
        },
        gpu_memory=gpu_memory,
        bubble_fraction=estimates.bubble_fraction(work),
        bytes_per_step={"tensor": volume.tensor, "pipeline": volume.pipeline, "data": volume.data},
        flops_per_step=flops,
        step_seconds=step,
        mfu=model_flops / (step * work.world_size * peak),
        assumptions={
            "gpuProduct": product,
            "peakTFLOPS": peak / 1e12,
            "kernelEfficiency": model.kernel_efficiency,
            "bandwidthGBps": bandwidths,
            "zeroStage": work.zero_stage,
            "activationRecomputation": work.recompute,
        },
        memory_stage=memory.stage,
        memory_by_stage=by_stage,
        model_flops_per_step=model_flops,
    )


def _warnings(ctx: _Context, figures: Estimates) -> list[str]:
    found: list[str] = [f"{ctx.nvlink_note[0].upper()}{ctx.nvlink_note[1:]}."] if ctx.nvlink_note else []
    if figures.gpu_memory is None:
        found.append(
            f"GPU memory is unknown (no nvidia.com/gpu.memory label), so the estimate of "
            f"{figures.memory['total'] / GIB:.1f} GiB per GPU was not checked."
        )
    else:
        advice = _smaller_model_parallel(ctx.work, figures.gpu_memory)
        if advice:
            found.append(advice)
    return found


def _smaller_model_parallel(work: Workload, gpu_memory: float) -> str | None:
    """Megatron's rule: tp*pp just large enough to fit, the rest DP. Say so when DP is 1 but tp*pp could shrink."""
    if work.data != 1 or work.tensor * work.pipeline == 1:
        return None
    options = []
    for tp in range(1, work.tensor + 1):
        for pp in range(1, min(work.pipeline, work.layers) + 1):
            group = tp * pp
            if group >= work.world_size or work.world_size % group or work.heads % tp or work.tensor % tp:
                continue
            trial = work.with_sizes(pp, tp, work.world_size // group)
            total = estimates.memory_per_gpu(trial).total
            if total <= gpu_memory:
                options.append((group, -tp, pp, total))
    if not options:
        return None
    group, neg_tp, pp, total = min(options)
    return (
        f"DP is 1 while tensor x pipeline = {work.tensor * work.pipeline} GPUs hold one replica; tensor {-neg_tp} x "
        f"pipeline {pp} would fit ({total / GIB:.1f} of {gpu_memory / GIB:.0f} GiB per GPU), leaving DP "
        f"{work.world_size // group}: make tensor x pipeline just large enough to fit, then scale with DP."
    )


def _unschedulable(ctx: _Context, misses: list[_Miss]) -> Unschedulable:
    closest = max(misses, key=lambda m: (m.qualifying / m.nodes_needed, m.gpus))
    shortfalls = closest.tally.shortfalls()
    of_product = f" of {closest.product}" if closest.product else ""
    message = f"needs {closest.nodes_needed} nodes with {closest.gpus} free {GPU_RESOURCE}{of_product}; "
    message += f"{closest.qualifying} {'qualifies' if closest.qualifying == 1 else 'qualify'}"
    if shortfalls:
        message += ": " + ", ".join(s.render() for s in shortfalls)
    others = sorted({(m.nodes_needed, m.gpus) for m in misses if m is not closest and m.gpus != closest.gpus})
    if others:
        message += "; also tried " + ", ".join(f"{n} nodes x {g} GPUs" for n, g in others)
    if ctx.nvlink_note:
        message += f"; {ctx.nvlink_note}"
    return Unschedulable(
        nodes_needed=closest.nodes_needed,
        gpus_per_node=closest.gpus,
        gpu_product=closest.product,
        qualifying=closest.qualifying,
        shortfalls=shortfalls,
        message=message,
    )
