"""A validation result in words, for every command that validates a job (`paralleljob validate`, `plan`,
`run`): one summary line for a valid job, one line per problem (`LABEL: spec.path: message`), and for a job whose
derived DP does not add up, what the batch arithmetic gives.
"""

from __future__ import annotations

from typing import Any

from paralleljob.api import documents
from paralleljob.api.validation import ResolvedJob, ValidationResult, validate_document


def report(doc: documents.Document, label: str, *, cluster: bool = True) -> tuple[ValidationResult, list[str]]:
    """Validate the document once: the result, whose `resolved` job the caller goes on with, and its lines."""
    result = validate_document(doc.body, cluster=cluster)
    lines = [f"{label}: {p.render()}" for p in result.problems]
    if result.ok:
        return result, [f"{label}: {summary(result)}", *lines]
    note = arithmetic_note(result, doc.body)
    return result, lines + ([f"{label}: {note}"] if note else [])


def summary(result: ValidationResult) -> str:
    """One line for a valid job: layout, GPUs, nodes and the derived numbers."""
    resolved = result.resolved
    assert resolved is not None
    spec = resolved.spec
    if resolved.needs_layout:
        return _budget_summary(resolved)
    gpn = spec.gpus_per_node
    nodes = f"{resolved.world_size // gpn} nodes x {gpn} GPUs" if gpn else "nodes chosen by the planner"
    derived = " (derived)" if spec.parallelism.data is None else ""
    return (
        f"{resolved.name}: valid, layout {resolved.layout} (PP x TP x DP), {resolved.world_size} GPUs, {nodes}, "
        f"DP {resolved.data}{derived}, batch {resolved.batch.train_batch_size} = micro {resolved.batch.micro_batch}"
        f" x accumulation {resolved.batch.gradient_accumulation_steps} x DP {resolved.data}"
    )


def _budget_summary(resolved: ResolvedJob) -> str:
    """A job that gives a GPU budget: what is fixed now, and that the layout is chosen at admission."""
    par = resolved.spec.parallelism
    fixed = [
        f"{axis} {size}"
        for axis, size in (("pipeline", par.pipeline), ("tensor", par.tensor), ("data", par.data))
        if size
    ]
    kept = f", keeping {' and '.join(fixed)}" if fixed else ""
    return (
        f"{resolved.name}: valid, a budget of {resolved.world_size} GPUs; the layout (pipeline x tensor x data, "
        f"micro-batch and accumulation for train_batch_size {resolved.batch.train_batch_size}, recomputation, "
        f"ZeRO stage) will be chosen at admission on the cluster's free nodes{kept}; "
        "preview it with paralleljob plan --auto"
    )


def arithmetic_note(result: ValidationResult, doc: Any) -> str | None:
    """For a rejected job whose DP was derived, still show what the batch arithmetic gives."""
    batch = result.batch
    spec = doc.get("spec") if isinstance(doc, dict) else None
    parallelism = spec.get("parallelism") if isinstance(spec, dict) else None
    if batch is None or not isinstance(parallelism, dict) or "data" in parallelism:
        return None
    pp, tp = parallelism.get("pipeline"), parallelism.get("tensor")
    if not isinstance(pp, int) or not isinstance(tp, int):
        return None
    return (
        f"spec.parallelism.data: note: derived DP {batch.data_parallel} from train_batch_size "
        f"{batch.train_batch_size} = {batch.micro_batch} x {batch.gradient_accumulation_steps} x DP, so "
        f"pipeline {pp} x tensor {tp} x data {batch.data_parallel} needs {pp * tp * batch.data_parallel} GPUs"
    )
