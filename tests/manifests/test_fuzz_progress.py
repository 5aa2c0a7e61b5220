"""Fuzzed progress reports: whatever rank 0 (which runs users' code) writes into its progress ConfigMap, what the
operator takes from it is only that job's progress, within the CRD's status schema and bounded in size, and
reading it never raises.

Rank 0's account may patch its one ConfigMap, so its `data` is hostile input: keys the operator reads with
arbitrary strings (huge, non-numeric, negative, NaN, timestamps that are not), keys it does not read, values that
are not strings, and `data` that is not a map at all.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob.api import crd
from paralleljob.manifests import progress
from paralleljob_contract import progress as channel

STATUS = jsonschema.Draft7Validator(crd.root_schema()["properties"]["status"])
# What a report may feed: the progress itself, the last checkpoint and the network verdict, nothing the operator
# decides with (phase, placement, restarts, conditions).
REPORTABLE = {"progress", "lastCheckpointStep", "network"}
# A generous bound on the copy of one report, whatever its size: every number is parsed, every text is capped.
MAX_COPY_BYTES = 8 * 1024
KNOWN_KEYS = sorted(
    value
    for name, value in vars(channel).items()
    if name.isupper() and isinstance(value, str) and name != "CONFIG_MAP_SUFFIX"
)

texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["0", "1", "-1", "10", "1e308", "nan", "inf", "-inf", "2.5", "True", "2026-12-01T08:00:00Z"]),
    st.integers(min_value=0, max_value=4).map(lambda n: "9" * (10**n)),
)
values = st.one_of(texts, st.integers(), st.floats(), st.none(), st.lists(st.integers(), max_size=3))
data = st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=12)), values, max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(data, st.lists(st.integers(), max_size=2), st.text(max_size=5), st.none()),
    total=st.integers(1, 10**6),
)
def test_a_report_feeds_only_its_jobs_progress_within_the_status_schema(data: Any, total: int) -> None:
    copied = progress.status_of({"data": data}, total)
    assert set(copied) <= REPORTABLE
    status: dict[str, Any] = {"phase": "Running", **copied}
    STATUS.validate(status)
    assert len(json.dumps(copied)) <= MAX_COPY_BYTES
    if "progress" in copied:
        assert 0 <= copied["progress"]["step"] <= total
        assert copied["progress"]["totalSteps"] == total
    if "lastCheckpointStep" in copied:
        assert 0 <= copied["lastCheckpointStep"] <= total


@settings(max_examples=200, deadline=None)
@given(data=data, since=st.one_of(st.none(), texts), budget=st.integers(0, 100))
def test_a_reported_in_place_restart_count_stays_within_the_attempts_budget(data: Any, since: Any, budget: int) -> None:
    count = progress.in_place_restarts_of({"data": data}, since, budget)
    assert count is None or 0 <= count <= budget
