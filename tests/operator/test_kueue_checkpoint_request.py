"""Before Kueue's eviction stops a gang, the operator asks rank 0 for a checkpoint only when the job keeps
checkpoints: a job without spec.checkpoint is stopped without asking (mypy --strict found the pass reading
`spec.checkpoint.volume` of a job that has no checkpoint section, an AttributeError on every such eviction)."""

from __future__ import annotations

from paralleljob.api import validate_document
from paralleljob.handlers import queueing
from tests.operator.helpers import job_doc

RUNNING_POD = {"status": {"phase": "Running"}}


def test_a_job_without_checkpoints_is_not_asked_for_one_before_its_eviction() -> None:
    doc = job_doc()
    doc["spec"].pop("checkpoint", None)
    result = validate_document(doc)
    assert result.resolved is not None and result.resolved.spec.checkpoint is None
    # The pass is never read for such a job: nothing to ask, whatever the pods do.
    assert queueing._checkpoint_needed(None, result.resolved, [RUNNING_POD]) is None  # type: ignore[arg-type]
