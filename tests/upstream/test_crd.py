"""The chart's CRD on the real kube-apiserver, installed by `helm install`: every CEL rule refuses exactly the
jobs its Python twin refuses, with the rule's own message at its field; the structural schema refuses, defaults
and prunes as generated, on status writes too; and what a user does with kubectl (apply without
`--validate=false`, server-side apply, explain, the printer columns) works.

The jobs are the CEL table of tests/api/cel_cases.py, which exercises every rule both ways. They are sent
as dry-run creates: the API server defaults, validates and runs CEL (costs included) exactly as for a create,
and stores nothing.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from paralleljob.api import crd, parsing, rules
from testcluster import polling
from testcluster.api import REPO, Api, Tool
from tests.api import cel_cases
from tests.api.jobs import DELETE, job

pytestmark = pytest.mark.both_releases

JOBS = "/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs"
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if not p.name.startswith("cluster-"))


def job_of(edits: dict[str, Any]) -> dict[str, Any]:
    return job(**{k.replace(".", "__"): v for k, v in edits.items()})


def refusing_rules(doc: dict[str, Any]) -> set[str]:
    """The messages of the rules whose Python twin refuses the job, as the server defaults it first."""
    spec, problems = parsing.parse_spec(crd.apply_defaults(cel_cases.SPEC_SCHEMA, doc["spec"]))
    assert spec is not None, problems
    return {rule.message for rule in rules.RULES if rule.check(spec) is not None}


def server_refusals(api: Api, namespace: str, doc: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    response = api.send("POST", JOBS.format(namespace=namespace), doc, dryRun="All")
    if response.status_code == 201:
        return 201, []
    body = response.json()
    causes = list((body.get("details") or {}).get("causes") or [])
    # A FieldValueInvalid cause reads "Invalid value: <the rule's message>", as `kubectl apply` prints it.
    return response.status_code, [c | {"message": c["message"].removeprefix("Invalid value: ")} for c in causes]


@pytest.mark.parametrize("case", cel_cases.CASES, ids=list(cel_cases.CASES))
def test_the_real_server_refuses_exactly_what_the_python_twins_refuse(
    chart: str, admin_api: Api, namespace: str, case: str
) -> None:
    doc = job_of(cel_cases.CASES[case])
    wanted = refusing_rules(doc)
    code, causes = server_refusals(admin_api, namespace, doc)
    by_message = {cause["message"]: cause.get("field") for cause in causes}
    assert code == (422 if wanted else 201), causes
    assert set(by_message) == wanted
    for rule in rules.RULES:
        if rule.message in by_message:
            assert by_message[rule.message] == "spec" + rule.field_path, rule.name


def test_every_rule_of_the_crd_is_a_rule_the_table_refuses_once(chart: str, admin_api: Api, namespace: str) -> None:
    """The server's CRD has every rule of the Python table, and each refuses at least one job of the table."""
    refused: set[str] = set()
    for edits in cel_cases.CASES.values():
        _, causes = server_refusals(admin_api, namespace, job_of(edits))
        refused |= {cause["message"] for cause in causes}
    assert refused == {rule.message for rule in rules.RULES}


@pytest.mark.parametrize(("name", "allowed"), [("a" * 56, True), ("a" * 57, False)])
def test_the_name_rule_runs_on_the_server(chart: str, admin_api: Api, namespace: str, name: str, allowed: bool) -> None:
    doc = job()
    doc["metadata"]["name"] = name
    code, causes = server_refusals(admin_api, namespace, doc)
    assert (code == 201) == allowed, causes
    if not allowed:
        assert [c["message"] for c in causes] == [rules.NAME_RULE_MESSAGE]


# What the CRD's structural schema, generated from the API types, refuses before any CEL rule runs: a minimum, a
# type, an enum and a required field, each with the server's message at the field.
SCHEMA_REFUSALS = {
    "below-a-minimum": (
        {"spec.parallelism.pipeline": 0},
        "spec.parallelism.pipeline: Invalid value: 0: spec.parallelism.pipeline in body should be greater than or "
        "equal to 1",
    ),
    "wrong-type": (
        {"spec.parallelism.tensor": "2"},
        'spec.parallelism.tensor: Invalid value: "string": spec.parallelism.tensor in body must be of type integer: '
        '"string"',
    ),
    "not-in-the-enum": ({"spec.model.precision": "fp8"}, 'spec.model.precision: Unsupported value: "fp8"'),
    "a-required-field-missing": ({"spec.model": DELETE}, "spec.model: Required value"),
}


