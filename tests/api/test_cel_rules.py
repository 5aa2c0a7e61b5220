"""The CRD's CEL rules and their Python twins agree, on valid and invalid specs (evaluated with cel-python).

The API server applies schema defaults before it runs CEL, so each spec is defaulted from the generated
schema first, exactly as `kubectl apply` would see it.
"""

from __future__ import annotations

import celpy
import pytest

from paralleljob.api import crd, parsing, rules
from tests.api.cel_cases import CASES, SPEC_SCHEMA
from tests.api.jobs import job

CEL = celpy.Environment()


def spec_of(edits: dict) -> dict:
    doc = job(**{k.replace(".", "__"): v for k, v in edits.items()})
    return crd.apply_defaults(SPEC_SCHEMA, doc["spec"])


def cel_allows(rule: rules.Rule, spec: dict) -> bool:
    program = CEL.program(CEL.compile(rule.cel))
    return bool(program.evaluate({"self": celpy.json_to_cel(spec)}))


@pytest.mark.parametrize("rule", rules.RULES, ids=[r.name for r in rules.RULES])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_cel_rule_and_python_twin_agree(rule: rules.Rule, case: str) -> None:
    spec_dict = spec_of(CASES[case])
    spec, problems = parsing.parse_spec(spec_dict)
    assert spec is not None, problems
    assert cel_allows(rule, spec_dict) == (rule.check(spec) is None)


@pytest.mark.parametrize("rule", rules.RULES, ids=[r.name for r in rules.RULES])
def test_every_rule_is_exercised_both_ways(rule: rules.Rule) -> None:
    verdicts = set()
    for edits in CASES.values():
        spec, _ = parsing.parse_spec(spec_of(edits))
        assert spec is not None
        verdicts.add(rule.check(spec) is None)
    assert verdicts == {True, False}, f"{rule.name} needs a passing and a failing case"


@pytest.mark.parametrize(
    ("name", "allowed"),
    [("gpt-small", True), ("a" * 56, True), ("a" * 57, False), ("GPT", False), ("-gpt", False), ("gpt_1", False)],
)
def test_the_name_rule_accepts_exactly_short_dns_labels(name: str, allowed: bool) -> None:
    program = CEL.program(CEL.compile(rules.NAME_RULE_CEL))
    assert bool(program.evaluate({"self": celpy.json_to_cel({"metadata": {"name": name}})})) == allowed
    assert (parsing.check_name(name) == []) == allowed
