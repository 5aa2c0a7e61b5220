"""Writes of ParallelJobs go through the generated CRD, as kube-apiserver runs it: the structural schema (types,
enums, minimums, required), pruning or refusal of unknown fields, defaults, every x-kubernetes-validations rule
(transition rules with oldSelf included), and the status subresource. A bad `kubectl apply` gets the 422 a user
would see."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
import yaml

from tests.chart.conftest import REPO, tool
from tests.cluster.conftest import Client, refusal

JOBS = "/apis/paralleljob.io/v1alpha1/namespaces/research/paralleljobs"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
INVALID = 'ParallelJob.paralleljob.io "quickstart" is invalid: '


def quickstart(**edits: Any) -> dict[str, Any]:
    """The quickstart job with `a__b=value` edits (None deletes)."""
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"].pop("namespace", None)
    for path, value in edits.items():
        *parents, last = path.split("__")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


CASES = {
    "below-a-minimum": (
        quickstart(spec__parallelism__pipeline=0),
        422,
        INVALID + "spec.parallelism.pipeline: Invalid value: 0: spec.parallelism.pipeline in body should be greater "
        "than or equal to 1",
    ),
    "wrong-type": (
        quickstart(spec__parallelism__tensor="2"),
        422,
        INVALID + 'spec.parallelism.tensor: Invalid value: "string": spec.parallelism.tensor in body must be of type '
        'integer: "string"',
    ),
    "not-in-the-enum": (
        quickstart(spec__model__precision="fp8"),
        422,
        INVALID + 'spec.model.precision: Unsupported value: "fp8": supported values: ',
    ),
    "a-required-field-missing": (quickstart(spec__model=None), 422, INVALID + "spec.model: Required value"),
    "a-cel-rule": (
        quickstart(spec__deepspeed__zero_optimization={"stage": 2}),
        422,
        INVALID + 'spec.deepspeed.zero_optimization.stage: Invalid value: "object": ZeRO stage 2 and 3 are '
        "incompatible with pipeline parallelism",
    ),
    "a-cel-rule-on-the-root": (
        quickstart(metadata={"name": "q" * 57}),
        422,
        '<nil>: Invalid value: "object": metadata.name must be a DNS-1123 label of at most 56 characters',
    ),
}


@pytest.mark.parametrize(("doc", "code", "message"), CASES.values(), ids=CASES.keys())
def test_a_job_the_crd_refuses_gets_a_422_naming_the_field(admin: Client, doc, code, message):
    got_code, reason, got_message = refusal(admin.create(JOBS, doc))
    assert (got_code, reason) == (code, "Invalid")
    assert got_message.startswith(message) or message in got_message, got_message


def test_schema_defaults_are_stored(admin):
    created = admin.ok(admin.create(JOBS, quickstart(metadata={"name": "defaulted"}, spec__failurePolicy=None)))
    assert "failurePolicy" in created["spec"]


def test_an_unknown_field_is_pruned_or_refused_under_strict_validation(admin):
    doc = quickstart(metadata={"name": "unknown"}, spec__gpuz=8)
    assert refusal(admin.create(JOBS, doc, fieldValidation="Strict")) == (
        400,
        "BadRequest",
        'ParallelJob in version "v1alpha1" cannot be handled as a ParallelJob: strict decoding error: unknown '
        'field "spec.gpuz"',
    )
    created = admin.ok(admin.create(JOBS, doc))
    assert "gpuz" not in created["spec"]


def test_a_transition_rule_refuses_changing_the_layout_of_a_created_job(admin):
    admin.ok(admin.create(JOBS, quickstart(metadata={"name": "fixed"})))
    got = refusal(admin.patch(f"{JOBS}/fixed", {"spec": {"parallelism": {"tensor": 1}}}))
    assert got[:2] == (422, "Invalid")
    assert got[2].startswith('ParallelJob.paralleljob.io "fixed" is invalid: spec: Forbidden: parallelism, gpusPerNode')
    # An edit of another field is allowed: oldSelf equals self where the rule looks.
    assert admin.patch(f"{JOBS}/fixed", {"spec": {"training": {"steps": 7}}}).status_code == 200


def test_the_status_subresource_keeps_spec_and_status_apart(admin):
    created = admin.ok(admin.create(JOBS, {**quickstart(metadata={"name": "split"}), "status": {"phase": "Running"}}))
    assert "status" not in created  # status is written through /status only
    admin.ok(admin.patch(f"{JOBS}/split/status", {"status": {"phase": "Running"}, "spec": {"training": {"steps": 1}}}))
    admin.ok(admin.patch(f"{JOBS}/split", {"status": {"phase": "Failed"}}))
    stored = admin.ok(admin.send("GET", f"{JOBS}/split"))
    assert stored["status"]["phase"] == "Running"
    assert stored["spec"]["training"].get("steps") == created["spec"]["training"].get("steps")
    assert stored["metadata"]["generation"] == 1


def test_a_status_write_is_validated_too(admin):
    admin.ok(admin.create(JOBS, quickstart(metadata={"name": "status-checked"})))
    got = refusal(admin.patch(f"{JOBS}/status-checked/status", {"status": {"phase": "Exploded"}}))
    assert got[:2] == (422, "Invalid")
    assert 'status.phase: Unsupported value: "Exploded"' in got[2]


def test_kubectl_apply_of_a_bad_job_prints_the_api_message(cluster, admin, tmp_path):
    """--validate=false: no OpenAPI documents are served, so kubectl's own check is off and the server's 422 is
    what the user reads."""
    doc = quickstart(spec__parallelism__pipeline=0)
    doc["metadata"]["namespace"] = "research"
    completed = subprocess.run(
        [tool("kubectl"), "--kubeconfig", str(cluster.kubeconfig), "apply", "--validate=false", "-f", "-"],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 1
    assert 'The ParallelJob "quickstart" is invalid: spec.parallelism.pipeline: Invalid value: 0:' in completed.stderr


def test_kubectl_get_shows_the_printer_columns_and_watch_streams_them(cluster, admin):
    admin.ok(admin.create(JOBS, quickstart(metadata={"name": "watched"})))
    command = [tool("kubectl"), "--kubeconfig", str(cluster.kubeconfig), "get", "pj", "watched", "-n", "research"]
    header = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
    assert header.split() == ["NAME", "LAYOUT", "GPUS", "NODES", "PHASE", "STEP", "LOSS", "RESTARTS", "AGE"]
    with subprocess.Popen([*command, "-w", "--no-headers"], stdout=subprocess.PIPE, text=True) as watch:
        try:
            assert watch.stdout is not None
            first = watch.stdout.readline()
            assert first.split()[0] == "watched"
            status = {"status": {"phase": "Running", "layout": "2x2x2", "progress": {"step": 7, "loss": 3.25}}}
            admin.ok(admin.patch(f"{JOBS}/watched/status", status))
            changed = watch.stdout.readline().split()
            assert changed[:5] == ["watched", "2x2x2", "Running", "7", "3.25"]  # empty cells print as spaces
        finally:
            watch.kill()
