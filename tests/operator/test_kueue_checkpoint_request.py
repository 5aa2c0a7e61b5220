"""Before Kueue's eviction stops a gang, the operator asks rank 0 for a checkpoint only when the job keeps
checkpoints: a job without spec.checkpoint is stopped without asking (mypy --strict found the pass reading
`spec.checkpoint.volume` of a job that has no checkpoint section, an AttributeError on every such eviction)."""

from __future__ import annotations

import datetime

from paralleljob.api import validate_document
from paralleljob.handlers.observed import Observed
from paralleljob.handlers.settings import Settings
from paralleljob.handlers.steps import kueue
from tests.operator.helpers import job_doc

RUNNING_POD = {"status": {"phase": "Running"}}


def test_a_job_without_checkpoints_is_not_asked_for_one_before_its_eviction() -> None:
    doc = job_doc()
    doc["spec"].pop("checkpoint", None)
    result = validate_document(doc)
    assert result.resolved is not None and result.resolved.spec.checkpoint is None
    # Nothing to ask, whatever the pods do; and rank 0's progress is not even read for it.
    seen = Observed(job=doc)
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    settings = Settings(image="trainer:test")
    assert kueue.checkpoint_needed(seen, result.resolved, [RUNNING_POD], settings, now) is None
    assert not kueue._may_ask(result.resolved, [RUNNING_POD])
