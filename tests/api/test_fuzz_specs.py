"""Fuzzed specs, in process: the CRD's CEL rules (run by cel-python on the spec as the API server defaults it)
and their Python twins agree on every generated job, and `validate_document` (what `paralleljob validate`, the
operator and the local runner call) refuses every job a CEL rule refuses, with a message, never a traceback.

The same documents go through the real kube-apiserver in tests/upstream/test_fuzz_server.py.
"""

from __future__ import annotations

from typing import Any

import celpy
from hypothesis import HealthCheck, given, settings

from paralleljob.api import crd, parsing, rules, validate_document
from paralleljob.api.problems import errors_of
from tests.api import spec_strategies

CEL = celpy.Environment()
SPEC_SCHEMA = crd.spec_schema()
PROGRAMS = {rule.name: CEL.program(CEL.compile(rule.cel)) for rule in rules.RULES}


def cel_refusals(spec: dict[str, Any]) -> set[str]:
    """The names of the rules whose CEL refuses the defaulted spec."""
    value = celpy.json_to_cel(spec)
    return {name for name, program in PROGRAMS.items() if not bool(program.evaluate({"self": value}))}


def twin_refusals(spec: dict[str, Any]) -> set[str] | None:
    """The names of the rules whose Python twin refuses the spec; None when the spec does not parse at all."""
    parsed, _ = parsing.parse_spec(spec)
    if parsed is None:
        return None
    return {rule.name for rule in rules.RULES if rule.check(parsed) is not None}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_strategies.documents())
def test_every_cel_rule_agrees_with_its_python_twin_on_fuzzed_jobs(doc: dict[str, Any]) -> None:
    spec = crd.apply_defaults(SPEC_SCHEMA, doc["spec"])
    twins = twin_refusals(spec)
    if twins is None:
        return  # A spec the schema types refuse never reaches CEL; the validator's verdict is tested below.
    assert cel_refusals(spec) == twins


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_strategies.documents())
def test_the_validator_refuses_every_job_a_cel_rule_refuses_and_says_why(doc: dict[str, Any]) -> None:
    result = validate_document(doc)
    spec = crd.apply_defaults(SPEC_SCHEMA, doc["spec"])
    refused_by_cel = cel_refusals(spec) if twin_refusals(spec) is not None else set()
    if refused_by_cel:
        assert not result.ok, f"CEL refuses {sorted(refused_by_cel)} but the validator accepts"
    if not result.ok:
        errors = errors_of(result.problems)
        assert errors, "a refusal must say why"
        assert all(problem.message.strip() for problem in errors)