@pytest.mark.parametrize(("edits", "message"), SCHEMA_REFUSALS.values(), ids=list(SCHEMA_REFUSALS))
def test_the_schema_refuses_a_bad_field_with_a_422_naming_it(
    chart: str, admin_api: Api, namespace: str, edits: dict[str, Any], message: str
) -> None:
    response = admin_api.send("POST", JOBS.format(namespace=namespace), job_of(edits), dryRun="All")
    assert response.status_code == 422, response.text
    assert message in response.json()["message"], response.json()["message"]


def test_the_schema_defaults_are_stored(chart: str, admin_api: Api, namespace: str) -> None:
    created = admin_api.create(JOBS.format(namespace=namespace), job_of({"spec.failurePolicy": DELETE}))
    assert "failurePolicy" in created["spec"]


def test_an_unknown_field_is_pruned_or_refused_under_strict_validation(
    chart: str, admin_api: Api, namespace: str
) -> None:
    path, doc = JOBS.format(namespace=namespace), job_of({"spec.gpuz": 8})
    strict = admin_api.send("POST", path, doc, fieldValidation="Strict")
    assert strict.status_code == 400 and 'unknown field "spec.gpuz"' in strict.json()["message"], strict.text
    assert "gpuz" not in admin_api.create(path, doc)["spec"]


def test_a_status_write_is_validated_too(chart: str, admin_api: Api, namespace: str) -> None:
    path = JOBS.format(namespace=namespace)
    admin_api.create(path, job())
    response = admin_api.send("PATCH", f"{path}/gpt-small/status", {"status": {"phase": "Exploded"}})
    assert response.status_code == 422, response.text
    assert 'status.phase: Unsupported value: "Exploded"' in response.json()["message"]


def test_a_transition_rule_refuses_changing_the_layout_of_a_created_job(
    chart: str, admin_api: Api, namespace: str
) -> None:
    path = JOBS.format(namespace=namespace)
    admin_api.create(path, job())
    response = admin_api.send("PATCH", f"{path}/gpt-small", {"spec": {"parallelism": {"tensor": 2}}})
    assert response.status_code == 422, response.text
    response = admin_api.send("PATCH", f"{path}/gpt-small", {"spec": {"parallelism": {"gpus": 16}}})
    assert response.status_code == 422 and "budget" in response.text, response.text


def test_the_status_subresource_keeps_spec_and_status_apart(chart: str, admin_api: Api, namespace: str) -> None:
    path = JOBS.format(namespace=namespace)
    admin_api.create(path, job())
    patched = admin_api.ok(
        admin_api.send(
            "PATCH", f"{path}/gpt-small/status", {"status": {"phase": "Running"}, "spec": {"training": {"steps": 1}}}
        )
    )
    assert patched["status"]["phase"] == "Running" and patched["spec"]["training"]["steps"] == 100
    patched = admin_api.ok(admin_api.send("PATCH", f"{path}/gpt-small", {"status": {"phase": "Failed"}}))
    assert patched["status"]["phase"] == "Running"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_kubectl_apply_of_every_example_needs_no_validate_false(
    chart: str, kubectl: Tool, namespace: str, example: Any
) -> None:
    """Client-side and server-side apply of every example. The one example that shows a mistake is refused with
    the CRD's message, as its header says."""
    text = example.read_text()
    invalid = "reject it up front" in text
    for mode in ((), ("--server-side",)):
        done = kubectl.run("apply", "-n", namespace, *mode, "-f", str(example), check=False)
        if invalid:
            assert done.returncode == 1 and "incompatible with pipeline parallelism" in done.stderr, done.stderr
        else:
            assert done.returncode == 0, done.stderr


def test_kubectl_explain_answers_from_the_servers_openapi(chart: str, kubectl: Tool) -> None:
    text = kubectl("explain", "paralleljob.spec.parallelism")
    assert "The 3D layout: pipeline x tensor x data." in text
    for field in ("pipeline", "tensor", "data", "gpus", "nodes"):
        assert f"  {field}\t<integer>" in text, text


def test_kubectl_get_shows_the_printer_columns(chart: str, admin_api: Api, kubectl: Tool, namespace: str) -> None:
    path = JOBS.format(namespace=namespace)
    admin_api.create(path, job())
    status = {
        "phase": "Running",
        "layout": "2x4x2",
        "worldSize": 16,
        "nodes": 2,
        "progress": {"step": 7, "loss": 3.25},
        "restarts": 1,
    }
    admin_api.ok(admin_api.send("PATCH", f"{path}/gpt-small/status", {"status": status}))
    lines = kubectl("get", "pj", "-n", namespace).splitlines()
    header, row = lines[0].split(), lines[1].split()
    assert header == ["NAME", "LAYOUT", "GPUS", "NODES", "PHASE", "STEP", "LOSS", "RESTARTS", "AGE"]
    assert row[:8] == ["gpt-small", "2x4x2", "16", "2", "Running", "7", "3.25", "1"]


