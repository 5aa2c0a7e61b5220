"""Cross-field rules of a ParallelJob spec, each written twice: as a CEL rule for the CRD and in Python. Each
spec section declares its own beside its types (`api.sections`); this module gathers them in order, with the
rules on the whole object (the name) and on updates (the fields that cannot change).

The CRD's `x-kubernetes-validations` reject a bad job at `kubectl apply`; the Python twin gives the same
verdict (with the numbers in the message) to `paralleljob validate`, the operator and the local runner.
`tests/api/test_cel_rules.py` evaluates both on the same specs and checks that they agree.

CEL cannot see fields that the schema preserves as unknown, so every DeepSpeed key a rule reads is declared
in `sections.deepspeed.DEEPSPEED_KNOWN_PROPERTIES`. CEL also errors on `has(a.b)` when `a` is absent, so every rule guards
each level of a path.
"""

from __future__ import annotations

from paralleljob.api import types as t
from paralleljob.api.problems import Problem
from paralleljob.api.rule import Check, Rule, unchanged
from paralleljob.api.sections import checkpoint, deepspeed, model, parallelism, recovery, template, training
from paralleljob.api.sections.deepspeed import zero_stage
from paralleljob.api.sections.network import multi_node_nvlink
from paralleljob.api.sections.parallelism import budget_gpus, data_parallel_of
from paralleljob.api.sections.template import MANAGED_BY_KEY, OPERATOR_DOMAIN, is_operator_key

__all__ = [
    "MANAGED_BY_KEY",
    "OPERATOR_DOMAIN",
    "RULES",
    "Check",
    "Rule",
    "budget_gpus",
    "check_rules",
    "data_parallel_of",
    "is_operator_key",
    "multi_node_nvlink",
    "zero_stage",
]

# The order of the CRD's x-kubernetes-validations and of `paralleljob validate`'s problems, as it was when the
# rules lived in one table: the committed CRD does not move. A rule not named here comes after these, in the
# order of its section.
ORDER = (
    "sizes-or-budget",
    "one-budget",
    "nodes-need-gpus-per-node",
    "budget-matches-sizes",
    "budget-needs-train-batch",
    "tensor-fits-node",
    "tensor-fits-clique",
    "heads-split-across-tensor",
    "hidden-per-head",
    "ffn-split-across-tensor",
    "layers-fill-stages",
    "zero-with-pipeline",
    "offload-needs-zero",
    "batch-product",
    "gpus-per-node-divides-world",
    "data-path-required",
    "byte-vocab",
    "uint16-vocab",
    "precision-matches-deepspeed",
    "checkpoint-needs-volume",
    "operator-owned-labels",
    "operator-owned-annotations",
)


def _in_order(*sections: tuple[Rule, ...]) -> tuple[Rule, ...]:
    gathered = [rule for section in sections for rule in section]
    return tuple(sorted(gathered, key=lambda rule: ORDER.index(rule.name) if rule.name in ORDER else len(ORDER)))


RULES = _in_order(
    parallelism.RULES, model.RULES, deepspeed.RULES, training.RULES, checkpoint.RULES, template.RULES, recovery.RULES
)

# Rules on the whole object (CRD root): only metadata.name is visible there besides spec.
NAME_RULE_CEL = (
    f"self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= {t.MAX_NAME_LENGTH}"
)


NAME_RULE_MESSAGE = (
    f"metadata.name must be a DNS-1123 label of at most {t.MAX_NAME_LENGTH} characters (pods are <name>-<nodeRank>)"
)


# A transition rule on spec (evaluated on updates only, with oldSelf the stored spec): the fields that decide
# the rank layout, the model's shape and the batch cannot change after creation, since the plan, the pods and
# the checkpoints on the volume all depend on them. Other fields (steps, template, network, failure policy...)
# may change; the operator applies them from the next gang attempt. Each field is compared on its own: one
# `self == oldSelf` over the whole spec would compare unbounded lists and preserved objects, whose estimated
# CEL cost a real API server refuses when the CRD is created.
SPEC_IMMUTABLE_FIELDS = (
    "parallelism.gpus",
    "parallelism.nodes",
    "parallelism.pipeline",
    "parallelism.tensor",
    "parallelism.data",
    "gpusPerNode",
    "model.layers",
    "model.hiddenSize",
    "model.attentionHeads",
    "model.sequenceLength",
    "model.vocabSize",
    "model.ffnHiddenSize",
    "model.precision",
    "model.architecture",
    "model.kvHeads",
    "model.ropeTheta",
    "model.tieEmbeddings",
    "deepspeed.train_batch_size",
    "deepspeed.train_micro_batch_size_per_gpu",
    "deepspeed.gradient_accumulation_steps",
    "managedBy",
)


SPEC_IMMUTABLE_CEL = " && ".join(unchanged(path) for path in SPEC_IMMUTABLE_FIELDS)


SPEC_IMMUTABLE_MESSAGE = (
    "parallelism, gpusPerNode, the model's shape and precision, the DeepSpeed batch sizes and managedBy cannot "
    "change after creation: delete the ParallelJob and create it again (training resumes from the checkpoint volume)"
)


def check_rules(spec: t.ParallelJobSpec, *, cluster: bool = True) -> list[Problem]:
    """Run every cross-field rule (without `cluster`, not the cluster-only ones); all problems, not the first."""
    rules = [rule for rule in RULES if cluster or not rule.cluster_only]
    return [p for rule in rules if (p := rule.check(spec)) is not None]
