"""Fuzzed specs through the real kube-apiserver: for generated jobs (tests/api/spec_strategies.py), the chart's
CRD refuses exactly the rules whose Python twins refuse, the schema refuses what does not parse, and nothing the
server admits is refused by a CEL twin; the validator refuses all that the server refuses.

Dry-run creates: the server defaults, runs the structural schema and CEL with its cost budget, and stores
nothing. The in-process twin of this test (tests/api/test_fuzz_specs.py) runs many more examples.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from paralleljob.api import crd, parsing, rules, validate_document
from testcluster.api import Api
from tests.api import spec_strategies

JOBS = "/apis/paralleljob.io/v1alpha1/namespaces/{namespace}/paralleljobs"
SPEC_SCHEMA = crd.spec_schema()


def twin_refusals(doc: dict[str, Any]) -> set[str] | None:
    """The messages of the rules whose twin refuses the job as the server defaults it; None if it does not parse."""
    spec, _ = parsing.parse_spec(crd.apply_defaults(SPEC_SCHEMA, doc["spec"]))
    if spec is None:
        return None
    return {rule.message for rule in rules.RULES if rule.check(spec) is not None}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(doc=spec_strategies.documents())
def test_the_server_the_twins_and_the_validator_agree_on_fuzzed_jobs(
    chart: str, admin_api: Api, namespace: str, doc: dict[str, Any]
) -> None:
    response = admin_api.send("POST", JOBS.format(namespace=namespace), doc, dryRun="All")
    assert response.status_code in (201, 422), response.text
    causes = (response.json().get("details") or {}).get("causes") or []
    refused = {cause["message"].removeprefix("Invalid value: ") for cause in causes}
    wanted = twin_refusals(doc)
    if wanted is not None:
        assert refused == wanted
    else:
        assert response.status_code == 422, "a spec the Python types refuse must not be stored"
    if response.status_code == 422:
        assert not validate_document(doc).ok