def test_the_short_name_and_category_resolve(chart: str, kubectl: Tool, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(job()))
    assert "gpt-small" in kubectl("get", "all", "-n", namespace, "-o", "name")
    assert kubectl("get", "paralleljobs.paralleljob.io", "-n", namespace, "-o", "name").strip() == (
        "paralleljob.paralleljob.io/gpt-small"
    )


def test_the_crd_helm_installed_is_the_generated_one(chart: str, kubectl: Tool) -> None:
    served = yaml.safe_load(kubectl("get", "crd", "paralleljobs.paralleljob.io", "-o", "yaml"))
    generated = yaml.safe_load((REPO / "crds" / "paralleljob.io_paralleljobs.yaml").read_text())
    assert copy.deepcopy(served["spec"]["versions"][0]["schema"]) == generated["spec"]["versions"][0]["schema"]


# A job stored before one of its rules existed: a copy of the CRD in a group of its own (so the chart's stays as
# helm installed it), first without the two rules, then as shipped.
RATCHET_GROUP = "ratchet.paralleljob.io"
ADDED_RULES = ("zero-with-pipeline", "layers-fill-stages")
STORED_EARLIER = {
    "zero2": {"spec.deepspeed.zero_optimization.stage": 2},
    "layers": {"spec.model.layers": 1},
}


def regrouped(without: tuple[str, ...] = ()) -> dict[str, Any]:
    doc = crd.build_crd()
    doc["metadata"]["name"] = f"paralleljobs.{RATCHET_GROUP}"
    doc["spec"]["group"] = RATCHET_GROUP
    dropped = {rule.message for rule in rules.RULES if rule.name in without}
    for version in doc["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["x-kubernetes-validations"] = [r for r in spec["x-kubernetes-validations"] if r["message"] not in dropped]
    return doc


def test_a_job_stored_before_a_rule_existed_can_still_have_its_status_and_labels_written(
    admin_api: Api, namespace: str
) -> None:
    definitions = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    jobs = f"/apis/{RATCHET_GROUP}/v1alpha1/namespaces/{namespace}/paralleljobs"
    admin_api.create(definitions, regrouped(without=ADDED_RULES))
    try:
        stored = {}
        for name, edits in STORED_EARLIER.items():
            doc = job_of(edits) | {"apiVersion": f"{RATCHET_GROUP}/v1alpha1"}
            doc["metadata"] = {"name": name}
            stored[name] = wait_for_ok(lambda doc=doc: admin_api.send("POST", jobs, doc))
        current = admin_api.ok(admin_api.send("GET", f"{definitions}/paralleljobs.{RATCHET_GROUP}"))
        shipped = regrouped() | {"metadata": current["metadata"]}
        admin_api.ok(admin_api.send("PUT", f"{definitions}/paralleljobs.{RATCHET_GROUP}", shipped))
        for name, edits in STORED_EARLIER.items():
            again = job_of(edits) | {"apiVersion": f"{RATCHET_GROUP}/v1alpha1", "metadata": {"name": f"{name}-new"}}
            # The server refuses the same job now: the rules are in force.
            wait_for_ok(lambda again=again: admin_api.send("POST", jobs, again, dryRun="All"), want=422)
            # What the operator writes of a stored job: its status, and labels or annotations.
            status = {"status": {"phase": "Failed", "message": "the spec breaks a rule"}}
            admin_api.ok(admin_api.send("PATCH", f"{jobs}/{name}/status", status))
            admin_api.ok(admin_api.send("PATCH", f"{jobs}/{name}", {"metadata": {"labels": {"seen": "yes"}}}))
            # An edit of a field the rule does not read passes; one of a field it reads is judged again.
            admin_api.ok(admin_api.send("PATCH", f"{jobs}/{name}", {"spec": {"training": {"steps": 7}}}))
        response = admin_api.send(
            "PATCH", f"{jobs}/zero2", {"spec": {"deepspeed": {"zero_optimization": {"stage": 3}}}}
        )
        assert response.status_code == 422 and "ZeRO stage 2 and 3" in response.text, response.text
    finally:
        admin_api.send("DELETE", f"{definitions}/paralleljobs.{RATCHET_GROUP}")


def wait_for_ok(send: Any, want: int = 201, timeout: float = 30) -> dict[str, Any]:
    """Send until the answer has status `want`: a CRD's new version is served a moment after it is stored."""
    last: list[Any] = []

    def answered() -> bool:
        last[:] = [send()]
        return bool(last[0].status_code == want)

    try:
        polling.wait_for(answered, timeout, f"an answer {want}", interval=0.2)
    except TimeoutError:
        pytest.fail(f"no answer {want} in {timeout} s; the last: {last[0].status_code} {last[0].text}")
    return dict(last[0].json())
