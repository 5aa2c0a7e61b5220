"""spec.parallelism and spec.gpusPerNode: the 3D sizes or a GPU budget, and their rules (sizes or a budget,
one budget, tensor groups inside a node or an NVLink domain, whole pods).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from paralleljob.api.fields import api_field
from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule
from paralleljob.api.sections.deepspeed import HAS_DEEPSPEED, ds_int
from paralleljob.api.sections.network import MNNVL_CEL, multi_node_nvlink
from paralleljob_contract.layout import tensor_fits

if TYPE_CHECKING:
    from paralleljob.api import types as t


@dataclasses.dataclass(frozen=True)
class Parallelism:
    """The 3D layout: pipeline (PP) x tensor (TP) x data (DP) parallel sizes, or a GPU budget to choose them for."""

    pipeline: int | None = api_field(
        "Pipeline-parallel size (PP): the number of pipeline stages the model's layers are split into. "
        "Stages exchange activations point to point, so the planner lays consecutive stages close in the fabric. "
        "Required unless gpus or nodes gives a budget; with a budget, a size given here is kept.",
        default=None,
        minimum=1,
    )
    tensor: int | None = api_field(
        "Tensor-parallel size (TP): the number of GPUs that split each layer's matrices (Megatron-style). "
        "A tensor-parallel group all-reduces four times per layer and micro-batch, so it must fit in one "
        "NVLink domain: a node, or a multi-node NVLink clique (see spec.topology.nvlinkDomainLabel). "
        "Required unless gpus or nodes gives a budget; with a budget, a size given here is kept.",
        default=None,
        minimum=1,
    )
    data: int | None = api_field(
        "Data-parallel size (DP): the number of model replicas. Optional: when absent it is derived from "
        "spec.deepspeed as train_batch_size / (train_micro_batch_size_per_gpu * gradient_accumulation_steps), "
        "or chosen with the layout when gpus or nodes gives a budget. Total GPUs = pipeline * tensor * data.",
        default=None,
        minimum=1,
    )
    gpus: int | None = api_field(
        "A GPU budget instead of sizes: at first admission the operator chooses pipeline x tensor x data = gpus, "
        "the micro-batch and accumulation for spec.deepspeed.train_batch_size, activation recomputation and "
        "the ZeRO stage, by modeled step time on the free nodes (as paralleljob plan --auto does), and records "
        "the choice in status.layoutChoice; restarts re-place but never re-choose. Needs train_batch_size.",
        default=None,
        minimum=1,
    )
    nodes: int | None = api_field(
        "A budget in nodes: gpus = nodes * spec.gpusPerNode (which it needs). Exclusive with gpus.",
        default=None,
        minimum=1,
    )
    sequence_parallel: bool | None = api_field(
        "Megatron sequence parallelism inside each tensor-parallel group: norms and residual adds run on 1/tensor of "
        "the sequence, an all-gather precedes each column-parallel linear and a reduce-scatter follows each "
        "row-parallel one (the same bytes as the all-reduces they replace), and activations outside the "
        "parallel regions take 1/tensor of the memory. Needs tensor > 1, given explicitly, dividing "
        "model.sequenceLength. Default: off.",
        default=None,
    )


_PAR = "self.parallelism"


_BUDGET = f"(has({_PAR}.gpus) || has({_PAR}.nodes))"


def budget_gpus(spec: t.ParallelJobSpec) -> int | None:
    """The GPU budget of spec.parallelism (gpus, or nodes x gpusPerNode), None when the sizes are given."""
    par = spec.parallelism
    if par.gpus is not None:
        return par.gpus
    if par.nodes is not None and spec.gpus_per_node is not None:
        return par.nodes * spec.gpus_per_node
    return None


def data_parallel_of(spec: t.ParallelJobSpec) -> int | None:
    """DP as the API derives it: spec.parallelism.data, else train_batch_size / (micro x GAS) when those three
    are given and divide; None when it cannot be derived (the batch rules report why)."""
    if spec.parallelism.data is not None:
        return spec.parallelism.data
    tbs, micro = ds_int(spec, "train_batch_size"), ds_int(spec, "train_micro_batch_size_per_gpu")
    gas = ds_int(spec, "gradient_accumulation_steps")
    if tbs is None or micro is None or gas is None or micro * gas <= 0 or tbs % (micro * gas):
        return None
    return tbs // (micro * gas)


def _sizes_or_budget(spec: t.ParallelJobSpec) -> Problem | None:
    par = spec.parallelism
    if (par.pipeline is not None and par.tensor is not None) or par.gpus is not None or par.nodes is not None:
        return None
    return error(
        "spec.parallelism",
        "needs pipeline and tensor, or a GPU budget (gpus, or nodes with gpusPerNode) for the operator to "
        "choose them; set one.",
    )


def _one_budget(spec: t.ParallelJobSpec) -> Problem | None:
    par = spec.parallelism
    if par.gpus is None or par.nodes is None:
        return None
    return error("spec.parallelism.nodes", "and gpus both give a budget; keep one.")


def _nodes_need_gpus_per_node(spec: t.ParallelJobSpec) -> Problem | None:
    if spec.parallelism.nodes is None or spec.gpus_per_node is not None:
        return None
    return error(
        "spec.parallelism.nodes",
        f"{spec.parallelism.nodes} nodes need spec.gpusPerNode to make a GPU budget; set it, or give gpus instead.",
    )


def _budget_matches_sizes(spec: t.ParallelJobSpec) -> Problem | None:
    par, gpus = spec.parallelism, spec.parallelism.gpus
    if gpus is None or None in (par.pipeline, par.tensor, par.data):
        return None
    assert par.pipeline is not None and par.tensor is not None and par.data is not None
    product = par.pipeline * par.tensor * par.data
    if product == gpus:
        return None
    return error(
        "spec.parallelism.gpus",
        f"{gpus} GPUs but pipeline {par.pipeline} x tensor {par.tensor} x data {par.data} = {product}; "
        "leave one size out for the operator to choose, or make them agree.",
    )


def _budget_needs_train_batch(spec: t.ParallelJobSpec) -> Problem | None:
    # A budget is given as soon as gpus or nodes is, as the CEL twin reads it, even when nodes lacks the
    # gpusPerNode that would make it a GPU count (its own rule says so).
    given = spec.parallelism.gpus is not None or spec.parallelism.nodes is not None
    if not given or ds_int(spec, "train_batch_size") is not None:
        return None
    return error(
        "spec.deepspeed.train_batch_size",
        "is needed with a GPU budget: the layout search splits this global batch into micro-batch x "
        "accumulation x DP; set it.",
    )


def _tensor_fits_node(spec: t.ParallelJobSpec) -> Problem | None:
    gpn, tp = spec.gpus_per_node, spec.parallelism.tensor
    if gpn is None or tp is None or multi_node_nvlink(spec) or tensor_fits(tp, gpn, multi_node_domain=False):
        return None
    # The largest divisor of gpusPerNode below tensor, found from tensor down (never gpusPerNode steps).
    divisor = next(d for d in range(min(gpn, tp), 0, -1) if gpn % d == 0)
    return error(
        "spec.parallelism.tensor",
        f"{tp} does not divide gpusPerNode {gpn}, so a tensor-parallel group would cross nodes and run its "
        f"all-reduces over the network; set tensor to a divisor of {gpn} (e.g. {divisor}) or, on a "
        "multi-node NVLink domain, set spec.topology.nvlinkDomainLabel and spec.network.imexChannelClaim.",
    )


def _tensor_fits_clique(spec: t.ParallelJobSpec) -> Problem | None:
    gpn, tp = spec.gpus_per_node, spec.parallelism.tensor
    if gpn is None or tp is None or not multi_node_nvlink(spec) or tensor_fits(tp, gpn, multi_node_domain=True):
        return None
    return error(
        "spec.parallelism.tensor",
        f"{tp} neither divides nor is a multiple of gpusPerNode {gpn}, so tensor-parallel groups would not "
        "line up with pods; make one a multiple of the other.",
    )


def _gpus_per_node_divides_world(spec: t.ParallelJobSpec) -> Problem | None:
    gpn, pp, tp, dp = spec.gpus_per_node, spec.parallelism.pipeline, spec.parallelism.tensor, data_parallel_of(spec)
    if not gpn or pp is None or tp is None or dp is None or dp <= 0:
        return None
    world = pp * tp * dp
    if world % gpn == 0:
        return None
    fits = [g for g in range(min(gpn, world), 0, -1) if world % g == 0 and g % tp == 0] or [world]
    return error(
        "spec.gpusPerNode",
        f"{gpn} does not divide the job's {world} GPUs (pipeline {pp} x tensor {tp} x data {dp}), so the ranks "
        f"cannot fill whole pods; set gpusPerNode to a divisor of {world} such as {fits[0]}, or remove it to let "
        "the planner choose.",
    )


def _sequence_parallel_needs_tensor(spec: t.ParallelJobSpec) -> Problem | None:
    tp, seq = spec.parallelism.tensor, spec.model.sequence_length
    if not spec.parallelism.sequence_parallel or (tp is not None and tp > 1 and seq % tp == 0):
        return None
    return error(
        "spec.parallelism.sequenceParallel",
        f"needs an explicit parallelism.tensor > 1 that divides model.sequenceLength {seq} (tensor is {tp}); "
        "set tensor, or turn sequenceParallel off.",
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "sizes-or-budget",
        ".parallelism",
        f"(has({_PAR}.pipeline) && has({_PAR}.tensor)) || {_BUDGET}",
        "parallelism needs pipeline and tensor, or a GPU budget (gpus, or nodes with gpusPerNode)",
        _sizes_or_budget,
    ),
    Rule(
        "one-budget",
        ".parallelism.nodes",
        f"!(has({_PAR}.gpus) && has({_PAR}.nodes))",
        "parallelism.gpus and parallelism.nodes both give a budget; keep one",
        _one_budget,
    ),
    Rule(
        "nodes-need-gpus-per-node",
        ".parallelism.nodes",
        f"!has({_PAR}.nodes) || has(self.gpusPerNode)",
        "parallelism.nodes needs gpusPerNode to make a GPU budget",
        _nodes_need_gpus_per_node,
    ),
    Rule(
        "budget-matches-sizes",
        ".parallelism.gpus",
        f"!(has({_PAR}.gpus) && has({_PAR}.pipeline) && has({_PAR}.tensor) && has({_PAR}.data)) "
        f"|| {_PAR}.pipeline * {_PAR}.tensor * {_PAR}.data == {_PAR}.gpus",
        "parallelism.pipeline * tensor * data must equal parallelism.gpus when all are given",
        _budget_matches_sizes,
    ),
    Rule(
        "budget-needs-train-batch",
        ".deepspeed.train_batch_size",
        f"!{_BUDGET} || (has(self.deepspeed) && has(self.deepspeed.train_batch_size))",
        "a GPU budget needs deepspeed.train_batch_size, the global batch the layout search splits",
        _budget_needs_train_batch,
    ),
    Rule(
        "tensor-fits-node",
        ".parallelism.tensor",
        f"!has(self.gpusPerNode) || !has(self.parallelism.tensor) || ({MNNVL_CEL}) "
        "|| self.gpusPerNode % self.parallelism.tensor == 0",
        "parallelism.tensor must divide gpusPerNode, so that each tensor-parallel group stays in one node",
        _tensor_fits_node,
    ),
    Rule(
        "tensor-fits-clique",
        ".parallelism.tensor",
        f"!has(self.gpusPerNode) || !has(self.parallelism.tensor) || !({MNNVL_CEL}) "
        "|| self.gpusPerNode % self.parallelism.tensor == 0 || self.parallelism.tensor % self.gpusPerNode == 0",
        "parallelism.tensor and gpusPerNode must divide one another in a multi-node NVLink domain",
        _tensor_fits_clique,
    ),
    Rule(
        "gpus-per-node-divides-world",
        ".gpusPerNode",
        "!has(self.gpusPerNode) || self.gpusPerNode == 0 || !has(self.parallelism.pipeline) "
        "|| !has(self.parallelism.tensor) || (has(self.parallelism.data) "
        "? (self.parallelism.pipeline * self.parallelism.tensor * self.parallelism.data) % self.gpusPerNode == 0 "
        f": (!({HAS_DEEPSPEED} && has(self.deepspeed.train_batch_size) && has(self.deepspeed.train_micro_batch_size_per_gpu) "
        "&& has(self.deepspeed.gradient_accumulation_steps)) "
        "|| self.deepspeed.train_micro_batch_size_per_gpu * self.deepspeed.gradient_accumulation_steps <= 0 "
        "|| self.deepspeed.train_batch_size % (self.deepspeed.train_micro_batch_size_per_gpu "
        "* self.deepspeed.gradient_accumulation_steps) != 0 "
        "|| (self.parallelism.pipeline * self.parallelism.tensor * (self.deepspeed.train_batch_size "
        "/ (self.deepspeed.train_micro_batch_size_per_gpu * self.deepspeed.gradient_accumulation_steps))) "
        "% self.gpusPerNode == 0))",
        "gpusPerNode must divide pipeline * tensor * data, so that the ranks fill whole pods",
        _gpus_per_node_divides_world,
    ),
    Rule(
        "sequence-parallel-needs-tensor",
        ".parallelism.sequenceParallel",
        f"!has({_PAR}.sequenceParallel) || !{_PAR}.sequenceParallel "
        f"|| (has({_PAR}.tensor) && {_PAR}.tensor > 1 && self.model.sequenceLength % {_PAR}.tensor == 0)",
        "parallelism.sequenceParallel needs parallelism.tensor > 1 dividing model.sequenceLength",
        _sequence_parallel_needs_tensor,
    ),
)
