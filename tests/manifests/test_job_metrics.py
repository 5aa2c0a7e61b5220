"""The operator's per-job training metrics: the figures read from a job object, as a table, and the series the
collector exports from them (one per job and figure, labelled namespace and name; none for a figure not
reported; none at all once the job is forgotten)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from paralleljob.handlers.job_metrics import JobMetrics
from paralleljob.manifests.job_figures import figures_of

NOW = 1_796_400_000.0  # 2026-12-04T16:00:00Z


def job(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "research", "name": "gpt"},
        "spec": {"training": {"steps": 100}, **spec},
        "status": status or {},
    }


RUNNING = {
    "phase": "Running",
    "layout": "2x2x2",
    "worldSize": 8,
    "gpusPerNode": 4,
    "spareNodes": ["node-9"],
    "restarts": 3,
    "inPlaceRestarts": 2,
    "lastCheckpointStep": 40,
    "lastCheckpointTime": "2026-12-04T15:50:00Z",
    "progress": {
        "step": 42,
        "totalSteps": 100,
        "loss": 3.5,
        "validationLoss": 3.7,
        "tokensPerSecond": 5000.0,
        "tflopsPerGpu": 0.02,
        "stepSeconds": 2.0,
        "modeledStepSeconds": 0.5,
        "updated": "2026-12-04T15:59:30Z",
        "stragglers": '[{"node": "node-3", "factor": 1.6}, {"node": "node-5", "factor": 2.25}]',
    },
}

CASES = {
    "running": (
        job(RUNNING, failurePolicy={"progressTimeoutSeconds": 60}),
        {
            "step": 42.0,
            "total_steps": 100.0,
            "loss": 3.5,
            "validation_loss": 3.7,
            "tflops_per_gpu": 0.02,
            "mfu": None,
            "gang_restarts": 1.0,
            "in_place_restarts": 2.0,
            "gpus": 12.0,
            "progress_timeout_seconds": 60.0,
            "slowest_node_factor": 2.25,
        },
    ),
    "pending-holds-no-gpus": (job({"phase": "Pending", "worldSize": 8}), {"gpus": 0.0, "step": None}),
    "not-started-takes-total-from-spec": (job(), {"total_steps": 100.0, "phase": None, "gang_restarts": 0.0}),
    "malformed-numbers-are-not-reported": (
        job({"phase": "Running", "progress": {"step": "42", "loss": float("nan"), "mfu": True}}),
        {"step": None, "loss": None, "mfu": None},
    ),
    "stragglers-as-objects-in-status": (
        job({"stragglers": [{"node": "a", "factor": 1.4}, {"node": "b"}]}),
        {"slowest_node_factor": 1.4},
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_figures_of_a_job_object(case: str) -> None:
    obj, expected = CASES[case]
    figures = figures_of(obj)
    assert {field: getattr(figures, field) for field in expected} == expected


def scrape(collector: JobMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_one_series_per_job_and_figure_and_none_once_the_job_is_deleted() -> None:
    collector = JobMetrics(clock=lambda: NOW)
    collector.observe(job(RUNNING, failurePolicy={"progressTimeoutSeconds": 60}))
    collector.observe({**job({"phase": "Pending"}), "metadata": {"namespace": "other", "name": "gpt"}})
    found = scrape(collector)
    gpt = (("name", "gpt"), ("namespace", "research"))
    assert found[("paralleljob_job_step", gpt)] == 42
    assert found[("paralleljob_job_seconds_since_step", gpt)] == 30
    assert found[("paralleljob_job_checkpoint_age_seconds", gpt)] == 600
    assert found[("paralleljob_job_restarts_total", (("kind", "gang"), *gpt))] == 1
    assert found[("paralleljob_job_phase", (*gpt, ("phase", "Running")))] == 1
    assert found[("paralleljob_job_info", (("layout", "2x2x2"), *gpt))] == 1
    assert ("paralleljob_job_mfu", gpt) not in found, "no peak, no MFU series"
    per_job = {key for key in found if ("namespace", "research") in key[1]}
    # 13 figures (MFU absent here), info, 6 phases, 2 kinds of restart, 2 ages: a fixed number per job.
    assert len(per_job) == 23
    collector.forget("research", "gpt")
    assert not [key for key in scrape(collector) if ("namespace", "research") in key[1]]
    assert [key for key in scrape(collector) if ("namespace", "other") in key[1]]
